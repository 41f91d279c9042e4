// Hand-worked edge cases of core's codecs (contract §4), each derived in its
// comment from the format's definition rather than from the implementation.
// The exhaustive sweep (codecs_exhaustive_test.cpp) proves agreement with a
// reference on every input; these cases pin the reference's intent in
// readable form: ties to even, the overflow edge, signed zero, NaN rules, and
// the nvfp4 block formula.
//
// Format reminders used below:
//  e4m3: bias 7, 3 mantissa bits; subnormal step 2^-9; max 0x7E = 1.75 * 2^8 = 448;
//        the code after it (0x7F) would be 1.875 * 2^8 = 480 but is NaN.
//  e5m2: bias 15, 2 mantissa bits; subnormal step 2^-16; max 0x7B = 1.75 * 2^15 = 57344;
//        0x7C is Inf (the place of 2^16 = 65536).
//  e2m1: codes 0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6; sign in bit 3.
//  fp16: bias 15, 10 mantissa bits; subnormal step 2^-24; max 0x7BFF = 65504.
#include <doctest/doctest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <kvsim/core/codecs.hpp>
#include <limits>

#include "../support/nvfp4_edge_blocks.hpp"

namespace {

using namespace kvsim::codec;
using kvsim::bits_float;
using kvsim::float_bits;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kNegNaN = bits_float(0xFFC00000u);  // a NaN with the sign bit set

// Widened to int so doctest prints numbers, not characters.
int e4m3(float x, Saturation s = Saturation::finite) { return f32_to_e4m3(x, s); }
int e5m2(float x, Saturation s = Saturation::finite) { return f32_to_e5m2(x, s); }
int e2m1(float x) { return f32_to_e2m1(x); }
int int8(float x) { return f32_to_int8(x); }
uint32_t bits(float x) { return float_bits(x); }
float next_up(float x) { return std::nextafter(x, kInf); }
float next_down(float x) { return std::nextafter(x, -kInf); }

// ---------------------------------------------------------------- constexpr

// Core codecs are constexpr: a few of the cases below, checked at compile time.
static_assert(f32_to_e4m3(448.0f) == 0x7E);
static_assert(f32_to_e4m3(464.0f, Saturation::none) == 0x7E);  // overflow-edge tie to even
static_assert(f32_to_e4m3(480.0f, Saturation::none) == 0x7F);
static_assert(f32_to_e5m2(61440.0f, Saturation::none) == 0x7C);
static_assert(f32_to_e2m1(0.75f) == 0x2);
static_assert(f32_to_f16(65520.0f) == 0x7C00);
static_assert(f32_to_bf16(kNaN) == 0x7FFF);
static_assert(f32_to_int8(2.5f) == 2);
static_assert(e4m3_to_f32(0x6C) == 96.0f);
static_assert([] {
  // The g = 0.5 block of the nvfp4 test case below: scale byte 0x48 (4.0).
  const float x[16] = {12, -12, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0.5f, -0.5f, 0};
  uint8_t packed[8] = {};
  const uint8_t scale = nvfp4_quantize16(x, 0.5f, packed);
  return scale == 0x48 && packed[0] == 0xF7 && packed[6] == 0x07;
}());

// ---------------------------------------------------------------- e4m3

TEST_CASE("e4m3: overflow edge, saturating and non-saturating") {
  for (const Saturation s : {Saturation::finite, Saturation::none}) {
    CAPTURE(static_cast<int>(s));
    CHECK(e4m3(448.0f, s) == 0x7E);  // largest finite, exact
    // 464 is halfway between 448 (0x7E, mantissa 110) and the would-be 480
    // (mantissa 111): the tie goes to the even mantissa, 448, in both modes.
    CHECK(e4m3(464.0f, s) == 0x7E);
    CHECK(e4m3(-464.0f, s) == 0xFE);
    CHECK(e4m3(next_down(464.0f), s) == 0x7E);
  }
  // Just past the tie rounds to 480, which is beyond the format: overflow.
  CHECK(e4m3(next_up(464.0f), Saturation::finite) == 0x7E);
  CHECK(e4m3(next_up(464.0f), Saturation::none) == 0x7F);
  CHECK(e4m3(480.0f, Saturation::finite) == 0x7E);
  CHECK(e4m3(480.0f, Saturation::none) == 0x7F);  // NaN pattern S.1111.111
  CHECK(e4m3(-480.0f, Saturation::finite) == 0xFE);
  CHECK(e4m3(-480.0f, Saturation::none) == 0xFF);  // sign kept on overflow
  CHECK(e4m3(1e30f, Saturation::finite) == 0x7E);
}

TEST_CASE("e4m3: Inf, NaN and signed zero") {
  CHECK(e4m3(kInf, Saturation::finite) == 0x7E);  // +-Inf clamp to +-448
  CHECK(e4m3(-kInf, Saturation::finite) == 0xFE);
  CHECK(e4m3(kInf, Saturation::none) == 0x7F);  // no Inf in e4m3fn: NaN pattern, sign kept
  CHECK(e4m3(-kInf, Saturation::none) == 0xFF);
  for (const Saturation s : {Saturation::finite, Saturation::none}) {
    CHECK(e4m3(kNaN, s) == 0x7F);                     // NaN -> 0x7F in every mode
    CHECK(e4m3(kNegNaN, s) == 0x7F);                  // ... sign dropped (contract §4)
    CHECK(e4m3(bits_float(0x7F800001u), s) == 0x7F);  // signalling NaN too
  }
  CHECK(e4m3(0.0f) == 0x00);
  CHECK(e4m3(-0.0f) == 0x80);  // -0 keeps its sign
}

TEST_CASE("e4m3: subnormals and ties to even") {
  const float step = std::ldexp(1.0f, -9);  // smallest subnormal, code 0x01
  CHECK(e4m3(step) == 0x01);
  CHECK(e4m3(step / 2) == 0x00);           // 2^-10: tie between 0x00 and 0x01 -> even 0x00
  CHECK(e4m3(next_up(step / 2)) == 0x01);  // just above half a step
  CHECK(e4m3(-step / 2) == 0x80);          // negative underflow keeps the sign
  CHECK(e4m3(-1e-30f) == 0x80);
  CHECK(e4m3(3 * step / 2) == 0x02);          // 1.5 steps: tie between 0x01 and 0x02 -> 0x02
  CHECK(e4m3(5 * step / 2) == 0x02);          // 2.5 steps: tie between 0x02 and 0x03 -> 0x02
  CHECK(e4m3(7 * step) == 0x07);              // largest subnormal
  CHECK(e4m3(std::ldexp(1.0f, -6)) == 0x08);  // smallest normal: exponent field 1
  // 7.5 steps = 2^-6 - 2^-10: tie between 0x07 (odd) and 0x08 -> 0x08, the
  // subnormal rounding carries into the normal range.
  CHECK(e4m3(15 * step / 2) == 0x08);
  CHECK(e4m3(1.0f) == 0x38);     // exponent 0 + 7 = 0111, mantissa 000
  CHECK(e4m3(1.0625f) == 0x38);  // halfway 1.0 (000) / 1.125 (001) -> even 000
  CHECK(e4m3(1.1875f) == 0x3A);  // halfway 1.125 (001) / 1.25 (010) -> 010
  CHECK(e4m3(1.9375f) == 0x40);  // halfway 1.875 (0x3F) / 2.0 (0x40): carry into the exponent
  CHECK(e4m3(248.0f) == 0x78);   // halfway 240 (0x77) / 256 (0x78) -> 0x78
  CHECK(e4m3(-3.0f) == 0xC4);    // 1.5 * 2^1: sign, exponent 1000, mantissa 100
  // bf16 inputs reach the codec through their exact fp32 value:
  // bf16 0x3F89 = 1 + 9/128 = 1.0703125, above the 1.0625 midpoint -> 1.125.
  CHECK(e4m3(bf16_to_f32(0x3F89)) == 0x39);
}

TEST_CASE("e4m3: decode") {
  CHECK(e4m3_to_f32(0x7E) == 448.0f);
  CHECK(e4m3_to_f32(0xFE) == -448.0f);
  CHECK(e4m3_to_f32(0x01) == std::ldexp(1.0f, -9));
  CHECK(e4m3_to_f32(0x38) == 1.0f);
  CHECK(bits(e4m3_to_f32(0x80)) == 0x80000000u);  // -0
  CHECK(std::isnan(e4m3_to_f32(0x7F)));
  CHECK(std::isnan(e4m3_to_f32(0xFF)));
}

// ---------------------------------------------------------------- e5m2

TEST_CASE("e5m2: overflow edge, Inf, NaN, subnormals") {
  for (const Saturation s : {Saturation::finite, Saturation::none}) {
    CHECK(e5m2(57344.0f, s) == 0x7B);  // largest finite, exact
    CHECK(e5m2(next_down(61440.0f), s) == 0x7B);
  }
  // 61440 = 57344 + 4096 is halfway between 0x7B (mantissa 11, odd) and the
  // place of 0x7C (2^16, even): the tie goes up, which is an overflow, exactly
  // as IEEE rounds 65520 to Inf in fp16.
  CHECK(e5m2(61440.0f, Saturation::finite) == 0x7B);
  CHECK(e5m2(61440.0f, Saturation::none) == 0x7C);
  CHECK(e5m2(-61440.0f, Saturation::none) == 0xFC);
  CHECK(e5m2(kInf, Saturation::finite) == 0x7B);
  CHECK(e5m2(-kInf, Saturation::finite) == 0xFB);
  CHECK(e5m2(kInf, Saturation::none) == 0x7C);
  CHECK(e5m2(-kInf, Saturation::none) == 0xFC);
  CHECK(e5m2(kNaN) == 0x7F);
  CHECK(e5m2(kNegNaN, Saturation::none) == 0x7F);
  CHECK(e5m2(-0.0f) == 0x80);
  const float step = std::ldexp(1.0f, -16);  // smallest subnormal
  CHECK(e5m2(step) == 0x01);
  CHECK(e5m2(step / 2) == 0x00);      // tie -> even 0x00
  CHECK(e5m2(-step / 2) == 0x80);     // negative underflow keeps the sign
  CHECK(e5m2(3 * step / 2) == 0x02);  // tie between 0x01 and 0x02 -> 0x02
  CHECK(e5m2(1.0f) == 0x3C);          // exponent 15 = 01111, mantissa 00
  CHECK(e5m2(1.125f) == 0x3C);        // halfway 1.0 (00) / 1.25 (01) -> 00
  CHECK(e5m2(1.375f) == 0x3E);        // halfway 1.25 (01) / 1.5 (10) -> 10
  CHECK(e5m2_to_f32(0x7B) == 57344.0f);
  CHECK(e5m2_to_f32(0xFC) == -kInf);
  CHECK(std::isnan(e5m2_to_f32(0x7D)));
}

TEST_CASE("fp8 pairs: f32x2_to_fp8x2_satfinite is the scalar codec in each byte, low byte first") {
  // On the host the pair is the scalar codec; on the device it is the
  // conversion instruction, held to this over all 2^32 inputs by
  // tests/cuda/core_device_test.cu (Fp8PairInstructionIsTheCodec).
  const float values[] = {0.0f, -0.0f, 1.0f, -1.125f, 448.0f, 464.0f, 480.0f, -1e9f, 57344.0f, 61440.0f,
                          std::ldexp(1.0f, -9), std::ldexp(1.0f, -10), -std::ldexp(1.0f, -17), kInf, -kInf,
                          kNaN, kNegNaN, bits_float(0x7F800001u)};
  for (const float lo : values)
    for (const float hi : values) {
      const uint16_t e4 = f32x2_to_fp8x2_satfinite<false>(lo, hi);
      const uint16_t e5 = f32x2_to_fp8x2_satfinite<true>(lo, hi);
      CHECK((e4 & 0xFF) == e4m3(lo, Saturation::finite));
      CHECK((e4 >> 8) == e4m3(hi, Saturation::finite));
      CHECK((e5 & 0xFF) == e5m2(lo, Saturation::finite));
      CHECK((e5 >> 8) == e5m2(hi, Saturation::finite));
    }
  CHECK(f32x2_to_fp8x2_satfinite<false>(kNegNaN, -kInf) == 0xFE7F);  // NaN's sign dropped, -Inf to -448
}

// ---------------------------------------------------------------- e2m1

TEST_CASE("e2m1: ties to the even code, saturation, NaN") {
  // Values by code: 0:0 1:0.5 2:1 3:1.5 4:2 5:3 6:4 7:6.
  CHECK(e2m1(0.25f) == 0x0);  // halfway code 0 / code 1 -> code 0
  CHECK(e2m1(next_up(0.25f)) == 0x1);
  CHECK(e2m1(0.75f) == 0x2);  // halfway 0.5 (code 1) / 1.0 (code 2) -> code 2
  CHECK(e2m1(1.25f) == 0x2);  // halfway 1.0 (2) / 1.5 (3) -> 2
  CHECK(e2m1(1.75f) == 0x4);  // halfway 1.5 (3) / 2.0 (4) -> 4
  CHECK(e2m1(2.5f) == 0x4);   // halfway 2 (4) / 3 (5) -> 4
  CHECK(e2m1(3.5f) == 0x6);   // halfway 3 (5) / 4 (6) -> 6, i.e. 4.0
  CHECK(e2m1(5.0f) == 0x6);   // halfway 4 (6) / 6 (7) -> 6, i.e. 4.0
  CHECK(e2m1(next_up(5.0f)) == 0x7);
  CHECK(e2m1(6.0f) == 0x7);
  CHECK(e2m1(7.0f) == 0x7);  // above the largest value: saturate at 6
  CHECK(e2m1(1e30f) == 0x7);
  CHECK(e2m1(-7.0f) == 0xF);
  CHECK(e2m1(kInf) == 0x7);  // +-Inf -> +-6
  CHECK(e2m1(-kInf) == 0xF);
  CHECK(e2m1(kNaN) == 0x7);  // NaN -> +6 (PTX satfinite rule), sign dropped
  CHECK(e2m1(kNegNaN) == 0x7);
  CHECK(e2m1(-3.5f) == 0xE);   // sign in bit 3
  CHECK(e2m1(-0.25f) == 0x8);  // rounds to zero, keeps the sign
  CHECK(e2m1(-0.0f) == 0x8);
  CHECK(e2m1_to_f32(0x7) == 6.0f);
  CHECK(e2m1_to_f32(0xB) == -1.5f);
  CHECK(bits(e2m1_to_f32(0x8)) == 0x80000000u);
}

// ---------------------------------------------------------------- fp16, bf16

TEST_CASE("fp16: overflow, subnormals, NaN") {
  CHECK(f32_to_f16(65504.0f) == 0x7BFF);  // largest finite
  CHECK(f32_to_f16(65519.0f) == 0x7BFF);  // below the midpoint 65520
  // 65520 is halfway between 65504 (mantissa 0x3FF, odd) and 2^16 (the place
  // of 0x7C00): ties to even go up, and 2^16 overflows to Inf (IEEE).
  CHECK(f32_to_f16(65520.0f) == 0x7C00);
  CHECK(f32_to_f16(-65520.0f) == 0xFC00);
  CHECK(f32_to_f16(kInf) == 0x7C00);
  CHECK(f32_to_f16(-kInf) == 0xFC00);
  const float step = std::ldexp(1.0f, -24);  // smallest subnormal
  CHECK(f32_to_f16(step) == 0x0001);
  CHECK(f32_to_f16(step / 2) == 0x0000);  // 2^-25: tie -> even 0x0000
  CHECK(f32_to_f16(next_up(step / 2)) == 0x0001);
  CHECK(f32_to_f16(-step / 2) == 0x8000);
  CHECK(f32_to_f16(3 * step / 2) == 0x0002);
  // 1023.5 steps: tie between the largest subnormal 0x03FF and 2^-14 (0x0400).
  CHECK(f32_to_f16(1023.5f * step) == 0x0400);
  CHECK(f32_to_f16(1.0f) == 0x3C00);
  CHECK(f32_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3C00);      // tie -> even
  CHECK(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3C02);  // tie -> even
  CHECK(f32_to_f16(-0.0f) == 0x8000);
  CHECK(f32_to_f16(kNaN) == 0x7FFF);
  CHECK(f32_to_f16(kNegNaN) == 0x7FFF);  // canonical, sign dropped
  CHECK(f32_to_f16(bits_float(0x7F800001u)) == 0x7FFF);
  CHECK(f16_to_f32(0x7BFF) == 65504.0f);
  CHECK(f16_to_f32(0x0001) == step);
  CHECK(f16_to_f32(0xFC00) == -kInf);
}

TEST_CASE("bf16: ties, overflow, subnormals, NaN") {
  CHECK(f32_to_bf16(1.0f) == 0x3F80);
  CHECK(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 0x3F80);      // halfway 0x3F80/0x3F81 -> even
  CHECK(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3F82);  // halfway 0x3F81/0x3F82 -> even
  CHECK(f32_to_bf16(bits_float(0x7F7F7FFFu)) == 0x7F7F);          // just below the last midpoint
  CHECK(f32_to_bf16(bits_float(0x7F7F8000u)) == 0x7F80);          // tie, 0x7F7F odd -> up: Inf
  CHECK(f32_to_bf16(std::numeric_limits<float>::max()) == 0x7F80);
  CHECK(f32_to_bf16(-std::numeric_limits<float>::max()) == 0xFF80);
  CHECK(f32_to_bf16(kInf) == 0x7F80);
  // Truncating 0x7F800001 would give 0x7F80 (Inf); NaN must stay NaN: 0x7FFF.
  CHECK(f32_to_bf16(bits_float(0x7F800001u)) == 0x7FFF);
  CHECK(f32_to_bf16(kNegNaN) == 0x7FFF);
  CHECK(f32_to_bf16(bits_float(0x00008000u)) == 0x0000);  // 2^-134: half the smallest bf16 subnormal
  CHECK(f32_to_bf16(bits_float(0x00018000u)) == 0x0002);  // 1.5 subnormal steps -> even 0x0002
  CHECK(f32_to_bf16(-0.0f) == 0x8000);
  CHECK(bf16_to_f32(0x3F80) == 1.0f);
  CHECK(std::isnan(bf16_to_f32(0x7FFF)));
}

// ---------------------------------------------------------------- int8

TEST_CASE("int8: nearest even, saturation, NaN") {
  CHECK(int8(2.5f) == 2);
  CHECK(int8(3.5f) == 4);
  CHECK(int8(-2.5f) == -2);
  CHECK(int8(-3.5f) == -4);
  CHECK(int8(0.5f) == 0);
  CHECK(int8(-0.5f) == 0);
  CHECK(int8(next_up(0.5f)) == 1);
  CHECK(int8(0.49999997f) == 0);
  CHECK(int8(126.5f) == 126);
  CHECK(int8(127.5f) == 127);    // rounds to 128 (even), then saturates
  CHECK(int8(-128.5f) == -128);  // tie between -129 and -128 -> -128 (even)
  CHECK(int8(-128.6f) == -128);  // rounds to -129, saturates
  CHECK(int8(1e9f) == 127);
  CHECK(int8(-1e9f) == -128);
  CHECK(int8(kInf) == 127);
  CHECK(int8(-kInf) == -128);
  CHECK(int8(kNaN) == 0);
  CHECK(int8(kNegNaN) == 0);
  CHECK(int8(8388609.0f) == 127);  // 2^23 + 1: beyond the small-rounding path
}

// ---------------------------------------------------------------- nvfp4 blocks

struct Block {
  uint8_t scale;
  std::array<uint8_t, 8> packed;
};

Block quantize(const std::array<float, 16>& x, float g) {
  Block b{};
  b.scale = nvfp4_quantize16(x.data(), g, b.packed.data());
  return b;
}

TEST_CASE("nvfp4: all-zero block") {
  // amax = 0 -> sf = 0 -> scale byte 0x00; out = 0 -> every code e2m1(0) = 0.
  const Block b = quantize({}, 1.0f);
  CHECK(int(b.scale) == 0x00);
  for (const uint8_t byte : b.packed) CHECK(int(byte) == 0x00);
  CHECK(nvfp4_decode(0x0, b.scale, 1.0f) == 0.0f);
}

TEST_CASE("nvfp4: one outlier crushes the small values") {
  // g = 1. amax = 600; sf = 600 / (6 * 1) = 100 (exact). In e4m3's [64, 128)
  // binade the step is 8: 100 is halfway between 96 (mantissa 100) and 104
  // (mantissa 101) -> even mantissa -> 96 = 1.5 * 2^6: exponent 6 + 7 = 1101,
  // scale byte 0 1101 100 = 0x6C. out = 1/96, so code_i = e2m1(x_i / 96)
  // (none of the x_i / 96 below is within 1e-3 of an e2m1 midpoint, so the
  // rounding of 1/96 to fp32 cannot move a code):
  //   x:    1  -2   3  -4  30  600 -30  40  50  60 -70  80   5  10 -10  20
  //   x/96 .01 -.02 .03 -.04 .31 6.25 -.31 .42 .52 .63 -.73 .83 .05 .10 -.10 .21
  //   code  0   8   0   8   1   7    9   1   1   1   9   2   0   0   8   0
  // (6.25 saturates to 6 = code 7; small negatives round to -0 = code 8.)
  // Bytes (element 2i low nibble): 0x80 0x80 0x71 0x19 0x11 0x29 0x00 0x08.
  const std::array<float, 16> x = {1, -2, 3, -4, 30, 600, -30, 40, 50, 60, -70, 80, 5, 10, -10, 20};
  const Block b = quantize(x, 1.0f);
  CHECK(int(b.scale) == 0x6C);
  const std::array<uint8_t, 8> want = {0x80, 0x80, 0x71, 0x19, 0x11, 0x29, 0x00, 0x08};
  for (int i = 0; i < 8; ++i) {
    CAPTURE(i);
    CHECK(int(b.packed[i]) == int(want[i]));
  }
  CHECK(int(nibble_at(b.packed.data(), 4)) == 0x1);  // even element: low nibble of byte 2
  CHECK(int(nibble_at(b.packed.data(), 5)) == 0x7);  // odd element: high nibble of byte 2
  CHECK(int(nibble_at(b.packed.data(), 10)) == 0x9);
  // Decode: (e2m1 * 96) * 1.
  CHECK(nvfp4_decode(nibble_at(b.packed.data(), 5), b.scale, 1.0f) == 576.0f);  // 6 * 96
  CHECK(nvfp4_decode(nibble_at(b.packed.data(), 11), b.scale, 1.0f) == 96.0f);
  CHECK(nvfp4_decode(nibble_at(b.packed.data(), 10), b.scale, 1.0f) == -48.0f);
  CHECK(bits(nvfp4_decode(nibble_at(b.packed.data(), 1), b.scale, 1.0f)) == 0x80000000u);  // -0
}

TEST_CASE("nvfp4: all-negative block") {
  // x_i = -(i + 1), g = 1. amax = 16; sf = 16/6 = 2.6667. e4m3 [2, 4) step
  // 0.25: between 2.5 and 2.75, midpoint 2.625 -> 2.75 = 1.375 * 2^1:
  // exponent 1 + 7 = 1000, mantissa 011 -> 0x43. out = 1/2.75, x/2.75:
  //   -1 -.36 -> -0.5 (9)   -2 -.73 -> -0.5 (9)   -3 -1.09 -> -1 (A)  -4 -1.45 -> -1.5 (B)
  //   -5 -1.82 -> -2 (C)    -6 -2.18 -> -2 (C)    -7 -2.55 -> -3 (D)  -8 -2.91 -> -3 (D)
  //   -9 -3.27 -> -3 (D)   -10 -3.64 -> -4 (E)   -11 -4.00 -> -4 (E) -12 -4.36 -> -4 (E)
  //  -13 -4.73 -> -4 (E)   -14 -5.09 -> -6 (F)   -15 -5.45 -> -6 (F) -16 -5.82 -> -6 (F)
  // Bytes: 0x99 0xBA 0xCC 0xDD 0xED 0xEE 0xFE 0xFF.
  std::array<float, 16> x{};
  for (int i = 0; i < 16; ++i) x[i] = -static_cast<float>(i + 1);
  const Block b = quantize(x, 1.0f);
  CHECK(int(b.scale) == 0x43);
  const std::array<uint8_t, 8> want = {0x99, 0xBA, 0xCC, 0xDD, 0xED, 0xEE, 0xFE, 0xFF};
  for (int i = 0; i < 8; ++i) {
    CAPTURE(i);
    CHECK(int(b.packed[i]) == int(want[i]));
  }
  CHECK(nvfp4_decode(0xF, b.scale, 1.0f) == -16.5f);   // -6 * 2.75
  CHECK(nvfp4_decode(0x9, b.scale, 1.0f) == -1.375f);  // -0.5 * 2.75
}

TEST_CASE("nvfp4: global scale g = 0.5, exact ties inside the block") {
  // amax = 12; sf = 12 / (6 * 0.5) = 4 (exact) -> e4m3 1.0 * 2^2: exponent
  // 1001 -> 0x48. out = 1 / (4 * 0.5) = 0.5 exactly, so x * out lands exactly
  // on e2m1 midpoints where expected:
  //   x:     12  -12   1   2   3   4   5   6   7   8   9  10  11  0.5 -0.5  0
  //   x/2:    6   -6  .5   1 1.5   2 2.5   3 3.5   4 4.5   5 5.5  .25 -.25  0
  //   code:   7    F   1   2   3   4   4   5   6   6   6   6   7    0    8   0
  // (2.5 -> 2, 3.5 -> 4, 5 -> 4, 0.25 -> 0: ties to the even code.)
  // Bytes: 0xF7 0x21 0x43 0x54 0x66 0x66 0x07 0x08.
  const std::array<float, 16> x = {12, -12, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0.5f, -0.5f, 0};
  const Block b = quantize(x, 0.5f);
  CHECK(int(b.scale) == 0x48);
  const std::array<uint8_t, 8> want = {0xF7, 0x21, 0x43, 0x54, 0x66, 0x66, 0x07, 0x08};
  for (int i = 0; i < 8; ++i) {
    CAPTURE(i);
    CHECK(int(b.packed[i]) == int(want[i]));
  }
  // Decode: (e2m1 * 4) * 0.5.
  CHECK(nvfp4_decode(0x7, b.scale, 0.5f) == 12.0f);
  CHECK(nvfp4_decode(0xF, b.scale, 0.5f) == -12.0f);
  CHECK(nvfp4_decode(0x6, b.scale, 0.5f) == 8.0f);
  CHECK(nvfp4_decode(0x1, b.scale, 0.5f) == 1.0f);
}

TEST_CASE("nvfp4: NaN element, underflowing scale, saturating scale") {
  // NaN is ignored by amax: amax = 3, sf = 0.5 = 2^-1 -> exponent 0110 -> 0x30;
  // out = 2; the NaN element encodes as e2m1(NaN) = 0x7, 3 * 2 = 6 -> 0x7.
  std::array<float, 16> with_nan{};
  with_nan[0] = kNaN;
  with_nan[1] = 3.0f;
  const Block n = quantize(with_nan, 1.0f);
  CHECK(int(n.scale) == 0x30);
  CHECK(int(n.packed[0]) == 0x77);
  for (int i = 1; i < 8; ++i) CHECK(int(n.packed[i]) == 0x00);

  // amax = 1e-6: sf = 1.67e-7 is below half of e4m3's smallest subnormal
  // (2^-10 ~ 9.8e-4) -> scale byte 0 -> out = 0 -> x * 0 = +-0 -> codes 0 / 8.
  std::array<float, 16> tiny{};
  for (int i = 0; i < 16; ++i) tiny[i] = (i % 2) ? -1e-6f : 1e-6f;
  const Block t = quantize(tiny, 1.0f);
  CHECK(int(t.scale) == 0x00);
  for (const uint8_t byte : t.packed) CHECK(int(byte) == 0x80);

  // amax = 6000: sf = 1000 saturates to 448 (0x7E); out = 1/448;
  // 6000/448 = 13.4 -> 6 (0x7); 1344/448 = 3 -> 0x5.
  std::array<float, 16> big{};
  big[0] = 6000.0f;
  big[1] = 1344.0f;
  const Block s = quantize(big, 1.0f);
  CHECK(int(s.scale) == 0x7E);
  CHECK(int(s.packed[0]) == 0x57);
  CHECK(nvfp4_decode(0x7, s.scale, 1.0f) == 2688.0f);  // 6 * 448
}

TEST_CASE("nvfp4: a row of blocks (nvfp4_quantize_blocks) is nvfp4_quantize16 block by block") {
  // The CPU's row form (every block's amax, scale, multiplier, then every
  // code) against the one-block form, for 1..8 blocks, over the edge blocks
  // (tests/support/nvfp4_edge_blocks.hpp): NaN, +-Inf, +-0, subnormals, e2m1
  // midpoints, values that saturate the scale, and ordinary ones.
  int64_t blocks_checked = 0;
  kvsim::testing::for_each_nvfp4_edge_row([&](int row, int blocks, float g, const float* x) {
    uint8_t packed[8 * 8], scales[8];
    nvfp4_quantize_blocks<8>(x, blocks, g, packed, scales);
    for (int b = 0; b < blocks; ++b) {
      uint8_t want[8];
      const uint8_t want_scale = nvfp4_quantize16(x + 16 * b, g, want);
      CAPTURE(row);
      CAPTURE(b);
      CHECK(int(scales[b]) == int(want_scale));
      for (int i = 0; i < 8; ++i) CHECK(int(packed[8 * b + i]) == int(want[i]));
      ++blocks_checked;
    }
  });
  CHECK(blocks_checked == kvsim::testing::kNvfp4EdgeBlocks);
}

}  // namespace
