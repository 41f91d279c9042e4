// One thread per work item: a grid-stride loop over [0, items) calling a
// functor that runs one of core's KVSIM_HD work-item functions. Each work
// item owns its output bytes (proved by validation), so the schedule cannot
// change a byte.
#pragma once

#include <algorithm>
#include <cstdint>

#include "backends/cuda/cuda_check.hpp"

namespace kvsim::cuda {

template <class Item>
__global__ void run_items_kernel(int64_t items, Item item) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; w < items; w += step) item(w);
}

inline constexpr int kItemThreads = 128;
inline constexpr int64_t kMaxItemBlocks = 132 * 32;  // enough to fill every SM; the loop covers the rest

template <class Item>
void launch_items(const char* op, const char* kernel, cudaStream_t stream, int64_t items, const Item& item) {
  if (items <= 0) return;
  const int64_t blocks = std::min<int64_t>((items + kItemThreads - 1) / kItemThreads, kMaxItemBlocks);
  run_items_kernel<<<static_cast<unsigned>(blocks), kItemThreads, 0, stream>>>(items, item);
  check_launch(op, kernel, stream);
}

}  // namespace kvsim::cuda
