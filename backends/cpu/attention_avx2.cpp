// AVX2 + FMA kernels of the fast attention path (attention_fast.hpp) for
// hosts without AVX-512, compiled with a target pragma and used only where
// the CPU reports AVX2 and FMA at run time (cpu_isa.hpp). The order is the
// portable kernels' (attention_portable_kernels.inc) with 8 floats per
// register: each vector operation is the IEEE operation core's scalar order
// performs on that element (fma is correctly rounded in both), so the bytes
// are those of attend_query; no flag of the build changes (-ffp-contract=off
// stays, and no fast-math). The decoders and exp are attention_avx512.cpp's,
// operation for operation, with blends where AVX-512 has mask registers.
//
// Everything compiled under the pragma has internal linkage (the kernel table
// and its accessor lie outside it): no inline function shared with other
// files is ever emitted with AVX2 code.
#include "backends/cpu/attention_fast.hpp"

#include "backends/cpu/cpu_target.hpp"

#if KVSIM_CPU_X86
#include <immintrin.h>

#include "backends/cpu/attention_simd.hpp"
#endif

#if KVSIM_CPU_X86

KVSIM_CPU_TARGET_BEGIN(KVSIM_CPU_TARGET_AVX2)

namespace kvsim::cpu_attention {
namespace {

using canon::kPartitionSize;
using canon::kWarp;

inline __m256i set1(uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); }
inline __m256i select(__m256i mask, __m256i yes, __m256i no) { return _mm256_blendv_epi8(no, yes, mask); }

// ---------------------------------------------------------------- row decoders
// Elements [i, i + 8) of a row as their exact fp32 values: bit-identical to
// core's codecs for every code (checked exhaustively by the fast-path test).
template <RowFormat F>
inline __m256 dec8(const uint8_t* row, int32_t i);

template <>
inline __m256 dec8<RowFormat::f32>(const uint8_t* row, int32_t i) {
  return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + i);
}

template <>
inline __m256 dec8<RowFormat::bf16>(const uint8_t* row, int32_t i) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// codec::f16_to_f32: Inf/NaN keep their payload; normals rebias the
// exponent; subnormals are m * 2^-24 (exact); the sign is or-ed in.
template <>
inline __m256 dec8<RowFormat::f16>(const uint8_t* row, int32_t i) {
  const __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i)));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(x, set1(0x8000)), 16);
  const __m256i mag = _mm256_and_si256(x, set1(0x7FFF));
  const __m256i shifted = _mm256_slli_epi32(mag, 13);
  __m256i bits = _mm256_add_epi32(shifted, set1(112u << 23));
  bits = select(_mm256_cmpgt_epi32(mag, set1(0x7BFF)), _mm256_or_si256(shifted, set1(0x7F800000u)), bits);
  const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(mag), _mm256_set1_ps(0x1p-24f));
  bits = select(_mm256_cmpgt_epi32(set1(0x400), mag), _mm256_castps_si256(sub), bits);
  return _mm256_castsi256_ps(_mm256_or_si256(bits, sign));
}

inline __m256i bytes8(const uint8_t* row, int32_t i) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + i)));
}

// codec::e4m3_to_f32: S.1111.111 is NaN (sign | 0x7FC00000).
template <>
inline __m256 dec8<RowFormat::e4m3>(const uint8_t* row, int32_t i) {
  const __m256i x = bytes8(row, i);
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(x, set1(0x80)), 24);
  const __m256i mag = _mm256_and_si256(x, set1(0x7F));
  __m256i bits = _mm256_add_epi32(_mm256_slli_epi32(mag, 20), set1(120u << 23));
  const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(mag), _mm256_set1_ps(0x1p-9f));
  bits = select(_mm256_cmpgt_epi32(set1(8), mag), _mm256_castps_si256(sub), bits);
  bits = select(_mm256_cmpeq_epi32(mag, set1(0x7F)), set1(0x7FC00000u), bits);
  return _mm256_castsi256_ps(_mm256_or_si256(bits, sign));
}

// codec::e5m2_to_f32: exponent all ones is Inf/NaN with the 2-bit payload.
template <>
inline __m256 dec8<RowFormat::e5m2>(const uint8_t* row, int32_t i) {
  const __m256i x = bytes8(row, i);
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(x, set1(0x80)), 24);
  const __m256i mag = _mm256_and_si256(x, set1(0x7F));
  __m256i bits = _mm256_add_epi32(_mm256_slli_epi32(mag, 21), set1(112u << 23));
  bits = select(_mm256_cmpgt_epi32(mag, set1(0x7B)),
                _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(mag, set1(3)), 21), set1(0x7F800000u)), bits);
  const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(mag), _mm256_set1_ps(0x1p-16f));
  bits = select(_mm256_cmpgt_epi32(set1(4), mag), _mm256_castps_si256(sub), bits);
  return _mm256_castsi256_ps(_mm256_or_si256(bits, sign));
}

template <>
inline __m256 dec8<RowFormat::i8>(const uint8_t* row, int32_t i) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + i))));
}

template <RowFormat F>
void decode_format(const uint8_t* row, float* out, int32_t n) {
  for (int32_t i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, dec8<F>(row, i));
}

void decode_row(RowFormat format, const uint8_t* row, float* out, int32_t head_dim) {
  switch (format) {
    case RowFormat::f32: return decode_format<RowFormat::f32>(row, out, head_dim);
    case RowFormat::f16: return decode_format<RowFormat::f16>(row, out, head_dim);
    case RowFormat::bf16: return decode_format<RowFormat::bf16>(row, out, head_dim);
    case RowFormat::e4m3: return decode_format<RowFormat::e4m3>(row, out, head_dim);
    case RowFormat::e5m2: return decode_format<RowFormat::e5m2>(row, out, head_dim);
    case RowFormat::i8: return decode_format<RowFormat::i8>(row, out, head_dim);
  }
}

// ---------------------------------------------------------------- exp
// canon::exp_f32 on 8 lanes, operation for operation (attention_avx512.cpp's
// exp16); the three early returns become blends, in the same order.
inline __m256 exp8(__m256 x) {
  const __m256 is_nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  const __m256 big = _mm256_cmp_ps(x, _mm256_set1_ps(88.72283935546875f), _CMP_GT_OQ);
  const __m256 small = _mm256_cmp_ps(x, _mm256_set1_ps(-103.97208404541015625f), _CMP_LT_OQ);
  const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
  const __m256 magic = _mm256_set1_ps(12582912.0f);
  const __m256 kf = _mm256_sub_ps(_mm256_add_ps(t, magic), magic);
  const __m256 nkf = _mm256_xor_ps(kf, _mm256_set1_ps(-0.0f));
  __m256 r = _mm256_fmadd_ps(nkf, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fmadd_ps(nkf, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 r2 = _mm256_mul_ps(r, r);
  __m256 y = _mm256_fmadd_ps(p, r2, r);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
  const __m256i k = _mm256_cvttps_epi32(kf);
  const __m256i k1 = _mm256_srai_epi32(_mm256_add_epi32(k, _mm256_srli_epi32(k, 31)), 1);  // k / 2, truncated
  const __m256i k2 = _mm256_sub_epi32(k, k1);
  const __m256i bias = set1(127);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, bias), 23)));
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, bias), 23)));
  y = _mm256_blendv_ps(y, x, is_nan);
  y = _mm256_blendv_ps(y, _mm256_castsi256_ps(set1(0x7F800000u)), big);
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), small);
  return y;
}

// canon::probability: exactly +0 for a masked key (score -inf).
inline __m256 probability8(__m256 s, __m256 m) {
  const __m256 masked = _mm256_cmp_ps(s, _mm256_castsi256_ps(set1(0xFF800000u)), _CMP_EQ_OQ);
  return _mm256_andnot_ps(masked, exp8(_mm256_sub_ps(s, m)));
}

// Lanes [0, n) of 8 (n < 8): the load/store mask.
inline __m256i first_lanes(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

void exp_floats(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp8(_mm256_loadu_ps(x + i)));
  if (i < n) {
    const __m256i k = first_lanes(n - i);
    _mm256_maskstore_ps(y + i, k, exp8(_mm256_maskload_ps(x + i, k)));
  }
}

// ---------------------------------------------------------------- scores
// Lane 0 of core's xor butterfly over the 32 lanes v[0..3] (8 lanes each):
// at level `off` lane l < off adds lane l + off to its own, own lane first.
inline float butterfly_lane0(const __m256* v) {
  const __m256 b = _mm256_add_ps(_mm256_add_ps(v[0], v[2]), _mm256_add_ps(v[1], v[3]));  // levels 16, 8
  const __m128 x = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));     // level 4
  const __m128 y = _mm_add_ps(x, _mm_movehl_ps(x, x));                                    // level 2
  return _mm_cvtss_f32(_mm_add_ss(y, _mm_shuffle_ps(y, y, _MM_SHUFFLE(1, 1, 1, 1))));      // level 1
}

// The K row decoded once per key for every query head of the group, then
// transposed through the plan's kt_source (kt[j*32 + l] = k[l*c + j], the
// +0 slot beyond D); lane l's chain is fma(q, k, acc) over j in order.
template <RowFormat F>
void scores_format(const PartitionTask& t) {
  const int32_t D = t.head_dim, c = t.lanes_c;
  float* kt = t.kbuf;
  float* k = t.kbuf + c * kWarp;
  constexpr int32_t kAhead = 8;
  const int32_t lines = (t.row_bytes + 63) / 64;
  for (int32_t j = 0; j < t.count; ++j) {
    if (j + kAhead < t.count && t.k_rows[j + kAhead] != nullptr)
      for (int32_t ln = 0; ln < lines; ++ln)
        _mm_prefetch(reinterpret_cast<const char*>(t.k_rows[j + kAhead]) + 64 * ln, _MM_HINT_T0);
    for (int32_t ln = 0; ln < lines; ++ln) _mm_prefetch(reinterpret_cast<const char*>(t.v_rows[j]) + 64 * ln, _MM_HINT_T1);
    float* s = t.s + static_cast<int64_t>(j) * kQuad;
    if (t.k_rows[j] == nullptr) {
      for (int32_t q = 0; q < t.quads; ++q)
        for (int g = 0; g < kQuad; ++g) s[static_cast<int64_t>(q) * kPartitionSize * kQuad + g] = canon::neg_inf();
      continue;
    }
    decode_format<F>(t.k_rows[j], k, D);
    k[D] = 0.0f;
    for (int32_t i = 0; i < c * kWarp; i += 8)
      _mm256_storeu_ps(kt + i, _mm256_i32gather_ps(k, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.kt_source + i)), 4));
    for (int32_t g = 0; g < t.quads * kQuad; ++g) {
      float score = 0.0f;
      if (g < t.group) {
        const float* qt = t.qt + static_cast<int64_t>(g) * c * kWarp;
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int32_t jj = 0; jj < c; ++jj)
          for (int v = 0; v < 4; ++v)
            acc[v] = _mm256_fmadd_ps(_mm256_loadu_ps(qt + jj * kWarp + 8 * v), _mm256_loadu_ps(kt + jj * kWarp + 8 * v), acc[v]);
        score = butterfly_lane0(acc) * t.score_scale;
      }
      s[static_cast<int64_t>(g / kQuad) * kPartitionSize * kQuad + g % kQuad] = score;
    }
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
// Four query heads side by side (s[key][4]), two keys per register.
// The maximum of each of a quad's four heads over n keys (s[key][4]).
// maxps(s, m) is `s > m ? s : m` per lane (a NaN score never wins). Four
// chains, then the chains: the max is order-free but for the sign of a zero
// maximum, which no later step can see (docs/canonical-arithmetic.md), so
// this gives attend_query's bytes.
inline __m128 quad_max(const float* s, int32_t n) {
  const int64_t total = static_cast<int64_t>(n) * kQuad;
  const __m256 ninf = _mm256_castsi256_ps(set1(0xFF800000u));
  __m256 mx[4] = {ninf, ninf, ninf, ninf};
  int64_t i = 0;
  for (; i + 32 <= total; i += 32)
    for (int c = 0; c < 4; ++c) mx[c] = _mm256_max_ps(_mm256_loadu_ps(s + i + 8 * c), mx[c]);
  for (; i + 8 <= total; i += 8) mx[0] = _mm256_max_ps(_mm256_loadu_ps(s + i), mx[0]);
  if (i < total) mx[1] = _mm256_max_ps(_mm256_blend_ps(ninf, _mm256_castps128_ps256(_mm_loadu_ps(s + i)), 0x0F), mx[1]);
  const __m256 m8 = _mm256_max_ps(_mm256_max_ps(mx[0], mx[1]), _mm256_max_ps(mx[2], mx[3]));
  return _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
}

void scores_max(const PartitionTask& t, float* m) {
  for (int32_t q = 0; q < t.quads; ++q) {
    const __m128 qm = quad_max(t.s + static_cast<int64_t>(q) * kPartitionSize * kQuad, t.count);
    _mm_storeu_ps(m + q * kQuad, _mm_max_ps(qm, _mm_loadu_ps(m + q * kQuad)));  // qm > m ? qm : m
  }
}

void fold(const float* acc, float w, int32_t n, float* merged) {
  const __m256 vw = _mm256_set1_ps(w);
  int32_t d = 0;
  for (; d + 8 <= n; d += 8)
    _mm256_storeu_ps(merged + d, _mm256_fmadd_ps(_mm256_loadu_ps(acc + d), vw, _mm256_loadu_ps(merged + d)));
  for (; d < n; ++d) merged[d] = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(acc[d]), _mm_set_ss(w), _mm_set_ss(merged[d])));
}

void softmax(const PartitionTask& t) {
  const int32_t n = t.count;
  const int64_t total = static_cast<int64_t>(n) * kQuad;
  for (int32_t q = 0; q < t.quads; ++q) {
    const float* s = t.s + static_cast<int64_t>(q) * kPartitionSize * kQuad;
    float* p = t.p + static_cast<int64_t>(q) * kPartitionSize * kQuad;
    const __m128 m4 = quad_max(s, n);
    _mm_storeu_ps(t.m + q * kQuad, m4);
    int64_t i = 0;
    const __m256 m = _mm256_set_m128(m4, m4);
    for (i = 0; i + 8 <= total; i += 8) _mm256_storeu_ps(p + i, probability8(_mm256_loadu_ps(s + i), m));
    if (i < total)
      _mm_storeu_ps(p + i, _mm256_castps256_ps128(probability8(_mm256_castps128_ps256(_mm_loadu_ps(s + i)), m)));
    quad_partition_sum(p, n, t.l + q * kQuad);
  }
}

// ---------------------------------------------------------------- P.V
// NZ vectors (8 dims each) of NG heads' accumulators in registers over every
// key of the partition: acc = fma(p_j, v_j[d], acc), keys in order. Head g's
// probabilities are pcol[g][j * kQuad]; keys [0, limit[g]) enter head g.
template <RowFormat F, int NG, int NZ>
inline void pv_block(const PartitionTask& t, const float* const* pcol, float* const* out, const int32_t* limit,
                     int32_t d0) {
  __m256 acc[NG][NZ];
  int32_t common = t.count, longest = 0;
  for (int g = 0; g < NG; ++g) {
    common = limit[g] < common ? limit[g] : common;
    longest = limit[g] > longest ? limit[g] : longest;
    for (int z = 0; z < NZ; ++z) acc[g][z] = _mm256_setzero_ps();
  }
  for (int32_t j = 0; j < longest; ++j) {
    const uint8_t* row = t.v_rows[j];
    __m256 v[NZ];
    for (int z = 0; z < NZ; ++z) v[z] = dec8<F>(row, d0 + 8 * z);
    for (int g = 0; g < NG; ++g) {
      if (j >= common && j >= limit[g]) continue;
      const __m256 pj = _mm256_broadcast_ss(pcol[g] + j * kQuad);
      for (int z = 0; z < NZ; ++z) acc[g][z] = _mm256_fmadd_ps(pj, v[z], acc[g][z]);
    }
  }
  for (int g = 0; g < NG; ++g)
    for (int z = 0; z < NZ; ++z) _mm256_storeu_ps(out[g] + d0 + 8 * z, acc[g][z]);
}

// Heads [h0, h0 + NG), up to 4 at once (8 or 16 accumulators of the 16 ymm
// registers), so one V decode serves 4 heads; 2 or fewer take 32 dims.
template <RowFormat F, int NG>
void pv_heads(const PartitionTask& t, int32_t h0) {
  const float* pcol[NG];
  float* out[NG];
  int32_t limit[NG];
  pv_head_columns(t, h0, NG, pcol, out, limit);
  constexpr int kWide = NG > 2 ? 2 : 4;
  int32_t d = 0;
  for (; d + 8 * kWide <= t.head_dim; d += 8 * kWide) pv_block<F, NG, kWide>(t, pcol, out, limit, d);
  for (; d < t.head_dim; d += 8) pv_block<F, NG, 1>(t, pcol, out, limit, d);
}

template <RowFormat F>
void pv_format(const PartitionTask& t) {
  for (int32_t h0 = 0; h0 < t.group; h0 += 4) {
    switch (t.group - h0 < 4 ? t.group - h0 : 4) {
      case 1: pv_heads<F, 1>(t, h0); break;
      case 2: pv_heads<F, 2>(t, h0); break;
      case 3: pv_heads<F, 3>(t, h0); break;
      default: pv_heads<F, 4>(t, h0); break;
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

bool head_dim_ok(int32_t head_dim) { return head_dim % 8 == 0 && head_dim <= canon::kMaxHeadDim; }

void identity_lanes(RowFormat, int32_t, int32_t* lane_of_position) {
  for (int pos = 0; pos < kWarp; ++pos) lane_of_position[pos] = pos;
}

void fma_rounds(float* x, int64_t n, int32_t steps, float a, float b) {
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
  for (int64_t i = 0; i + 64 <= n; i += 64) {  // 8 independent registers in flight (of 16)
    __m256 v[8];
    for (int r = 0; r < 8; ++r) v[r] = _mm256_loadu_ps(x + i + 8 * r);
    for (int32_t s = 0; s < steps; ++s)
      for (int r = 0; r < 8; ++r) v[r] = _mm256_fmadd_ps(v[r], va, vb);
    for (int r = 0; r < 8; ++r) _mm256_storeu_ps(x + i + 8 * r, v[r]);
  }
}

}  // namespace
}  // namespace kvsim::cpu_attention

KVSIM_CPU_TARGET_END

namespace kvsim::cpu_attention {

const Kernels* avx2_kernels() {
  static const Kernels k{&scores, &softmax, &pv, &scores_max, &fold, &head_dim_ok, &identity_lanes, &exp_floats, &decode_row, &fma_rounds};
  return &k;
}

}  // namespace kvsim::cpu_attention

#else  // no AVX2 kernels in this build

namespace kvsim::cpu_attention {
const Kernels* avx2_kernels() { return nullptr; }
}  // namespace kvsim::cpu_attention

#endif
