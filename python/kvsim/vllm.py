"""vLLM-shaped functions over kvsim's oracle.

Semantics from vLLM's public source: ``csrc/cache_kernels.cu``
(``reshape_and_cache_flash_kernel``, ``reshape_and_cache_kernel``: token i
goes to slot ``slot_mapping[i]`` = block * block_size + offset, a negative
slot is skipped; fp8 caches store ``fp8(x / scale)`` through
``scaled_convert``) and the cache shapes of
``vllm/v1/attention/backends/flash_attn.py``
(``FlashAttentionBackend.get_kv_cache_shape``: kv_cache [2, num_blocks,
block_size, num_kv_heads, head_size], key_cache, value_cache =
kv_cache.unbind(0)) and ``vllm/attention/ops/paged_attn.py``
(``PagedAttention.split_kv_cache``: key_cache [num_blocks, num_kv_heads,
head_size / x, block_size, x], value_cache [num_blocks, num_kv_heads,
head_size, block_size], x = 16 / element size).
"""

from . import _kvsim
from . import _tensors as T
from ._pools import Bound, cache_dtype_of
from .errors import BadArgument

_KV_CACHE_DTYPES = {"fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}


def _cache_dtype(kv_cache_dtype, key_cache):
    if kv_cache_dtype == "auto":
        return cache_dtype_of(key_cache)
    if kv_cache_dtype not in _KV_CACHE_DTYPES:
        raise BadArgument(f"bad_argument: kv_cache_dtype {kv_cache_dtype!r}: expected 'auto', 'fp8', 'fp8_e4m3' "
                          "or 'fp8_e5m2'")
    return _KV_CACHE_DTYPES[kv_cache_dtype]


def _scale(x):
    return float(x.item()) if hasattr(x, "item") else float(x)


def _write(engine, key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale, heads,
           page, head_dim):
    dtype = _cache_dtype(kv_cache_dtype, key_cache)
    bound = Bound(engine, [key_cache, value_cache], dtype, "nhd", 1, heads, page, head_dim)
    staged = T.Staged()
    k = staged.host(key)
    v = staged.host(value)
    _kvsim.reshape_and_cache(bound.pools, 0, T.as_dlpack(k), T.as_dlpack(v), T.int_array(slot_mapping, dtype="int64"),
                             T.float8_dtype(k) or "", _scale(k_scale), _scale(v_scale))
    bound.finish()


def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype="auto", k_scale=1.0,
                            v_scale=1.0):
    """kvsim's oracle for vLLM's ``reshape_and_cache_flash`` (``torch.ops._C_cache_ops``), in place.

    ``key``/``value`` [num_tokens, H, D]; ``key_cache``/``value_cache``
    [num_blocks, block_size, H, D] (the two ``unbind(0)`` views of vllm-flash's
    kv_cache, or any two such tensors); ``slot_mapping`` [num_tokens], −1
    skips a token; ``kv_cache_dtype`` "auto" (cache dtype = input dtype, bytes
    copied) or "fp8" / "fp8_e4m3" / "fp8_e5m2" (uint8 or float8 caches, code =
    e4m3/e5m2 saturating of x / k_scale); ``k_scale``/``v_scale`` floats or
    one-element tensors. A slot past the cache raises
    kvsim.errors.SlotBeyondPool, a shape mismatch ShapeMismatch, caches
    unchanged.
    """
    shape = tuple(key_cache.shape)
    if len(shape) != 4:
        from .errors import ShapeMismatch
        raise ShapeMismatch(f"shape_mismatch: key_cache has shape {shape}, expected [num_blocks, block_size, H, D]")
    _write("flashinfer-tuple", key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale,
           shape[2], shape[1], shape[3])


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype="auto", k_scale=1.0,
                      v_scale=1.0):
    """kvsim's oracle for vLLM's ``reshape_and_cache`` (the split-x paged-attention cache), in place.

    ``key_cache`` [num_blocks, H, D / x, block_size, x] and ``value_cache``
    [num_blocks, H, D, block_size] (vllm-paged preset), x = 16 bytes / element
    size; other arguments as :func:`reshape_and_cache_flash`.
    """
    kshape, vshape = tuple(key_cache.shape), tuple(value_cache.shape)
    if len(kshape) != 5 or len(vshape) != 4:
        from .errors import ShapeMismatch
        raise ShapeMismatch(f"shape_mismatch: key_cache {kshape} / value_cache {vshape}, expected "
                            "[num_blocks, H, D/x, block_size, x] and [num_blocks, H, D, block_size]")
    _write("vllm-paged", key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale,
           kshape[1], kshape[3], vshape[2])


def paged_attention_decode(query, key_cache, value_cache, block_tables, seq_lens, scale, kv_cache_dtype="auto",
                           k_scale=1.0, v_scale=1.0, out=None):
    """Decode attention over vLLM's split-x cache (``paged_attention_v1``'s arguments), kvsim's canonical arithmetic.

    ``query`` [num_seqs, num_heads, D]; ``block_tables`` [num_seqs,
    max_blocks] (−1 padded); ``seq_lens`` [num_seqs] (the query token
    included). Returns ``out`` [num_seqs, num_heads, D] in the query's dtype.
    kvsim's order (docs/canonical-arithmetic.md) is not vLLM's, so compare a
    kernel's output with kvsim.testing.attention_report, not bytes. The
    natural-log LSE is not returned (the oracle's ops do not expose it yet).
    """
    kshape = tuple(key_cache.shape)
    dtype = _cache_dtype(kv_cache_dtype, key_cache)
    bound = Bound("vllm-paged", [key_cache, value_cache], dtype, "nhd", 1, kshape[1], kshape[3],
                  tuple(value_cache.shape)[2])
    staged = T.Staged()
    q = staged.host(query)
    result = T.empty_like(q) if out is None else out
    o = staged.host(result, written=True)
    table = T.int_array(block_tables)
    _kvsim.decode_attention(bound.pools, 0, T.as_dlpack(q), T.as_dlpack(o), T.int_array(seq_lens), table.reshape(-1),
                            int(table.shape[1]), float(scale), _scale(k_scale), _scale(v_scale), 1.0, 1.0, 0, 0)
    staged.finish()
    bound.finish()
    return result
