// What the tiled prefill kernels of both orders share (attention_prefill.cu:
// the fp32 order, attention_prefill_mma.cu: the mma order): a prefill op cut
// into blocks of consecutive query rows of one sequence, the conditions on the
// pool that let a kernel read a K/V row as one run of codes, and the upload of
// the blocks and the page table.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include <kvsim/core/ops/attention.hpp>

#include "backends/cuda/attention_plan.cuh"
#include "backends/cuda/cuda_check.hpp"

namespace kvsim::cuda {

// A block of consecutive query rows of one sequence. Without a window key j
// of every row is cache slot j, so the rows of a block share every K/V tile
// and differ only in where their key lists end.
struct RowBlock {
  int32_t seq = 0;
  int32_t first_row = 0;       // row of q / out
  int32_t rows = 0;            // 1 .. rows_per_block
  int32_t first_position = 0;  // absolute position of first_row
  int64_t stats_first = 0;     // the mma kernel's first partition-max slot (unused by the fp32 kernel)
};

// A CTA's row block with the page size: where each of its rows' attended keys
// (0..p) and key list (to the end of p's page) end; rows past the block have
// none. The block's last row has the longest of both.
struct BlockKeys {
  RowBlock blk;
  PageDivider page;
  KVSIM_HD constexpr int64_t attended_end(int r) const {
    return r < blk.rows ? int64_t{blk.first_position} + r + 1 : 0;
  }
  KVSIM_HD constexpr int64_t list_end(int r) const {
    if (r >= blk.rows) return 0;
    const int64_t p = int64_t{blk.first_position} + r;
    return p + 1 + (page.page_size - 1 - page.mod(p));
  }
  KVSIM_HD constexpr int64_t attended() const { return attended_end(blk.rows - 1); }
  KVSIM_HD constexpr int64_t listed() const { return list_end(blk.rows - 1); }  // also the end of the slots read
};

// The op's rows in blocks of up to rows_per_block, longest key lists first
// (the causal triangle's heavy blocks start early).
std::vector<RowBlock> make_row_blocks(const PrefillAttentionOp& op, int32_t rows_per_block);

// K and V head rows are contiguous, 16-byte aligned runs of codes at every
// slot (element_offset(.., d) = row start + d), and the pool holds K and V.
bool prefill_rows_contiguous(const KvPools& pools);

// The blocks and the op's page table on the device, and the kernel's
// arguments pointing at that table; `extra_bytes` more (256-byte aligned) for
// the kernel's own scratch. release() frees it on the stream after the launch.
struct PrefillUpload {
  AttentionArgs args;
  const RowBlock* blocks = nullptr;
  void* extra = nullptr;
  void* meta = nullptr;
  void release(cudaStream_t stream);
};
PrefillUpload upload_prefill(const char* name, const KvPools& pools, const PrefillAttentionOp& op, int32_t group,
                             const std::vector<RowBlock>& blocks, size_t extra_bytes, cudaStream_t stream);

// Gives a tiled prefill kernel its dynamic shared memory; with `info`, fills
// in the kernel's resources and returns true (the caller then launches
// nothing), else returns false.
template <class Kernel>
bool prefill_kernel_setup(Kernel kernel, int threads, int smem, int tile_keys, int stages, KernelInfo* info) {
  KVSIM_CUDA_CHECK("prefill_attention", cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  if (!info) return false;
  cudaFuncAttributes attr{};
  KVSIM_CUDA_CHECK("prefill_attention", cudaFuncGetAttributes(&attr, kernel));
  int per_sm = 0;
  KVSIM_CUDA_CHECK("prefill_attention", cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  *info = KernelInfo{attr.numRegs, smem, per_sm, threads / 32, tile_keys, stages};
  return true;
}

}  // namespace kvsim::cuda
