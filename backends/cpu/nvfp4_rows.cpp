// The CPU backend's nvfp4 block quantizers (nvfp4_rows.hpp). Core's
// arithmetic (codecs.hpp: nvfp4_block_amax, nvfp4_scale_of_amax,
// nvfp4_encode_multiplier, nvfp4_encode_block) is the definition; the
// AVX-512 quantizer performs the same IEEE operations on the same operands
// (-ffp-contract=off stays, no fast-math), so it gives the same bytes for
// every input: tests/oracle/nvfp4_rows_test.cpp holds it to
// codec::nvfp4_quantize16 block by block.
//
// Everything compiled under a target pragma has internal linkage (rows_at
// lies outside it): no inline function shared with other files is emitted
// with wide code (arch.isa_confinement).
#include "backends/cpu/nvfp4_rows.hpp"

#include "backends/cpu/cpu_target.hpp"
#include "kvsim/core/codecs.hpp"

#include <limits>

#if KVSIM_CPU_X86
#include <immintrin.h>
#endif

namespace kvsim::cpu_nvfp4 {
namespace {

template <int kMax>
void rows_core(const float* x, int32_t blocks, float global_scale, uint8_t* packed, uint8_t* scales) {
  codec::nvfp4_quantize_blocks<kMax>(x, blocks, global_scale, packed, scales);
}

// Core's row form at its row loops' size (kNvfp4RowBlocks) where that holds the blocks.
inline void rows_core_any(const float* x, int32_t blocks, float global_scale, uint8_t* packed, uint8_t* scales) {
  if (blocks <= codec::kNvfp4RowBlocks)
    return rows_core<codec::kNvfp4RowBlocks>(x, blocks, global_scale, packed, scales);
  rows_core<kMaxBlocks>(x, blocks, global_scale, packed, scales);
}

void rows_baseline(const float* x, int32_t blocks, float global_scale, uint8_t* packed, uint8_t* scales) {
  rows_core_any(x, blocks, global_scale, packed, scales);
}

#if KVSIM_CPU_X86
KVSIM_CPU_TARGET_BEGIN(KVSIM_CPU_TARGET_AVX2)
// Core's row form compiled for AVX2 (what the write items' AVX2 clones ran).
__attribute__((flatten)) void rows_avx2(const float* x, int32_t blocks, float global_scale, uint8_t* packed,
                                        uint8_t* scales) {
  rows_core_any(x, blocks, global_scale, packed, scales);
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
// The tree and the chain take up to 16 blocks; core's row loops hand over
// kNvfp4RowBlocks (8: a row of D = 128) at a time, which the chain runs in
// half a register. One lane per block throughout (the blocks transposed,
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

// codec::f32_to_e4m3(f, Saturation::finite) on 16 lanes: f32_to_fp8<4, 3>'s
// integer steps (uint32 arithmetic, wrapping as there) and its one fp32
// multiply and add for the subnormal steps.
inline __m512i e4m3_satfinite(__m512 f) {
  const __m512i x = _mm512_castps_si512(f);
  const __m512i a = _mm512_and_si512(x, splat(0x7FFFFFFFu));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a, 20), splat(1));
  const __m512i normal =
      _mm512_sub_epi32(_mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(a, splat((1u << 19) - 1u)), lsb), 20),
                       splat(120u << 3));  // kRebias
  const __m512 scaled = _mm512_mul_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(512.0f));  // kSubnormalSteps
  const __m512i subnormal =
      _mm512_sub_epi32(_mm512_castps_si512(_mm512_add_ps(scaled, _mm512_set1_ps(8388608.0f))), splat(0x4B000000u));
  __m512i magnitude = _mm512_mask_blend_epi32(_mm512_cmpge_epu32_mask(a, splat(121u << 23)), subnormal, normal);
  magnitude = _mm512_mask_mov_epi32(magnitude, _mm512_cmpgt_epu32_mask(magnitude, splat(codec::kE4m3MaxCode)),
                                    splat(codec::kE4m3MaxCode));
  const __m512i code = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(x, 24), splat(0x80u)), magnitude);
  return _mm512_mask_mov_epi32(code, _mm512_cmpgt_epu32_mask(a, splat(0x7F800000u)), splat(codec::kFp8NaN));
}

// codec::e4m3_to_f32 on 16 lanes of codes 0..255: decode_magnitude<4, 3>
// (normal: the code's bits moved into place and rebiased; subnormal: m *
// 2^-9, exact), the sign or-ed in, S.1111.111 -> sign | 0x7FC00000.
inline __m512 e4m3_decode(__m512i c) {
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(c, splat(0x80u)), 24);
  const __m512i mag = _mm512_and_si512(c, splat(0x7Fu));
  const __m512i normal = _mm512_add_epi32(_mm512_slli_epi32(mag, 20), splat(120u << 23));
  const __m512 subnormal =
      _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(mag, splat(7u))), _mm512_set1_ps(0x1p-9f));
  __m512i bits = _mm512_mask_mov_epi32(normal, _mm512_cmplt_epu32_mask(mag, splat(8u)), _mm512_castps_si512(subnormal));
  bits = _mm512_or_si512(bits, sign);
  bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(mag, splat(0x7Fu)),
                               _mm512_or_si512(sign, splat(0x7FC00000u)));
  return _mm512_castsi512_ps(bits);
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

// nvfp4_quantize16 of `blocks` (1..16) blocks, kIn = 8 or 16 (>= blocks).
template <int kIn>
inline void rows_avx512_n(const float* x, int32_t blocks, float global_scale, uint8_t* packed, uint8_t* scales) {
  __m512 v[kIn], a[kIn];
  for (int b = 0; b < kIn; ++b) {
    v[b] = b < blocks ? _mm512_loadu_ps(x + 16 * b) : _mm512_setzero_ps();
    a[b] = amax_input(v[b]);
  }
  const __m512 amax = block_amaxes<kIn>(a);
  // nvfp4_scale_of_amax: sf = amax / (6 * g), e4m3 satfinite.
  const __m512i code = e4m3_satfinite(_mm512_div_ps(amax, _mm512_set1_ps(6.0f * global_scale)));
  // nvfp4_encode_multiplier: 1 / (sf8 * g), or 0 where sf8 == 0 or g == 0.
  const __m512 sf8 = e4m3_decode(code);
  const __m512 out = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_mul_ps(sf8, _mm512_set1_ps(global_scale)));
  const __mmask16 zero =
      global_scale == 0.0f ? __mmask16(0xFFFF) : _mm512_cmp_ps_mask(sf8, _mm512_setzero_ps(), _CMP_EQ_OQ);
  alignas(64) float mul[16];
  _mm512_store_ps(mul, _mm512_maskz_mov_ps(static_cast<__mmask16>(~zero), out));
  // The scale bytes in block order.
  const __m512i order = _mm512_setr_epi32(lane_of(0), lane_of(1), lane_of(2), lane_of(3), lane_of(4), lane_of(5),
                                          lane_of(6), lane_of(7), lane_of(8), lane_of(9), lane_of(10), lane_of(11),
                                          lane_of(12), lane_of(13), lane_of(14), lane_of(15));
  _mm_mask_storeu_epi8(scales, static_cast<__mmask16>((1u << blocks) - 1u),
                       _mm512_cvtepi32_epi8(_mm512_permutexvar_epi32(order, code)));
  // nvfp4_encode_block: e2m1(x_i * out) per element, element 2i in the low
  // nibble of byte i (each 64-bit lane's two nibbles into its low byte).
  for (int b = 0; b < kIn; ++b) {
    if (b >= blocks) break;
    const __m512i nib = e2m1_nibbles(_mm512_mul_ps(v[b], _mm512_set1_ps(mul[lane_of(b)])));
    // Per 64-bit lane: bits 0-3 from the even element, 4-7 from the odd one's bits 32-35.
    const __m512i pairs = _mm512_ternarylogic_epi64(_mm512_srli_epi64(nib, 28), nib, _mm512_set1_epi64(0xF0), 0xE4);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(packed + 8 * b), _mm512_cvtepi64_epi8(pairs));
  }
}

void rows_avx512(const float* x, int32_t blocks, float global_scale, uint8_t* packed, uint8_t* scales) {
  if (blocks <= 8) return rows_avx512_n<8>(x, blocks, global_scale, packed, scales);
  rows_avx512_n<16>(x, blocks, global_scale, packed, scales);
}

KVSIM_CPU_TARGET_END
#endif

}  // namespace

RowsFn rows_at(CpuIsa isa) {
#if KVSIM_CPU_X86
  if (isa != CpuIsa::portable) return isa == CpuIsa::avx512 ? &rows_avx512 : &rows_avx2;
#endif
  (void)isa;
  return &rows_baseline;
}

}  // namespace kvsim::cpu_nvfp4
