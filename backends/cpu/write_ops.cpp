// CPU oracle of the write ops (contract §5.1, §5.2, §5.4, §5.5): loops only.
// Every byte written comes from core's work-item functions in
// core/ops/write_ops.hpp; validation (Backend's entry points) has already
// proved that no two work items share a byte, so any thread count gives the
// same pools.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "backends/cpu/cpu_backend.hpp"

namespace kvsim {

namespace {

// Runs body(w) for w in [0, items) on the arena's threads.
template <class Body>
void for_each_item(tbb::task_arena& arena, int64_t items, const Body& body) {
  if (items <= 0) return;
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, items), [&](const tbb::blocked_range<int64_t>& r) {
      for (int64_t w = r.begin(); w < r.end(); ++w) body(w);
    });
  });
}

}  // namespace

void CpuBackend::run_append_paged(const KvPools& pools, const AppendPagedOp& op) {
  const AppendPagedArgs args = make_append_paged_args(pools, op);
  const int32_t heads = pools.geometry.kv_heads;
  for_each_item(arena_, args.nnz * heads, [&](int64_t w) {
    append_paged_token_head(pools, args, w / heads, static_cast<int32_t>(w % heads));
  });
}

void CpuBackend::run_reshape_and_cache(const KvPools& pools, const ReshapeAndCacheOp& op) {
  const ReshapeAndCacheArgs args = make_reshape_and_cache_args(pools, op);
  const int32_t heads = pools.geometry.kv_heads;
  for_each_item(arena_, args.num_tokens * heads, [&](int64_t w) {
    reshape_and_cache_token_head(pools, args, w / heads, static_cast<int32_t>(w % heads));
  });
}

void CpuBackend::run_append_mla(const KvPools& pools, const AppendMlaOp& op) {
  const AppendMlaArgs args = make_append_mla_args(pools, op);
  for_each_item(arena_, args.nnz, [&](int64_t i) { append_mla_token(pools, args, i); });
}

void CpuBackend::run_indexer_k_scatter(const IndexerKScatterOp& op) {
  const IndexerKScatterArgs args = make_indexer_k_scatter_args(op);
  for_each_item(arena_, args.num_tokens, [&](int64_t t) { indexer_k_scatter_token(args, t); });
}

}  // namespace kvsim
