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
    (CPU in place; CUDA through host copies written back).

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
