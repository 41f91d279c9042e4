"""kvsim's own API over an engine's cache tensors: ``Pools``, ``LatentPool`` and their ``Geometry``.

``Pools(engine, tensors, ...)`` binds the engine's tensors (the presets of
core/include/kvsim/core/engine_presets.hpp, ``kvsim.engines()``) as kvsim's
primary pool, in place, and runs the contract's read and copy ops on them on
the CPU oracle: ``gather`` (contract §5.9, the read side), ``copy_blocks``
(vLLM's copy_blocks), ``partial_copy`` (TensorRT-LLM's
cuKVCacheBlockPartialCopy) and, with a secondary pool, ``offload`` /
``onboard`` (TensorRT-LLM's host offloading, contract MoveBlocksOp).
``LatentPool`` is DeepSeek MLA's latent cache ([ckv | kpe] per token) with
``append_mla`` and ``mla_attention``. Each op validates before it moves a byte; a
raised kvsim.Error leaves the tensors unchanged. CUDA tensors run on the
CUDA backend in place (a module built without it stages them through the
host; docs/python.md).
"""

from dataclasses import dataclass

import numpy as np

from . import _kvsim
from . import _tensors as T
from ._pools import Bound, cache_dtype_of


@dataclass(frozen=True)
class Geometry:
    """A pool's geometry as kvsim reads it from the engine's tensors (core's PoolGeometry)."""

    layers: int
    kv_heads: int
    page_size: int
    head_dim: int
    blocks: int
    cache_dtype: str
    layout: str
    placement: str
    secondary_blocks: int = 0


class Pools:
    """An engine's cache tensors as one kvsim pool (used in place).

    ``engine`` a preset name (``kvsim.engines()``: vllm-flash, vllm-paged,
    flashinfer, flashinfer-tuple, trtllm, sglang, ...), ``tensors`` the
    engine's tensor(s) for one layer (per-layer engines) or all layers
    (trtllm, vllm-flash-cross-layer; give ``layers``), ``kv_heads``,
    ``page_size``, ``head_dim`` (elements; nvfp4 tensors hold D / 2 bytes),
    ``cache_dtype`` for uint8 tensors, ``kv_layout`` NHD/HND where the
    engine has both, ``scale_tensors`` nvfp4 block scales.
    ``secondary`` (and ``secondary_scale_tensors``): tensors of the same
    engine and geometry with their own block count, the secondary pool that
    ``offload`` and ``onboard`` move whole blocks to and from (TensorRT-LLM
    keeps it in host memory; here it is any tensor that shares no memory with
    the primary one).
    """

    def __init__(self, engine, tensors, *, kv_heads, page_size, head_dim, layers=1, cache_dtype=None,
                 kv_layout="NHD", scale_tensors=(), secondary=None, secondary_scale_tensors=()):
        self.engine = engine
        self.tensors = _listed(tensors)
        self.scale_tensors = list(scale_tensors)
        self.secondary = None if secondary is None else (_listed(secondary), list(secondary_scale_tensors))
        self._args = (cache_dtype_of(self.tensors[0], cache_dtype), kv_layout.lower(), layers, kv_heads, page_size,
                      head_dim)
        g = self._bind().pools.geometry  # validates the tensors now
        self.geometry = Geometry(**g)

    def _bind(self, tensors=None):
        return Bound(self.engine, tensors or self.tensors, *self._args, self.scale_tensors, self.secondary)

    def _run(self, op, *args):
        bound = self._bind()
        op(bound.pools, *args)
        bound.finish()

    def gather(self, block_ids, num_tokens, *, layer=0, kv=0, scale=1.0, global_scale=1.0):
        """One sequence's K (kv=0) or V (kv=1) rows of ``layer`` as fp32 [num_tokens, H, D] (numpy).

        ``block_ids`` the sequence's table (-1 pages read as zeros); fp8/int8
        codes are decoded and multiplied by ``scale``, nvfp4 decoded with
        ``global_scale``; fp32/fp16/bf16 values exactly.
        """
        out = np.zeros((int(num_tokens), self.geometry.kv_heads, self.geometry.head_dim), np.float32)
        # Read only: K and V of two tensors are read from one fresh copy, so the
        # output can never fall inside the pool's address range (gather's rule).
        host = [T.host_copy(t) for t in self.tensors]
        bound = Bound(self.engine, list(T.stack_pair(*host)) if len(host) == 2 else host, *self._args,
                      self.scale_tensors)
        _kvsim.gather(bound.pools, int(layer), int(kv), T.int_array(block_ids), int(num_tokens), out, float(scale),
                      float(global_scale))
        return out

    def copy_blocks(self, src, dst):
        """vLLM's copy_blocks: block src[i] copied whole (every layer, K and V, nvfp4 scales) onto dst[i]."""
        self._run(_kvsim.copy_blocks, T.int_array(src), T.int_array(dst))

    def partial_copy(self, src_block, dst_block, num_tokens):
        """TensorRT-LLM's partial block copy: the first num_tokens entries of every (layer, K/V, head)."""
        self._run(_kvsim.partial_copy, int(src_block), int(dst_block), int(num_tokens))

    def offload(self, primary, secondary):
        """Whole blocks primary[i] -> secondary[i] (data and nvfp4 scales), TensorRT-LLM's offload to host."""
        self._run(_kvsim.offload, T.int_array(primary), T.int_array(secondary))

    def onboard(self, primary, secondary):
        """Whole blocks secondary[i] -> primary[i], TensorRT-LLM's onboard (the reverse of offload)."""
        self._run(_kvsim.onboard, T.int_array(primary), T.int_array(secondary))


def _listed(tensors):
    return list(tensors) if isinstance(tensors, (tuple, list)) else [tensors]


class LatentPool(Pools):
    """DeepSeek MLA's latent cache as a kvsim pool (kv_factor 1, one head), used in place.

    ``kv_cache`` one tensor [blocks, page_size, d_ckv + d_kpe] per layer (vLLM's
    MLA kv_cache; FlashInfer's ckv and kpe caches side by side), any strides.
    ``cache_dtype`` names what a uint8 tensor holds (fp8_e4m3, fp8_e5m2,
    nvfp4). nvfp4 (kvsim's mix, contract §5.4): ``kv_cache`` is packed bytes
    [blocks, page_size, (d_ckv + 2 d_kpe) / 2], nvfp4 ckv nibbles then the
    e4m3 kpe bytes, ``scale_cache`` the block scales [blocks, page_size,
    (d_ckv + 2 d_kpe) / 16]. ``secondary``: a second such tensor for
    offload / onboard.
    """

    def __init__(self, kv_cache, *, cache_dtype=None, scale_cache=None, secondary=None, secondary_scale_cache=None):
        self.engine = "mla"
        self.tensors = [kv_cache]
        self.scale_tensors = [] if scale_cache is None else [scale_cache]
        self.secondary = None if secondary is None else (
            [secondary], [] if secondary_scale_cache is None else [secondary_scale_cache])
        self._args = (cache_dtype_of(kv_cache, cache_dtype), "nhd", 1, 1, 0, 0)
        self.geometry = Geometry(**self._bind().pools.geometry)

    def append_mla(self, ckv, kpe, batch_indices, positions, indptr, indices, last_page_len, *, ckv_global_scale=1.0,
                   kpe_scale=1.0):
        """FlashInfer's append_paged_mla_kv_cache on this pool (contract §5.4): ckv [nnz, d_ckv], kpe [nnz, d_kpe],
        FlashInfer's CSR coordinates (the table already includes the new tokens). Bytes are copied when the input
        dtype is the cache's; an nvfp4 pool quantizes ckv with ``ckv_global_scale`` and stores kpe as e4m3 (fp32/
        fp16/bf16 kpe encoded as x / ``kpe_scale``)."""
        staged = T.Staged()
        c, k = staged.host(ckv), staged.host(kpe)
        self._run(_kvsim.append_mla, 0, T.as_dlpack(c), T.as_dlpack(k), T.int_array(batch_indices),
                  T.int_array(positions), T.int_array(indptr), T.int_array(indices), T.int_array(last_page_len),
                  T.float8_dtype(c) or "", T.float8_dtype(k) or "", float(ckv_global_scale), float(kpe_scale))

    def mla_attention(self, q, seq_lens, block_table, *, d_ckv, q_indptr=None, sm_scale=1.0, scale=1.0,
                      ckv_global_scale=1.0, kpe_scale=1.0, out=None):
        """Absorbed MLA attention, kvsim's canonical order (core/ops/mla_attention.hpp); returns out [rows, Hq, d_ckv].

        ``q`` [rows, Hq, d_ckv + d_kpe] (q_nope · W_UK | q_pe), fp32/fp16/bf16; ``block_table`` [batch, max_blocks]
        (−1 padded), ``seq_lens`` [batch] (the query tokens included). ``q_indptr`` None: decode, one row per
        sequence at seq_len - 1; else causal prefill chunks, rows [q_indptr[b], q_indptr[b+1]) ending at seq_len - 1.
        ``scale`` the fp8/int8 latent's per-tensor scale (folded into the score and the output)."""
        from . import _attention
        table = T.int_array(block_table)
        if table.ndim != 2:
            from .errors import ShapeMismatch
            raise ShapeMismatch(f"shape_mismatch: block_table has shape {table.shape}, expected [batch, max_blocks]")
        d_kpe = int(q.shape[-1]) - int(d_ckv)
        result = _attention.empty(q, (int(q.shape[0]), int(q.shape[1]), int(d_ckv))) if out is None else out
        staged = T.Staged()
        qh, oh = staged.host(q), staged.host(result, written=True)
        self._run(_kvsim.mla_attention, 0, T.as_dlpack(qh), T.as_dlpack(oh),
                  None if q_indptr is None else T.int_array(q_indptr), T.int_array(seq_lens), table.reshape(-1),
                  int(table.shape[1]), int(d_ckv), d_kpe, float(sm_scale), _attention.scale_value(scale),
                  float(ckv_global_scale), float(kpe_scale))
        staged.finish()
        return result
