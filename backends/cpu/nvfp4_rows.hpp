// The CPU backend's nvfp4 block quantizer, per ISA: what core's host row loops
// (write_pool_row's nvfp4 rows, write_kv_rows' K and V rows together,
// qkv_store_nvfp4_blocks) call for up to kNvfp4CallBlocks blocks of one or
// two rows at a time (kvsim/core/nvfp4_rows.hpp). Every ISA gives
// codec::nvfp4_quantize16's bytes of the loaded floats block by block, for
// every input, dtype and global scale (tests/oracle/nvfp4_rows_test.cpp).
#pragma once

#include <cstdint>

#include "backends/cpu/cpu_isa.hpp"
#include "kvsim/core/nvfp4_rows.hpp"

namespace kvsim::cpu_nvfp4 {

// rows[0..nrows) (nrows 1 or 2) of `blocks` blocks each, nrows * blocks <=
// kMaxBlocks (Nvfp4Row: input, dtype, global scale and outputs per row).
using RowsFn = void (*)(const Nvfp4Row* rows, int32_t nrows, int32_t blocks);
inline constexpr int32_t kMaxBlocks = kNvfp4CallBlocks;

// portable: core's CoreNvfp4Rows (baseline x86-64); avx2 and avx512: the
// explicit quantizers of those ISAs. The ISA must be one this CPU runs.
RowsFn rows_at(CpuIsa isa);

// The quantizer argument of core's row loops: a call through fn.
struct Rows {
  RowsFn fn;
  void operator()(const Nvfp4Row* rows, int32_t nrows, int32_t blocks) const { fn(rows, nrows, blocks); }
};

}  // namespace kvsim::cpu_nvfp4
