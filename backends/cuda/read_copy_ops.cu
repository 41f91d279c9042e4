// CUDA gather and block copies (contract §5.6, §5.9): core's
// gather_paged_token_head and copy_block_row, one thread per work item.
// offload / onboard between the device pool and the pinned secondary pool are
// asynchronous DMA copies (cudaMemcpy(2D)Async) when both pools have the
// contiguous strides allocate_pools gives them: then each (block, layer) of
// data and scales is one run of bytes whose start comes from element_offset().
// Pools with caller strides fall back to copy_block_row in a kernel, which
// reaches pinned host memory through unified addressing.
#include <utility>
#include <vector>

#include "backends/cuda/cuda_backend.hpp"
#include "backends/cuda/launch.cuh"

namespace kvsim {

namespace {

// Row = token, i = (head, chunk), chunk fastest.
struct GatherItem {
  GatherPagedArgs args;
  int32_t chunks;
  __device__ void operator()(int64_t t, int32_t i) const { gather_paged_chunk(args, t, i / chunks, i % chunks); }
};

// Row = pair, i = an item of up to kCopyWords 16-byte chunks of a block that
// is one run of bytes: chunks i, i + groups, ... (< chunks), so that each of a
// warp's accesses is one run and every item's loads are in flight together.
struct CopyRunItem {
  BlockCopyArgs args;
  const int32_t* src_blocks;
  const int32_t* dst_blocks;
  int64_t chunks, groups;
  __device__ void operator()(int64_t p, int32_t i) const {
    const int32_t n = static_cast<int32_t>((chunks - i + groups - 1) / groups);
    copy_block_run_chunks(args, BlockRef{src_blocks[p]}.block(), BlockRef{dst_blocks[p]}.block(), i, n, groups);
  }
};

// Row = (pair, block row), i = 16-byte chunk: a warp moves consecutive bytes;
// the pairs' block indices are on the device.
struct CopyRowsItem {
  BlockCopyArgs args;
  const int32_t* src_blocks;
  const int32_t* dst_blocks;
  int64_t rows;
  __device__ void operator()(int64_t row, int32_t chunk) const {
    const int64_t p = row / rows;
    copy_block_row_chunk(args, BlockRef{src_blocks[p]}.block(), BlockRef{dst_blocks[p]}.block(), row - p * rows, chunk);
  }
};

void launch_copy_rows(CudaBackend& b, const char* op, const BlockCopyArgs& args, std::span<const int32_t> src,
                      std::span<const int32_t> dst) {
  const std::vector<const void*> d = b.upload(op, {src, dst});
  const int64_t rows = args.rows_per_block();
  b.begin_kernels();
  const auto* src_blocks = static_cast<const int32_t*>(d[0]);
  const auto* dst_blocks = static_cast<const int32_t*>(d[1]);
  if (args.run_bytes > 0) {
    const int64_t chunks = (args.run_bytes + args.scale_run_bytes + 15) / 16;
    const int64_t groups = (chunks + kCopyWords - 1) / kCopyWords;
    if (groups <= INT32_MAX) {
      // 64 registers, 4 CTAs of 256 per SM: up to 64 KB of loads in flight per SM.
      cuda::launch_row_items<4>(op, "copy_block_run_chunks", b.stream(), static_cast<int64_t>(src.size()),
                                static_cast<int32_t>(groups), CopyRunItem{args, src_blocks, dst_blocks, chunks, groups});
      return;
    }
  }
  const int64_t all_rows = static_cast<int64_t>(src.size()) * rows;
  const int32_t chunks = row_chunks(args.head_dim, args.dtype);
  cuda::launch_row_items(op, "copy_block_row_chunk", b.stream(), all_rows, chunks,
                         CopyRowsItem{args, src_blocks, dst_blocks, rows});
}

// One block's runs from src to dst (make_block_copy_args' layer_run_bytes >
// 0): the whole block where it is one run (in_block), else one run per layer;
// then the same for the scale pool.
void copy_block_runs(const char* op, cudaStream_t stream, const KvPools& pools, const BlockCopyArgs& a,
                     int64_t src_block, int64_t dst_block) {
  const PoolGeometry& g = pools.geometry;
  auto runs = [&](const uint8_t* src, const PoolStrides& ss, uint8_t* dst, const PoolStrides& ds, CacheDtype dtype,
                  int64_t block_run, int64_t layer_run) {
    const int32_t n = block_run > 0 ? 1 : g.layers;
    for (int32_t layer = 0; layer < n; ++layer) {
      const int64_t so = element_byte_offset(element_offset(ss, src_block, layer, 0, 0, 0, 0), dtype);
      const int64_t d0 = element_byte_offset(element_offset(ds, dst_block, layer, 0, 0, 0, 0), dtype);
      KVSIM_CUDA_CHECK(op, cudaMemcpyAsync(dst + d0, src + so, block_run > 0 ? block_run : layer_run,
                                           cudaMemcpyDefault, stream));
    }
  };
  runs(a.src_data, a.src_strides, a.dst_data, a.dst_strides, g.dtype, a.run_bytes, a.layer_run_bytes);
  if (g.has_scale_pool())
    runs(a.src_scales, a.src_scale_strides, a.dst_scales, a.dst_scale_strides, g.scale_geometry().dtype,
         a.scale_run_bytes, a.scale_layer_run_bytes);
}

}  // namespace

void CudaBackend::run_gather_paged(const KvPools& pools, const GatherPagedOp& op) {
  constexpr const char* kOp = "gather_paged";
  if (op.num_tokens == 0) return;
  GatherPagedArgs args = make_gather_paged_args(pools, op);
  // Only the pages the read touches were validated; upload exactly those.
  const int64_t P = pools.geometry.tokens_per_block;
  const std::span<const int32_t> pages = op.block_ids.first(static_cast<size_t>((op.num_tokens + P - 1) / P));
  args.block_ids = static_cast<const int32_t*>(upload(kOp, {pages})[0]);
  const int32_t heads = pools.geometry.kv_heads, chunks = row_chunks(pools.geometry.head_dim, pools.geometry.dtype);
  begin_kernels();
  cuda::launch_row_items(kOp, "gather_paged_chunk", stream_, op.num_tokens, heads * chunks, GatherItem{args, chunks});
  finish(kOp);
}

void CudaBackend::run_partial_copy(const KvPools& pools, const PartialCopyOp& op) {
  constexpr const char* kOp = "partial_copy";
  const PoolGeometry& g = pools.geometry;
  // n <= 0 is the whole-block sentinel; nvfp4 always copies whole blocks.
  const int32_t tokens = (op.num_tokens <= 0 || g.dtype == CacheDtype::nvfp4) ? g.tokens_per_block : op.num_tokens;
  const BlockCopyArgs args = make_block_copy_args(pools, PoolKind::primary, PoolKind::primary, tokens);
  const int32_t src[1] = {op.src_block}, dst[1] = {op.dst_block};
  launch_copy_rows(*this, kOp, args, src, dst);
  finish(kOp);
}

void CudaBackend::run_copy_blocks(const KvPools& pools, const CopyBlocksOp& op) {
  constexpr const char* kOp = "copy_blocks";
  if (op.pairs.empty()) return;
  const BlockCopyArgs args =
      make_block_copy_args(pools, PoolKind::primary, PoolKind::primary, pools.geometry.tokens_per_block);
  std::vector<int32_t> src, dst;
  for (const auto& [s, d] : op.pairs) {
    src.push_back(s);
    dst.push_back(d);
  }
  launch_copy_rows(*this, kOp, args, src, dst);
  finish(kOp);
}

void CudaBackend::run_offload(const KvPools& pools, const MoveBlocksOp& op) { move_blocks(pools, op, /*to_secondary=*/true); }
void CudaBackend::run_onboard(const KvPools& pools, const MoveBlocksOp& op) { move_blocks(pools, op, /*to_secondary=*/false); }

void CudaBackend::move_blocks(const KvPools& pools, const MoveBlocksOp& op, bool to_secondary) {
  const char* kOp = to_secondary ? "offload" : "onboard";
  if (op.primary.empty()) return;
  const PoolGeometry& g = pools.geometry;
  const PoolKind src = to_secondary ? PoolKind::primary : PoolKind::secondary;
  const PoolKind dst = to_secondary ? PoolKind::secondary : PoolKind::primary;
  const std::span<const int32_t> src_ids = to_secondary ? op.primary : op.secondary;
  const std::span<const int32_t> dst_ids = to_secondary ? op.secondary : op.primary;

  const BlockCopyArgs args = make_block_copy_args(pools, src, dst, g.tokens_per_block);
  if (args.layer_run_bytes == 0) {  // engine strides: row by row
    launch_copy_rows(*this, kOp, args, src_ids, dst_ids);
    finish(kOp);
    return;
  }
  begin_kernels();
  for (size_t i = 0; i < src_ids.size(); ++i) copy_block_runs(kOp, stream_, pools, args, src_ids[i], dst_ids[i]);
  finish(kOp);
}

void CudaBackend::run_copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  begin_kernels();
  KVSIM_CUDA_CHECK("copy", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  finish("copy");
}

namespace {
// One thread per lane, its canon::kFmaProbeChains chains interleaved: enough
// independent FFMAs per warp to cover the pipeline's latency.
__global__ void fma_probe_kernel(float* out, int64_t lanes, int32_t steps) {
  const int64_t lane = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (lane >= lanes) return;
  float x[canon::kFmaProbeChains];
#pragma unroll
  for (int c = 0; c < canon::kFmaProbeChains; ++c) x[c] = canon::fma_probe_seed(lane, c);
  for (int32_t s = 0; s < steps; ++s)
#pragma unroll
    for (int c = 0; c < canon::kFmaProbeChains; ++c) x[c] = canon::fma_f32(x[c], canon::kFmaProbeA, canon::kFmaProbeB);
#pragma unroll
  for (int c = 0; c < canon::kFmaProbeChains; ++c) out[lane * canon::kFmaProbeChains + c] = x[c];
}
}  // namespace

void CudaBackend::run_fma_probe(float* out, int64_t lanes, int32_t steps) {
  if (lanes == 0) return;
  begin_kernels();
  constexpr int kThreads = 256;
  fma_probe_kernel<<<static_cast<unsigned>((lanes + kThreads - 1) / kThreads), kThreads, 0, stream_>>>(out, lanes, steps);
  cuda::check_launch("fma_probe", "fma_probe_kernel", stream_);
  finish("fma_probe");
}

}  // namespace kvsim
