"""FlashInfer-shaped functions over kvsim's oracle.

Semantics from FlashInfer's public source: ``flashinfer/page.py``
(``append_paged_kv_cache``, ``get_batch_indices_positions``) and
``include/flashinfer/page.cuh`` (``AppendPagedKVCacheKernel``: token i of
request b goes to ``divmod(kv_indptr[b] * page_size + positions[i], page_size)``
-> (page slot, entry) -> ``kv_indices[page slot]``).
"""

from . import _kvsim
from . import _tensors as T
from ._pools import Bound, cache_dtype_of


def _cache_shape(paged_kv_cache, kv_layout):
    """(engine, tensors, kv_heads, page_size, head_dim) of FlashInfer's paged_kv_cache."""
    layout = kv_layout.upper()
    if layout not in ("NHD", "HND"):
        from .errors import BadArgument
        raise BadArgument(f"bad_argument: kv_layout {kv_layout!r}: expected 'NHD' or 'HND'")
    if isinstance(paged_kv_cache, (tuple, list)):
        k = paged_kv_cache[0]
        shape = tuple(k.shape)
        if len(shape) != 4:
            from .errors import ShapeMismatch
            raise ShapeMismatch(f"shape_mismatch: k_cache has shape {shape}, expected [pages, P, H, D] or [pages, H, P, D]")
        heads, page = (shape[2], shape[1]) if layout == "NHD" else (shape[1], shape[2])
        return "flashinfer-tuple", list(paged_kv_cache), heads, page, shape[3]
    shape = tuple(paged_kv_cache.shape)
    if len(shape) != 5:
        from .errors import ShapeMismatch
        raise ShapeMismatch(f"shape_mismatch: paged_kv_cache has shape {shape}, expected [pages, 2, P, H, D] "
                            "or [pages, 2, H, P, D] (or a (k_cache, v_cache) tuple)")
    heads, page = (shape[3], shape[2]) if layout == "NHD" else (shape[2], shape[3])
    return "flashinfer", [paged_kv_cache], heads, page, shape[4]


def append_paged_kv_cache(append_key, append_value, batch_indices, positions, paged_kv_cache, kv_indices,
                          kv_indptr, kv_last_page_len, kv_layout="NHD", *, cache_dtype=None, scale_cache=None,
                          k_global_scale=1.0, v_global_scale=1.0):
    """kvsim's oracle for ``flashinfer.page.append_paged_kv_cache``, in place.

    Same arguments as FlashInfer: ``append_key``/``append_value`` [nnz, H, D]
    (any strides: slices of a fused QKV are fine), ``batch_indices`` and
    ``positions`` [nnz], ``paged_kv_cache`` one [pages, 2, P, H, D] (NHD) /
    [pages, 2, H, P, D] (HND) tensor or a (k_cache, v_cache) tuple, the CSR
    table ``kv_indices``/``kv_indptr``/``kv_last_page_len`` that already
    includes the appended tokens. Tensors are numpy arrays or torch tensors
    (CPU in place; CUDA in place on kvsim's CUDA backend).

    kvsim extensions: ``cache_dtype`` names what a uint8 cache holds
    ("fp8_e4m3", "fp8_e5m2", "nvfp4"); for nvfp4 the cache is packed bytes
    (last axis D / 2), ``scale_cache`` the one-byte block scales (same form,
    last axis D / 16), and the fp32/fp16/bf16 input is quantized with
    ``k_global_scale``/``v_global_scale`` (contract §4).

    Where kvsim differs: an nvfp4 element that is NaN encodes as 0x7 (kvsim's
    e2m1 rule saturates NaN to +6); FlashInfer's nvfp4 append writes 0x0.
    Validation happens before any byte moves: a bad table, position or shape
    raises the kvsim.Error subclass named in docs/errors.md, caches unchanged.
    """
    engine, tensors, heads, page, head_dim = _cache_shape(paged_kv_cache, kv_layout)
    dtype = cache_dtype_of(tensors[0], cache_dtype)
    scales = []
    if scale_cache is not None:
        scales = list(scale_cache) if isinstance(scale_cache, (tuple, list)) else [scale_cache]
    if dtype == "nvfp4":
        head_dim *= 2  # packed bytes
    bound = Bound(engine, tensors, dtype, kv_layout.lower(), 1, heads, page, head_dim, scales)
    staged = T.Staged()
    k = staged.host(append_key)
    v = staged.host(append_value)
    kd = T.float8_dtype(k) or ""  # float8 inputs arrive as uint8 views
    _kvsim.append_paged(bound.pools, 0, T.as_dlpack(k), T.as_dlpack(v), T.int_array(batch_indices),
                        T.int_array(positions), T.int_array(kv_indptr), T.int_array(kv_indices),
                        T.int_array(kv_last_page_len), kd, float(k_global_scale), float(v_global_scale))
    bound.finish()


def get_batch_indices_positions(append_indptr, seq_lens, nnz):
    """``flashinfer.page.get_batch_indices_positions`` (numpy): positions[i] = i + len[b] - append_indptr[b+1]."""
    import numpy as np
    append_indptr = T.int_array(append_indptr)
    seq_lens = T.int_array(seq_lens)
    batch = np.zeros(nnz, dtype=np.int32)
    pos = np.zeros(nnz, dtype=np.int32)
    for b in range(len(seq_lens)):
        for i in range(append_indptr[b], append_indptr[b + 1]):
            batch[i] = b
            pos[i] = i + seq_lens[b] - append_indptr[b + 1]
    return batch, pos


# ---------------------------------------------------------------- attention wrappers
#
# FlashInfer's batch attention API (flashinfer/decode.py
# ``BatchDecodeWithPagedKVCacheWrapper``, flashinfer/prefill.py
# ``BatchPrefillWithPagedKVCacheWrapper``): plan() takes the CSR page table
# (kv_indptr, kv_indices, kv_last_page_len) and the head counts, run() the
# query and the cache and returns ``out`` or ``(out, lse)`` with
# ``return_lse=True``: lse [rows, num_qo_heads] float32, **base 2** (FlashInfer
# works in log2 space; vLLM's FlashInfer backend merges its states with
# ``is_lse_base_on_e=False``, vllm/v1/attention/backends/flashinfer.py).
# run()'s scales: sm_scale defaults to 1 / sqrt(head_dim), q_scale and k_scale
# multiply it, v_scale multiplies the output.

_UNMODELLED = ("pos_encoding_mode", "logits_soft_cap", "custom_mask", "packed_custom_mask")


def _check_modelled(**kw):
    """kvsim models plain softmax attention: RoPE inside the kernel, soft caps and custom masks are refused."""
    for name, value in kw.items():
        if value not in (None, "NONE", 0, 0.0, False):
            from .errors import BadArgument
            raise BadArgument(f"bad_argument: {name}={value!r} is not modelled by kvsim (plain softmax attention only)")


class _PagedAttentionWrapper:
    def __init__(self, float_workspace_buffer=None, kv_layout="NHD", use_cuda_graph=False, *args, **kwargs):
        if kv_layout.upper() not in ("NHD", "HND"):
            from .errors import BadArgument
            raise BadArgument(f"bad_argument: kv_layout {kv_layout!r}: expected 'NHD' or 'HND'")
        self._kv_layout = kv_layout.upper()
        self._plan = None

    def _set_plan(self, qo_indptr, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                  sm_scale, window_left):
        import math
        self._plan = dict(qo_indptr=None if qo_indptr is None else T.int_array(qo_indptr),
                          indptr=T.int_array(indptr), indices=T.int_array(indices),
                          last_page_len=T.int_array(last_page_len), num_qo_heads=int(num_qo_heads),
                          num_kv_heads=int(num_kv_heads), head_dim=int(head_dim), page_size=int(page_size),
                          sm_scale=1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale),
                          window=0 if window_left is None or window_left < 0 else int(window_left) + 1)

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False, cache_dtype=None, scale_cache=None, k_global_scale=1.0, v_global_scale=1.0, **kwargs):
        """FlashInfer's run(): ``out``, or ``(out, lse)`` with return_lse (lse [rows, num_qo_heads], base 2)."""
        from . import _attention
        from .errors import BadArgument, ShapeMismatch
        if self._plan is None:
            raise BadArgument("bad_argument: run() before plan()")
        p = self._plan
        engine, tensors, heads, page, head_dim = _cache_shape(paged_kv_cache, self._kv_layout)
        dtype = cache_dtype_of(tensors[0], cache_dtype)
        if dtype == "nvfp4":
            head_dim *= 2
        if (heads, page, head_dim) != (p["num_kv_heads"], p["page_size"], p["head_dim"]):
            raise ShapeMismatch(f"shape_mismatch: the cache has {heads} KV heads, page size {page}, head_dim "
                                f"{head_dim}; plan() said {p['num_kv_heads']}, {p['page_size']}, {p['head_dim']}")
        if tuple(q.shape)[1:] != (p["num_qo_heads"], p["head_dim"]):
            raise ShapeMismatch(f"shape_mismatch: q has shape {tuple(q.shape)}, expected [rows, "
                                f"{p['num_qo_heads']}, {p['head_dim']}] (plan())")
        scales = [] if scale_cache is None else (list(scale_cache) if isinstance(scale_cache, (tuple, list))
                                                 else [scale_cache])
        bound = Bound(engine, tensors, dtype, self._kv_layout.lower(), 1, heads, page, head_dim, scales)
        seq_lens, table = _kvsim.csr_to_dense(bound.pools, p["indptr"], p["indices"], p["last_page_len"])
        sm_scale = p["sm_scale"] * _attention.scale_value(q_scale)
        if return_lse and lse is None:
            lse = _attention.empty_lse(q, int(q.shape[0]), int(q.shape[1]))
        out, lse = _attention.run(bound, q, seq_lens=seq_lens, block_table=table, q_indptr=p["qo_indptr"],
                                  sm_scale=sm_scale, k_scale=k_scale, v_scale=v_scale,
                                  k_global_scale=k_global_scale, v_global_scale=v_global_scale, window=p["window"],
                                  out=out, lse=lse if return_lse else None, lse_base2=True)
        return (out, lse) if return_lse else out

    def run_return_lse(self, q, paged_kv_cache, *args, **kwargs):
        kwargs["return_lse"] = True
        return self.run(q, paged_kv_cache, *args, **kwargs)


class BatchDecodeWithPagedKVCacheWrapper(_PagedAttentionWrapper):
    """kvsim's oracle in the shape of ``flashinfer.BatchDecodeWithPagedKVCacheWrapper``.

    ``plan(indptr, indices, last_page_len, num_qo_heads, num_kv_heads,
    head_dim, page_size, pos_encoding_mode="NONE", window_left=-1,
    logits_soft_cap=None, q_data_type=..., kv_data_type=..., sm_scale=None)``
    then ``run(q, paged_kv_cache, *, q_scale, k_scale, v_scale, out, lse,
    return_lse=False)``: q [batch, num_qo_heads, head_dim], one query per
    request at position kv_len - 1 (its K/V already appended);
    ``paged_kv_cache`` a [pages, 2, ...] tensor or (k_cache, v_cache) as in
    :func:`append_paged_kv_cache`. Returns out [batch, num_qo_heads,
    head_dim] in q's dtype, with ``return_lse`` also lse [batch,
    num_qo_heads] float32 in **base 2**.

    The arithmetic is kvsim's canonical order (docs/canonical-arithmetic.md),
    not FlashInfer's, so compare a kernel's output with
    kvsim.testing.attention_report; the LSE is the oracle's: lse2 =
    fl(fl(M + log_f32(L)) * fl(log2 e)) with M the max of the scaled scores
    and L the merged sum (docs/python.md). Differences from FlashInfer:
    kvsim folds k_scale into the fp32 score scale (sm_scale * k_scale rounded
    to fp32) and applies v_scale before the output is rounded (FlashInfer
    multiplies the rounded output); window_left = w attends the last w + 1
    positions; RoPE in the kernel, logits soft-capping and custom masks are
    refused (kvsim.errors.BadArgument).
    """

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
             pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type=None, kv_data_type=None,
             data_type=None, sm_scale=None, rope_scale=None, rope_theta=None, **kwargs):
        _check_modelled(pos_encoding_mode=pos_encoding_mode, logits_soft_cap=logits_soft_cap)
        self._set_plan(None, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                       sm_scale, window_left)


class BatchPrefillWithPagedKVCacheWrapper(_PagedAttentionWrapper):
    """kvsim's oracle in the shape of ``flashinfer.BatchPrefillWithPagedKVCacheWrapper`` (causal).

    ``plan(qo_indptr, paged_kv_indptr, paged_kv_indices,
    paged_kv_last_page_len, num_qo_heads, num_kv_heads, head_dim_qk,
    page_size, head_dim_vo=None, custom_mask=None, packed_custom_mask=None,
    causal=False, pos_encoding_mode="NONE", ..., sm_scale=None,
    window_left=-1, logits_soft_cap=None, ...)`` then ``run(q,
    paged_kv_cache, ...)`` as the decode wrapper: q [qo_indptr[-1],
    num_qo_heads, head_dim]; the KV lengths come from the CSR table (the new
    tokens already appended) and query i of request b sits at position kv_len
    - qo_len + i (FlashInfer's bottom-right causal alignment); lse
    [qo_indptr[-1], num_qo_heads] base 2. kvsim's prefill is causal:
    ``causal=False`` is refused unless every request has at most one query
    (where both masks agree).
    """

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
             num_kv_heads, head_dim_qk, page_size, head_dim_vo=None, custom_mask=None, packed_custom_mask=None,
             causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False, sm_scale=None, window_left=-1,
             logits_soft_cap=None, rope_scale=None, rope_theta=None, q_data_type=None, kv_data_type=None, **kwargs):
        from .errors import BadArgument
        _check_modelled(pos_encoding_mode=pos_encoding_mode, logits_soft_cap=logits_soft_cap,
                        custom_mask=custom_mask, packed_custom_mask=packed_custom_mask,
                        use_fp16_qk_reduction=use_fp16_qk_reduction)
        if head_dim_vo is not None and head_dim_vo != head_dim_qk:
            raise BadArgument("bad_argument: head_dim_vo != head_dim_qk is not modelled (kvsim's K and V share D)")
        qo = T.int_array(qo_indptr)
        if not causal and len(qo) > 1 and int((qo[1:] - qo[:-1]).max()) > 1:
            raise BadArgument("bad_argument: causal=False with more than one query per request: kvsim's prefill "
                              "attention is causal (FlashInfer's bottom-right alignment)")
        self._set_plan(qo, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads,
                       head_dim_qk, page_size, sm_scale, window_left)


# ---------------------------------------------------------------- MLA (DeepSeek latent cache)
#
# FlashInfer keeps the MLA cache as two tensors, ckv_cache [pages, page_size,
# ckv_dim] and kpe_cache [pages, page_size, kpe_dim] (flashinfer/page.py,
# append_paged_mla_kv_cache; flashinfer/mla.py, BatchMLAPagedAttentionWrapper.run).
# kvsim's latent pool is one [ckv | kpe] row per token (kvsim.LatentPool), so
# the two tensors are joined into one host copy, the op runs there, and the
# written bytes go back into both (validation first: a raised kvsim.Error
# leaves both caches unchanged).

def _joined_latent(ckv_cache, kpe_cache):
    """One host [pages, P, ckv_dim + kpe_dim] copy of FlashInfer's two MLA caches."""
    import numpy as np
    from .errors import ShapeMismatch
    cs, ks = tuple(ckv_cache.shape), tuple(kpe_cache.shape)
    if len(cs) != 3 or len(ks) != 3 or cs[:2] != ks[:2]:
        raise ShapeMismatch(f"shape_mismatch: ckv_cache {cs} and kpe_cache {ks}: expected [pages, page_size, ckv_dim] "
                            "and [pages, page_size, kpe_dim]")
    if ckv_cache.dtype != kpe_cache.dtype:
        raise ShapeMismatch(f"shape_mismatch: ckv_cache is {ckv_cache.dtype} but kpe_cache {kpe_cache.dtype}")
    dtype = T.float8_dtype(ckv_cache) or cache_dtype_of(ckv_cache)
    staged = T.Staged()
    c, k = T.as_dlpack(staged.host(ckv_cache)), T.as_dlpack(staged.host(kpe_cache))  # float8 as uint8 views
    joined = T.torch.cat([c, k], dim=-1) if T.is_torch(c) else np.concatenate([c, k], axis=-1)
    return joined, cs[2], dtype


def _write_back_latent(joined, d_ckv, ckv_cache, kpe_cache):
    T.copy_into(T.as_dlpack(ckv_cache), joined[..., :d_ckv])
    T.copy_into(T.as_dlpack(kpe_cache), joined[..., d_ckv:])


def append_paged_mla_kv_cache(append_ckv, append_kpe, batch_indices, positions, ckv_cache, kpe_cache, kv_indices,
                              kv_indptr, kv_last_page_len):
    """kvsim's oracle for ``flashinfer.page.append_paged_mla_kv_cache``, in place.

    Same arguments as FlashInfer: ``append_ckv`` [nnz, ckv_dim],
    ``append_kpe`` [nnz, kpe_dim], ``batch_indices``/``positions`` [nnz],
    ``ckv_cache`` [pages, page_size, ckv_dim], ``kpe_cache`` [pages,
    page_size, kpe_dim] and the CSR table that already includes the new
    tokens. The bytes are copied (the input dtype is the cache's: kvsim's
    append_mla, contract §5.4). Where kvsim differs: FlashInfer's kernel
    takes only ckv_dim 512 / kpe_dim 64 (its note); kvsim takes any widths,
    and it rejects (kvsim.Error, caches unchanged) what FlashInfer writes
    without a check: a position past the sequence, a page index past the
    cache, two tokens on one slot.
    """
    from .pools import LatentPool
    joined, d_ckv, dtype = _joined_latent(ckv_cache, kpe_cache)
    LatentPool(joined, cache_dtype=dtype).append_mla(append_ckv, append_kpe, batch_indices, positions, kv_indptr,
                                                     kv_indices, kv_last_page_len)
    _write_back_latent(joined, d_ckv, ckv_cache, kpe_cache)


class BatchMLAPagedAttentionWrapper:
    """kvsim's oracle in the shape of ``flashinfer.mla.BatchMLAPagedAttentionWrapper`` (absorbed MLA).

    ``plan(qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads,
    head_dim_ckv, head_dim_kpe, page_size, causal, sm_scale, q_data_type,
    kv_data_type, use_profiler=False)`` then ``run(q_nope, q_pe, ckv_cache,
    kpe_cache, out=None, lse=None, return_lse=False)``: q_nope [rows,
    num_heads, head_dim_ckv] (already times W_UK), q_pe [rows, num_heads,
    head_dim_kpe], the caches as in :func:`append_paged_mla_kv_cache`; the
    pages of request b are kv_indices[kv_indptr[b]:kv_indptr[b+1]], its KV
    length kv_len_arr[b] (the new tokens included), and query i of request b
    sits at position kv_len - qo_len + i. Returns out [rows, num_heads,
    head_dim_ckv] in q_nope's dtype (the latent space: W_UV is applied after).

    The arithmetic is kvsim's canonical MLA order (core/ops/mla_attention.hpp:
    the score is one dot product over the whole [ckv | kpe] row times
    sm_scale), not FlashInfer's, so compare a kernel's output with a ULP
    bound, not bytes. Not modelled (kvsim.errors.BadArgument): return_lse
    (kvsim's MLA op writes no LSE) and causal=False with more than one query
    per request.
    """

    def __init__(self, float_workspace_buffer=None, use_cuda_graph=False, qo_indptr=None, kv_indptr=None,
                 kv_indices=None, kv_len_arr=None, backend="auto"):
        self._plan = None

    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv, head_dim_kpe, page_size,
             causal, sm_scale, q_data_type=None, kv_data_type=None, use_profiler=False):
        import numpy as np
        from .errors import BadArgument
        qo, ip, ix = T.int_array(qo_indptr), T.int_array(kv_indptr), T.int_array(kv_indices)
        if not causal and len(qo) > 1 and int((qo[1:] - qo[:-1]).max()) > 1:
            raise BadArgument("bad_argument: causal=False with more than one query per request: kvsim's MLA "
                              "attention is causal")
        pages = [ix[ip[b]:ip[b + 1]] for b in range(len(ip) - 1)]
        table = np.full((len(pages), max([len(p) for p in pages] + [1])), -1, np.int32)
        for b, p in enumerate(pages):
            table[b, :len(p)] = p
        self._plan = dict(qo_indptr=qo, table=table, seq_lens=T.int_array(kv_len_arr), num_heads=int(num_heads),
                          d_ckv=int(head_dim_ckv), d_kpe=int(head_dim_kpe), page_size=int(page_size),
                          sm_scale=float(sm_scale))

    def run(self, q_nope, q_pe, ckv_cache, kpe_cache, out=None, lse=None, return_lse=False, profiler_buffer=None,
            kv_len=None, page_table=None, return_lse_base_on_e=False):
        """FlashInfer's run(): out [rows, num_heads, head_dim_ckv]."""
        from .errors import BadArgument, ShapeMismatch
        from .pools import LatentPool
        if self._plan is None:
            raise BadArgument("bad_argument: run() before plan()")
        if return_lse:
            raise BadArgument("bad_argument: return_lse=True: kvsim's MLA attention writes no LSE")
        p = self._plan
        rows = int(p["qo_indptr"][-1])
        want = ((rows, p["num_heads"], p["d_ckv"]), (rows, p["num_heads"], p["d_kpe"]))
        if (tuple(q_nope.shape), tuple(q_pe.shape)) != want:
            raise ShapeMismatch(f"shape_mismatch: q_nope {tuple(q_nope.shape)} and q_pe {tuple(q_pe.shape)}: plan() "
                                f"says {want[0]} and {want[1]}")
        joined, d_ckv, dtype = _joined_latent(ckv_cache, kpe_cache)
        if (d_ckv, int(joined.shape[-1]) - d_ckv, int(joined.shape[1])) != (p["d_ckv"], p["d_kpe"], p["page_size"]):
            raise ShapeMismatch(f"shape_mismatch: the caches hold ckv_dim {d_ckv}, kpe_dim "
                                f"{int(joined.shape[-1]) - d_ckv}, page_size {int(joined.shape[1])}; plan() said "
                                f"{p['d_ckv']}, {p['d_kpe']}, {p['page_size']}")
        staged = T.Staged()
        qn, qp = staged.host(q_nope), staged.host(q_pe)
        q = T.torch.cat([qn, qp], dim=-1) if T.is_torch(qn) else __import__("numpy").concatenate([qn, qp], axis=-1)
        result = LatentPool(joined, cache_dtype=dtype).mla_attention(
            q, p["seq_lens"], p["table"], d_ckv=d_ckv, q_indptr=p["qo_indptr"], sm_scale=p["sm_scale"])
        if out is None:
            return result.to(q_nope.device) if T.is_torch(q_nope) else result
        T.copy_into(out, result)
        return out
