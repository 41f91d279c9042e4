// mla_attention: DeepSeek-V3 multi-head latent attention over a latent pool,
// absorbed form (FlashInfer BatchMLAPagedAttention, vLLM / FlashMLA decode).
// The pool holds one latent row per token, [ckv (d_ckv) | kpe (d_kpe)], kv
// factor 1, one head (append_mla writes it). The absorbed query of head h is
// [q_nope · W_UK (d_ckv) | q_pe (d_kpe)]; the score of key t is the dot product
// of that query with key t's whole latent row, and the output is the softmax
// average of the keys' ckv parts: a [Hq, d_ckv] row in the latent space (W_UV
// is applied after the op). 128 query heads read the same latent head.
//
// Canonical order (docs/canonical-arithmetic.md, as attend_query): work item =
// (query row, query head). The keys of a query at position p are positions
// 0..p (no window, no masked page tail), cut into partitions of
// kPartitionSize keys (the split-KV chunks); per partition: scores
// dot(q, row, d_ckv + d_kpe) * (sm_scale * scale), the partition max,
// probabilities, their sum, and the P.V accumulation over the ckv part with
// fma in key order; partitions are merged in order with merge_weight, and the
// output is (merged / L) * scale. Decode (one row per sequence at
// seq_len - 1) and prefill chunks (q_indptr) run the same item, so a chunked
// prefill is bit-equal to one chunk and a one-token chunk to decode.
//
// Latent row values: fp32/fp16/bf16 as stored; fp8 / int8 codes with the
// per-tensor `scale` folded into the score and the output (as decode_attention
// folds k_scale / v_scale); nvfp4 pools: ckv nibbles decoded with their block
// scales and ckv_global_scale, kpe as e4m3 bytes packed in two nibbles each
// (append_mla's layout) times kpe_scale.
#pragma once

#include <span>
#include <vector>

#include "attention.hpp"

namespace kvsim {

struct MlaAttentionOp {
  int32_t layer = 0;
  TensorView q;    // [rows, Hq, d_ckv + d_kpe] fp32/fp16/bf16: absorbed q_nope | q_pe
  TensorView out;  // [rows, Hq, d_ckv] fp32/fp16/bf16
  // Empty: decode, one row per sequence at position seq_lens[b] - 1. Else
  // batch + 1 entries: rows [q_indptr[b], q_indptr[b+1]) are sequence b's
  // chunk, the last of them at seq_lens[b] - 1.
  std::span<const int32_t> q_indptr;
  std::span<const int32_t> seq_lens;     // tokens per sequence, the chunk included
  std::span<const int32_t> block_table;  // [batch, max_blocks_per_seq] primary BlockRefs, slot = position
  int32_t max_blocks_per_seq = 0;
  int32_t d_ckv = 512;
  int32_t d_kpe = 64;
  float sm_scale = 1.0f;
  float scale = 1.0f;             // fp8 / int8 latent: per-tensor decode scale; 1 otherwise
  float ckv_global_scale = 1.0f;  // nvfp4 ckv
  float kpe_scale = 1.0f;         // nvfp4 pools: decode scale of the e4m3 kpe bytes
};

// Trivially copyable arguments of attend_mla_query; row_seq / row_position
// point at the backend's copies of make_mla_rows().
struct MlaAttentionArgs : PagedReadArgs {
  int32_t d_ckv = 0, d_kpe = 0;
  int32_t heads = 0;
  int64_t rows = 0;
  const int32_t* row_seq = nullptr;
  const int64_t* row_position = nullptr;
  float score_scale = 1.0f;  // sm_scale * scale
  float scale = 1.0f;
  float ckv_global_scale = 1.0f;
  float kpe_scale = 1.0f;
};

// Sequence and position of every query row (attention.hpp's AttentionRows).
using MlaRows = AttentionRows;
inline MlaRows make_mla_rows(const MlaAttentionOp& op) {
  MlaRows r;
  for (size_t b = 0; b < op.seq_lens.size(); ++b) {
    const int32_t n = op.q_indptr.empty() ? 1 : op.q_indptr[b + 1] - op.q_indptr[b];
    for (int32_t i = 0; i < n; ++i) {
      r.seq.push_back(static_cast<int32_t>(b));
      r.position.push_back(static_cast<int64_t>(op.seq_lens[b]) - n + i);
    }
  }
  return r;
}

inline MlaAttentionArgs make_mla_attention_args(const KvPools& pools, const MlaAttentionOp& op) {
  MlaAttentionArgs a;
  set_paged_query_fields(a, pools, op);
  a.d_ckv = op.d_ckv;
  a.d_kpe = op.d_kpe;
  a.heads = op.q.rank == 3 ? static_cast<int32_t>(op.q.shape[1]) : 0;
  a.rows = op.q.rank == 3 ? op.q.shape[0] : 0;
  a.score_scale = op.sm_scale * op.scale;
  a.scale = op.scale;
  a.ckv_global_scale = op.ckv_global_scale;
  a.kpe_scale = op.kpe_scale;
  return a;
}

// Scratch floats one work item needs for a query at `position`.
KVSIM_HD constexpr int64_t mla_scratch_floats(int32_t d_ckv, int32_t d_kpe, int64_t position) {
  const int64_t n = position + 1;
  const int64_t parts = (n + canon::kPartitionSize - 1) / canon::kPartitionSize;
  const int64_t dq = static_cast<int64_t>(d_ckv) + d_kpe;
  return 2 * dq                                  // q, latent row
         + 2 * static_cast<int64_t>(canon::kPartitionSize)  // scores, probabilities
         + parts * (2 + static_cast<int64_t>(d_ckv))      // m_p, l_p, acc_p
         + d_ckv;                                          // merged
}

// The latent row of the token in `slot` of sequence seq, exact fp32 values
// (codes for fp8 / int8; the per-tensor scale is the caller's).
KVSIM_HD inline void load_latent_row(const MlaAttentionArgs& a, int32_t seq, int64_t slot, float* row) {
  const KvPools& p = a.pools;
  const TableSlot at = table_slot(p.geometry, a.block_table, a.max_blocks_per_seq, seq, slot);
  auto elem = [&](int32_t d) { return element_offset(p.strides[0], at.block, a.layer, 0, 0, at.entry, d); };
  if (p.geometry.dtype != CacheDtype::nvfp4) {
    for (int32_t d = 0; d < a.d_ckv + a.d_kpe; ++d)
      row[d] = load_cache_code_value(p.bytes(PoolKind::primary), p.geometry.dtype, elem(d));
    return;
  }
  const uint8_t* nibbles = p.bytes(PoolKind::primary);
  for (int32_t d = 0; d < a.d_ckv; ++d) {
    const uint8_t sf = p.scale_bytes(PoolKind::primary)[scale_offset(p.scale_strides[0], at.block, a.layer, 0, 0, at.entry, d)];
    row[d] = codec::nvfp4_decode(load_nibble(nibbles, elem(d)), sf, a.ckv_global_scale);
  }
  for (int32_t j = 0; j < a.d_kpe; ++j) {  // e4m3 bytes, low nibble first (append_mla's fp8 pairs)
    const uint8_t lo = load_nibble(nibbles, elem(a.d_ckv + 2 * j));
    const uint8_t hi = load_nibble(nibbles, elem(a.d_ckv + 2 * j + 1));
    row[a.d_ckv + j] = codec::e4m3_to_f32(static_cast<uint8_t>(lo | (hi << 4))) * a.kpe_scale;
  }
}

// Work item: query row `row` (sequence row_seq[row], position row_position[row]), query head `head`.
KVSIM_HD inline void attend_mla_query(const MlaAttentionArgs& a, int64_t row, int32_t head, float* scratch) {
  using namespace canon;
  const int32_t seq = a.row_seq[row];
  const int64_t position = a.row_position[row];
  const int32_t dq = a.d_ckv + a.d_kpe, dv = a.d_ckv;
  const int64_t n = position + 1;
  const int64_t parts = (n + kPartitionSize - 1) / kPartitionSize;

  float* q = scratch;
  float* lrow = q + dq;
  float* s = lrow + dq;                // [kPartitionSize]
  float* p = s + kPartitionSize;       // [kPartitionSize]
  float* part_m = p + kPartitionSize;  // [parts]
  float* part_l = part_m + parts;      // [parts]
  float* part_acc = part_l + parts;    // [parts][dv]
  float* merged = part_acc + parts * dv;

  for (int32_t d = 0; d < dq; ++d) q[d] = load_float(a.q.data, a.q.dtype, a.q.offset(row, head, d));
  for (int64_t part = 0; part < parts; ++part) {
    const int64_t first = part * kPartitionSize;
    const int32_t count = static_cast<int32_t>(n - first < kPartitionSize ? n - first : kPartitionSize);
    for (int32_t j = 0; j < count; ++j) {
      load_latent_row(a, seq, first + j, lrow);
      s[j] = dot(q, lrow, dq) * a.score_scale;
    }
    const float m = partition_max(s, count);
    for (int32_t j = 0; j < count; ++j) p[j] = probability(s[j], m);
    part_m[part] = m;
    part_l[part] = partition_sum(p, count);
    float* acc = part_acc + part * dv;
    for (int32_t d = 0; d < dv; ++d) acc[d] = 0.0f;
    for (int32_t j = 0; j < count; ++j) {
      load_latent_row(a, seq, first + j, lrow);
      for (int32_t d = 0; d < dv; ++d) acc[d] = fma_f32(p[j], lrow[d], acc[d]);
    }
  }
  float global_max = neg_inf();
  for (int64_t part = 0; part < parts; ++part) global_max = part_m[part] > global_max ? part_m[part] : global_max;
  float L = 0.0f;
  for (int32_t d = 0; d < dv; ++d) merged[d] = 0.0f;
  for (int64_t part = 0; part < parts; ++part) {
    const float w = merge_weight(part_m[part], global_max);
    L = fma_f32(part_l[part], w, L);
    const float* acc = part_acc + part * dv;
    for (int32_t d = 0; d < dv; ++d) merged[d] = fma_f32(acc[d], w, merged[d]);
  }
  for (int32_t d = 0; d < dv; ++d) store_float(a.out.data, a.out.dtype, a.out.offset(row, head, d), (merged[d] / L) * a.scale);
}

}  // namespace kvsim
