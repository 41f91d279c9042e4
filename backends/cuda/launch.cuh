// One thread per work item: a grid-stride loop over [0, items) calling a
// functor that runs one of core's KVSIM_HD work-item functions (or, for row
// items, a 32-bit grid of rows x items per row). Each work
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
inline constexpr int64_t kItemBlocksPerSm = 32;  // enough to fill every SM; the loop covers the rest

template <class Item>
void launch_items(const char* op, const char* kernel, cudaStream_t stream, int64_t items, const Item& item) {
  if (items <= 0) return;
  const int64_t max_blocks = device_sm_count(op) * kItemBlocksPerSm;
  const int64_t blocks = std::min<int64_t>((items + kItemThreads - 1) / kItemThreads, max_blocks);
  run_items_kernel<<<static_cast<unsigned>(blocks), kItemThreads, 0, stream>>>(items, item);
  check_launch(op, kernel, stream);
}

// Rows of `per_row` work items each, one thread per item: item(row, i) for
// row in [0, rows), i in [0, per_row). Consecutive threads take consecutive
// i of a row, so a warp's chunk items touch consecutive bytes. Index math is
// 32-bit (one division per thread) when rows * per_row < 2^32: the 64-bit
// divisions of the grid-stride form cost more instructions than the 16-byte
// move each item makes.
// kMinBlocks > 1 caps registers so that many CTAs fit an SM (more 16-byte
// moves in flight): for kernels whose items only move bytes.
template <int kMinBlocks, class Item>
__global__ void __launch_bounds__(256, kMinBlocks) run_row_items32_kernel(uint32_t items, uint32_t per_row, Item item) {
  const uint32_t w = blockIdx.x * blockDim.x + threadIdx.x;
  if (w >= items) return;
  const uint32_t row = w / per_row;
  item(static_cast<int64_t>(row), static_cast<int32_t>(w - row * per_row));
}

inline constexpr int kRowItemThreads = 256;

template <class Item>
struct RowItemAdapter {
  Item item;
  int64_t per_row;
  __device__ void operator()(int64_t w) const { item(w / per_row, static_cast<int32_t>(w % per_row)); }
};

template <int kMinBlocks = 1, class Item>
void launch_row_items(const char* op, const char* kernel, cudaStream_t stream, int64_t rows, int32_t per_row,
                      const Item& item) {
  static_assert(kRowItemThreads == 256, "the kernel's launch bounds assume 256 threads");
  const int64_t items = rows * per_row;
  if (items <= 0) return;
  if (items < (int64_t{1} << 32)) {
    const int64_t blocks = (items + kRowItemThreads - 1) / kRowItemThreads;
    run_row_items32_kernel<kMinBlocks><<<static_cast<unsigned>(blocks), kRowItemThreads, 0, stream>>>(
        static_cast<uint32_t>(items), static_cast<uint32_t>(per_row), item);
    check_launch(op, kernel, stream);
    return;
  }
  launch_items(op, kernel, stream, items, RowItemAdapter<Item>{item, per_row});
}

}  // namespace kvsim::cuda
