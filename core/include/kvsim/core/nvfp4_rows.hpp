// How a host row loop quantizes its nvfp4 blocks (write_pool_row's nvfp4
// rows, write_kv_rows' K and V rows together, qkv_store_nvfp4_blocks): one
// call takes up to kNvfp4CallBlocks blocks of one or two rows (an item's K
// and V rows of D <= 128: 16 blocks), each row with its own input, dtype,
// global scale and outputs. Block b of a row: its 16 input elements at
// x + 16b (consecutive elements of `dtype`), its 8 packed bytes at packed + 8b
// (element 2i in the low nibble of byte i), its scale byte in scales[b]. The
// row loops point packed and scales straight into the pools where those are
// runs of bytes, else at stack buffers that they scatter. The row loops take
// the quantizer as a parameter whose default is CoreNvfp4Rows (core's
// nvfp4_quantize_blocks); a backend may pass its own, which must give the same
// bytes as codec::nvfp4_quantize16 of the loaded floats, block by block, for
// every input (the CPU's AVX-512 and AVX2 quantizers,
// backends/cpu/nvfp4_rows.cpp, held to it by tests/oracle/nvfp4_rows_test.cpp).
#pragma once

#include "codecs.hpp"
#include "tensor.hpp"

namespace kvsim {

struct Nvfp4Row {
  const void* x = nullptr;
  CacheDtype dtype = CacheDtype::fp32;  // fp32, fp16 or bf16 (load_float's)
  float global_scale = 1.0f;
  uint8_t* packed = nullptr;
  uint8_t* scales = nullptr;
};

// The most blocks one quantizer call takes (nrows * blocks): a CPU's fixed
// per-call work (the scale chain's two divisions) over 256 elements.
inline constexpr int32_t kNvfp4CallBlocks = 16;

struct CoreNvfp4Rows {
  // rows[0..nrows) of `blocks` blocks each, nrows * blocks <= kNvfp4CallBlocks.
  KVSIM_HD void operator()(const Nvfp4Row* rows, int32_t nrows, int32_t blocks) const {
    constexpr int kBlocks = codec::kNvfp4RowBlocks, kElems = codec::kNvfp4BlockElems;
    for (int32_t r = 0; r < nrows; ++r)
      for (int32_t b0 = 0; b0 < blocks; b0 += kBlocks) {
        const int32_t n = blocks - b0 < kBlocks ? blocks - b0 : kBlocks;
        float x[kBlocks * kElems];
        load_floats(rows[r].x, rows[r].dtype, static_cast<int64_t>(b0) * kElems, 1, n * kElems, x);
        codec::nvfp4_quantize_blocks<kBlocks>(x, n, rows[r].global_scale, rows[r].packed + b0 * kElems / 2,
                                              rows[r].scales + b0);
      }
  }
};

}  // namespace kvsim
