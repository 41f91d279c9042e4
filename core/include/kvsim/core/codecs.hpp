// Bit-exact number codecs (contract §4). Every function is integer arithmetic on
// the fp32 bit pattern (or exact fp32 operations), so host and device produce
// the same code for every input; the exhaustive tests in
// tests/core/codecs_exhaustive_test.cpp check all 2^32 fp32 inputs against an
// independent reference.
//
// Conventions (decided here, documented in docs/index-arithmetic.md §codecs):
//  * bf16 / fp16: round to nearest even; NaN -> canonical 0x7FFF (sign dropped,
//    as CUDA's __float2bfloat16_rn / cvt.rn.f16.f32 produce); overflow -> +-Inf.
//  * fp8 e4m3 ("fn": no Inf, NaN = S.1111.111, max 448) and e5m2 (IEEE-like,
//    max 57344): round to nearest even on the exact fp32 value.
//      saturating:      finite overflow and +-Inf -> +-max (0x7E / 0x7B | sign),
//                       which is __nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...).
//      non-saturating:  overflow -> e4m3: S.1111.111 (NaN, sign kept),
//                       e5m2: +-Inf (0x7C | sign); +-Inf -> same.
//      NaN -> 0x7F in every mode (sign dropped; CUDA's intrinsic keeps the sign
//      bit, contract §4 fixes 0x7F). -0 and negative underflow keep the sign (0x80).
//  * e2m1 (nvfp4 element): +-{0, .5, 1, 1.5, 2, 3, 4, 6}, sign in bit 3, round to
//    nearest even, saturating at 6; +-Inf -> +-6; NaN -> 0x7 (+6), the PTX
//    cvt.rn.satfinite rule of mapping NaN to the positive maximum. -0 and
//    negative values that round to zero keep the sign: 0x8.
//  * Decoders (f16/bf16/e4m3/e5m2/e2m1 -> fp32) are exact and keep a NaN's
//    sign and payload bits as they are (a signalling fp16 NaN stays
//    signalling: 0x7C01 -> 0x7F802000; e4m3 S.1111.111 -> sign | 0x7FC00000).
//    Hardware conversions may quiet NaNs (x86 F16C does), so a backend must
//    decode with these functions, never with a conversion instruction.
//  * int8: round to nearest even, saturate to [-128, 127]; NaN -> 0.
#pragma once

#include "bits.hpp"
#include "dtype.hpp"

namespace kvsim::codec {

// Round the magnitude of a finite fp32 value (bits with the sign cleared) to
// nearest even in a binary format with EB exponent bits, MB mantissa bits and
// bias 2^(EB-1)-1, including its subnormals. The exponent field is allowed to
// run past the format's top: callers decide what overflow means. Works for
// formats whose smallest subnormal is >= 2^-24 (fp16, fp8, e2m1).
template <int EB, int MB>
KVSIM_HD constexpr uint32_t round_magnitude(uint32_t abs_bits) {
  constexpr int bias = (1 << (EB - 1)) - 1;
  constexpr int min_normal_exp = 1 - bias;
  const int exp_field = static_cast<int>(abs_bits >> 23);
  if (exp_field == 0) return 0;  // fp32 zero/subnormal: < half the target's smallest subnormal
  const int e = exp_field - 127;
  const uint32_t m = (abs_bits & 0x7FFFFFu) | 0x800000u;  // 24-bit significand
  const int shift = 23 - MB + (e < min_normal_exp ? (min_normal_exp - e) : 0);
  if (shift >= 25) return 0;  // value < half the smallest subnormal (ties at exactly half go to 0)
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  // Normal: q carries the implicit bit, so adding the biased exponent minus one
  // lets a mantissa carry roll into the exponent. Subnormal: q is the code.
  if (e >= min_normal_exp) return (static_cast<uint32_t>(e + bias - 1) << MB) + q;
  return q;
}

// Decode a sign-less code of a binary format (no Inf/NaN handling) to fp32, exactly.
// Both forms are computed and one chosen, without a branch (a CPU loop of
// decodes is then vector code).
template <int EB, int MB>
KVSIM_HD constexpr float decode_magnitude(uint32_t code) {
  constexpr int bias = (1 << (EB - 1)) - 1;
  const uint32_t e = code >> MB;
  const uint32_t m = code & ((1u << MB) - 1u);
  // subnormal: m * 2^(1 - bias - MB); both factors exact in fp32, product exact
  const float subnormal = static_cast<float>(m) * bits_float(static_cast<uint32_t>(127 + 1 - bias - MB) << 23);
  const float normal = bits_float((static_cast<uint32_t>(static_cast<int>(e) - bias + 127) << 23) | (m << (23 - MB)));
  return e == 0 ? subnormal : normal;
}

// ---------------------------------------------------------------- bf16, fp16
inline constexpr uint16_t kCanonicalNaN16 = 0x7FFF;

KVSIM_HD constexpr uint16_t f32_to_bf16(float f) {
  const uint32_t x = float_bits(f);
  if (is_nan_bits(x)) return kCanonicalNaN16;
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

KVSIM_HD constexpr float bf16_to_f32(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

KVSIM_HD constexpr uint16_t f32_to_f16(float f) {
  const uint32_t x = float_bits(f);
  if (is_nan_bits(x)) return kCanonicalNaN16;
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a >= 0x7F800000u) return sign | 0x7C00u;  // Inf
  const uint32_t code = round_magnitude<5, 10>(a);
  return sign | static_cast<uint16_t>(code >= 0x7C00u ? 0x7C00u : code);
}

KVSIM_HD constexpr float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t mag = h & 0x7FFFu;
  if (mag >= 0x7C00u) {
    const uint32_t mant = mag & 0x3FFu;
    return bits_float(sign | 0x7F800000u | (mant << 13));  // Inf, or NaN with its payload
  }
  return bits_float(float_bits(decode_magnitude<5, 10>(mag)) | sign);
}

// ---------------------------------------------------------------- fp8
enum class Saturation : uint8_t { finite, none };  // finite = __NV_SATFINITE

inline constexpr uint8_t kFp8NaN = 0x7F;
inline constexpr uint8_t kE4m3MaxCode = 0x7E;  // 448
inline constexpr uint8_t kE5m2MaxCode = 0x7B;  // 57344
inline constexpr uint8_t kE5m2InfCode = 0x7C;

// fp32 -> an fp8 format of E exponent and M mantissa bits, RNE; above the
// largest finite code: that code with Saturation::finite, else `overflow`
// (e4m3 has no Inf: NaN; e5m2: Inf).
//
// The same codes as round_magnitude<E, M> (and the format's table:
// tests/core/codecs_exhaustive_test.cpp, all 2^32 inputs, both saturations),
// computed without a branch so that a CPU loop of codes is vector code and
// random data costs no mispredicted rounding branch (session 27: the CPU's
// reshape_and_cache fp8 spent ~30 cycles per element there):
// * |f| at or above the smallest normal 2^(1-bias): the fp32 bits rounded to
//   M mantissa bits in place -- add half an ulp of the target minus one, plus
//   the kept lsb (ties to even), shift -- then rebias the exponent field. A
//   carry out of the mantissa rolls into the exponent, as it should; +Inf
//   lands above every finite code.
// * below it (the format's subnormals, steps of 2^(1-bias-M)): |f| scaled to
//   those steps (exact: a power of two, upward) and rounded to an integer by
//   adding 2^23 in fp32 (round to nearest even, the default mode; no
//   fast-math), whose low bits are then that integer.
template <int E, int M, uint8_t kMaxCode, uint8_t kOverflowCode>
KVSIM_HD constexpr uint8_t f32_to_fp8(float f, Saturation sat) {
  constexpr int kBias = (1 << (E - 1)) - 1;
  constexpr uint32_t kMinNormalBits = static_cast<uint32_t>(127 + 1 - kBias) << 23;
  constexpr uint32_t kRebias = static_cast<uint32_t>(127 - kBias) << M;
  constexpr int kDrop = 23 - M;
  constexpr float kSubnormalSteps = static_cast<float>(1u << (kBias - 1 + M));  // 1 / 2^(1-bias-M)
  const uint32_t x = float_bits(f);
  const uint32_t a = x & 0x7FFFFFFFu;
  const uint32_t normal = ((a + ((1u << (kDrop - 1)) - 1u) + ((a >> kDrop) & 1u)) >> kDrop) - kRebias;
  const uint32_t subnormal = float_bits(bits_float(a) * kSubnormalSteps + 8388608.0f) - 0x4B000000u;
  // The three choices by masks, not selects (which GCC's vectorizer can
  // meet as control flow): normal or subnormal, overflow, NaN.
  const uint32_t normal_mask = 0u - static_cast<uint32_t>(a >= kMinNormalBits);
  const uint32_t magnitude = (normal & normal_mask) | (subnormal & ~normal_mask);
  const uint32_t over_mask = 0u - static_cast<uint32_t>(magnitude > kMaxCode);
  const uint32_t over = sat == Saturation::finite ? kMaxCode : kOverflowCode;
  const uint32_t code = ((x >> 24) & 0x80u) | (magnitude & ~over_mask) | (over & over_mask);
  const uint32_t nan_mask = 0u - static_cast<uint32_t>(a > 0x7F800000u);
  return static_cast<uint8_t>((code & ~nan_mask) | (kFp8NaN & nan_mask));
}

KVSIM_HD constexpr uint8_t f32_to_e4m3(float f, Saturation sat = Saturation::finite) {
  return f32_to_fp8<4, 3, kE4m3MaxCode, kFp8NaN>(f, sat);
}

KVSIM_HD constexpr float e4m3_to_f32(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t mag = c & 0x7Fu;
  const float value = bits_float(float_bits(decode_magnitude<4, 3>(mag)) | sign);
  return mag == 0x7Fu ? bits_float(sign | 0x7FC00000u) : value;  // 0x7F: NaN
}

KVSIM_HD constexpr uint8_t f32_to_e5m2(float f, Saturation sat = Saturation::finite) {
  return f32_to_fp8<5, 2, kE5m2MaxCode, kE5m2InfCode>(f, sat);
}

KVSIM_HD constexpr float e5m2_to_f32(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t mag = c & 0x7Fu;
  if (mag >= kE5m2InfCode) return bits_float(sign | 0x7F800000u | ((mag & 3u) << 21));
  return bits_float(float_bits(decode_magnitude<5, 2>(mag)) | sign);
}

// Two satfinite fp8 codes at once: f32_to_e4m3(lo / hi, finite) in the low /
// high byte (kE5m2: f32_to_e5m2). The codec above is the definition; on the
// device (sm_89+) the pair is the conversion instruction
// cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32 -- round to nearest even on the exact
// value, finite overflow and +-Inf to +-max, -0 and negative underflow keep
// the sign, like the codec -- with one difference fixed by a select: a NaN
// keeps its sign there, while contract §4 fixes 0x7F. One instruction for the
// ~25 integer steps of round_magnitude per code: what bound the quantizing
// write kernels (docs/benchmarks.md). tests/cuda/core_device_test.cu
// (Fp8PairInstructionIsTheCodec) compares both formats over all 2^32 inputs
// in each byte.
template <bool kE5m2>
KVSIM_HD inline uint16_t f32x2_to_fp8x2_satfinite(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t pair;
  if constexpr (kE5m2)
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(hi), "f"(lo));
  const uint16_t lo_code = lo != lo ? kFp8NaN : static_cast<uint16_t>(pair & 0xFFu);
  const uint16_t hi_code = hi != hi ? kFp8NaN : static_cast<uint16_t>(pair >> 8);
  return static_cast<uint16_t>(lo_code | (hi_code << 8));
#else
  const uint8_t a = kE5m2 ? f32_to_e5m2(lo, Saturation::finite) : f32_to_e4m3(lo, Saturation::finite);
  const uint8_t b = kE5m2 ? f32_to_e5m2(hi, Saturation::finite) : f32_to_e4m3(hi, Saturation::finite);
  return static_cast<uint16_t>(a | (b << 8));
#endif
}

// ---------------------------------------------------------------- e2m1 (fp4)
inline constexpr uint8_t kE2m1MaxCode = 0x7;  // 6.0

// e2m1 has eight magnitudes, so round to nearest even is a count of the
// midpoints between neighbouring codes that |f| passes: a midpoint below an
// even code (0.75 -> 1, 1.75 -> 2, 3.5 -> 4) is passed at equality, one below
// an odd code (0.25, 1.25, 2.5, 5) only above it, so ties go to the even code;
// |f| > 5 (+Inf too) is 7, saturation. No branch: the same code as
// round_magnitude<2, 1> would give (tests/core/codecs_exhaustive_test.cpp,
// all 2^32 inputs against the format's table), in fewer steps.
KVSIM_HD constexpr uint8_t f32_to_e2m1(float f) {
  const uint32_t x = float_bits(f);
  const float a = bits_float(x & 0x7FFFFFFFu);
  const uint32_t code = static_cast<uint32_t>(a > 0.25f) + static_cast<uint32_t>(a >= 0.75f) +
                        static_cast<uint32_t>(a > 1.25f) + static_cast<uint32_t>(a >= 1.75f) +
                        static_cast<uint32_t>(a > 2.5f) + static_cast<uint32_t>(a >= 3.5f) +
                        static_cast<uint32_t>(a > 5.0f);
  const uint32_t sign = (x >> 28) & 0x8u;
  // NaN -> 7 by a mask, not a select: a select here left GCC's vectorizer
  // "control flow in loop" (nvfp4_quantize16's code loop stayed scalar).
  const uint32_t nan = 0u - static_cast<uint32_t>(is_nan_bits(x));
  return static_cast<uint8_t>(((sign | code) & ~nan) | (kE2m1MaxCode & nan));
}

KVSIM_HD constexpr float e2m1_to_f32(uint8_t c) {
  const float mag = decode_magnitude<2, 1>(c & 0x7u);
  return (c & 0x8u) ? bits_float(float_bits(mag) | 0x80000000u) : mag;
}

// ---------------------------------------------------------------- int8
// Round to nearest even for |x| < 2^24 (callers clamp first).
KVSIM_HD constexpr int32_t round_half_even_small(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t a = x & 0x7FFFFFFFu;
  const int e = static_cast<int>(a >> 23) - 127;
  if (e < -1) return 0;
  const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  const int shift = 23 - e;  // 1..24 for e in [-1, 22]
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return (x >> 31) ? -static_cast<int32_t>(q) : static_cast<int32_t>(q);
}

KVSIM_HD constexpr int8_t f32_to_int8(float f) {
  if (is_nan(f)) return 0;
  if (f >= 128.0f) return 127;
  if (f <= -129.0f) return -128;
  const int32_t r = round_half_even_small(f);
  return static_cast<int8_t>(r > 127 ? 127 : (r < -128 ? -128 : r));
}

KVSIM_HD constexpr float int8_to_f32(int8_t v) { return static_cast<float>(v); }

// ---------------------------------------------------------------- nvfp4 block
// One 16-element NVFP4 block (contract §4): amax = max|x| (NaN elements ignored);
// sf = amax / (6*g); sf8 = e4m3_satfinite(sf); out = 1 / (float(sf8) * g), or 0
// when amax, sf8 or g is 0; code_i = e2m1(x_i * out). Element 2i goes to the
// low nibble of byte i. Decode: (e2m1(code) * float(sf8)) * g. g must be
// finite and > 0 (checked by validation before any op runs). The group size
// is codec::kNvfp4BlockElems (dtype.hpp: the geometry's scale pool needs it too).

// max |x_i| over one block, NaN elements ignored, as a tree of pairwise
// maxima: with NaN made +0 first every value is >= +0 and ordered, so the
// maximum does not depend on the order (the same value as a running max that
// skips NaN), and the halves are vector code.
KVSIM_HD constexpr float nvfp4_max_ordered(float a, float b) { return b > a ? b : a; }
KVSIM_HD constexpr float nvfp4_block_amax(const float* x) {
  static_assert(kNvfp4BlockElems == 16);
  // One array per level (not one array folded in place): each level stays in
  // registers instead of a store and overlapping loads.
  float m16[16], m8[8], m4[4];
  for (int i = 0; i < 16; ++i) m16[i] = is_nan(x[i]) ? 0.0f : abs_f32(x[i]);
  for (int i = 0; i < 8; ++i) m8[i] = nvfp4_max_ordered(m16[i], m16[i + 8]);
  for (int i = 0; i < 4; ++i) m4[i] = nvfp4_max_ordered(m8[i], m8[i + 4]);
  return nvfp4_max_ordered(nvfp4_max_ordered(m4[0], m4[2]), nvfp4_max_ordered(m4[1], m4[3]));
}

KVSIM_HD constexpr uint8_t nvfp4_scale_of_amax(float amax, float global_scale) {
  const float sf = amax / (6.0f * global_scale);
  return f32_to_e4m3(sf, Saturation::finite);
}

KVSIM_HD constexpr uint8_t nvfp4_block_scale(const float* x, float global_scale) {
  return nvfp4_scale_of_amax(nvfp4_block_amax(x), global_scale);
}

KVSIM_HD constexpr float nvfp4_encode_multiplier(uint8_t scale_code, float global_scale) {
  const float sf8 = e4m3_to_f32(scale_code);
  const float out = 1.0f / (sf8 * global_scale);
  return (sf8 == 0.0f || global_scale == 0.0f) ? 0.0f : out;  // amax == 0 gives sf8 == 0
}

// One block's 16 codes e2m1(x_i * out), packed: element 2i in the low nibble
// of byte i. The codes first, then the nibble pairs: the interleaved form
// stayed scalar on the CPU (session 27).
KVSIM_HD constexpr void nvfp4_encode_block(const float* x, float out, uint8_t* packed) {
  uint8_t codes[kNvfp4BlockElems];
  for (int i = 0; i < kNvfp4BlockElems; ++i) codes[i] = f32_to_e2m1(x[i] * out);
  for (int i = 0; i < kNvfp4BlockElems / 2; ++i) packed[i] = static_cast<uint8_t>(codes[2 * i] | (codes[2 * i + 1] << 4));
}

// Quantize 16 fp32 values; writes 8 packed bytes and returns the scale byte.
KVSIM_HD constexpr uint8_t nvfp4_quantize16(const float* x, float global_scale, uint8_t* packed) {
  const uint8_t scale_code = nvfp4_scale_of_amax(nvfp4_block_amax(x), global_scale);
  nvfp4_encode_block(x, nvfp4_encode_multiplier(scale_code, global_scale), packed);
  return scale_code;
}

// nvfp4_quantize16 of `blocks` consecutive blocks (blocks <= kMaxBlocks):
// block b's 8 packed bytes at packed + 8b, its scale byte in scales[b]. Each
// step is taken for every block before the next (amaxes, scales, multipliers,
// codes), so that a CPU compiles each as vector code over the row; the values
// are nvfp4_quantize16's, block by block (session 27: one block at a time cost
// the CPU ~5 ns an element).
template <int kMaxBlocks>
KVSIM_HD constexpr void nvfp4_quantize_blocks(const float* x, int blocks, float global_scale, uint8_t* packed,
                                              uint8_t* scales) {
  float amax[kMaxBlocks], out[kMaxBlocks];
  for (int b = 0; b < blocks; ++b) amax[b] = nvfp4_block_amax(x + b * kNvfp4BlockElems);
  for (int b = 0; b < blocks; ++b) scales[b] = nvfp4_scale_of_amax(amax[b], global_scale);
  for (int b = 0; b < blocks; ++b) out[b] = nvfp4_encode_multiplier(scales[b], global_scale);
  // The codes of every block, then every nibble pair (nvfp4_encode_block's two
  // steps over the row: per block they ran ~30% slower on the CPU).
  // One flat loop over the row with each element's multiplier spread out: a
  // loop of 16 per block stayed 16 bytes wide (xmm compares) on AVX-512.
  const int n = blocks * kNvfp4BlockElems;
  float mul[kMaxBlocks * kNvfp4BlockElems];
  for (int b = 0; b < blocks; ++b)
    for (int i = 0; i < kNvfp4BlockElems; ++i) mul[b * kNvfp4BlockElems + i] = out[b];  // a broadcast store
  uint8_t codes[kMaxBlocks * kNvfp4BlockElems];
  for (int i = 0; i < n; ++i) codes[i] = f32_to_e2m1(x[i] * mul[i]);
  for (int i = 0; i < n / 2; ++i)
    packed[i] = static_cast<uint8_t>(codes[2 * i] | (codes[2 * i + 1] << 4));
}

// How many nvfp4 blocks one nvfp4_quantize_blocks call of a row loop takes:
// a CPU's vector loops want the row (8 blocks: 128 elements), a GPU thread's
// registers one block (nvfp4_quantize16).
#if defined(__CUDA_ARCH__)
inline constexpr int kNvfp4RowBlocks = 1;
#else
inline constexpr int kNvfp4RowBlocks = 8;
#endif

KVSIM_HD constexpr float nvfp4_decode(uint8_t nibble, uint8_t scale_code, float global_scale) {
  return (e2m1_to_f32(nibble) * e4m3_to_f32(scale_code)) * global_scale;
}

KVSIM_HD constexpr uint8_t nibble_at(const uint8_t* packed, int64_t element) {
  const uint8_t byte = packed[element >> 1];
  return (element & 1) ? static_cast<uint8_t>(byte >> 4) : static_cast<uint8_t>(byte & 0xFu);
}

}  // namespace kvsim::codec
