// decode_attention and prefill_attention (SPEC §5.7, §5.8) descriptors. The
// arithmetic is core's canonical order (../attention_math.hpp,
// docs/canonical-arithmetic.md); both ops call attend_query() for every
// (query token, KV head) so a one-token prefill chunk is bit-equal to decode.
#pragma once

#include <span>

#include "../page_table.hpp"
#include "../tensor.hpp"
#include "../window.hpp"

namespace kvsim {

// Scales: the fp8/int8 per-tensor K scale is folded into the softmax scale
// (score = dot(q, k_code) * (sm_scale * k_scale)); the V scale multiplies the
// normalised output. nvfp4 K/V are fully decoded with their global scales.
struct AttentionScales {
  float sm_scale = 1.0f;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  float k_global_scale = 1.0f;  // nvfp4
  float v_global_scale = 1.0f;  // nvfp4
};

// One query token per sequence, at position seq_lens[b] - 1 (its K/V already
// in the cache). Block table is dense (TensorRT-LLM / vLLM), -1 padded, and
// maps cache slots (after the window mapping) to blocks.
struct DecodeAttentionOp {
  int32_t layer = 0;
  TensorView q;    // [batch, Hq, D] fp32/fp16/bf16
  TensorView out;  // [batch, Hq, D] fp32/fp16/bf16
  std::span<const int32_t> seq_lens;     // tokens per sequence, including the query token
  std::span<const int32_t> block_table;  // [batch, max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
  AttentionScales scales;
  WindowMapping window;
};

// Causal attention for a chunk of new tokens: query i of sequence b (i in
// [q_indptr[b], q_indptr[b+1])) is at position seq_lens[b] - n_b + (i -
// q_indptr[b]) and attends to keys at positions <= its own (past + chunk).
struct PrefillAttentionOp {
  int32_t layer = 0;
  TensorView q;    // [nnz, Hq, D]
  TensorView out;  // [nnz, Hq, D]
  std::span<const int32_t> q_indptr;     // [batch + 1]
  std::span<const int32_t> seq_lens;     // tokens per sequence after this chunk
  std::span<const int32_t> block_table;  // [batch, max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
  AttentionScales scales;
  WindowMapping window;
};

// Host validation: throws a named ValidationError before any byte moves.
void validate_decode_attention(const KvPools& pools, const DecodeAttentionOp& op);
void validate_prefill_attention(const KvPools& pools, const PrefillAttentionOp& op);

}  // namespace kvsim
