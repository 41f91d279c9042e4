// AVX-512 kernels of the fast attention path (attention_fast.hpp), compiled
// for AVX-512F/BW/VL/DQ + FMA with a target pragma and used only where the
// CPU reports those features at run time (cpu_isa.hpp); every other host takes the
// portable kernels. Each vector operation is the IEEE operation core's
// scalar order performs on that element (fma is correctly rounded in both),
// so the bytes are those of attend_query; no flag of the build changes
// (-ffp-contract=off stays, and no fast-math).
//
// Everything compiled under the pragma has internal linkage (the kernel table
// and its accessor lie outside it): no inline function shared with other
// files is ever emitted with AVX-512 code.
#include "backends/cpu/attention_fast.hpp"

#include "backends/cpu/cpu_target.hpp"

#if KVSIM_CPU_X86
#include <immintrin.h>

#include "backends/cpu/attention_simd.hpp"
#endif

#if KVSIM_CPU_X86

KVSIM_CPU_TARGET_BEGIN(KVSIM_CPU_TARGET_AVX512)

namespace kvsim::cpu_attention {
namespace {

using canon::kPartitionSize;

// ---------------------------------------------------------------- row decoders
// Elements [i, i + 16) of a row as their exact fp32 values: bit-identical to
// core's codecs for every code (checked exhaustively by the fast-path test).
template <RowFormat F>
inline __m512 dec16(const uint8_t* row, int32_t i);

template <>
inline __m512 dec16<RowFormat::f32>(const uint8_t* row, int32_t i) {
  return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + i);
}

template <>
inline __m512 dec16<RowFormat::bf16>(const uint8_t* row, int32_t i) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * i));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// codec::f16_to_f32: Inf/NaN keep their payload; normals rebias the
// exponent; subnormals are m * 2^-24 (exact); the sign is or-ed in.
inline __m512 f16_to_f32x16(__m512i x) {  // x: 16 codes zero-extended to 32 bits
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(x, _mm512_set1_epi32(0x8000)), 16);
  const __m512i mag = _mm512_and_si512(x, _mm512_set1_epi32(0x7FFF));
  const __m512i shifted = _mm512_slli_epi32(mag, 13);
  __m512i bits = _mm512_add_epi32(shifted, _mm512_set1_epi32(112 << 23));
  bits = _mm512_mask_mov_epi32(bits, _mm512_cmpge_epu32_mask(mag, _mm512_set1_epi32(0x7C00)),
                               _mm512_or_si512(shifted, _mm512_set1_epi32(0x7F800000)));
  const __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(mag), _mm512_set1_ps(0x1p-24f));
  bits = _mm512_mask_mov_epi32(bits, _mm512_cmplt_epu32_mask(mag, _mm512_set1_epi32(0x400)), _mm512_castps_si512(sub));
  return _mm512_castsi512_ps(_mm512_or_si512(bits, sign));
}

template <>
inline __m512 dec16<RowFormat::f16>(const uint8_t* row, int32_t i) {
  return f16_to_f32x16(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * i))));
}

// codec::e4m3_to_f32: S.1111.111 is NaN (sign | 0x7FC00000).
template <>
inline __m512 dec16<RowFormat::e4m3>(const uint8_t* row, int32_t i) {
  const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + i)));
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(x, _mm512_set1_epi32(0x80)), 24);
  const __m512i mag = _mm512_and_si512(x, _mm512_set1_epi32(0x7F));
  __m512i bits = _mm512_add_epi32(_mm512_slli_epi32(mag, 20), _mm512_set1_epi32(120 << 23));
  const __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(mag), _mm512_set1_ps(0x1p-9f));
  bits = _mm512_mask_mov_epi32(bits, _mm512_cmplt_epu32_mask(mag, _mm512_set1_epi32(8)), _mm512_castps_si512(sub));
  bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epu32_mask(mag, _mm512_set1_epi32(0x7F)),
                               _mm512_set1_epi32(0x7FC00000));
  return _mm512_castsi512_ps(_mm512_or_si512(bits, sign));
}

// codec::e5m2_to_f32: exponent all ones is Inf/NaN with the 2-bit payload.
template <>
inline __m512 dec16<RowFormat::e5m2>(const uint8_t* row, int32_t i) {
  const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + i)));
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(x, _mm512_set1_epi32(0x80)), 24);
  const __m512i mag = _mm512_and_si512(x, _mm512_set1_epi32(0x7F));
  __m512i bits = _mm512_add_epi32(_mm512_slli_epi32(mag, 21), _mm512_set1_epi32(112 << 23));
  bits = _mm512_mask_mov_epi32(
      bits, _mm512_cmpge_epu32_mask(mag, _mm512_set1_epi32(0x7C)),
      _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(mag, _mm512_set1_epi32(3)), 21), _mm512_set1_epi32(0x7F800000)));
  const __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(mag), _mm512_set1_ps(0x1p-16f));
  bits = _mm512_mask_mov_epi32(bits, _mm512_cmplt_epu32_mask(mag, _mm512_set1_epi32(4)), _mm512_castps_si512(sub));
  return _mm512_castsi512_ps(_mm512_or_si512(bits, sign));
}

template <>
inline __m512 dec16<RowFormat::i8>(const uint8_t* row, int32_t i) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + i))));
}

// ---------------------------------------------------------------- exp
// canon::exp_f32 on 16 lanes, operation for operation (same constants, same
// rounding steps); the three early returns become blends.
inline __m512 exp16(__m512 x) {
  const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __mmask16 big = _mm512_cmp_ps_mask(x, _mm512_set1_ps(88.72283935546875f), _CMP_GT_OQ);
  const __mmask16 small = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-103.97208404541015625f), _CMP_LT_OQ);
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 magic = _mm512_set1_ps(12582912.0f);
  const __m512 kf = _mm512_sub_ps(_mm512_add_ps(t, magic), magic);
  const __m512 nkf = _mm512_xor_ps(kf, _mm512_set1_ps(-0.0f));
  __m512 r = _mm512_fmadd_ps(nkf, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fmadd_ps(nkf, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 r2 = _mm512_mul_ps(r, r);
  __m512 y = _mm512_fmadd_ps(p, r2, r);
  y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
  const __m512i k = _mm512_cvttps_epi32(kf);
  const __m512i k1 = _mm512_srai_epi32(_mm512_add_epi32(k, _mm512_srli_epi32(k, 31)), 1);  // k / 2, truncated
  const __m512i k2 = _mm512_sub_epi32(k, k1);
  const __m512i bias = _mm512_set1_epi32(127);
  y = _mm512_mul_ps(y, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k1, bias), 23)));
  y = _mm512_mul_ps(y, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k2, bias), 23)));
  y = _mm512_mask_mov_ps(y, is_nan, x);
  y = _mm512_mask_mov_ps(y, big, _mm512_castsi512_ps(_mm512_set1_epi32(0x7F800000)));
  y = _mm512_mask_mov_ps(y, small, _mm512_setzero_ps());
  return y;
}

// canon::probability: exactly 0 for a masked key (score -inf).
inline __m512 probability16(__m512 s, __m512 m) {
  const __mmask16 masked = _mm512_cmp_ps_mask(s, _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(0xFF800000u))), _CMP_EQ_OQ);
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~masked), exp16(_mm512_sub_ps(s, m)));
}

// ---------------------------------------------------------------- scores
// Lane 0 of the xor butterfly for four query heads. h[g] holds level 16
// (v[l] + v[l + 16], l < 16). Each level adds lane l and lane l + off of the
// previous level, own lane first, exactly as lane l < off does on a warp.
// Returns the four heads' sums in lanes 0..3.
inline __m128 butterfly4(const __m512* h) {
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(h[0], h[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(h[0], h[1], _MM_SHUFFLE(3, 2, 3, 2)));  // level 8
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(h[2], h[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(h[2], h[3], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 z = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));  // level 4: head g in quarter g
  const __m512 w = _mm512_add_ps(z, _mm512_permute_ps(z, _MM_SHUFFLE(1, 0, 3, 2)));      // level 2
  const __m512 v = _mm512_add_ps(w, _mm512_permute_ps(w, _MM_SHUFFLE(2, 3, 0, 1)));      // level 1
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), v));
}

constexpr int kMaxC = canon::kMaxHeadDim / canon::kWarp;

// C > 0: compile-time c; C == 0: any c (t.lanes_c).
template <RowFormat F, int C>
void scores_impl(const PartitionTask& t) {
  const int c = C > 0 ? C : t.lanes_c;
  const int pairs = (c + 1) / 2;
  const int nvec = t.head_dim / 16;
  const __m128 scale = _mm_set1_ps(t.score_scale);
  const __m512 zero = _mm512_setzero_ps();
  const __m128 masked = _mm_castsi128_ps(_mm_set1_epi32(static_cast<int>(0xFF800000u)));
  constexpr int kNat = 2 * (C > 0 ? C : kMaxC) + 1;
  // Prefetch: K rows kAhead keys ahead into L1; each V row into L2 while its
  // score is computed, for the P.V pass that follows.
  constexpr int32_t kAhead = 8;
  const int32_t lines = (t.row_bytes + 63) / 64;
  for (int32_t j = 0; j < kAhead && j < t.count; ++j)
    if (t.k_rows[j] != nullptr)
      for (int32_t ln = 0; ln < lines; ++ln) _mm_prefetch(reinterpret_cast<const char*>(t.k_rows[j]) + 64 * ln, _MM_HINT_T0);
  for (int32_t j = 0; j < t.count; ++j) {
    if (j + kAhead < t.count && t.k_rows[j + kAhead] != nullptr)
      for (int32_t ln = 0; ln < lines; ++ln)
        _mm_prefetch(reinterpret_cast<const char*>(t.k_rows[j + kAhead]) + 64 * ln, _MM_HINT_T0);
    for (int32_t ln = 0; ln < lines; ++ln) _mm_prefetch(reinterpret_cast<const char*>(t.v_rows[j]) + 64 * ln, _MM_HINT_T1);
    const uint8_t* row = t.k_rows[j];
    if (row == nullptr) {
      for (int32_t q = 0; q < t.quads; ++q) _mm_storeu_ps(t.s + (static_cast<int64_t>(q) * kPartitionSize + j) * kQuad, masked);
      continue;
    }
    // The row in natural order, 16 dims per vector, +0 beyond head_dim.
    __m512 nat[kNat];
    for (int v = 0; v < 2 * c + 1; ++v) nat[v] = v < nvec ? dec16<F>(row, 16 * v) : zero;
    // kt[2j + h] lane i = k[(16h + i) * c + j]: the lanes' j-th dims.
    __m512 kt[kNat - 1];
    for (int jj = 0; jj < c; ++jj)
      for (int h = 0; h < 2; ++h) {
        const __m512* src = nat + h * c;
        __m512 o = _mm512_maskz_permutex2var_ps(t.perm_mask[jj * pairs], src[0], _mm512_loadu_si512(t.perm + jj * pairs * 16), src[1]);
        for (int pp = 1; pp < pairs; ++pp)
          o = _mm512_or_ps(o, _mm512_maskz_permutex2var_ps(t.perm_mask[jj * pairs + pp], src[2 * pp],
                                                          _mm512_loadu_si512(t.perm + (jj * pairs + pp) * 16),
                                                          src[2 * pp + 1]));
        kt[2 * jj + h] = o;
      }
    for (int32_t q = 0; q < t.quads; ++q) {
      __m512 half[kQuad];
      for (int gi = 0; gi < kQuad; ++gi) {
        const int32_t g = q * kQuad + gi;
        if (g >= t.group) {
          half[gi] = zero;
          continue;
        }
        const float* qg = t.qt + static_cast<int64_t>(g) * c * 32;
        __m512 lo = zero, hi = zero;  // lanes 0..15, 16..31; acc = fma(q, k, acc) in j order
        for (int jj = 0; jj < c; ++jj) {
          lo = _mm512_fmadd_ps(_mm512_load_ps(qg + jj * 32), kt[2 * jj], lo);
          hi = _mm512_fmadd_ps(_mm512_load_ps(qg + jj * 32 + 16), kt[2 * jj + 1], hi);
        }
        half[gi] = _mm512_add_ps(lo, hi);  // level 16
      }
      _mm_storeu_ps(t.s + (static_cast<int64_t>(q) * kPartitionSize + j) * kQuad, _mm_mul_ps(butterfly4(half), scale));
    }
  }
}

// ---------------------------------------------------------------- scores, head_dim 128
// With c = 4 each lane owns 4 consecutive dims, so the transposition is a 4x4
// transpose inside 128-bit lanes. The 32 butterfly lanes then sit at vector
// positions pos = 16h + 4k + v (h: half, k: 128-bit lane, v: element) as:
//   nat4 (rows decoded 16 dims per vector):   lane 16h + 4v + k
//   w16  (16-bit rows widened by unpacking):  lane 16h + 8(v >> 1) + 2k + (v & 1)
// qt is laid out with the same map (lane_order), and butterfly4_* add lane l
// and lane l + off, own lane first, level by level as the warp does.
enum class Route { generic, nat4, w16 };

inline Route route_for(RowFormat f, int32_t head_dim) {
  if (head_dim != 128) return Route::generic;
  return f == RowFormat::bf16 || f == RowFormat::f16 ? Route::w16 : Route::nat4;
}

void lane_order(RowFormat f, int32_t head_dim, int32_t* lane_of_position) {
  const Route r = route_for(f, head_dim);
  for (int pos = 0; pos < 32; ++pos) {
    const int h = pos / 16, k = (pos % 16) / 4, v = pos % 4;
    lane_of_position[pos] = r == Route::generic ? pos
                            : r == Route::nat4  ? 16 * h + 4 * v + k
                                                : 16 * h + 8 * (v >> 1) + 2 * k + (v & 1);
  }
}

// out[j] element (k, v) = r[v] element (k, j): a 4x4 transpose per 128-bit lane.
inline void transpose4(const __m512* r, __m512* out) {
  const __m512d t0 = _mm512_castps_pd(_mm512_unpacklo_ps(r[0], r[1]));
  const __m512d t1 = _mm512_castps_pd(_mm512_unpackhi_ps(r[0], r[1]));
  const __m512d t2 = _mm512_castps_pd(_mm512_unpacklo_ps(r[2], r[3]));
  const __m512d t3 = _mm512_castps_pd(_mm512_unpackhi_ps(r[2], r[3]));
  out[0] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
  out[1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
  out[2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
  out[3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
}

// Butterfly lane 0 of four heads, nat4 positions; h[g] holds level 16
// (position p = 4k + v is lane 4v + k). Returns the heads' sums in lanes 0..3.
inline __m128 butterfly4_nat4(const __m512* h) {
  // level 8: lane l < 8 (v < 2) + lane l + 8 (v + 2); heads A, B -> [A v0, A v1, B v0, B v1]
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_ps(h[0], h[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_ps(h[0], h[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_ps(h[2], h[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_ps(h[2], h[3], _MM_SHUFFLE(3, 2, 3, 2)));
  // level 4: lane k (v 0) + lane k + 4 (v 1) -> [A, B, C, D] in every 128-bit lane k
  const __m512 z = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
  // level 2: 128-bit lane k + k + 2; level 1: 0 + 1
  const __m512 w = _mm512_add_ps(z, _mm512_shuffle_f32x4(z, z, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512 v = _mm512_add_ps(w, _mm512_shuffle_f32x4(w, w, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_castps512_ps128(v);
}

// The same for w16 positions (p = 4k + v is lane 8(v >> 1) + 2k + (v & 1)).
inline __m128 butterfly4_w16(const __m512* h) {
  // level 8: v < 2 + v + 2 -> [A v0, A v1, B v0, B v1] = lanes 2k, 2k + 1
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_ps(h[0], h[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_ps(h[0], h[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_ps(h[2], h[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_ps(h[2], h[3], _MM_SHUFFLE(3, 2, 3, 2)));
  // level 4: 128-bit lane k < 2 + k + 2 -> [AB k0, AB k1, CD k0, CD k1]
  const __m512 z = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  // level 2: k 0 + k 1; level 1: v 0 + v 1
  const __m512 w = _mm512_add_ps(z, _mm512_shuffle_f32x4(z, z, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m512 v = _mm512_add_ps(w, _mm512_permute_ps(w, _MM_SHUFFLE(2, 3, 0, 1)));
  // A, B at elements 0, 2 of 128-bit lane 0; C, D at elements 0, 2 of lane 2
  return _mm512_castps512_ps128(
      _mm512_permutexvar_ps(_mm512_setr_epi32(0, 2, 8, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), v));
}

// 16 codes of a 16-bit row at words [8k, 8k + 4) (lo) or [8k + 4, 8k + 8) (hi)
// of each 128-bit lane k, as fp32.
template <RowFormat F, bool Hi>
inline __m512 widen16(__m512i raw) {
  if constexpr (F == RowFormat::bf16) {
    const __m512i z = _mm512_setzero_si512();
    return _mm512_castsi512_ps(Hi ? _mm512_unpackhi_epi16(z, raw) : _mm512_unpacklo_epi16(z, raw));
  } else {
    const __m512i z = _mm512_setzero_si512();
    return f16_to_f32x16(Hi ? _mm512_unpackhi_epi16(raw, z) : _mm512_unpacklo_epi16(raw, z));
  }
}

// K row of one key, transposed: kt[2j + h] = dim j of the lanes of half h.
template <RowFormat F, Route R>
inline void load_kt_d128(const uint8_t* row, __m512* kt) {
  for (int h = 0; h < 2; ++h) {
    __m512 r[4], o[4];
    if constexpr (R == Route::nat4) {
      for (int v = 0; v < 4; ++v) r[v] = dec16<F>(row, 64 * h + 16 * v);
    } else {
      const __m512i raw0 = _mm512_loadu_si512(row + 128 * h);
      const __m512i raw1 = _mm512_loadu_si512(row + 128 * h + 64);
      r[0] = widen16<F, false>(raw0);
      r[1] = widen16<F, true>(raw0);
      r[2] = widen16<F, false>(raw1);
      r[3] = widen16<F, true>(raw1);
    }
    transpose4(r, o);
    for (int jj = 0; jj < 4; ++jj) kt[2 * jj + h] = o[jj];
  }
}

// Scores of NK keys (none masked) for every query head: NK independent
// chains side by side, so consecutive keys' latency overlaps.
template <RowFormat F, Route R, int NK>
inline void scores_d128_keys(const PartitionTask& t, const uint8_t* const* rows, int32_t j0, __m128 scale) {
  const __m512 zero = _mm512_setzero_ps();
  __m512 kt[NK][8];
  for (int n = 0; n < NK; ++n) load_kt_d128<F, R>(rows[n], kt[n]);
  for (int32_t q = 0; q < t.quads; ++q) {
    __m512 half[NK][kQuad];
    for (int gi = 0; gi < kQuad; ++gi) {
      const int32_t g = q * kQuad + gi;
      if (g >= t.group) {
        for (int n = 0; n < NK; ++n) half[n][gi] = zero;
        continue;
      }
      const float* qg = t.qt + static_cast<int64_t>(g) * 4 * 32;
      __m512 lo[NK], hi[NK];
      for (int n = 0; n < NK; ++n) lo[n] = hi[n] = zero;
      for (int jj = 0; jj < 4; ++jj) {
        const __m512 ql = _mm512_load_ps(qg + jj * 32), qh = _mm512_load_ps(qg + jj * 32 + 16);
        for (int n = 0; n < NK; ++n) {
          lo[n] = _mm512_fmadd_ps(ql, kt[n][2 * jj], lo[n]);
          hi[n] = _mm512_fmadd_ps(qh, kt[n][2 * jj + 1], hi[n]);
        }
      }
      for (int n = 0; n < NK; ++n) half[n][gi] = _mm512_add_ps(lo[n], hi[n]);  // level 16
    }
    for (int n = 0; n < NK; ++n) {
      const __m128 sum = R == Route::nat4 ? butterfly4_nat4(half[n]) : butterfly4_w16(half[n]);
      _mm_storeu_ps(t.s + (static_cast<int64_t>(q) * kPartitionSize + j0 + n) * kQuad, _mm_mul_ps(sum, scale));
    }
  }
}

template <RowFormat F, Route R>
void scores_d128(const PartitionTask& t) {
  const __m128 scale = _mm_set1_ps(t.score_scale);
  const __m128 masked = _mm_castsi128_ps(_mm_set1_epi32(static_cast<int>(0xFF800000u)));
  constexpr int32_t kAhead = 8;
  const int32_t lines = (t.row_bytes + 63) / 64;
  const int32_t count = t.count;
  const uint8_t* const* k_rows = t.k_rows;
  for (int32_t j = 0; j < kAhead && j < count; ++j)
    if (k_rows[j] != nullptr)
      for (int32_t ln = 0; ln < lines; ++ln) _mm_prefetch(reinterpret_cast<const char*>(k_rows[j]) + 64 * ln, _MM_HINT_T0);
  for (int32_t j = 0; j < count;) {
    for (int32_t n = j; n < j + 2 && n < count; ++n) {
      if (n + kAhead < count && k_rows[n + kAhead] != nullptr)
        for (int32_t ln = 0; ln < lines; ++ln)
          _mm_prefetch(reinterpret_cast<const char*>(k_rows[n + kAhead]) + 64 * ln, _MM_HINT_T0);
      for (int32_t ln = 0; ln < lines; ++ln) _mm_prefetch(reinterpret_cast<const char*>(t.v_rows[n]) + 64 * ln, _MM_HINT_T1);
    }
    if (j + 1 < count && k_rows[j] != nullptr && k_rows[j + 1] != nullptr) {
      scores_d128_keys<F, R, 2>(t, k_rows + j, j, scale);
      j += 2;
    } else if (k_rows[j] != nullptr) {
      scores_d128_keys<F, R, 1>(t, k_rows + j, j, scale);
      j += 1;
    } else {
      for (int32_t q = 0; q < t.quads; ++q) _mm_storeu_ps(t.s + (static_cast<int64_t>(q) * kPartitionSize + j) * kQuad, masked);
      j += 1;
    }
  }
}

template <RowFormat F>
void scores_format(const PartitionTask& t) {
  switch (route_for(F, t.head_dim)) {
    case Route::nat4: return scores_d128<F, Route::nat4>(t);
    case Route::w16:
      if constexpr (F == RowFormat::bf16 || F == RowFormat::f16) return scores_d128<F, Route::w16>(t);
      break;
    case Route::generic: break;
  }
  switch (t.lanes_c) {
    case 2: return scores_impl<F, 2>(t);
    case 3: return scores_impl<F, 3>(t);
    case 4: return scores_impl<F, 4>(t);
    case 8: return scores_impl<F, 8>(t);
    default: return scores_impl<F, 0>(t);
  }
}

void scores(const PartitionTask& t) {
  switch (t.format) {
    case RowFormat::f32: return scores_format<RowFormat::f32>(t);
    case RowFormat::f16: return scores_format<RowFormat::f16>(t);
    case RowFormat::bf16: return scores_format<RowFormat::bf16>(t);
    case RowFormat::e4m3: return scores_format<RowFormat::e4m3>(t);
    case RowFormat::e5m2: return scores_format<RowFormat::e5m2>(t);
    case RowFormat::i8: return scores_format<RowFormat::i8>(t);
  }
}

// ---------------------------------------------------------------- softmax
// The maximum of each of a quad's four heads over n keys (s[key][4]), in all
// four 128-bit lanes. maxps(s, m) is `s > m ? s : m` per lane (a NaN score
// never wins). Four keys per vector and four chains, then the chains: the max
// is order-free but for the sign of a zero maximum, which no later step can
// see (docs/canonical-arithmetic.md), so this gives attend_query's bytes.
inline __m512 quad_max(const float* s, int32_t n) {
  const int32_t total = n * kQuad;
  const __m512 ninf = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(0xFF800000u)));
  __m512 mx[4] = {ninf, ninf, ninf, ninf};
  int32_t i = 0;
  for (; i + 64 <= total; i += 64)
    for (int k = 0; k < 4; ++k) mx[k] = _mm512_max_ps(_mm512_loadu_ps(s + i + 16 * k), mx[k]);
  for (; i < total; i += 16) {
    const __mmask16 k = total - i >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (total - i)) - 1u);
    mx[0] = _mm512_max_ps(_mm512_mask_loadu_ps(ninf, k, s + i), mx[0]);
  }
  const __m512 m4 = _mm512_max_ps(_mm512_max_ps(mx[0], mx[1]), _mm512_max_ps(mx[2], mx[3]));
  const __m512 m2 = _mm512_max_ps(m4, _mm512_shuffle_f32x4(m4, m4, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm512_max_ps(m2, _mm512_shuffle_f32x4(m2, m2, _MM_SHUFFLE(2, 3, 0, 1)));
}

void scores_max(const PartitionTask& t, float* m) {
  for (int32_t q = 0; q < t.quads; ++q) {
    const __m128 qm = _mm512_castps512_ps128(quad_max(t.s + static_cast<int64_t>(q) * kPartitionSize * kQuad, t.count));
    _mm_storeu_ps(m + q * kQuad, _mm_max_ps(qm, _mm_loadu_ps(m + q * kQuad)));  // qm > m ? qm : m
  }
}

void fold(const float* acc, float w, int32_t n, float* merged) {
  const __m512 vw = _mm512_set1_ps(w);
  int32_t d = 0;
  for (; d + 16 <= n; d += 16)
    _mm512_storeu_ps(merged + d, _mm512_fmadd_ps(_mm512_loadu_ps(acc + d), vw, _mm512_loadu_ps(merged + d)));
  if (d < n) {
    const __mmask16 k = static_cast<__mmask16>((1u << (n - d)) - 1u);
    _mm512_mask_storeu_ps(merged + d, k,
                          _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, acc + d), vw, _mm512_maskz_loadu_ps(k, merged + d)));
  }
}

void softmax(const PartitionTask& t) {
  const int32_t n = t.count;
  for (int32_t q = 0; q < t.quads; ++q) {
    const float* s = t.s + static_cast<int64_t>(q) * kPartitionSize * kQuad;
    float* p = t.p + static_cast<int64_t>(q) * kPartitionSize * kQuad;
    const int32_t total = n * kQuad;
    const __m512 m16 = quad_max(s, n);
    _mm_storeu_ps(t.m + q * kQuad, _mm512_castps512_ps128(m16));
    for (int32_t i = 0; i < total; i += 16) {
      const __mmask16 k = total - i >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (total - i)) - 1u);
      _mm512_mask_storeu_ps(p + i, k, probability16(_mm512_maskz_loadu_ps(k, s + i), m16));
    }
    quad_partition_sum(p, n, t.l + q * kQuad);
  }
}

// ---------------------------------------------------------------- P.V
// NZ vectors (16 dims each) of NG heads' accumulators in registers over every
// key of the partition: acc = fma(p_j, v_j[d], acc), keys in order. Head g's
// probabilities are pcol[g][j * kQuad]; keys [0, limit[g]) enter head g, and
// keys every head takes run without a test.
template <RowFormat F, int NG, int NZ>
inline void pv_block(const PartitionTask& t, const float* const* pcol, float* const* out, const int32_t* limit,
                     int32_t d0) {
  __m512 acc[NG][NZ];
  int32_t common = t.count, longest = 0;
  for (int g = 0; g < NG; ++g) {
    common = limit[g] < common ? limit[g] : common;
    longest = limit[g] > longest ? limit[g] : longest;
    for (int z = 0; z < NZ; ++z) acc[g][z] = _mm512_setzero_ps();
  }
  for (int32_t j = 0; j < common; ++j) {
    const uint8_t* row = t.v_rows[j];
    __m512 v[NZ];
    for (int z = 0; z < NZ; ++z) v[z] = dec16<F>(row, d0 + 16 * z);
    for (int g = 0; g < NG; ++g) {
      const __m512 pj = _mm512_set1_ps(pcol[g][j * kQuad]);
      for (int z = 0; z < NZ; ++z) acc[g][z] = _mm512_fmadd_ps(pj, v[z], acc[g][z]);
    }
  }
  for (int32_t j = common; j < longest; ++j) {
    const uint8_t* row = t.v_rows[j];
    __m512 v[NZ];
    for (int z = 0; z < NZ; ++z) v[z] = dec16<F>(row, d0 + 16 * z);
    for (int g = 0; g < NG; ++g) {
      if (j >= limit[g]) continue;
      const __m512 pj = _mm512_set1_ps(pcol[g][j * kQuad]);
      for (int z = 0; z < NZ; ++z) acc[g][z] = _mm512_fmadd_ps(pj, v[z], acc[g][z]);
    }
  }
  for (int g = 0; g < NG; ++g)
    for (int z = 0; z < NZ; ++z) _mm512_storeu_ps(out[g] + d0 + 16 * z, acc[g][z]);
}

// Heads [h0, h0 + NG): up to 8 at once (16 accumulators of 32 dims), so one
// V decode serves 8 heads; 4 or fewer take 64 dims per block.
template <RowFormat F, int NG>
void pv_heads(const PartitionTask& t, int32_t h0) {
  const float* pcol[NG];
  float* out[NG];
  int32_t limit[NG];
  pv_head_columns(t, h0, NG, pcol, out, limit);
  constexpr int kWide = NG > 4 ? 2 : 4;
  int32_t d = 0;
  for (; d + 16 * kWide <= t.head_dim; d += 16 * kWide) pv_block<F, NG, kWide>(t, pcol, out, limit, d);
  for (; d < t.head_dim; d += 16) pv_block<F, NG, 1>(t, pcol, out, limit, d);
}

template <RowFormat F>
void pv_format(const PartitionTask& t) {
  for (int32_t h0 = 0; h0 < t.group; h0 += 8) {
    switch (t.group - h0 < 8 ? t.group - h0 : 8) {
      case 1: pv_heads<F, 1>(t, h0); break;
      case 2: pv_heads<F, 2>(t, h0); break;
      case 3: pv_heads<F, 3>(t, h0); break;
      case 4: pv_heads<F, 4>(t, h0); break;
      case 5: pv_heads<F, 5>(t, h0); break;
      case 6: pv_heads<F, 6>(t, h0); break;
      case 7: pv_heads<F, 7>(t, h0); break;
      default: pv_heads<F, 8>(t, h0); break;
    }
  }
}

void pv(const PartitionTask& t) {
  switch (t.format) {
    case RowFormat::f32: return pv_format<RowFormat::f32>(t);
    case RowFormat::f16: return pv_format<RowFormat::f16>(t);
    case RowFormat::bf16: return pv_format<RowFormat::bf16>(t);
    case RowFormat::e4m3: return pv_format<RowFormat::e4m3>(t);
    case RowFormat::e5m2: return pv_format<RowFormat::e5m2>(t);
    case RowFormat::i8: return pv_format<RowFormat::i8>(t);
  }
}

bool head_dim_ok(int32_t head_dim) { return head_dim % 16 == 0 && head_dim <= canon::kMaxHeadDim; }

void exp_floats(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, exp16(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 k = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(y + i, k, exp16(_mm512_maskz_loadu_ps(k, x + i)));
  }
}

void fma_rounds(float* x, int64_t n, int32_t steps, float a, float b) {
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
  for (int64_t i = 0; i + 256 <= n; i += 256) {  // 16 independent registers in flight
    __m512 v[16];
    for (int r = 0; r < 16; ++r) v[r] = _mm512_loadu_ps(x + i + 16 * r);
    for (int32_t s = 0; s < steps; ++s)
      for (int r = 0; r < 16; ++r) v[r] = _mm512_fmadd_ps(v[r], va, vb);
    for (int r = 0; r < 16; ++r) _mm512_storeu_ps(x + i + 16 * r, v[r]);
  }
}

void decode_row(RowFormat format, const uint8_t* row, float* out, int32_t head_dim) {
  for (int32_t i = 0; i + 16 <= head_dim; i += 16) {
    __m512 v;
    switch (format) {
      case RowFormat::f32: v = dec16<RowFormat::f32>(row, i); break;
      case RowFormat::f16: v = dec16<RowFormat::f16>(row, i); break;
      case RowFormat::bf16: v = dec16<RowFormat::bf16>(row, i); break;
      case RowFormat::e4m3: v = dec16<RowFormat::e4m3>(row, i); break;
      case RowFormat::e5m2: v = dec16<RowFormat::e5m2>(row, i); break;
      default: v = dec16<RowFormat::i8>(row, i); break;
    }
    _mm512_storeu_ps(out + i, v);
  }
}

}  // namespace
}  // namespace kvsim::cpu_attention

KVSIM_CPU_TARGET_END

namespace kvsim::cpu_attention {

const Kernels* avx512_kernels() {
  static const Kernels k{&scores, &softmax, &pv, &scores_max, &fold, &head_dim_ok, &lane_order, &exp_floats, &decode_row, &fma_rounds};
  return &k;
}

}  // namespace kvsim::cpu_attention

#else  // no AVX-512 kernels in this build

namespace kvsim::cpu_attention {
const Kernels* avx512_kernels() { return nullptr; }
}  // namespace kvsim::cpu_attention

#endif
