// Bulk attention kernels for 16- and 32-bit caches (attention_bulk.cuh).
#include "backends/cuda/attention_bulk.cuh"

namespace kvsim::cuda {

bool launch_bulk_wide(const AttentionPlan& plan, cudaStream_t stream, KernelInfo* info) {
  switch (plan.args.pools.geometry.dtype) {
    case CacheDtype::fp32: return bulk::dispatch<CacheDtype::fp32>(plan, stream, info);
    case CacheDtype::fp16: return bulk::dispatch<CacheDtype::fp16>(plan, stream, info);
    case CacheDtype::bf16: return bulk::dispatch<CacheDtype::bf16>(plan, stream, info);
    default: return false;
  }
}

}  // namespace kvsim::cuda
