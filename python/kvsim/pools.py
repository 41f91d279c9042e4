"""kvsim's own API over an engine's cache tensors: ``Pools`` and its ``Geometry``.

``Pools(engine, tensors, ...)`` binds the engine's tensors (the presets of
core/include/kvsim/core/engine_presets.hpp, ``kvsim.engines()``) as kvsim's
primary pool, in place, and runs the contract's read and copy ops on them on
the CPU oracle: ``gather`` (contract §5.9, the read side), ``copy_blocks``
(vLLM's copy_blocks) and ``partial_copy`` (TensorRT-LLM's
cuKVCacheBlockPartialCopy). Each op validates before it moves a byte; a
raised kvsim.Error leaves the tensors unchanged. CUDA tensors are staged
through the host per op (docs/python.md).
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


class Pools:
    """An engine's cache tensors as one kvsim pool (used in place).

    ``engine`` a preset name (``kvsim.engines()``: vllm-flash, vllm-paged,
    flashinfer, flashinfer-tuple, trtllm, sglang, ...), ``tensors`` the
    engine's tensor(s) for one layer (per-layer engines) or all layers
    (trtllm, vllm-flash-cross-layer; give ``layers``), ``kv_heads``,
    ``page_size``, ``head_dim`` (elements; nvfp4 tensors hold D / 2 bytes),
    ``cache_dtype`` for uint8 tensors, ``kv_layout`` NHD/HND where the
    engine has both, ``scale_tensors`` nvfp4 block scales.
    """

    def __init__(self, engine, tensors, *, kv_heads, page_size, head_dim, layers=1, cache_dtype=None,
                 kv_layout="NHD", scale_tensors=()):
        self.engine = engine
        self.tensors = list(tensors) if isinstance(tensors, (tuple, list)) else [tensors]
        self.scale_tensors = list(scale_tensors)
        self._args = (cache_dtype_of(self.tensors[0], cache_dtype), kv_layout.lower(), layers, kv_heads, page_size,
                      head_dim)
        g = self._bind().pools.geometry  # validates the tensors now
        self.geometry = Geometry(**g)

    def _bind(self, tensors=None):
        return Bound(self.engine, tensors or self.tensors, *self._args, self.scale_tensors)

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
        host = [T.Staged().host(t) for t in self.tensors]
        bound = self._bind(list(T.stack_pair(*host)) if len(host) == 2 else host)
        _kvsim.gather(bound.pools, int(layer), int(kv), T.int_array(block_ids), int(num_tokens), out, float(scale),
                      float(global_scale))
        return out

    def copy_blocks(self, src, dst):
        """vLLM's copy_blocks: block src[i] copied whole (every layer, K and V, nvfp4 scales) onto dst[i]."""
        self._run(_kvsim.copy_blocks, T.int_array(src), T.int_array(dst))

    def partial_copy(self, src_block, dst_block, num_tokens):
        """TensorRT-LLM's partial block copy: the first num_tokens entries of every (layer, K/V, head)."""
        self._run(_kvsim.partial_copy, int(src_block), int(dst_block), int(num_tokens))
