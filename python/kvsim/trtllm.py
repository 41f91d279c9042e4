"""TensorRT-LLM-shaped functions over kvsim's oracle.

Semantics from TensorRT-LLM's public source:
``cpp/tensorrt_llm/kernels/unfusedAttentionKernels.h``
(``QKVPreprocessingParams``: qkv_input, q_output, qkv_bias, seq_lens,
cache_seq_lens, kvScaleOrigQuant, rotary_embedding_dim,
rotary_embedding_base, cyclic_kv_cache_len, sink_token_len,
position_embedding_type, generation_phase) and
``unfusedAttentionKernels_2_template.h`` (``applyBiasRopeUpdateKVCache``:
bias added in fp32, RoPE on Q and K, K/V quantized with the encode scale
kvScaleOrigQuant into the paged pool; ``zeroPagedVCacheTail`` for the V rows a
whole-page reader meets), and the pool of
``cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp``: one primary pool
``[blocks][layers][2][kv_heads][tokens_per_block][head_dim]`` (kvsim's
``trtllm`` preset). kvsim's rules are contract §5.3
(core/include/kvsim/core/ops/qkv_preprocess.hpp).
"""

from . import _kvsim
from . import _tensors as T
from ._pools import Bound, cache_dtype_of
from .errors import BadArgument, ShapeMismatch

_ROPE = {"none": "none", "rope_gpt_neox": "neox", "neox": "neox", "rope_gptj": "gptj", "gptj": "gptj"}


def qkv_preprocess(qkv_input, q_output, kv_cache_pool, *, layer, seq_lens, cache_seq_lens, block_table, head_num,
                   qkv_bias=None, position_embedding_type="none", rotary_embedding_dim=0,
                   rotary_embedding_base=10000.0, rotary_embedding_max_positions=None, position_offsets=None,
                   kv_scale_orig_quant=1.0, cyclic_kv_cache_len=0, sink_token_len=0, generation_phase=False,
                   zero_v_tail=True, cache_dtype=None, scale_pool=None, k_global_scale=1.0, v_global_scale=1.0):
    """kvsim's oracle for TensorRT-LLM's ``invokeQKVPreprocessing`` (context or generation step), in place.

    ``qkv_input`` [num_tokens, (head_num + 2 kv_head_num) * size_per_head]
    (remove_padding: sequence b's new tokens packed after those of b - 1),
    ``q_output`` [num_tokens, head_num, size_per_head] (Q after bias and
    RoPE), ``kv_cache_pool`` the primary pool [blocks, layers, 2, kv_head_num,
    tokens_per_block, size_per_head] (uint8 for fp8/int8 codes or nvfp4
    packed bytes, with ``cache_dtype``), ``seq_lens`` the new tokens per
    sequence, ``cache_seq_lens`` the tokens per sequence after this step,
    ``block_table`` [batch, max_blocks] the KV cache manager's block ids of
    each sequence (-1 padded; TensorRT-LLM's kernels take them as
    kv_cache_block_offsets, one pool offset per K and V: kvsim takes the ids
    and computes the offsets with the ``trtllm`` preset's strides).
    ``position_embedding_type`` "none", "rope_gpt_neox" or "rope_gptj" with
    ``rotary_embedding_dim`` and ``rotary_embedding_base`` (the cos/sin table
    is core's build_rope_table: fp32 of double cos/sin of position *
    base^(-2i/dim)); ``position_offsets`` shifts the rotary position (the
    speculative-decoding offsets). ``kv_scale_orig_quant``: the fp8/int8
    encode scale (TensorRT-LLM's kvScaleOrigQuant, one for K and V; a pair
    (k, v) is kvsim's extension). ``cyclic_kv_cache_len`` /
    ``sink_token_len``: the sliding-window ring. With ``zero_v_tail`` a
    context step zeroes the V rows past the sequence in its last block.

    Where kvsim differs: kvsim zeroes the V tail for every cache dtype
    (TensorRT-LLM only when the cache dtype equals the input dtype), and its
    nvfp4 NaN rule is e2m1 0x7. Bad input raises the named kvsim.Error
    (docs/errors.md) with the pool unchanged.
    """
    shape = tuple(kv_cache_pool.shape)
    if len(shape) != 6 or shape[2] != 2:
        raise ShapeMismatch(f"shape_mismatch: kv_cache_pool has shape {shape}, expected [blocks, layers, 2, "
                            "kv_heads, tokens_per_block, head_dim]")
    dtype = cache_dtype_of(kv_cache_pool, cache_dtype)
    head_dim = shape[5] * 2 if dtype == "nvfp4" else shape[5]
    rope = _ROPE.get(str(position_embedding_type).lower())
    if rope is None:
        raise BadArgument(f"bad_argument: position_embedding_type {position_embedding_type!r}: expected 'none', "
                          "'rope_gpt_neox' or 'rope_gptj'")
    scales = [] if scale_pool is None else [scale_pool]
    bound = Bound("trtllm", [kv_cache_pool], dtype, "hnd", shape[1], shape[3], shape[4], head_dim, scales)
    table = T.int_array(block_table)
    if table.ndim != 2:
        raise ShapeMismatch(f"shape_mismatch: block_table has shape {table.shape}, expected [batch, max_blocks]")
    cache_lens = T.int_array(cache_seq_lens)
    if rotary_embedding_max_positions is None:
        rotary_embedding_max_positions = max(1, int(cache_lens.max(initial=0)) +
                                             (0 if position_offsets is None else int(T.int_array(position_offsets).max(initial=0))))
    k_scale, v_scale = (kv_scale_orig_quant if isinstance(kv_scale_orig_quant, (tuple, list))
                        else (kv_scale_orig_quant, kv_scale_orig_quant))
    staged = T.Staged()
    x = staged.host(qkv_input)
    q = staged.host(q_output, written=True)
    b = staged.host(qkv_bias)
    _kvsim.qkv_preprocess(bound.pools, int(layer), int(head_num), T.as_dlpack(x), None if b is None else T.as_dlpack(b),
                          T.as_dlpack(q), rope, int(rotary_embedding_dim), float(rotary_embedding_base),
                          int(rotary_embedding_max_positions), T.int_array(seq_lens), cache_lens,
                          None if position_offsets is None else T.int_array(position_offsets), table.reshape(-1),
                          int(table.shape[1]), int(cyclic_kv_cache_len), int(sink_token_len), not generation_phase,
                          bool(zero_v_tail), float(k_scale), float(v_scale), float(k_global_scale),
                          float(v_global_scale))
    staged.finish()
    bound.finish()


def _bytes_view(x):
    """The same memory as uint8, the last axis in bytes (a [T, 1] int32/float32 scale becomes [T, 4])."""
    if T.is_torch(x):
        return x.view(T.torch.uint8) if x.element_size() != 1 or x.dtype != T.torch.uint8 else x
    import numpy as np
    return x.view(np.uint8)


def indexer_k_cache_scatter_op(k_fp8, k_scale, k_cache, slot_mapping_fp8, slot_mapping_scale, num_tokens=None):
    """kvsim's oracle for TensorRT-LLM's ``torch.ops.trtllm.indexer_k_cache_scatter_op`` (DeepSeek's indexer K cache), in place.

    ``k_fp8`` [T, head_dim] fp8 bytes (float8 or uint8), ``k_scale`` [T, 4]
    bytes or [T, 1] 4-byte elements (the fp32 scale), ``k_cache`` the byte
    cache [blocks, block_size, 1, head_dim + 4] (any strides),
    ``slot_mapping_fp8`` / ``slot_mapping_scale`` [T] flat element indices of
    each token's first data byte and first scale byte (as if the cache were
    contiguous); a negative index skips the token. ``num_tokens`` (newer
    TensorRT-LLM) uses the first num_tokens rows. Semantics:
    ``cpp/tensorrt_llm/kernels/IndexerKCacheScatter.cu``, kvsim's contract
    §5.5. Bad input raises the named kvsim.Error, the cache unchanged.
    """
    if num_tokens is not None:
        k_fp8, k_scale = k_fp8[:num_tokens], k_scale[:num_tokens]
        slot_mapping_fp8, slot_mapping_scale = slot_mapping_fp8[:num_tokens], slot_mapping_scale[:num_tokens]
    staged = T.Staged()
    kb = staged.host(_bytes_view(k_fp8))
    sb = staged.host(_bytes_view(k_scale))
    cb = staged.host(_bytes_view(k_cache), written=True)
    _kvsim.indexer_k_scatter(kb, sb, T.int_array(slot_mapping_fp8, dtype="int64"),
                             T.int_array(slot_mapping_scale, dtype="int64"), cb)
    staged.finish()
