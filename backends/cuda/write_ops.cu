// CUDA write ops (SPEC §5.1, §5.2, §5.4, §5.5): the CPU oracle's work items
// (core/ops/write_ops.hpp), one thread each, after the op's host index arrays
// are uploaded and swapped into the *Args struct make_*_args() built.
#include "backends/cuda/cuda_backend.hpp"
#include "backends/cuda/launch.cuh"

namespace kvsim {

namespace {

struct AppendPagedItem {
  KvPools pools;
  AppendPagedArgs args;
  int32_t heads;
  __device__ void operator()(int64_t w) const {
    append_paged_token_head(pools, args, w / heads, static_cast<int32_t>(w % heads));
  }
};

struct ReshapeAndCacheItem {
  KvPools pools;
  ReshapeAndCacheArgs args;
  int32_t heads;
  __device__ void operator()(int64_t w) const {
    reshape_and_cache_token_head(pools, args, w / heads, static_cast<int32_t>(w % heads));
  }
};

struct AppendMlaItem {
  KvPools pools;
  AppendMlaArgs args;
  __device__ void operator()(int64_t i) const { append_mla_token(pools, args, i); }
};

struct IndexerKScatterItem {
  IndexerKScatterArgs args;
  __device__ void operator()(int64_t t) const { indexer_k_scatter_token(args, t); }
};

// The CSR table and append coordinates on the device.
void upload_append_table(CudaBackend& b, const char* op, std::span<const int32_t> batch_indices,
                         std::span<const int32_t> positions, std::span<const int32_t> indptr,
                         std::span<const int32_t> indices, std::span<const int32_t> last_page_len,
                         const int32_t*& dev_batch_indices, const int32_t*& dev_positions, CsrPageTable& table) {
  const std::vector<const void*> d = b.upload(op, {batch_indices, positions, indptr, indices, last_page_len});
  dev_batch_indices = static_cast<const int32_t*>(d[0]);
  dev_positions = static_cast<const int32_t*>(d[1]);
  table.indptr = static_cast<const int32_t*>(d[2]);
  table.indices = static_cast<const int32_t*>(d[3]);
  table.last_page_len = static_cast<const int32_t*>(d[4]);
}

}  // namespace

void CudaBackend::run_append_paged(const KvPools& pools, const AppendPagedOp& op) {
  constexpr const char* kOp = "append_paged";
  AppendPagedArgs args = make_append_paged_args(pools, op);
  if (args.nnz == 0) return;
  upload_append_table(*this, kOp, op.batch_indices, op.positions, op.indptr, op.indices, op.last_page_len,
                      args.batch_indices, args.positions, args.table);
  const int32_t heads = pools.geometry.kv_heads;
  cuda::launch_items(kOp, "append_paged_token_head", stream_, args.nnz * heads, AppendPagedItem{pools, args, heads});
  finish(kOp);
}

void CudaBackend::run_reshape_and_cache(const KvPools& pools, const ReshapeAndCacheOp& op) {
  constexpr const char* kOp = "reshape_and_cache";
  ReshapeAndCacheArgs args = make_reshape_and_cache_args(pools, op);
  if (args.num_tokens == 0) return;
  args.slot_mapping = static_cast<const int64_t*>(upload(kOp, {op.slot_mapping})[0]);
  const int32_t heads = pools.geometry.kv_heads;
  cuda::launch_items(kOp, "reshape_and_cache_token_head", stream_, args.num_tokens * heads,
                     ReshapeAndCacheItem{pools, args, heads});
  finish(kOp);
}

void CudaBackend::run_append_mla(const KvPools& pools, const AppendMlaOp& op) {
  constexpr const char* kOp = "append_mla";
  AppendMlaArgs args = make_append_mla_args(pools, op);
  if (args.nnz == 0) return;
  upload_append_table(*this, kOp, op.batch_indices, op.positions, op.indptr, op.indices, op.last_page_len,
                      args.batch_indices, args.positions, args.table);
  cuda::launch_items(kOp, "append_mla_token", stream_, args.nnz, AppendMlaItem{pools, args});
  finish(kOp);
}

void CudaBackend::run_indexer_k_scatter(const IndexerKScatterOp& op) {
  constexpr const char* kOp = "indexer_k_scatter";
  IndexerKScatterArgs args = make_indexer_k_scatter_args(op);
  if (args.num_tokens == 0) return;
  const std::vector<const void*> d = upload(kOp, {op.slot_mapping_fp8, op.slot_mapping_scale});
  args.slot_mapping_fp8 = static_cast<const int64_t*>(d[0]);
  args.slot_mapping_scale = static_cast<const int64_t*>(d[1]);
  cuda::launch_items(kOp, "indexer_k_scatter_token", stream_, args.num_tokens, IndexerKScatterItem{args});
  finish(kOp);
}

}  // namespace kvsim
