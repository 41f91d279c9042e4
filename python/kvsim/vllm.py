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
                           k_scale=1.0, v_scale=1.0, out=None, return_lse=False):
    """Decode attention over vLLM's split-x cache (``paged_attention_v1``'s arguments), kvsim's canonical arithmetic.

    ``query`` [num_seqs, num_heads, D]; ``block_tables`` [num_seqs,
    max_blocks] (−1 padded); ``seq_lens`` [num_seqs] (the query token
    included). Returns ``out`` [num_seqs, num_heads, D] in the query's dtype;
    with ``return_lse`` ``(out, lse)``, lse [num_seqs, num_heads] float32,
    natural log (vLLM's convention: ``merge_attn_states`` and FlashAttention's
    softmax_lse are base e), the oracle's M + log_f32(L). kvsim's order
    (docs/canonical-arithmetic.md) is not vLLM's, so compare a kernel's
    output with kvsim.testing.attention_report, not bytes.
    """
    from . import _attention
    kshape = tuple(key_cache.shape)
    if len(kshape) != 5:
        from .errors import ShapeMismatch
        raise ShapeMismatch(f"shape_mismatch: key_cache has shape {kshape}, expected [num_blocks, H, D/x, block_size, x]")
    dtype = _cache_dtype(kv_cache_dtype, key_cache)
    bound = Bound("vllm-paged", [key_cache, value_cache], dtype, "nhd", 1, kshape[1], kshape[3],
                  tuple(value_cache.shape)[2])
    lse = _attention.empty_lse(query, int(query.shape[0]), int(query.shape[1])) if return_lse else None
    out, lse = _attention.run(bound, query, seq_lens=seq_lens, block_table=block_tables, sm_scale=scale,
                              k_scale=k_scale, v_scale=v_scale, out=out, lse=lse)
    return (out, lse) if return_lse else out


def flash_attn_varlen_func(q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, cu_seqlens_k=None, seqused_k=None,
                           q_v=None, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
                           block_table=None, return_softmax_lse=False, out=None, *, kv_cache_dtype="auto",
                           q_descale=None, k_descale=None, v_descale=None, **kwargs):
    """kvsim's oracle for vLLM's ``vllm.vllm_flash_attn.flash_attn_varlen_func`` over the paged cache (causal).

    The paged form vLLM's FlashAttention backend calls
    (vllm/v1/attention/backends/flash_attn.py): ``q`` [total_q, num_heads,
    D], ``k``/``v`` the key_cache/value_cache [num_blocks, block_size,
    num_kv_heads, D] (the ``unbind(0)`` halves of kv_cache), ``cu_seqlens_q``
    [batch + 1], ``seqused_k`` [batch] the KV lengths (the new tokens
    already written), ``block_table`` [batch, max_blocks]. Query i of
    request b sits at position seqused_k[b] - qo_len + i (bottom-right
    causal). ``softmax_scale`` defaults to 1 / sqrt(D); ``k_descale`` and
    ``v_descale`` are the fp8 cache's per-tensor scales (one value);
    ``window_size=(left, -1)`` attends the last left + 1 positions. Returns
    ``out``, or with ``return_softmax_lse`` ``(out, softmax_lse)``,
    softmax_lse [num_heads, total_q] float32, natural log (FlashAttention's
    layout; kvsim writes it through the transposed view).

    Not modelled (kvsim.errors.BadArgument): non-causal attention with more
    than one query per request, softcap, ALiBi, dropout, q_v, a right window,
    an unpaged k/v (block_table None).
    """
    import math
    from . import _attention
    from .errors import BadArgument, ShapeMismatch
    if block_table is None or seqused_k is None:
        raise BadArgument("bad_argument: kvsim models the paged form: give block_table and seqused_k")
    for name, value in (("softcap", softcap), ("alibi_slopes", alibi_slopes), ("dropout_p", dropout_p),
                        ("q_v", q_v), ("return_attn_probs", return_attn_probs)):
        if value not in (None, 0, 0.0, False):
            raise BadArgument(f"bad_argument: {name}={value!r} is not modelled by kvsim")
    left, right = window_size
    if right not in (-1, 0):
        raise BadArgument(f"bad_argument: window_size right = {right}: only causal windows are modelled")
    qo = T.int_array(cu_seqlens_q)
    if not causal and len(qo) > 1 and int((qo[1:] - qo[:-1]).max()) > 1:
        raise BadArgument("bad_argument: causal=False with more than one query per request: kvsim's prefill "
                          "attention is causal")
    shape = tuple(k.shape)
    if len(shape) != 4:
        raise ShapeMismatch(f"shape_mismatch: k has shape {shape}, expected [num_blocks, block_size, H, D]")
    dtype = _cache_dtype(kv_cache_dtype, k)
    bound = Bound("flashinfer-tuple", [k, v], dtype, "nhd", 1, shape[2], shape[1], shape[3])
    scale = 1.0 / math.sqrt(shape[3]) if softmax_scale is None else float(softmax_scale)
    scale *= _attention.scale_value(q_descale)
    lse = None
    if return_softmax_lse:
        lse = _attention.empty_lse(q, int(q.shape[0]), int(q.shape[1]), heads_major=True)
    out, _ = _attention.run(bound, q, seq_lens=seqused_k, block_table=block_table, q_indptr=qo, sm_scale=scale,
                            k_scale=k_descale, v_scale=v_descale, window=0 if left < 0 else left + 1, out=out,
                            lse=None if lse is None else _attention.transposed(lse))
    return (out, lse) if return_softmax_lse else out


def concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype="auto", scale=1.0):
    """kvsim's oracle for vLLM's ``concat_and_cache_mla`` (``torch.ops._C_cache_ops``), in place.

    Semantics of csrc/cache_kernels.cu (``concat_and_cache_mla_kernel``):
    ``kv_c`` [num_tokens, kv_lora_rank], ``k_pe`` [num_tokens, pe_dim] (any
    row strides), ``kv_cache`` [num_blocks, block_size, kv_lora_rank +
    pe_dim]; token i's row [kv_c | k_pe] goes to slot ``slot_mapping[i]`` =
    block * block_size + entry, a negative slot is skipped, and the token
    count is slot_mapping's length (later rows of kv_c are CUDA-graph
    padding, as in vLLM V1). ``kv_cache_dtype`` "auto" copies the bytes (cache
    dtype = input dtype); "fp8" / "fp8_e4m3" / "fp8_e5m2" store
    e4m3/e5m2-satfinite(x / scale) (vLLM's scaled_convert), ``scale`` a float
    or a one-element tensor. Runs as kvsim's append_mla (contract §5.4). A
    slot past the cache raises kvsim.errors.SlotBeyondPool, two tokens on one
    slot BadArgument (vLLM's kernel writes both, in no defined order), the
    cache unchanged.
    """
    from .errors import ShapeMismatch
    from .pools import LatentPool
    if len(tuple(kv_cache.shape)) != 3:
        raise ShapeMismatch(f"shape_mismatch: kv_cache has shape {tuple(kv_cache.shape)}, expected [num_blocks, "
                            "block_size, kv_lora_rank + pe_dim]")
    if int(kv_cache.shape[2]) != int(kv_c.shape[-1]) + int(k_pe.shape[-1]):
        raise ShapeMismatch(f"shape_mismatch: kv_cache rows of {int(kv_cache.shape[2])} but kv_c {tuple(kv_c.shape)} "
                            f"and k_pe {tuple(k_pe.shape)}: rule: kv_cache.size(2) == kv_lora_rank + pe_dim")
    pool = LatentPool(kv_cache, cache_dtype=_cache_dtype(kv_cache_dtype, kv_cache))
    staged = T.Staged()
    c, k = staged.host(kv_c), staged.host(k_pe)
    pool._run(_kvsim.concat_and_cache_mla, T.as_dlpack(c), T.as_dlpack(k), T.int_array(slot_mapping, dtype="int64"),
              T.float8_dtype(c) or "", _scale(scale))
