// The nvfp4 edge blocks: 4,000 rows of 1..8 blocks (18,000 blocks) over
// values that reach every branch of the codecs -- NaN, +-Inf, +-0,
// subnormals, e2m1 midpoints, values that saturate the scale, any bits and
// ordinary values -- each row with one of five global scales. Any row form
// of the nvfp4 quantizer is held to codec::nvfp4_quantize16 on them
// (tests/core/codecs_edge_test.cpp: core's nvfp4_quantize_blocks;
// tests/oracle/nvfp4_rows_test.cpp: the CPU backend's, at every ISA).
#pragma once

#include <bit>
#include <cstdint>
#include <limits>

namespace kvsim::testing {

inline constexpr int kNvfp4EdgeRows = 4000;
inline constexpr int64_t kNvfp4EdgeBlocks = 18000;

// f(row, blocks, g, x) for each row, x holding blocks * 16 floats.
template <class F>
void for_each_nvfp4_edge_row(F&& f) {
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), 0.0f, -0.0f, 1e-45f, -3e-39f, 0.25f, 0.75f,
                            -1.25f, 1.75f, 2.5f, -3.5f, 5.0f, 6.0f, 1e30f, -65504.0f, 448.0f * 6.0f};
  uint64_t state = 0x9E3779B97F4A7C15ull;
  const auto next = [&] {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return state;
  };
  const float globals[] = {1.0f, 0.5f, 3.0e-3f, 1.0f / 448.0f, 7.0f};
  for (int row = 0; row < kNvfp4EdgeRows; ++row) {
    const int blocks = 1 + row % 8;
    const float g = globals[row % 5];
    float x[8 * 16];
    for (int i = 0; i < blocks * 16; ++i) {
      const uint64_t r = next();
      switch (r % 4) {
        case 0: x[i] = specials[(r >> 8) % (sizeof specials / sizeof specials[0])]; break;
        case 1: x[i] = std::bit_cast<float>(static_cast<uint32_t>(r >> 16)); break;  // any bits
        default: x[i] = (static_cast<float>((r >> 16) % 20001) - 10000.0f) * 1e-3f * (1 + (r >> 40) % 50); break;
      }
    }
    f(row, blocks, g, static_cast<const float*>(x));
  }
}

}  // namespace kvsim::testing
