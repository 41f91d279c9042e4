// Host validation of qkv_preprocess_write (TensorRT-LLM's fused bias + RoPE +
// KV-cache write): throws a named ValidationError before any byte moves.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../page_table.hpp"
#include "../checks.hpp"
#include "../tensor.hpp"
#include "../window.hpp"
#include "kvsim/core/ops/qkv_preprocess.hpp"

namespace kvsim {

// ---------------------------------------------------------------- validation
namespace detail {
inline std::string qkv_seq(size_t b) { return "sequence " + std::to_string(b); }

inline void qkv_check_float_view(const TensorView& v, const char* name, int32_t rank,
                                 std::initializer_list<int64_t> shape) {
  if (!is_float_input(v.dtype))
    fail(ErrorCode::shape_mismatch, std::string(name) + " dtype " + std::string(dtype_name(v.dtype)) +
                                        ": rule: qkv_preprocess inputs and outputs are fp32, fp16 or bf16");
  if (v.rank != rank)
    fail(ErrorCode::shape_mismatch, std::string(name) + " has rank " + std::to_string(v.rank) + ": rule: rank " +
                                        std::to_string(rank));
  int i = 0;
  for (int64_t s : shape) {
    if (v.shape[i] != s)
      fail(ErrorCode::shape_mismatch, std::string(name) + ".shape[" + std::to_string(i) + "] = " +
                                          std::to_string(v.shape[i]) + ": rule: must be " + std::to_string(s));
    ++i;
  }
}
}  // namespace detail

// Host validation: throws a named ValidationError before any byte moves.
inline void validate_qkv_preprocess(const KvPools& pools, const QkvPreprocessOp& op) {
  const PoolGeometry& g = pools.geometry;
  validate_geometry(g);
  if (g.kv_factor != 2)
    fail(ErrorCode::bad_geometry, "kv_factor = " + std::to_string(g.kv_factor) +
                                      ": rule: qkv_preprocess_write needs separate K and V (kv_factor 2)");
  validate_layer(g, op.layer, "qkv_preprocess_write: ");
  if (g.head_dim > kQkvMaxHeadDim)
    fail(ErrorCode::unsupported_head_dim, "head_dim = " + std::to_string(g.head_dim) +
                                              ": rule: qkv_preprocess_write supports head_dim <= " +
                                              std::to_string(kQkvMaxHeadDim));
  validate_pool(pools, PoolKind::primary, "qkv_preprocess_write: ");
  check_nvfp4_one_writer_per_byte(pools, PoolKind::primary, "qkv_preprocess_write");

  // ---- dtypes and heads
  const int32_t H = g.kv_heads, D = g.head_dim, Hq = op.num_q_heads;
  if (!is_float_input(op.qkv.dtype))
    fail(ErrorCode::shape_mismatch, "qkv dtype " + std::string(dtype_name(op.qkv.dtype)) +
                                        ": rule: fused QKV is fp32, fp16 or bf16");
  if (is_float_input(g.dtype) && g.dtype != op.qkv.dtype)
    fail(ErrorCode::shape_mismatch, "cache dtype " + std::string(dtype_name(g.dtype)) + " with qkv dtype " +
                                        std::string(dtype_name(op.qkv.dtype)) +
                                        ": rule: a fp32/fp16/bf16 cache takes the input dtype");
  if (Hq < 1 || Hq % H != 0 || static_cast<int64_t>(Hq) + 2 * static_cast<int64_t>(H) > INT32_MAX)
    fail(ErrorCode::shape_mismatch, "num_q_heads = " + std::to_string(Hq) + " with kv_heads = " + std::to_string(H) +
                                        ": rule: num_q_heads is a positive multiple of kv_heads (GQA), Hq + 2H < 2^31");

  // ---- per-sequence arrays
  const size_t batch = op.seq_lens.size();
  if (op.cache_lens.size() != batch)
    fail(ErrorCode::shape_mismatch, "cache_lens has " + std::to_string(op.cache_lens.size()) + " entries for " +
                                        std::to_string(batch) + " sequences");
  if (!op.position_offsets.empty() && op.position_offsets.size() != batch)
    fail(ErrorCode::shape_mismatch, "position_offsets has " + std::to_string(op.position_offsets.size()) +
                                        " entries for " + std::to_string(batch) + " sequences (or none)");
  check_dense_table_shape(op.block_table, batch, op.max_blocks_per_seq, "");
  int64_t num_tokens = 0;
  for (size_t b = 0; b < batch; ++b) {
    if (op.seq_lens[b] < 0)
      fail(ErrorCode::bad_argument, detail::qkv_seq(b) + ": seq_lens[" + std::to_string(b) + "] = " +
                                        std::to_string(op.seq_lens[b]) + ": rule: seq_len >= 0");
    if (op.cache_lens[b] < op.seq_lens[b])
      fail(ErrorCode::position_beyond_sequence,
           detail::qkv_seq(b) + ": seq_lens[" + std::to_string(b) + "] = " + std::to_string(op.seq_lens[b]) +
               " > cache_lens[" + std::to_string(b) + "] = " + std::to_string(op.cache_lens[b]) +
               ": rule: past = cache_len - seq_len >= 0");
    num_tokens += op.seq_lens[b];
  }

  // ---- tensors
  const int64_t width = (static_cast<int64_t>(Hq) + 2 * static_cast<int64_t>(H)) * D;
  detail::qkv_check_float_view(op.qkv, "qkv", 2, {num_tokens, width});
  detail::qkv_check_float_view(op.q_out, "q_out", 3, {num_tokens, Hq, D});
  if (num_tokens > 0 && (op.qkv.empty() || op.q_out.empty()))
    fail(ErrorCode::shape_mismatch, "qkv and q_out must have data for " + std::to_string(num_tokens) + " tokens");
  if (!op.bias.empty()) {
    detail::qkv_check_float_view(op.bias, "bias", 1, {width});
    if (op.bias.dtype != op.qkv.dtype)
      fail(ErrorCode::shape_mismatch, "bias dtype " + std::string(dtype_name(op.bias.dtype)) +
                                          ": rule: bias has qkv's dtype " + std::string(dtype_name(op.qkv.dtype)));
  }

  // ---- RoPE
  if (op.rope_style == RopeStyle::none) {
    if (op.rotary_dim != 0)
      fail(ErrorCode::bad_argument, "rotary_dim = " + std::to_string(op.rotary_dim) + " without a RoPE style: rule: 0");
  } else {
    if (op.rotary_dim < 2 || op.rotary_dim % 2 != 0 || op.rotary_dim > D)
      fail(ErrorCode::bad_argument, "rotary_dim = " + std::to_string(op.rotary_dim) +
                                        ": rule: even, >= 2 and <= head_dim = " + std::to_string(D));
    if (op.cos_sin.dtype != CacheDtype::fp32 || op.cos_sin.rank != 2 || op.cos_sin.shape[1] != op.rotary_dim ||
        op.cos_sin.stride[1] != 1 || op.cos_sin.empty())
      fail(ErrorCode::shape_mismatch, "cos_sin: rule: fp32 [max_position, rotary_dim = " +
                                          std::to_string(op.rotary_dim) + "] with contiguous rows");
    for (size_t b = 0; b < batch; ++b) {
      if (op.seq_lens[b] == 0) continue;
      const int64_t offset = op.position_offsets.empty() ? 0 : op.position_offsets[b];
      const int64_t first = static_cast<int64_t>(op.cache_lens[b]) - op.seq_lens[b] + offset;
      const int64_t last = static_cast<int64_t>(op.cache_lens[b]) - 1 + offset;
      if (first < 0)
        fail(ErrorCode::bad_argument, detail::qkv_seq(b) + ": rotary position " + std::to_string(first) +
                                          " (position_offsets[" + std::to_string(b) + "] = " + std::to_string(offset) +
                                          "): rule: rotary positions are >= 0");
      if (last >= op.cos_sin.shape[0])
        fail(ErrorCode::shape_mismatch, detail::qkv_seq(b) + ": rotary position " + std::to_string(last) +
                                            " needs cos_sin row " + std::to_string(last) + " but the table has " +
                                            std::to_string(op.cos_sin.shape[0]) + " rows");
    }
  }

  // ---- window
  validate_window(op.window);
  if (op.window.enabled()) {
    if (op.window.tokens_per_block != g.tokens_per_block)
      fail(ErrorCode::bad_window, "window tokens_per_block = " + std::to_string(op.window.tokens_per_block) +
                                      ": rule: the pool's P = " + std::to_string(g.tokens_per_block));
    const WindowMapping made = WindowMapping::derive(op.window);
    if (made.bubble != op.window.bubble || made.cyclic_len != op.window.cyclic_len)
      fail(ErrorCode::bad_window, "window bubble = " + std::to_string(op.window.bubble) + ", cyclic_len = " +
                                      std::to_string(op.window.cyclic_len) + ": rule: WindowMapping::make gives " +
                                      std::to_string(made.bubble) + ", " + std::to_string(made.cyclic_len));
  }

  // ---- scales
  if (has_tensor_scale(g.dtype))
    for (int i = 1; i <= 2; ++i)
      check_scale(op.scale_orig_quant[i], ScaleRule::finite_positive, ErrorCode::bad_argument,
                  std::string("scale_orig_quant[") + std::to_string(i) + (i == 1 ? "] (K)" : "] (V)"), "finite and > 0");
  if (g.dtype == CacheDtype::nvfp4) {
    validate_global_scale(op.nvfp4_global_scale[1], "nvfp4_global_scale[1] (K)");
    validate_global_scale(op.nvfp4_global_scale[2], "nvfp4_global_scale[2] (V)");
  }

  // ---- every block the op writes: live, primary, in range, one writer
  const PageDivider page = g.page_divider();
  const bool zero_tail = op.context_phase && op.zero_v_tail;
  std::vector<std::pair<int32_t, int64_t>> writes;  // (sequence, block)
  // (logical page, first position writing it; kVTailOnly when only V-tail zeroing writes it)
  constexpr int64_t kVTailOnly = std::numeric_limits<int64_t>::max();
  std::vector<std::pair<int64_t, int64_t>> pages;
  for (size_t b = 0; b < batch; ++b) {
    const int64_t cache_len = op.cache_lens[b];
    const int64_t past = cache_len - op.seq_lens[b];
    pages.clear();
    for (int64_t pos = past; pos < cache_len; ++pos)
      if (qkv_token_reaches_cache(op.window, cache_len, pos)) pages.emplace_back(page.div(op.window.cache_token(pos)), pos);
    if (zero_tail && op.seq_lens[b] > 0) {
      const QkvVTail z = qkv_v_tail(op.window, page, cache_len);
      if (z.tail_begin < z.tail_end) pages.emplace_back(page.div(z.tail_begin), kVTailOnly);
      if (z.bubble_begin < z.bubble_end) pages.emplace_back(page.div(z.bubble_begin), kVTailOnly);
    }
    std::sort(pages.begin(), pages.end());
    std::unordered_map<int64_t, int64_t> page_of_block;
    for (size_t i = 0; i < pages.size(); ++i) {
      if (i > 0 && pages[i].first == pages[i - 1].first) continue;
      // Plain variables, not a structured binding: lambdas below capture them
      // (clang before 16 cannot capture bindings).
      const int64_t logical = pages[i].first, pos = pages[i].second;
      auto who = [&] { return pos != kVTailOnly ? "token position " + std::to_string(pos) : std::string("the V-tail zeroing"); };
      if (logical >= op.max_blocks_per_seq)
        fail(ErrorCode::shape_mismatch, detail::qkv_seq(b) + ": " + who() + " needs logical page " +
                                            std::to_string(logical) + " but block_table has max_blocks_per_seq = " +
                                            std::to_string(op.max_blocks_per_seq) + " columns");
      const BlockRef ref{op.block_table[b * op.max_blocks_per_seq + logical]};
      validate_block_ref(
          ref, g,
          [&] {
            return detail::qkv_seq(b) + " (" + who() + "), block_table[" + std::to_string(b) + "][" +
                   std::to_string(logical) + "]";
          },
          /*is_write=*/true);
      auto [it, inserted] = page_of_block.emplace(ref.block(), logical);
      if (!inserted)
        fail(ErrorCode::shared_block_write, detail::qkv_seq(b) + ": block_table[" + std::to_string(b) + "][" +
                                                std::to_string(it->second) + "] and [" + std::to_string(logical) +
                                                "] are both block " + std::to_string(ref.block()) +
                                                ": rule: a sequence's written pages are distinct blocks");
      writes.emplace_back(static_cast<int32_t>(b), ref.block());
    }
  }
  validate_exclusive_writers(writes);
}

}  // namespace kvsim
