// Host validation of the read and copy ops (gather_paged, partial_copy,
// copy_blocks, offload/onboard) and the zero-copy gather view.
#pragma once

#include <cmath>
#include <optional>
#include <span>
#include <string>
#include <unordered_set>
#include <utility>

#include "../geometry.hpp"
#include "../page_table.hpp"
#include "../checks.hpp"
#include "../tensor.hpp"
#include "kvsim/core/ops/read_copy_ops.hpp"

namespace kvsim {

// ================================================================ host validation

namespace read_copy_detail {

// The pool's memory, allocation and strides (core's validate_pool).
inline void validate_pool_memory(const KvPools& pools, PoolKind kind, const char* op) {
  validate_pool(pools, kind, std::string(op) + ": ");
}

// A block a copy reads or writes: a live primary BlockRef in range.
inline void validate_copy_ref(int32_t raw, const PoolGeometry& g, const std::string& where, bool is_write) {
  const BlockRef r{raw};
  if (r.is_bad() && !is_write)
    fail(ErrorCode::bad_argument, where + " = -1 (BAD_PAGE): rule: a copy source must be a live block");
  validate_block_ref(r, g, where, is_write);
}

// Rank-3 fp32 [n, H, D] output with non-negative strides that map distinct
// coordinates to distinct elements (sorted-stride sufficient condition). An
// empty TensorView is accepted for n == 0.
inline void validate_gather_out(const TensorView& out, int64_t n, int32_t H, int32_t D) {
  if (n == 0 && out.rank == 0 && out.data == nullptr) return;  // nothing to write: no tensor needed
  if (out.dtype != CacheDtype::fp32 || out.rank != 3 || out.shape[0] != n || out.shape[1] != H || out.shape[2] != D)
    fail(ErrorCode::shape_mismatch, "gather_paged: out must be fp32 [num_tokens = " + std::to_string(n) +
                                        ", H = " + std::to_string(H) + ", D = " + std::to_string(D) + "], got " +
                                        std::string(dtype_name(out.dtype)) + " rank " + std::to_string(out.rank) +
                                        " [" + std::to_string(out.shape[0]) + ", " + std::to_string(out.shape[1]) +
                                        ", " + std::to_string(out.shape[2]) + "]");
  if (n == 0) return;
  if (out.data == nullptr) fail(ErrorCode::bad_argument, "gather_paged: out.data is null");
  int64_t stride[3], extent[3];
  for (int i = 0; i < 3; ++i) {
    if (out.stride[i] < 0)
      fail(ErrorCode::shape_mismatch, "gather_paged: out.stride[" + std::to_string(i) +
                                          "] = " + std::to_string(out.stride[i]) + ": rule: strides are non-negative");
    stride[i] = out.stride[i];
    extent[i] = out.shape[i];
  }
  for (int i = 1; i < 3; ++i)  // insertion sort by stride
    for (int j = i; j > 0 && stride[j] < stride[j - 1]; --j) {
      std::swap(stride[j], stride[j - 1]);
      std::swap(extent[j], extent[j - 1]);
    }
  int64_t span = 0;
  for (int i = 0; i < 3; ++i) {
    if (extent[i] <= 1) continue;
    if (stride[i] <= span)
      fail(ErrorCode::shape_mismatch, "gather_paged: out strides overlap (stride " + std::to_string(stride[i]) +
                                          " <= span " + std::to_string(span) +
                                          "): rule: one output element per coordinate");
    span += stride[i] * (extent[i] - 1);
  }
}

inline bool byte_ranges_overlap(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  if (a == nullptr || b == nullptr || a_bytes <= 0 || b_bytes <= 0) return false;
  const auto a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
  return a0 < b0 + static_cast<uintptr_t>(b_bytes) && b0 < a0 + static_cast<uintptr_t>(a_bytes);
}

// Everything about a gather except its output tensor (shared with gather_view).
inline void validate_gather_source(const KvPools& pools, const GatherPagedOp& op) {
  const PoolGeometry& g = pools.geometry;
  validate_geometry(g);
  validate_layer(g, op.layer, "gather_paged: ");
  if (op.kv < 0 || op.kv >= g.kv_factor)
    fail(ErrorCode::bad_argument, "gather_paged: kv = " + std::to_string(op.kv) +
                                      ": rule: kv in [0, kv_factor = " + std::to_string(g.kv_factor) + ")");
  if (op.num_tokens < 0)
    fail(ErrorCode::bad_argument,
         "gather_paged: num_tokens = " + std::to_string(op.num_tokens) + ": rule: num_tokens >= 0");
  if (g.dtype == CacheDtype::nvfp4) validate_global_scale(op.global_scale, "gather_paged: global_scale");
  if (has_tensor_scale(g.dtype))
    check_scale(op.scale, ScaleRule::finite, ErrorCode::bad_argument, "gather_paged: scale",
                "the dequantization scale is finite");
  const int64_t P = g.tokens_per_block;
  const int64_t pages = op.num_tokens / P + (op.num_tokens % P != 0);  // no overflow near INT64_MAX
  if (pages > static_cast<int64_t>(op.block_ids.size()))
    fail(ErrorCode::position_beyond_sequence, "gather_paged: num_tokens = " + std::to_string(op.num_tokens) +
                                                  " needs " + std::to_string(pages) +
                                                  " pages of P = " + std::to_string(P) + " but block_ids has " +
                                                  std::to_string(static_cast<int64_t>(op.block_ids.size())) +
                                                  " entries: rule: the gathered tokens lie inside the table");
  for (int64_t i = 0; i < pages; ++i)
    validate_block_ref(BlockRef{op.block_ids[i]}, g, [&] { return "gather_paged: block_ids[" + std::to_string(i) + "]"; },
                       /*is_write=*/false);
  if (op.num_tokens > 0) validate_pool_memory(pools, PoolKind::primary, "gather_paged");
}

}  // namespace read_copy_detail

inline void validate_gather_paged(const KvPools& pools, const GatherPagedOp& op) {
  read_copy_detail::validate_gather_source(pools, op);
  const PoolGeometry& g = pools.geometry;
  read_copy_detail::validate_gather_out(op.out, op.num_tokens, g.kv_heads, g.head_dim);
  if (op.num_tokens == 0) return;
  // The work items read the pool while writing out: the two must not share bytes.
  const int64_t out_bytes = op.out.span_bytes();
  // The whole allocation counts: a pool may be a strided view into a larger one.
  const int64_t pool_bytes = g.bytes_for(pools.data_allocation(PoolKind::primary));
  const int64_t scale_bytes = g.has_scale_pool() ? pools.scale_allocation(PoolKind::primary) : 0;
  if (read_copy_detail::byte_ranges_overlap(op.out.data, out_bytes, pools.data[0], pool_bytes) ||
      read_copy_detail::byte_ranges_overlap(op.out.data, out_bytes, pools.scales[0], scale_bytes))
    fail(ErrorCode::bad_argument, "gather_paged: out overlaps the primary pool: rule: the output is separate memory");
}

inline void validate_partial_copy(const KvPools& pools, const PartialCopyOp& op) {
  const PoolGeometry& g = pools.geometry;
  validate_geometry(g);
  read_copy_detail::validate_copy_ref(op.src_block, g, "partial_copy: src_block", /*is_write=*/false);
  read_copy_detail::validate_copy_ref(op.dst_block, g, "partial_copy: dst_block", /*is_write=*/true);
  if (op.src_block == op.dst_block)
    fail(ErrorCode::bad_argument, "partial_copy: src_block = dst_block = " + std::to_string(op.src_block) +
                                      ": rule: source and destination are distinct blocks");
  if (op.num_tokens > g.tokens_per_block)
    fail(ErrorCode::bad_argument, "partial_copy: num_tokens = " + std::to_string(op.num_tokens) +
                                      ": rule: num_tokens <= P = " + std::to_string(g.tokens_per_block) +
                                      " (<= 0 copies the whole block)");
  read_copy_detail::validate_pool_memory(pools, PoolKind::primary, "partial_copy");
  check_nvfp4_one_writer_per_byte(pools, PoolKind::primary, "partial_copy");
}

inline void validate_copy_blocks(const KvPools& pools, const CopyBlocksOp& op) {
  const PoolGeometry& g = pools.geometry;
  validate_geometry(g);
  if (op.pairs.empty()) return;
  std::unordered_set<int32_t> sources;
  for (size_t i = 0; i < op.pairs.size(); ++i) {
    const std::string at = "copy_blocks: pairs[" + std::to_string(i) + "]";
    read_copy_detail::validate_copy_ref(op.pairs[i].first, g, at + ".src", /*is_write=*/false);
    read_copy_detail::validate_copy_ref(op.pairs[i].second, g, at + ".dst", /*is_write=*/true);
    sources.insert(op.pairs[i].first);
  }
  std::unordered_set<int32_t> destinations;
  for (size_t i = 0; i < op.pairs.size(); ++i) {
    const int32_t dst = op.pairs[i].second;
    const std::string at = "copy_blocks: pairs[" + std::to_string(i) + "].dst = " + std::to_string(dst);
    if (!destinations.insert(dst).second)
      fail(ErrorCode::bad_argument, at + " is the destination of an earlier pair: rule: each block is written once");
    if (sources.count(dst))
      fail(ErrorCode::bad_argument,
           at + " is also a source: rule: pairs are independent (no block is both read and written)");
  }
  read_copy_detail::validate_pool_memory(pools, PoolKind::primary, "copy_blocks");
  check_nvfp4_one_writer_per_byte(pools, PoolKind::primary, "copy_blocks");
}

inline void validate_move_blocks(const KvPools& pools, const MoveBlocksOp& op) {
  const PoolGeometry& g = pools.geometry;
  validate_geometry(g);
  if (op.primary.size() != op.secondary.size())
    fail(ErrorCode::shape_mismatch, "move_blocks: primary has " + std::to_string(op.primary.size()) +
                                        " blocks but secondary has " + std::to_string(op.secondary.size()) +
                                        ": rule: block i of one list pairs with block i of the other");
  if (op.primary.empty()) return;
  const PoolKind kinds[2] = {PoolKind::primary, PoolKind::secondary};
  const std::span<const int32_t> lists[2] = {op.primary, op.secondary};
  for (int k = 0; k < 2; ++k) {
    const char* name = k == 0 ? "primary" : "secondary";
    const int64_t blocks = g.blocks(kinds[k]);
    std::unordered_set<int32_t> seen;
    for (size_t i = 0; i < lists[k].size(); ++i) {
      const int32_t b = lists[k][i];
      const std::string at = std::string("move_blocks: ") + name + "[" + std::to_string(i) + "] = " + std::to_string(b);
      if (b < 0 || b >= blocks)
        fail(ErrorCode::block_out_of_range,
             at + ": rule: a plain block index in [0, " + name + "_blocks = " + std::to_string(blocks) + ")");
      if (!seen.insert(b).second)
        fail(ErrorCode::bad_argument, at + " appears twice: rule: a move pairs blocks one to one");
    }
  }
  for (PoolKind k : kinds) {
    read_copy_detail::validate_pool_memory(pools, k, "move_blocks");
    check_nvfp4_one_writer_per_byte(pools, k, "move_blocks");
  }
}

// ================================================================ zero-copy gather

// vanilla.py: "A single block returns the contiguous view directly (no copy)".
// Returns a strided [n, H, D] fp32 view into the primary pool (backend memory;
// read-only by convention) holding exactly what gather_paged would write, when
// such a view exists:
//   * the cache dtype is fp32 (any other dtype needs a decode, i.e. a copy);
//   * 1 <= num_tokens <= P, so every token lies in block_ids[0], which is live;
//   * the kv's dim coordinate is one stride (x == D, or dim_outer == x *
//     dim_inner): NHD, HND and split-x V ([head][dim][token]); split-x K
//     ([head][dim/x][token][x]) only when P == 1.
// Otherwise std::nullopt: the caller runs gather_paged. Validates the request
// like gather_paged (everything but `out`, which it ignores) and throws the
// same errors. The view aliases the pool: it sees later writes to the block.
inline std::optional<TensorView> gather_view(const KvPools& pools, const GatherPagedOp& op) {
  read_copy_detail::validate_gather_source(pools, op);
  const PoolGeometry& g = pools.geometry;
  if (g.dtype != CacheDtype::fp32 || op.num_tokens < 1 || op.num_tokens > g.tokens_per_block) return std::nullopt;
  const BlockRef ref{op.block_ids[0]};
  if (ref.is_bad()) return std::nullopt;  // zeros are not in the pool
  const PoolStrides& s = pools.strides_of(PoolKind::primary);
  const InnerStrides& in = s.inner[op.kv];
  if (!(in.x == g.head_dim || in.dim_outer == static_cast<int64_t>(in.x) * in.dim_inner)) return std::nullopt;
  TensorView v;
  v.data = static_cast<float*>(pools.data[0]) + element_offset(s, ref.block(), op.layer, op.kv, 0, 0, 0);
  v.dtype = CacheDtype::fp32;
  v.rank = 3;
  v.shape[0] = op.num_tokens;
  v.shape[1] = g.kv_heads;
  v.shape[2] = g.head_dim;
  v.stride[0] = in.token;
  v.stride[1] = in.head;
  v.stride[2] = in.dim_inner;
  return v;
}

}  // namespace kvsim
