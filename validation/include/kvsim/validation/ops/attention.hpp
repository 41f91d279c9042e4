// Host validation of decode and prefill attention: throws a named
// ValidationError before any work item runs.
#pragma once

#include <span>
#include <string>
#include <utility>

#include "../page_table.hpp"
#include "../checks.hpp"
#include "../tensor.hpp"
#include "../window.hpp"
#include "kvsim/core/ops/attention.hpp"

namespace kvsim {

// ---------------------------------------------------------------- validation
namespace detail {
inline void validate_attention_table(const PoolGeometry& g, std::span<const int32_t> seq_lens,
                                     std::span<const int32_t> block_table, int32_t max_blocks, const WindowMapping& w,
                                     const std::string& o);
inline void validate_attention_common(const KvPools& pools, int32_t layer, const TensorView& q, const TensorView& out,
                                      int64_t rows, std::span<const int32_t> seq_lens,
                                      std::span<const int32_t> block_table, int32_t max_blocks,
                                      const AttentionScales& sc, const WindowMapping& w, const char* op) {
  const PoolGeometry& g = pools.geometry;
  const std::string o = std::string(op) + ": ";
  if (g.kv_factor != 2) fail(ErrorCode::bad_argument, o + "needs separate K and V (kv_factor 2)");
  validate_layer(g, layer, o);
  validate_pool(pools, PoolKind::primary, o);
  if (g.head_dim > canon::kMaxHeadDim)
    fail(ErrorCode::unsupported_head_dim, o + "head_dim = " + std::to_string(g.head_dim) + " > " + std::to_string(canon::kMaxHeadDim));
  for (const TensorView* t : {&q, &out}) {
    const char* name = t == &q ? "q" : "out";
    if (t->data == nullptr || t->rank != 3 || !is_float_input(t->dtype) || t->shape[0] != rows ||
        t->shape[2] != g.head_dim || t->shape[1] < g.kv_heads || t->shape[1] % g.kv_heads != 0 ||
        t->shape[1] > INT32_MAX)  // head indices are 32-bit
      fail(ErrorCode::shape_mismatch, o + name + " must be [" + std::to_string(rows) + ", Hq, " +
                                          std::to_string(g.head_dim) + "] fp32/fp16/bf16 with Hq a multiple of H = " +
                                          std::to_string(g.kv_heads));
  }
  if (q.shape[1] != out.shape[1]) fail(ErrorCode::shape_mismatch, o + "q and out have different head counts");
  for (const auto& [v, name] : {std::pair{sc.sm_scale, "sm_scale"}, {sc.k_scale, "k_scale"}, {sc.v_scale, "v_scale"}})
    check_scale(v, ScaleRule::finite, ErrorCode::bad_argument, o + name, "softmax/K/V scales must be finite");
  if (g.dtype == CacheDtype::nvfp4) {
    validate_global_scale(sc.k_global_scale, o + "k_global_scale");
    validate_global_scale(sc.v_global_scale, o + "v_global_scale");
  }
  validate_window(w);
  if (w.enabled() && w.tokens_per_block != g.tokens_per_block)
    fail(ErrorCode::bad_window, o + "window mapping built for P = " + std::to_string(w.tokens_per_block) +
                                    " but the pool has P = " + std::to_string(g.tokens_per_block));
  validate_attention_table(g, seq_lens, block_table, max_blocks, w, o);
}

// The optional LSE output: [rows, Hq] fp32 (any strides), or empty.
inline void validate_lse_output(const TensorView& lse, int64_t rows, int64_t heads, const char* op) {
  if (lse.empty()) return;
  if (lse.rank != 2 || lse.dtype != CacheDtype::fp32 || lse.shape[0] != rows || lse.shape[1] != heads)
    fail(ErrorCode::shape_mismatch, std::string(op) + ": lse must be [" + std::to_string(rows) + ", " +
                                        std::to_string(heads) + "] fp32");
}

// The mma order is offered for the cache dtypes whose codes are exact values
// of a 16-bit operand type (mma_order::offered_for).
inline void validate_attention_order(const PoolGeometry& g, AttentionOrder order, const char* op) {
  if (order != AttentionOrder::fp32 && order != AttentionOrder::mma)
    fail(ErrorCode::bad_argument, std::string(op) + ": unknown attention order " + std::to_string(static_cast<int>(order)));
  if (order == AttentionOrder::mma && !mma_order::offered_for(g.dtype))
    fail(ErrorCode::unsupported_attention_order,
         std::string(op) + ": attention order mma is not offered for a " + std::string(dtype_name(g.dtype)) +
             " cache: rule: mma needs bf16, fp16, fp8_e4m3, fp8_e5m2 or int8 codes (exact 16-bit operands)");
}

// The block table of an attention op: [batch, max_blocks] entries, every
// sequence at least one token and every page it occupies a live block.
inline void validate_attention_table(const PoolGeometry& g, std::span<const int32_t> seq_lens,
                                     std::span<const int32_t> block_table, int32_t max_blocks, const WindowMapping& w,
                                     const std::string& o) {
  check_dense_table_shape(block_table, seq_lens.size(), max_blocks, o);
  const PageDivider page = g.page_divider();
  for (size_t b = 0; b < seq_lens.size(); ++b) {
    if (seq_lens[b] < 1)
      fail(ErrorCode::position_beyond_sequence, o + "sequence " + std::to_string(b) + ": seq_lens = " +
                                                    std::to_string(seq_lens[b]) + ": rule: a query needs >= 1 token");
    // Every page holding a slot the sequence occupies is read (whole pages).
    const int64_t slots = w.cache_length(seq_lens[b]);
    const int64_t pages = page.div(slots - 1) + 1;
    if (pages > max_blocks)
      fail(ErrorCode::position_beyond_sequence, o + "sequence " + std::to_string(b) + " occupies " +
                                                    std::to_string(pages) + " pages but the table has " +
                                                    std::to_string(max_blocks) + " columns");
    for (int64_t pg = 0; pg < pages; ++pg) {
      const BlockRef r{block_table[b * max_blocks + pg]};
      auto where = [&] {
        return o + "sequence " + std::to_string(b) + ", block_table[" + std::to_string(b) + "][" + std::to_string(pg) +
               "]";
      };
      if (r.is_bad())
        fail(ErrorCode::write_through_bad_page, where() + " = -1 (BAD_PAGE) is read: rule: every page of a live sequence is a live block");
      validate_block_ref(r, g, where, /*is_write=*/false);
    }
  }
}

// q_indptr of a prefill op: batch + 1 non-decreasing entries from 0, no
// sequence with more queries than tokens.
inline void validate_q_indptr(std::span<const int32_t> q_indptr, std::span<const int32_t> seq_lens, const std::string& o) {
  if (q_indptr.size() != seq_lens.size() + 1 || q_indptr.empty() || q_indptr[0] != 0)
    fail(ErrorCode::shape_mismatch, o + "q_indptr must have batch + 1 entries starting at 0");
  for (size_t b = 0; b + 1 < q_indptr.size(); ++b) {
    if (q_indptr[b + 1] < q_indptr[b])
      fail(ErrorCode::non_monotone_indptr, o + "sequence " + std::to_string(b) + ": q_indptr[" + std::to_string(b + 1) +
                                               "] = " + std::to_string(q_indptr[b + 1]) + " < q_indptr[" +
                                               std::to_string(b) + "]: rule: non-decreasing");
    if (q_indptr[b + 1] - q_indptr[b] > seq_lens[b])
      fail(ErrorCode::position_beyond_sequence, o + "sequence " + std::to_string(b) + " has " +
                                                    std::to_string(q_indptr[b + 1] - q_indptr[b]) +
                                                    " queries but seq_lens = " + std::to_string(seq_lens[b]));
  }
}
}  // namespace detail

inline void validate_decode_attention(const KvPools& pools, const DecodeAttentionOp& op) {
  detail::validate_attention_common(pools, op.layer, op.q, op.out, static_cast<int64_t>(op.seq_lens.size()),
                                    op.seq_lens, op.block_table, op.max_blocks_per_seq, op.scales, op.window,
                                    "decode_attention");
  detail::validate_lse_output(op.lse, static_cast<int64_t>(op.seq_lens.size()), op.q.shape[1], "decode_attention");
  detail::validate_attention_order(pools.geometry, op.order, "decode_attention");
}

inline void validate_prefill_attention(const KvPools& pools, const PrefillAttentionOp& op) {
  detail::validate_q_indptr(op.q_indptr, op.seq_lens, "prefill_attention: ");
  detail::validate_attention_common(pools, op.layer, op.q, op.out, op.q_indptr.back(), op.seq_lens, op.block_table,
                                    op.max_blocks_per_seq, op.scales, op.window, "prefill_attention");
  detail::validate_lse_output(op.lse, op.q_indptr.back(), op.q.shape[1], "prefill_attention");
  detail::validate_attention_order(pools.geometry, op.order, "prefill_attention");
}

}  // namespace kvsim
