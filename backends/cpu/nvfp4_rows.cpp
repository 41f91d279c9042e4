// The CPU backend's nvfp4 block quantizers (nvfp4_rows.hpp). Core's
// arithmetic (codecs.hpp: nvfp4_block_amax, nvfp4_scale_of_amax,
// nvfp4_encode_multiplier, nvfp4_encode_block) is the definition; the
// AVX-512 and AVX2 quantizers perform the same IEEE operations on the same
// operands (-ffp-contract=off stays, no fast-math), so they give the same
// bytes for every input: tests/oracle/nvfp4_rows_test.cpp holds each to
// codec::nvfp4_quantize16 block by block.
//
// Everything compiled under a target pragma has internal linkage (rows_at
// lies outside it): no inline function shared with other files is emitted
// with wide code (arch.isa_confinement).
#include "backends/cpu/nvfp4_rows.hpp"

#include "backends/cpu/cpu_target.hpp"
#include "kvsim/core/codecs.hpp"

#include <cstring>
#include <limits>

#if KVSIM_CPU_X86
#include <immintrin.h>
#endif

namespace kvsim::cpu_nvfp4 {
namespace {

void rows_baseline(const Nvfp4Row* rows, int32_t nrows, int32_t blocks) { CoreNvfp4Rows{}(rows, nrows, blocks); }

// The wide quantizers load fp32 and bf16 rows in place; an fp16 row (no
// vector conversion in the avx2 feature list) is converted first by core's
// load_floats, in baseline code, and passed on as fp32.
template <RowsFn kFloatRows>
void rows_any_dtype(const Nvfp4Row* rows, int32_t nrows, int32_t blocks) {
  if (rows[0].dtype != CacheDtype::fp16 && (nrows < 2 || rows[1].dtype != CacheDtype::fp16))
    return kFloatRows(rows, nrows, blocks);
  float x[2][kMaxBlocks * codec::kNvfp4BlockElems];
  Nvfp4Row r[2];
  for (int32_t i = 0; i < nrows; ++i) {
    r[i] = rows[i];
    if (r[i].dtype != CacheDtype::fp16) continue;
    load_floats(r[i].x, r[i].dtype, 0, 1, blocks * codec::kNvfp4BlockElems, x[i]);
    r[i].x = x[i];
    r[i].dtype = CacheDtype::fp32;
  }
  kFloatRows(r, nrows, blocks);
}

// Block j of row (rows, nrows, blocks)'s block list b (row b / blocks).
struct BlockAt {
  const void* x;
  bool bf16;
  uint8_t* packed;
};
inline BlockAt block_at(const Nvfp4Row* rows, int32_t blocks, int32_t b) {
  const int32_t r = b >= blocks, j = b - r * blocks;
  const bool bf16 = rows[r].dtype == CacheDtype::bf16;
  return {static_cast<const uint8_t*>(rows[r].x) + static_cast<int64_t>(j) * 16 * (bf16 ? 2 : 4), bf16,
          rows[r].packed + 8 * j};
}

// The second row's scale bytes from the call's block-order scale bytes sc
// (the first row's took a masked or whole store).
inline void store_second_scales(const Nvfp4Row* rows, int32_t nrows, int32_t blocks, const uint8_t* sc) {
  if (nrows < 2) return;
  for (int32_t j = 0; j < blocks; ++j) rows[1].scales[j] = sc[blocks + j];
}

#if KVSIM_CPU_X86
KVSIM_CPU_TARGET_BEGIN(KVSIM_CPU_TARGET_AVX2)

// ---------------------------------------------------------------- AVX2
// The AVX-512 quantizer's steps (below) in 8-lane registers: a block is two
// ymm, the per-block chain runs in one lane per block of two registers
// (blocks 0-7, 8-15), the amax tree leaves block b of a group of 8 in lane
// lane_of8(b). Without unsigned compares, vrangeps, ternary logic or masked
// byte stores, the steps use signed compares where the operands are known
// to lie in [0, 2^31), vminps of |t| for the range, and/or for the selects.

inline __m256i splat8(uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); }

// |x| with NaN as +0 (vmaxps returns its second operand when either is NaN).
inline __m256 amax_input8(__m256 x) {
  return _mm256_max_ps(_mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(x), splat8(0x7FFFFFFFu))),
                       _mm256_setzero_ps());
}

// The maxima of 8 blocks' partials m[b] (8 values >= +0 each): lane
// lane_of8(b) holds block b's maximum (the same in any order).
inline __m256 block_amaxes8(const __m256* m) {
  __m256 w[4], y[2];
  for (int j = 0; j < 4; ++j)  // [block 2j | block 2j + 1], 4 partials each
    w[j] = _mm256_max_ps(_mm256_permute2f128_ps(m[2 * j], m[2 * j + 1], 0x20),
                         _mm256_permute2f128_ps(m[2 * j], m[2 * j + 1], 0x31));
  for (int j = 0; j < 2; ++j) {  // [block 4j, 4j + 2 | 4j + 1, 4j + 3], 2 partials each
    const __m256d lo = _mm256_unpacklo_pd(_mm256_castps_pd(w[2 * j]), _mm256_castps_pd(w[2 * j + 1]));
    const __m256d hi = _mm256_unpackhi_pd(_mm256_castps_pd(w[2 * j]), _mm256_castps_pd(w[2 * j + 1]));
    y[j] = _mm256_max_ps(_mm256_castpd_ps(lo), _mm256_castpd_ps(hi));
  }
  // [0, 2, 4, 6 | 1, 3, 5, 7]
  return _mm256_max_ps(_mm256_shuffle_ps(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm256_shuffle_ps(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
}
constexpr int lane_of8(int b) { return 4 * (b & 1) + (b >> 1); }
constexpr int block_of_lane8(int l) { return 2 * (l & 3) + (l >> 2); }

// codec::f32_to_e4m3(f, Saturation::finite) on 8 lanes: f32_to_fp8<4, 3>'s
// integer steps (uint32 arithmetic, wrapping as there) and its one fp32
// multiply and add for the subnormal steps. The signed compares are exact:
// a = |bits| < 2^31, and the chosen magnitude lies in [0, 1088] (normal
// lanes: a >= 121 << 23; subnormal: 0..8).
inline __m256i e4m3_satfinite8(__m256 f) {
  const __m256i x = _mm256_castps_si256(f);
  const __m256i a = _mm256_and_si256(x, splat8(0x7FFFFFFFu));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, 20), splat8(1));
  const __m256i normal =
      _mm256_sub_epi32(_mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(a, splat8((1u << 19) - 1u)), lsb), 20),
                       splat8(120u << 3));  // kRebias
  const __m256 scaled = _mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(512.0f));  // kSubnormalSteps
  const __m256i subnormal =
      _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(scaled, _mm256_set1_ps(8388608.0f))), splat8(0x4B000000u));
  __m256i magnitude = _mm256_blendv_epi8(subnormal, normal, _mm256_cmpgt_epi32(a, splat8((121u << 23) - 1u)));
  magnitude = _mm256_min_epi32(magnitude, splat8(codec::kE4m3MaxCode));
  const __m256i code = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(x, 24), splat8(0x80u)), magnitude);
  return _mm256_blendv_epi8(code, splat8(codec::kFp8NaN), _mm256_cmpgt_epi32(a, splat8(0x7F800000u)));
}

// codec::e4m3_to_f32 on 8 lanes of codes 0..255: decode_magnitude<4, 3>
// (normal: the code's bits moved into place and rebiased; subnormal: m *
// 2^-9, exact), the sign or-ed in, S.1111.111 -> sign | 0x7FC00000.
inline __m256 e4m3_decode8(__m256i c) {
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, splat8(0x80u)), 24);
  const __m256i mag = _mm256_and_si256(c, splat8(0x7Fu));
  const __m256i normal = _mm256_add_epi32(_mm256_slli_epi32(mag, 20), splat8(120u << 23));
  const __m256 subnormal =
      _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(mag, splat8(7u))), _mm256_set1_ps(0x1p-9f));
  __m256i bits = _mm256_blendv_epi8(normal, _mm256_castps_si256(subnormal), _mm256_cmpgt_epi32(splat8(8u), mag));
  bits = _mm256_or_si256(bits, sign);
  bits = _mm256_blendv_epi8(bits, _mm256_or_si256(sign, splat8(0x7FC00000u)), _mm256_cmpeq_epi32(mag, splat8(0x7Fu)));
  return _mm256_castsi256_ps(bits);
}

// e2m1_nibbles below on 8 lanes, the nibble alone in each lane (bits 4-31
// zero): min(|t|, 6) by vminps (t is never NaN), and the code bits 0-2 of s
// (its mantissa is the code, 0..7) with the sign of t in bit 3.
inline __m256i e2m1_nibbles8(__m256 y) {
  const __m256 t = _mm256_min_ps(y, _mm256_set1_ps(std::numeric_limits<float>::infinity()));
  const __m256 c =
      _mm256_min_ps(_mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(t), splat8(0x7FFFFFFFu))),
                    _mm256_set1_ps(6.0f));
  const __m256i ef = _mm256_max_epi32(_mm256_and_si256(_mm256_castps_si256(c), splat8(0x7F800000u)), splat8(127u << 23));
  const __m256i m = _mm256_add_epi32(_mm256_add_epi32(ef, splat8((22u << 23) - 254u)), _mm256_srli_epi32(ef, 22));
  const __m256i s = _mm256_castps_si256(_mm256_add_ps(c, _mm256_castsi256_ps(m)));
  return _mm256_or_si256(_mm256_and_si256(s, splat8(7u)),
                         _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(t), 28), splat8(8u)));
}

// One block's 8 packed bytes from its two halves' nibbles: each 64-bit lane's
// pair into its low byte, then bytes 0 and 8 of each 128-bit lane gathered
// into place (A0 A1 | A2 A3 from the first half, A4 A5 | A6 A7 from the second).
inline __m128i pack_block8(__m256i n0, __m256i n1) {
  const __m256i p0 = _mm256_or_si256(n0, _mm256_srli_epi64(n0, 28));
  const __m256i p1 = _mm256_or_si256(n1, _mm256_srli_epi64(n1, 28));
  const char z = static_cast<char>(0x80);
  const __m256i i0 = _mm256_setr_epi8(0, 8, z, z, z, z, z, z, z, z, z, z, z, z, z, z,  //
                                      z, z, 0, 8, z, z, z, z, z, z, z, z, z, z, z, z);
  const __m256i i1 = _mm256_setr_epi8(z, z, z, z, 0, 8, z, z, z, z, z, z, z, z, z, z,  //
                                      z, z, z, z, z, z, 0, 8, z, z, z, z, z, z, z, z);
  const __m256i u = _mm256_or_si256(_mm256_shuffle_epi8(p0, i0), _mm256_shuffle_epi8(p1, i1));
  return _mm_or_si128(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
}

inline void load_block8(const BlockAt& at, __m256& lo, __m256& hi) {
  if (at.bf16) {  // bf16_to_f32: the bits moved to the top half, exact
    const __m128i* h = static_cast<const __m128i*>(at.x);
    lo = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(h)), 16));
    hi = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(h + 1)), 16));
    return;
  }
  lo = _mm256_loadu_ps(static_cast<const float*>(at.x));
  hi = _mm256_loadu_ps(static_cast<const float*>(at.x) + 8);
}

// nvfp4_quantize16 of the call's nrows * blocks (<= 16) blocks; kGroups = 1
// or 2 groups of 8.
template <int kGroups>
inline void rows_avx2_n(const Nvfp4Row* rows, int32_t nrows, int32_t blocks) {
  constexpr int kIn = 8 * kGroups;
  const int32_t total = nrows * blocks;
  __m256 v[kIn][2], m[kIn];
  for (int b = 0; b < kIn; ++b) {
    if (b < total) load_block8(block_at(rows, blocks, b), v[b][0], v[b][1]);
    else v[b][0] = v[b][1] = _mm256_setzero_ps();
    m[b] = _mm256_max_ps(amax_input8(v[b][0]), amax_input8(v[b][1]));
  }
  const float g1 = nrows > 1 ? rows[1].global_scale : rows[0].global_scale;
  alignas(32) float mul[kIn];
  alignas(32) int32_t codes[kIn];
  for (int k = 0; k < kGroups; ++k) {
    const __m256 amax = block_amaxes8(m + 8 * k);
    const __m256i lane_block = _mm256_setr_epi32(8 * k + block_of_lane8(0), 8 * k + block_of_lane8(1),
                                                 8 * k + block_of_lane8(2), 8 * k + block_of_lane8(3),
                                                 8 * k + block_of_lane8(4), 8 * k + block_of_lane8(5),
                                                 8 * k + block_of_lane8(6), 8 * k + block_of_lane8(7));
    const __m256 g = _mm256_blendv_ps(_mm256_set1_ps(rows[0].global_scale), _mm256_set1_ps(g1),
                                      _mm256_castsi256_ps(_mm256_cmpgt_epi32(lane_block, splat8(blocks - 1))));
    const __m256i code = e4m3_satfinite8(_mm256_div_ps(amax, _mm256_mul_ps(_mm256_set1_ps(6.0f), g)));
    const __m256 sf8 = e4m3_decode8(code);
    const __m256 out = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_mul_ps(sf8, g));
    const __m256 zero = _mm256_or_ps(_mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_EQ_OQ),
                                     _mm256_cmp_ps(sf8, _mm256_setzero_ps(), _CMP_EQ_OQ));
    _mm256_store_ps(mul + 8 * k, _mm256_andnot_ps(zero, out));
    _mm256_store_si256(reinterpret_cast<__m256i*>(codes + 8 * k), code);
  }
  // The scale bytes in block order: the first row's, then the second's.
  alignas(16) uint8_t sc[16];
  for (int b = 0; b < kIn; ++b) sc[b] = static_cast<uint8_t>(codes[8 * (b >> 3) + lane_of8(b & 7)]);
  if (blocks == 8) {
    std::memcpy(rows[0].scales, sc, 8);
    if (nrows > 1) std::memcpy(rows[1].scales, sc + 8, 8);
  } else {
    for (int32_t j = 0; j < blocks; ++j) rows[0].scales[j] = sc[j];
    store_second_scales(rows, nrows, blocks, sc);
  }
  for (int b = 0; b < kIn; ++b) {
    if (b >= total) break;
    const __m256 f = _mm256_set1_ps(mul[8 * (b >> 3) + lane_of8(b & 7)]);
    const __m128i bytes = pack_block8(e2m1_nibbles8(_mm256_mul_ps(v[b][0], f)), e2m1_nibbles8(_mm256_mul_ps(v[b][1], f)));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(block_at(rows, blocks, b).packed), bytes);
  }
}

void rows_avx2(const Nvfp4Row* rows, int32_t nrows, int32_t blocks) {
  if (nrows * blocks <= 8) return rows_avx2_n<1>(rows, nrows, blocks);
  rows_avx2_n<2>(rows, nrows, blocks);
}

KVSIM_CPU_TARGET_END

KVSIM_CPU_TARGET_BEGIN(KVSIM_CPU_TARGET_AVX512)

// ---------------------------------------------------------------- AVX-512
// One block per zmm (16 floats: one block, exactly), and one zmm lane per
// block for the per-block chain. A block's loads, its 16 products and codes
// and its nibble packing stay in its own register with no transposition;
// only the amax crosses lanes, as a transposing max tree (block_amaxes) that
// leaves each block's amax in its own lane of one register. The chain --
// amax / (6 g), e4m3 encode, decode, 1 / (sf8 g) -- then runs once for up to
// 16 blocks, two divisions for the whole call instead of two per block (the
// scalar chain was most of a block's time: docs/benchmarks.md, session 28).
// The tree and the chain take up to 16 blocks; core's row loops hand over an
// item's K and V rows of D = 128 together (16 blocks: the chain's ~20 ns once
// per 256 elements, session 31), each lane under its row's global scale. One lane per block throughout (the blocks transposed,
// 16 blocks a register per element) would need a 16 x 16 transpose of the
// inputs and of the codes: more shuffles than the one tree.

inline __m512i splat(uint32_t v) { return _mm512_set1_epi32(static_cast<int>(v)); }

// |x| with NaN as +0 (nvfp4_block_amax's first level): vmaxps returns its
// second operand when either is NaN, and +0 for two zeros.
inline __m512 amax_input(__m512 x) {
  return _mm512_max_ps(_mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), splat(0x7FFFFFFFu))),
                       _mm512_setzero_ps());
}

// The maxima of kIn (8 or 16) registers a[b] of values >= +0 (no NaN, no -0:
// the maximum is the same in any order, so a tree of another shape gives
// nvfp4_block_amax's value). Lane 4L + i of the result holds block 4i + L's
// maximum (lane_of); for kIn = 8, lanes 4L + 2 and 4L + 3 repeat blocks L
// and 4 + L. 15 maxima and 30 shuffles for 16 blocks.
template <int kIn>
inline __m512 block_amaxes(const __m512* a) {
  static_assert(kIn == 8 || kIn == 16);
  __m512 w[kIn / 2], x[kIn / 4], y[2];
  // 8 partials per block: [block 2j | block 2j + 1] by 256-bit halves.
  for (int j = 0; j < kIn / 2; ++j)
    w[j] = _mm512_max_ps(_mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], 0x44),
                         _mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], 0xEE));
  // 4 partials per block: 128-bit lane q of x[j] is block 4j + q.
  for (int j = 0; j < kIn / 4; ++j)
    x[j] = _mm512_max_ps(_mm512_shuffle_f32x4(w[2 * j], w[2 * j + 1], 0x88),
                         _mm512_shuffle_f32x4(w[2 * j], w[2 * j + 1], 0xDD));
  // 2 partials per block: lane L of y[j] is [block 8j + L (2), block 8j + 4 + L (2)].
  for (int j = 0; j < kIn / 8; ++j) {
    const __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(x[2 * j]), _mm512_castps_pd(x[2 * j + 1]));
    const __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(x[2 * j]), _mm512_castps_pd(x[2 * j + 1]));
    y[j] = _mm512_max_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
  }
  if constexpr (kIn == 8) y[1] = y[0];
  // 1 per block: lane L is [block L, 4 + L, 8 + L, 12 + L].
  return _mm512_max_ps(_mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// The lane of block b in block_amaxes's result (a 4 x 4 transpose: its own inverse).
constexpr int lane_of(int b) { return 4 * (b & 3) + (b >> 2); }

// The chain's e4m3 steps on 16 lanes: the AVX2 ones (e4m3_satfinite8,
// e4m3_decode8) on each half. They run once per call, so the halves cost
// little, and the one definition serves both ISAs.
inline __m512i e4m3_satfinite(__m512 f) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(e4m3_satfinite8(_mm512_castps512_ps256(f))),
                            e4m3_satfinite8(_mm512_extractf32x8_ps(f, 1)), 1);
}
inline __m512 e4m3_decode(__m512i c) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(e4m3_decode8(_mm512_castsi512_si256(c))),
                            e4m3_decode8(_mm512_extracti64x4_epi64(c, 1)), 1);
}

// Sixteen nibbles codec::f32_to_e2m1(y), in the low 4 bits of each lane
// (bits above them are not zero). Not core's count of midpoints but the same
// code for every fp32 y (the test holds it to f32_to_e2m1 through the
// quantizer):
//  * t = min(y, +Inf) is y, or +Inf for NaN (vminps returns its second
//    operand when either is NaN): NaN is +6, code 0x7, positive.
//  * c = min(|t|, 6) (vrangeps: the smaller magnitude, sign cleared); |y| >= 6
//    and (5, 6) both round to 6, code 7.
//  * binade E = max(exponent(c), 0) in {0, 1, 2}: e2m1's step there is
//    2^(E-1) (0.5 below 2, then 1, then 2). s = c + m, m = 2^(E+22) + 2E
//    steps, is one fp32 add whose ulp is that step: it rounds c to nearest
//    even on e2m1's grid (m is a whole number of steps, an even one, so the
//    parity of s's mantissa is that of c's rounded step count k), and s's
//    mantissa is 2E + k, the code (0..7).
//  * the sign, bit 31 of t, into bit 3.
inline __m512i e2m1_nibbles(__m512 y) {
  const __m512 t = _mm512_min_ps(y, _mm512_set1_ps(std::numeric_limits<float>::infinity()));
  const __m512 c = _mm512_range_ps(t, _mm512_set1_ps(6.0f), 0x0A);  // [1:0] = 10: min |.|; [3:2] = 10: sign 0
  const __m512i ef = _mm512_max_epu32(_mm512_and_si512(_mm512_castps_si512(c), splat(0x7F800000u)), splat(127u << 23));
  // m = ef + (22 << 23) + 2E, with 2E = (ef >> 22) - 254
  const __m512i m = _mm512_add_epi32(_mm512_add_epi32(ef, splat((22u << 23) - 254u)), _mm512_srli_epi32(ef, 22));
  const __m512i s = _mm512_castps_si512(_mm512_add_ps(c, _mm512_castsi512_ps(m)));
  // bit 3 from t >> 28 (the sign), every other bit from s
  return _mm512_ternarylogic_epi32(_mm512_srli_epi32(_mm512_castps_si512(t), 28), s, splat(8u), 0xE4);
}

inline __m512 load_block(const BlockAt& at, int type) {
  if (type < 0 ? at.bf16 : type == 1)  // bf16_to_f32: the bits moved to the top half, exact
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(static_cast<const __m256i*>(at.x))), 16));
  return _mm512_loadu_ps(static_cast<const float*>(at.x));
}

// nvfp4_quantize16 of the call's nrows * blocks blocks (kIn = 8 or 16, >=
// that), each row under its own global scale: the chain's lanes take theirs.
// kBlocks > 0: the call's shape fixed (blocks = kBlocks, nrows = kIn /
// kBlocks) and kType its rows' dtype (0 fp32, 1 bf16), so that the block
// loops unroll with each block's row and offset known and v[] stays in
// registers (with run-time shapes they stayed loops over the stack).
template <int kIn, int kBlocks = 0, int kType = -1>
inline void rows_avx512_n(const Nvfp4Row* rows, int32_t nrows_arg, int32_t blocks_arg) {
  const int32_t blocks = kBlocks > 0 ? kBlocks : blocks_arg, nrows = kBlocks > 0 ? kIn / kBlocks : nrows_arg;
  const int32_t total = nrows * blocks;
  __m512 v[kIn], a[kIn];
#pragma GCC unroll 16
  for (int b = 0; b < kIn; ++b) {
    v[b] = b < total ? load_block(block_at(rows, blocks, b), kType) : _mm512_setzero_ps();
    a[b] = amax_input(v[b]);
  }
  const __m512 amax = block_amaxes<kIn>(a);
  // The lanes' blocks (lane_of is its own inverse); those of the second row take its scale.
  const __m512i lane_block = _mm512_setr_epi32(lane_of(0), lane_of(1), lane_of(2), lane_of(3), lane_of(4),
                                               lane_of(5), lane_of(6), lane_of(7), lane_of(8), lane_of(9),
                                               lane_of(10), lane_of(11), lane_of(12), lane_of(13), lane_of(14),
                                               lane_of(15));
  const float g1 = nrows > 1 ? rows[1].global_scale : rows[0].global_scale;
  const __m512 g = _mm512_mask_blend_ps(_mm512_cmpge_epi32_mask(lane_block, _mm512_set1_epi32(blocks)),
                                        _mm512_set1_ps(rows[0].global_scale), _mm512_set1_ps(g1));
  // nvfp4_scale_of_amax: sf = amax / (6 * g), e4m3 satfinite.
  const __m512i code = e4m3_satfinite(_mm512_div_ps(amax, _mm512_mul_ps(_mm512_set1_ps(6.0f), g)));
  // nvfp4_encode_multiplier: 1 / (sf8 * g), or 0 where sf8 == 0 or g == 0.
  const __m512 sf8 = e4m3_decode(code);
  const __m512 out = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_mul_ps(sf8, g));
  const __mmask16 zero = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_EQ_OQ) |
                         _mm512_cmp_ps_mask(sf8, _mm512_setzero_ps(), _CMP_EQ_OQ);
  alignas(64) float mul[16];
  _mm512_store_ps(mul, _mm512_maskz_mov_ps(static_cast<__mmask16>(~zero), out));
  // The scale bytes in block order (lane_block is also the gather order):
  // the first row's in one masked store, the second's after them.
  const __m128i sc = _mm512_cvtepi32_epi8(_mm512_permutexvar_epi32(lane_block, code));
  _mm_mask_storeu_epi8(rows[0].scales, static_cast<__mmask16>((1u << blocks) - 1u), sc);
  if (nrows > 1) {
    if (blocks == 8) {
      _mm_storel_epi64(reinterpret_cast<__m128i*>(rows[1].scales), _mm_unpackhi_epi64(sc, sc));
    } else {
      alignas(16) uint8_t bytes[16];
      _mm_store_si128(reinterpret_cast<__m128i*>(bytes), sc);
      store_second_scales(rows, nrows, blocks, bytes);
    }
  }
  // nvfp4_encode_block: e2m1(x_i * out) per element, element 2i in the low
  // nibble of byte i (each 64-bit lane's two nibbles into its low byte).
#pragma GCC unroll 16
  for (int b = 0; b < kIn; ++b) {
    if (b >= total) break;
    const __m512i nib = e2m1_nibbles(_mm512_mul_ps(v[b], _mm512_set1_ps(mul[lane_of(b)])));
    // Per 64-bit lane: bits 0-3 from the even element, 4-7 from the odd one's bits 32-35.
    const __m512i pairs = _mm512_ternarylogic_epi64(_mm512_srli_epi64(nib, 28), nib, _mm512_set1_epi64(0xF0), 0xE4);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(block_at(rows, blocks, b).packed), _mm512_cvtepi64_epi8(pairs));
  }
}

void rows_avx512(const Nvfp4Row* rows, int32_t nrows, int32_t blocks) {
  // The row loops' shapes (an item's K and V rows of D = 128, one row of
  // 128 or 256) with one dtype, fixed; any other shape at run time.
  const bool one_type = nrows == 1 || rows[0].dtype == rows[1].dtype;
  if (one_type && blocks * nrows == 16 && (blocks == 8 || blocks == 16)) {
    if (rows[0].dtype == CacheDtype::bf16)
      return blocks == 8 ? rows_avx512_n<16, 8, 1>(rows, nrows, blocks) : rows_avx512_n<16, 16, 1>(rows, nrows, blocks);
    return blocks == 8 ? rows_avx512_n<16, 8, 0>(rows, nrows, blocks) : rows_avx512_n<16, 16, 0>(rows, nrows, blocks);
  }
  if (nrows == 1 && blocks == 8)
    return rows[0].dtype == CacheDtype::bf16 ? rows_avx512_n<8, 8, 1>(rows, nrows, blocks)
                                             : rows_avx512_n<8, 8, 0>(rows, nrows, blocks);
  if (nrows * blocks <= 8) return rows_avx512_n<8>(rows, nrows, blocks);
  rows_avx512_n<16>(rows, nrows, blocks);
}

KVSIM_CPU_TARGET_END
#endif

}  // namespace

RowsFn rows_at(CpuIsa isa) {
#if KVSIM_CPU_X86
  if (isa == CpuIsa::avx512) return &rows_any_dtype<&rows_avx512>;
  if (isa == CpuIsa::avx2) return &rows_any_dtype<&rows_avx2>;
#endif
  (void)isa;
  return &rows_baseline;
}

}  // namespace kvsim::cpu_nvfp4
