"""kvsim from Python: the exact KV-cache oracle inside an engine's own kernel tests.

* ``kvsim.flashinfer.append_paged_kv_cache``, ``kvsim.vllm.reshape_and_cache_flash``,
  ``kvsim.vllm.reshape_and_cache``, ``kvsim.trtllm.qkv_preprocess``: the
  engines' own signatures, kvsim's bytes.
* Attention with the LSE in each engine's convention:
  ``kvsim.flashinfer.BatchDecodeWithPagedKVCacheWrapper`` /
  ``BatchPrefillWithPagedKVCacheWrapper`` (base 2),
  ``kvsim.vllm.paged_attention_decode`` / ``flash_attn_varlen_func`` (natural log).
* ``kvsim.testing.assert_cache_equal``: byte equality with the first difference named.
* ``kvsim.explain(...)``, ``kvsim.engine_info(...)``, ``kvsim.engines()``,
  ``kvsim.codec``, ``kvsim.replay(path, outputs=...)``, ``kvsim.Error`` and its named subclasses.
* ``kvsim.Pools(engine, tensors, ...)``: an engine's cache tensors as kvsim's pool
  (``geometry``, ``gather``, ``copy_blocks``, ``partial_copy``, ``offload``/``onboard`` with a secondary pool);
  ``kvsim.LatentPool(kv_cache)``: DeepSeek MLA's latent cache (``append_mla``, ``mla_attention``).
* MLA engine shapes: ``kvsim.vllm.concat_and_cache_mla``, ``kvsim.flashinfer.append_paged_mla_kv_cache``,
  ``kvsim.flashinfer.BatchMLAPagedAttentionWrapper``.

See docs/python.md.
"""

from . import _kvsim
from . import codec, errors, flashinfer, testing, trtllm, vllm
from ._tensors import int_array as _ints
from .errors import Error
from .pools import Geometry, LatentPool, Pools

__all__ = ["Error", "codec", "errors", "flashinfer", "vllm", "trtllm", "testing", "explain", "engine_info", "engines", "replay", "Geometry", "LatentPool", "Pools"]

has_cuda = _kvsim.has_cuda


def engines():
    """Names of the engine tensor presets (core/engine_presets.hpp)."""
    return list(_kvsim.engines())


def engine_info(engine, *, cache_dtype="bf16", kv_layout="NHD", layers=1, kv_heads=8, page_size=16, head_dim=128,
                blocks=64):
    """The engine's tensors for a geometry: names, per layer or not, K/V, axes (name, extent, row-major stride)."""
    return _kvsim.engine_info(engine, cache_dtype, kv_layout.lower(), layers, kv_heads, page_size, head_dim, blocks)


def explain(*, token, block_table=None, indptr=None, indices=None, last_page_len=None, seq=0, layer=0, head=0,
            dim=0, engine="", cache_dtype="bf16", kv_layout="NHD", placement="in_block", layers=1, kv_heads=8,
            page_size=16, head_dim=128, blocks=64, window=0, sinks=0, layer_windows=None, null_block=None):
    """The index arithmetic of one element as data (what ``kvsim explain`` prints).

    Returns a dict: cache_token, logical_page, page_slot, entry, block, slot,
    tensors (per K/V: offset, byte_offset, the stride terms, and with an engine
    the engine tensor's name and the offset inside it), steps (key, title,
    lines) and text. Give a dense ``block_table`` of the sequence, or the CSR
    ``indptr``/``indices``/``last_page_len`` and ``seq``.

    Per-layer attention (``kvsim explain --layer-windows``): ``layer_windows``
    one window per layer (0 = full), ``layer``'s is used; ``null_block`` (vLLM's
    hybrid KV cache manager, whose null block is 0): the table is indexed by
    position and entries equal to it are released pages, listed in
    ``null_entries``; a token on one raises ``kvsim.errors.BadWindow``.
    """
    if block_table is None and indptr is None:
        raise errors.BadArgument("bad_argument: give block_table or indptr/indices/last_page_len")
    dense = [] if block_table is None else [int(x) for x in _ints(block_table).reshape(-1)]
    csr = ([], [], []) if indptr is None else tuple(list(map(int, _ints(x))) for x in (indptr, indices, last_page_len))
    return _kvsim.explain(engine, cache_dtype, kv_layout.lower(), placement, layers, kv_heads, page_size, head_dim,
                          blocks, dense, csr[0], csr[1], csr[2], seq, token, layer, head, dim, window, sinks,
                          [] if layer_windows is None else [int(w) for w in layer_windows],
                          None if null_block is None else int(null_block))


def replay(scenario, *, outputs=False):
    """Replay a scenario file on the CPU oracle: name, ok, content_hash, invariants, counters.

    With ``outputs=True`` also the run's outputs, exactly what ``kvsim run
    SCENARIO --dump DIR`` writes (docs/run.md): ``outputs`` is a list of
    ``{file, step, op, layer, dtype, shape, array}`` (every write and
    attention op's inputs, index tables and scales, the query rows and
    fp32 outputs of every attention op, the final pools as flat raw bytes,
    nvfp4 scale pools, indexer caches); ``dtype`` is the kvsim dtype (bf16
    arrays are uint16 bit patterns, fp8 codes uint8).
    """
    if not outputs:
        return _kvsim.replay(str(scenario), "")
    import json
    import os
    import tempfile
    import numpy as np
    with tempfile.TemporaryDirectory(prefix="kvsim-replay-") as folder:
        report = _kvsim.replay(str(scenario), folder)
        with open(os.path.join(folder, "manifest.json")) as f:
            entries = json.load(f)["files"]
        for e in entries:
            e["array"] = np.load(os.path.join(folder, e["file"]))
    report["outputs"] = entries
    return report
