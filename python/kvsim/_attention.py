"""Attention over an engine's cache on kvsim's oracle, with the LSE.

The engine-shaped functions (kvsim.flashinfer's wrappers, kvsim.vllm's
paged_attention_decode and flash_attn_varlen_func) bind the engine's cache
tensors as a pool (_pools.Bound), then call the oracle's decode_attention /
prefill_attention (core's canonical order, docs/canonical-arithmetic.md).
The LSE is the oracle's: core's attend_query (and the CPU fast paths, held to
it byte for byte) writes lse = M + log_f32(L) from the merge's global max M
and merged sum L, natural log; FlashInfer's base-2 convention is that value
times fp32 log2(e), rounded once (canon::lse_base2), done in C++ too.
"""

import numpy as np

from . import _kvsim
from . import _tensors as T
from .errors import BadArgument, ShapeMismatch


def scale_value(x, default=1.0):
    """A float from a float, a one-element tensor or None."""
    if x is None:
        return default
    if hasattr(x, "reshape"):
        flat = x.reshape(-1)
        if flat.shape[0] != 1:
            raise BadArgument(f"bad_argument: a scale of {flat.shape[0]} values: kvsim takes one per-tensor scale "
                              "(a float or a one-element tensor)")
        return float(flat[0])
    return float(x)


def empty_lse(q, rows, heads, heads_major=False):
    """A float32 LSE tensor on q's device: [rows, heads], or [heads, rows] (FlashAttention's softmax_lse)."""
    shape = (heads, rows) if heads_major else (rows, heads)
    if T.is_torch(q):
        return T.torch.empty(shape, dtype=T.torch.float32, device=q.device)
    return np.empty(shape, dtype=np.float32)


def empty(like, shape):
    """A zero tensor of ``shape`` in like's dtype, on like's device (numpy or torch)."""
    if T.is_torch(like):
        return T.torch.zeros(shape, dtype=like.dtype, device=like.device)
    return np.zeros(shape, dtype=like.dtype)


def transposed(x):
    return x.t() if T.is_torch(x) else x.T


def run(bound, q, *, seq_lens, block_table, q_indptr=None, sm_scale, k_scale=1.0, v_scale=1.0, k_global_scale=1.0,
        v_global_scale=1.0, window=0, out=None, lse=None, lse_base2=False):
    """Decode (q_indptr None: one query per sequence) or causal prefill; returns (out, lse or None).

    ``lse`` is None (not computed) or a float32 [rows, Hq] tensor (any
    strides) written in place. CUDA tensors run on kvsim's CUDA backend.
    """
    staged = T.Staged()
    qh = staged.host(q)
    result = T.empty_like(q) if out is None else out
    oh = staged.host(result, written=True)
    lh = None if lse is None else staged.host(lse, written=True)
    table = T.int_array(block_table)
    if table.ndim != 2:
        raise ShapeMismatch(f"shape_mismatch: block_table has shape {table.shape}, expected [batch, max_blocks]")
    args = (float(sm_scale), scale_value(k_scale), scale_value(v_scale), float(k_global_scale),
            float(v_global_scale), int(window), 0, None if lh is None else T.as_dlpack(lh), bool(lse_base2))
    if q_indptr is None:
        _kvsim.decode_attention(bound.pools, 0, T.as_dlpack(qh), T.as_dlpack(oh), T.int_array(seq_lens),
                                table.reshape(-1), int(table.shape[1]), *args)
    else:
        _kvsim.prefill_attention(bound.pools, 0, T.as_dlpack(qh), T.as_dlpack(oh), T.int_array(q_indptr),
                                 T.int_array(seq_lens), table.reshape(-1), int(table.shape[1]), *args)
    staged.finish()
    bound.finish()
    return result, lse
