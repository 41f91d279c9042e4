// How a host row loop quantizes its nvfp4 blocks (write_pool_row's nvfp4
// rows, qkv_store_nvfp4_blocks): up to codec::kNvfp4RowBlocks consecutive
// blocks of x at a time, block b's 8 packed bytes at packed + 8b and its
// scale byte in scales[b]. The row loops take the quantizer as a parameter
// whose default is core's nvfp4_quantize_blocks; a backend may pass its own,
// which must give the same bytes as codec::nvfp4_quantize16 block by block
// for every input (the CPU's AVX-512 quantizer, backends/cpu/nvfp4_rows.cpp,
// held to it by tests/oracle/nvfp4_rows_test.cpp).
#pragma once

#include "codecs.hpp"

namespace kvsim {

struct CoreNvfp4Rows {
  KVSIM_HD void operator()(const float* x, int32_t blocks, float global_scale, uint8_t* packed,
                           uint8_t* scales) const {
    codec::nvfp4_quantize_blocks<codec::kNvfp4RowBlocks>(x, blocks, global_scale, packed, scales);
  }
};

}  // namespace kvsim
