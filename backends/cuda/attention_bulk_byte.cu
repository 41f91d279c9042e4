// Bulk attention kernels for 8-bit caches (attention_bulk.cuh). Split from
// the 16/32-bit instantiations so the two compile in parallel.
#include "backends/cuda/attention_bulk.cuh"

namespace kvsim::cuda {

bool launch_bulk_byte(const AttentionPlan& plan, cudaStream_t stream, KernelInfo* info) {
  switch (plan.args.pools.geometry.dtype) {
    case CacheDtype::fp8_e4m3: return bulk::dispatch<CacheDtype::fp8_e4m3>(plan, stream, info);
    case CacheDtype::fp8_e5m2: return bulk::dispatch<CacheDtype::fp8_e5m2>(plan, stream, info);
    case CacheDtype::int8: return bulk::dispatch<CacheDtype::int8>(plan, stream, info);
    default: return false;
  }
}

}  // namespace kvsim::cuda
