// Staged attention kernels for 16- and 32-bit caches (attention_staged.cuh).
// Split from the 8-bit instantiations so the two compile in parallel.
#include "backends/cuda/attention_staged.cuh"

namespace kvsim::cuda {

bool launch_staged_wide(const AttentionPlan& plan, cudaStream_t stream) {
  switch (plan.args.pools.geometry.dtype) {
    case CacheDtype::fp32: return staged::launch_for_dtype<CacheDtype::fp32>(plan, stream);
    case CacheDtype::fp16: return staged::launch_for_dtype<CacheDtype::fp16>(plan, stream);
    case CacheDtype::bf16: return staged::launch_for_dtype<CacheDtype::bf16>(plan, stream);
    default: return false;
  }
}

}  // namespace kvsim::cuda
