// CPU oracle of the read and block-copy ops (contract §5.6, §5.9): loops only.
// Every value and offset comes from core's work-item functions in
// core/ops/read_copy_ops.hpp; each work item owns its output bytes, so the
// result is the same for any thread count.
#include <cstring>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "backends/cpu/cpu_backend.hpp"

namespace kvsim {

void CpuBackend::run_gather_paged(const KvPools& pools, const GatherPagedOp& op) {
  if (op.num_tokens == 0) return;
  const GatherPagedArgs args = make_gather_paged_args(pools, op);
  const int32_t heads = pools.geometry.kv_heads;
  float code_values[256];
  const bool byte_codes = bits_per_element(pools.geometry.dtype) == 8;
  if (byte_codes) gather_code_values(args, code_values);
  for_each_item(op.num_tokens * heads, [&](int64_t i) {  // one item per (token, head)
    gather_paged_row(args, i / heads, static_cast<int32_t>(i % heads), byte_codes ? code_values : nullptr);
  });
}

namespace {

// Runs every row of every (src, dst) block pair; pair_at(p) yields the pair's
// block indices. Pairs are independent (validated), so rows of all pairs run
// concurrently.
template <class PairAt>
void copy_block_rows(CpuBackend& b, const BlockCopyArgs& args, int64_t pairs, PairAt pair_at) {
  if (args.run_bytes > 0) {  // each block one run of bytes: one copy per pair
    b.for_each_item(
        pairs,
        [&](int64_t i) {
          const std::pair<int64_t, int64_t> p = pair_at(i);
          copy_block_run(args, p.first, p.second, 0, args.run_bytes + args.scale_run_bytes);
        },
        args.run_bytes + args.scale_run_bytes);
    return;
  }
  if (args.layer_run_bytes > 0) {  // per_layer pools: one run per (block, layer)
    b.for_each_item(
        pairs * args.layers,
        [&](int64_t i) {
          const std::pair<int64_t, int64_t> p = pair_at(i / args.layers);
          copy_block_layer_run(args, p.first, p.second, static_cast<int32_t>(i % args.layers));
        },
        args.layer_run_bytes + args.scale_layer_run_bytes);
    return;
  }
  const int64_t rows = args.rows_per_block();
  b.for_each_item(
      pairs * rows,
      [&](int64_t i) {
        const std::pair<int64_t, int64_t> p = pair_at(i / rows);
        copy_block_row(args, p.first, p.second, i % rows);
      },
      (static_cast<int64_t>(args.head_dim) * bits_per_element(args.dtype) + 7) / 8);  // one row of one token
}

}  // namespace

void CpuBackend::run_partial_copy(const KvPools& pools, const PartialCopyOp& op) {
  const PoolGeometry& g = pools.geometry;
  // n <= 0 is the whole-block sentinel; nvfp4 always copies whole blocks.
  const int32_t tokens = (op.num_tokens <= 0 || g.dtype == CacheDtype::nvfp4) ? g.tokens_per_block : op.num_tokens;
  const BlockCopyArgs args = make_block_copy_args(pools, PoolKind::primary, PoolKind::primary, tokens);
  const std::pair<int64_t, int64_t> pair{BlockRef{op.src_block}.block(), BlockRef{op.dst_block}.block()};
  copy_block_rows(*this, args, 1, [&](int64_t) { return pair; });
}

void CpuBackend::run_copy_blocks(const KvPools& pools, const CopyBlocksOp& op) {
  if (op.pairs.empty()) return;
  const BlockCopyArgs args =
      make_block_copy_args(pools, PoolKind::primary, PoolKind::primary, pools.geometry.tokens_per_block);
  copy_block_rows(*this, args, static_cast<int64_t>(op.pairs.size()), [&](int64_t p) {
    return std::pair<int64_t, int64_t>{BlockRef{op.pairs[p].first}.block(), BlockRef{op.pairs[p].second}.block()};
  });
}

void CpuBackend::run_offload(const KvPools& pools, const MoveBlocksOp& op) { move_blocks(pools, op, /*to_secondary=*/true); }
void CpuBackend::run_onboard(const KvPools& pools, const MoveBlocksOp& op) { move_blocks(pools, op, /*to_secondary=*/false); }

void CpuBackend::move_blocks(const KvPools& pools, const MoveBlocksOp& op, bool to_secondary) {
  if (op.primary.empty()) return;
  const PoolKind src = to_secondary ? PoolKind::primary : PoolKind::secondary;
  const PoolKind dst = to_secondary ? PoolKind::secondary : PoolKind::primary;
  const std::span<const int32_t> src_ids = to_secondary ? op.primary : op.secondary;
  const std::span<const int32_t> dst_ids = to_secondary ? op.secondary : op.primary;
  const BlockCopyArgs args = make_block_copy_args(pools, src, dst, pools.geometry.tokens_per_block);
  copy_block_rows(*this, args, static_cast<int64_t>(src_ids.size()), [&](int64_t p) {
    return std::pair<int64_t, int64_t>{src_ids[p], dst_ids[p]};
  });
}

// The copy-bandwidth reference: memcpy in 1 MiB slices over the arena's threads.
void CpuBackend::run_copy(void* dst, const void* src, size_t bytes) {
  constexpr size_t kSlice = size_t{1} << 20;
  const size_t slices = (bytes + kSlice - 1) / kSlice;
  arena_.execute([&] {
    tbb::parallel_for(tbb::blocked_range<size_t>(0, slices), [&](const tbb::blocked_range<size_t>& r) {
      const size_t begin = r.begin() * kSlice, end = std::min(bytes, r.end() * kSlice);
      std::memcpy(static_cast<uint8_t*>(dst) + begin, static_cast<const uint8_t*>(src) + begin, end - begin);
    });
  });
}

}  // namespace kvsim
