// Staged attention kernels for 8-bit caches (attention_staged.cuh).
#include "backends/cuda/attention_staged.cuh"

namespace kvsim::cuda {

bool launch_staged_byte(const AttentionPlan& plan, cudaStream_t stream) {
  switch (plan.args.pools.geometry.dtype) {
    case CacheDtype::fp8_e4m3: return staged::launch_for_dtype<CacheDtype::fp8_e4m3>(plan, stream);
    case CacheDtype::fp8_e5m2: return staged::launch_for_dtype<CacheDtype::fp8_e5m2>(plan, stream);
    case CacheDtype::int8: return staged::launch_for_dtype<CacheDtype::int8>(plan, stream);
    default: return false;
  }
}

}  // namespace kvsim::cuda
