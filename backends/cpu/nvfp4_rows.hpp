// The CPU backend's nvfp4 block quantizer, per ISA: what core's host row loops
// (write_pool_row's nvfp4 rows, qkv_store_nvfp4_blocks) call for up to
// codec::kNvfp4RowBlocks blocks at a time (kvsim/core/nvfp4_rows.hpp). Every
// ISA gives codec::nvfp4_quantize16's bytes block by block, for every input
// and every global scale (tests/oracle/nvfp4_rows_test.cpp).
#pragma once

#include <cstdint>

#include "backends/cpu/cpu_isa.hpp"

namespace kvsim::cpu_nvfp4 {

// `blocks` (1..kMaxBlocks) consecutive 16-element blocks of x: block b's 8
// packed bytes at packed + 8b (element 2i in the low nibble of byte i), its
// e4m3 scale byte in scales[b].
using RowsFn = void (*)(const float* x, int32_t blocks, float global_scale, uint8_t* packed, uint8_t* scales);
inline constexpr int32_t kMaxBlocks = 16;

// portable: core's nvfp4_quantize_blocks (baseline x86-64); avx2: the same
// C++ compiled for AVX2; avx512: the explicit AVX-512 quantizer. The ISA must
// be one this CPU runs.
RowsFn rows_at(CpuIsa isa);

// The quantizer argument of core's row loops: a call through fn.
struct Rows {
  RowsFn fn;
  void operator()(const float* x, int32_t blocks, float global_scale, uint8_t* packed, uint8_t* scales) const {
    fn(x, blocks, global_scale, packed, scales);
  }
};

}  // namespace kvsim::cpu_nvfp4
