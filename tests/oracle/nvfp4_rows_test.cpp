// The CPU backend's nvfp4 quantizers (backends/cpu/nvfp4_rows.hpp: core's
// row form at portable, the explicit AVX2 and AVX-512 ones) against
// codec::nvfp4_quantize16, block by block, at every ISA this machine runs:
//   * the edge blocks (tests/support/nvfp4_edge_blocks.hpp: 18,000 blocks of
//     NaN, +-Inf, +-0, subnormals, e2m1 midpoints, saturating scales) under
//     each of their own global scales and under tiny, huge, subnormal,
//     overflowing, Inf, NaN, zero and negative ones (validation admits only
//     finite g > 0; the quantizer is held to core's bytes for any float);
//   * rows of 1..16 blocks of random bits and of normal-ish values (a sum of
//     uniforms times a power of two per block), some on e2m1's midpoints
//     exactly; each call also as two rows (an item's K and V) under two
//     global scales;
//   * bf16 and fp16 rows, read in place by the quantizer, one or two a call;
//   * every fp32 y through the codes step: blocks whose multiplier is 1
//     (g = 1, one element 6), every other element one fp32 bit pattern of
//     magnitude <= 6.375 (the amax that still gives scale 1.0) or NaN, each
//     nibble against codec::f32_to_e2m1.
#include <doctest/doctest.h>

#include <tbb/blocked_range.h>
#include <tbb/parallel_reduce.h>

#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backends/cpu/cpu_isa.hpp"
#include "backends/cpu/nvfp4_rows.hpp"
#include "kvsim/core/codecs.hpp"
#include "kvsim/core/nvfp4_rows.hpp"

#include "../support/cpu_isas.hpp"
#include "../support/nvfp4_edge_blocks.hpp"
#include "../support/rng.hpp"

using namespace kvsim;
using kvsim::testing::Rng;

namespace {

using kvsim::testing::machine_isas;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Global scales beyond the edge rows' own five: tiny, huge (6g overflows to
// Inf at 1e38), subnormal, Inf, NaN, +-0, negative.
const float kMoreGlobals[] = {1e-30f, 3.0e30f, 1e38f, 1e-40f, kInf, kNaN, 0.0f, -0.0f, -2.0f};

// Blocks where `fn` and nvfp4_quantize16 of the loaded floats differ (scale
// byte or any packed byte), over the call's rows (each `blocks` blocks).
int64_t mismatches(cpu_nvfp4::RowsFn fn, const Nvfp4Row* in, int nrows, int blocks) {
  uint8_t packed[2][cpu_nvfp4::kMaxBlocks * 8], scales[2][cpu_nvfp4::kMaxBlocks];
  Nvfp4Row rows[2];
  for (int r = 0; r < nrows; ++r) {
    rows[r] = in[r];
    rows[r].packed = packed[r];
    rows[r].scales = scales[r];
  }
  fn(rows, nrows, blocks);
  int64_t bad = 0;
  for (int r = 0; r < nrows; ++r)
    for (int b = 0; b < blocks; ++b) {
      float x[16];
      load_floats(rows[r].x, rows[r].dtype, 16 * b, 1, 16, x);
      uint8_t want[8];
      const uint8_t want_scale = codec::nvfp4_quantize16(x, rows[r].global_scale, want);
      bad += scales[r][b] != want_scale || std::memcmp(packed[r] + 8 * b, want, 8) != 0;
    }
  return bad;
}

// One fp32 row of `blocks` blocks of x under g; and, for an even count, the
// same blocks as two rows of half as many (an item's K and V), the second
// under g2: both against nvfp4_quantize16.
int64_t mismatches(cpu_nvfp4::RowsFn fn, const float* x, int blocks, float g, float g2) {
  Nvfp4Row rows[2];
  rows[0].x = x;
  rows[0].global_scale = g;
  int64_t bad = mismatches(fn, rows, 1, blocks);
  if (blocks % 2 == 0) {
    rows[0].x = x;
    rows[1].x = x + 16 * (blocks / 2);
    rows[1].global_scale = g2;
    bad += mismatches(fn, rows, 2, blocks / 2);
  }
  return bad;
}

TEST_CASE("every ISA's nvfp4 quantizer: the edge blocks under every global scale") {
  for (CpuIsa isa : machine_isas()) {
    const std::string isa_name = cpu_isa_name(isa);
    CAPTURE(isa_name);
    const cpu_nvfp4::RowsFn fn = cpu_nvfp4::rows_at(isa);
    int64_t checked = 0, bad = 0;
    kvsim::testing::for_each_nvfp4_edge_row([&](int, int blocks, float g, const float* x) {
      bad += mismatches(fn, x, blocks, g, kMoreGlobals[0]);
      for (size_t i = 0; i < std::size(kMoreGlobals); ++i)
        bad += mismatches(fn, x, blocks, kMoreGlobals[i], i + 1 < std::size(kMoreGlobals) ? kMoreGlobals[i + 1] : g);
      checked += blocks * (1 + static_cast<int64_t>(std::size(kMoreGlobals)));
    });
    CHECK(checked == kvsim::testing::kNvfp4EdgeBlocks * 10);
    CHECK(bad == 0);
  }
}

TEST_CASE("every ISA's nvfp4 quantizer: random-bit and normal-ish rows of 1..16 blocks") {
  const float globals[] = {1.0f, 0.5f, 1.0f / 448.0f, 3.0e-3f, 7.0f, 1e-30f, 1e30f};
  constexpr int kRows = 400000;  // 3.4 million blocks per ISA
  for (CpuIsa isa : machine_isas()) {
    const std::string isa_name = cpu_isa_name(isa);
    CAPTURE(isa_name);
    const cpu_nvfp4::RowsFn fn = cpu_nvfp4::rows_at(isa);
    Rng rng(0x6e7666345f726f77ull);
    int64_t checked = 0, bad = 0;
    float x[cpu_nvfp4::kMaxBlocks * 16];
    for (int row = 0; row < kRows; ++row) {
      const int blocks = 1 + row % cpu_nvfp4::kMaxBlocks;
      const float g = globals[(row / cpu_nvfp4::kMaxBlocks) % std::size(globals)];
      const int kind = row % 3;
      for (int b = 0; b < blocks; ++b) {
        // A power of two per block, so blocks span the scale's range.
        const float p = std::bit_cast<float>(static_cast<uint32_t>(rng.uniform(127 - 40, 127 + 40)) << 23);
        for (int i = 0; i < 16; ++i) {
          float& v = x[16 * b + i];
          if (kind == 0) {
            v = std::bit_cast<float>(static_cast<uint32_t>(rng.next()));
          } else if (kind == 1) {  // normal-ish: a sum of four uniforms, centred
            float sum = -2.0f;
            for (int k = 0; k < 4; ++k) sum += rng.unit();
            v = sum * p;
          } else {  // multiples of 1/8: every e2m1 midpoint of a scale-1 block, exactly
            v = static_cast<float>(rng.uniform(-48, 48)) * 0.125f;
          }
        }
      }
      bad += mismatches(fn, x, blocks, g, globals[row % std::size(globals)]);
      checked += blocks;
    }
    CHECK(checked == 3400000);
    CHECK(bad == 0);
  }
}

TEST_CASE("every ISA's nvfp4 quantizer: every fp32 value through the codes step (multiplier 1)") {
  // 15 values per block beside a 6.0, whose amax 6..6.375 makes sf = amax / 6
  // round to e4m3 1.0 (0x38) and the multiplier 1 / (1 * 1) = 1, so each
  // code is e2m1(y * 1) = e2m1(y). Values of larger magnitude are skipped
  // (their blocks would take another scale; the random rows cover them).
  const uint32_t kLimit = std::bit_cast<uint32_t>(6.375f);
  for (CpuIsa isa : machine_isas()) {
    const std::string isa_name = cpu_isa_name(isa);
    CAPTURE(isa_name);
    const cpu_nvfp4::RowsFn fn = cpu_nvfp4::rows_at(isa);
    constexpr uint64_t kChunk = uint64_t{1} << 20;
    const int64_t bad = tbb::parallel_reduce(
        tbb::blocked_range<uint64_t>(0, (uint64_t{1} << 32) / kChunk), int64_t{0},
        [&](const tbb::blocked_range<uint64_t>& r, int64_t bad) {
          float x[16 * 16];
          uint8_t packed[16 * 8], scales[16];
          uint64_t u = r.begin() * kChunk;
          const uint64_t end = r.end() * kChunk;
          int filled = 0;
          const auto flush = [&](int elements) {
            for (int i = elements; i < 16 * 16; ++i) x[i] = i % 16 == 0 ? 6.0f : 0.0f;
            Nvfp4Row one;
            one.x = x;
            one.packed = packed;
            one.scales = scales;
            fn(&one, 1, 16);
            for (int i = 0; i < 16 * 16; ++i) {
              const uint8_t want = i % 16 == 0 ? codec::kE2m1MaxCode : codec::f32_to_e2m1(x[i]);
              bad += codec::nibble_at(packed, i) != want;
            }
            for (int b = 0; b < 16; ++b) bad += scales[b] != 0x38;
          };
          for (; u < end; ++u) {
            const uint32_t bits = static_cast<uint32_t>(u);
            const uint32_t mag = bits & 0x7FFFFFFFu;
            if (mag > kLimit && mag <= 0x7F800000u) continue;  // NaN stays: it is ignored by the amax
            if (filled % 16 == 0) x[filled++] = 6.0f;
            x[filled++] = std::bit_cast<float>(bits);
            if (filled == 16 * 16) {
              flush(filled);
              filled = 0;
            }
          }
          if (filled > 0) flush(filled);
          return bad;
        },
        [](int64_t a, int64_t b) { return a + b; });
    CHECK(bad == 0);
  }
}

TEST_CASE("every ISA's nvfp4 quantizer: bf16 and fp16 rows read in place, one or two rows a call") {
  const float globals[] = {1.0f, 0.5f, 1.0f / 448.0f, 7.0f, 1e-30f, 1e30f, 0.0f, kNaN, kInf, -2.0f};
  constexpr int kCalls = 200000;
  for (CpuIsa isa : machine_isas()) {
    const std::string isa_name = cpu_isa_name(isa);
    CAPTURE(isa_name);
    const cpu_nvfp4::RowsFn fn = cpu_nvfp4::rows_at(isa);
    Rng rng(0x6e76663462663136ull);
    int64_t bad = 0;
    uint16_t bits[2][cpu_nvfp4::kMaxBlocks * 16];
    for (int call = 0; call < kCalls; ++call) {
      const int nrows = 1 + call % 2;
      const int blocks = 1 + (call / 2) % (cpu_nvfp4::kMaxBlocks / nrows);
      Nvfp4Row rows[2];
      for (int r = 0; r < nrows; ++r) {
        const bool bf16 = (call / 16 + r * ((call / 32) % 2)) % 2 == 0;  // mixed and same-dtype pairs
        // random bits, or values near a scale of 1 (every midpoint and NaN/Inf pattern of the type turns up)
        for (int i = 0; i < 16 * blocks; ++i) {
          const uint32_t u = static_cast<uint32_t>(rng.next());
          bits[r][i] = static_cast<uint16_t>(call % 3 == 0 ? u : (u & 0x83FFu) | (bf16 ? 0x3E00u : 0x3C00u) * ((u >> 16) & 1));
        }
        rows[r].x = bits[r];
        rows[r].dtype = bf16 ? CacheDtype::bf16 : CacheDtype::fp16;
        rows[r].global_scale = globals[(call / 7 + 3 * r) % std::size(globals)];
      }
      bad += mismatches(fn, rows, nrows, blocks);
    }
    CHECK(bad == 0);
  }
}

}  // namespace
