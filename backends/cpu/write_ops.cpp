// CPU write ops (contract §5.1, §5.2, §5.4): loops only (append_mla and
// indexer_k_scatter are items-form ops: item_ops.cpp).
// Every byte written comes from core's work-item functions in
// core/ops/write_ops.hpp; validation (Backend's entry points) has already
// proved that no two work items share a byte, so any thread count gives the
// same pools.
#include "backends/cpu/cpu_backend.hpp"

namespace kvsim {

void CpuBackend::run_append_paged(const KvPools& pools, const AppendPagedOp& op) {
  const AppendPagedArgs args = make_append_paged_args(pools, op);
  const int32_t heads = pools.geometry.kv_heads;
  for_each_item(args.nnz * heads, [&](int64_t w) {
    append_paged_token_head(pools, args, w / heads, static_cast<int32_t>(w % heads));
  });
}

void CpuBackend::run_reshape_and_cache(const KvPools& pools, const ReshapeAndCacheOp& op) {
  const ReshapeAndCacheArgs args = make_reshape_and_cache_args(pools, op);
  const int32_t heads = pools.geometry.kv_heads;
  for_each_item(args.num_tokens * heads, [&](int64_t w) {
    reshape_and_cache_token_head(pools, args, w / heads, static_cast<int32_t>(w % heads));
  });
}

}  // namespace kvsim
