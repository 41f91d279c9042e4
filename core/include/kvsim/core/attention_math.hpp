// The canonical arithmetic of attention (contract §1), written once for host and
// device. The order depends only on absolute token positions -- never on
// chunking, layout, page size, thread count or reuse -- so the invariants of
// contract §6 can demand bit equality. docs/canonical-arithmetic.md draws it.
//
//  keys of a query  : sinks, then the window (or 0..p), in position order,
//                     then the masked tail of the query's page (whole-page
//                     reads: probability exactly 0, V still enters P.V)
//  partitions       : that list cut every kPartitionSize keys from its start
//  score(q, k)      : lane l of 32 owns dims [l*c, (l+1)*c), c = ceil(D/32),
//                     acc = fma(q[d], k[d], acc) from d = l*c upward; the 32
//                     partials meet in an xor butterfly (16, 8, 4, 2, 1);
//                     then one multiply by the effective scale
//  partition max    : order-free (NaN never wins a > comparison)
//  partition sum    : lane l sums keys [l*r, (l+1)*r) of the partition in
//                     order (r = kPartitionSize / 32), then the butterfly
//  P.V              : per output dim, acc = fma(p_j, v_j[d], acc) over the
//                     partition's keys in order
//  merge            : M = max m_p; w_p = exp(m_p - M) (0 for empty
//                     partitions); L = fma(l_p, w_p, L), O = fma(acc_p, w_p, O)
//                     in partition order; out = (O / L) * v_scale, rounded
//                     to the output dtype.
//  LSE (optional)   : lse = M + log_f32(L) (natural log; base 2:
//                     lse * kLog2e, one more rounding), from the M and L of
//                     the merge above.
#pragma once

#include "bits.hpp"
#include "codecs.hpp"

namespace kvsim::canon {

inline constexpr int kWarp = 32;
inline constexpr int kPartitionSize = 256;              // keys per partition
inline constexpr int kLaneRun = kPartitionSize / kWarp;  // keys per lane in the partition sum
inline constexpr int kMaxHeadDim = 1024;

KVSIM_HD inline float fma_f32(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return __builtin_fmaf(a, b, c);  // correctly rounded (hardware or glibc)
#endif
}

KVSIM_HD constexpr float neg_inf() { return bits_float(0xFF800000u); }
KVSIM_HD constexpr float pos_inf() { return bits_float(0x7F800000u); }

// 2^n for n in [-126, 127], exactly.
KVSIM_HD constexpr float pow2i(int n) { return bits_float(static_cast<uint32_t>(n + 127) << 23); }

// core's fp32 exp: Cody-Waite reduction by ln 2 (split in a short high part
// and a correction, both applied with fma), a degree-6 polynomial (Cephes
// expf coefficients) in Horner form with fma, and an exact two-step scaling by
// 2^k so subnormal results and k = 128 round once. Maximum error against
// double exp: measured in tests/core/exp_test.cpp and quoted in
// docs/canonical-arithmetic.md. exp(-inf) = 0, exp(NaN) = NaN.
//
// The common case first, the same bits by fewer steps (attention's kernels
// run this once per score): for |x| <= 87, k = round(x log2 e) lies in
// [-126, 126], so 2^k is a normal float whose bits come straight from the
// rounding's magic sum (its low bits hold k), and one multiply y * 2^k
// rounds the exact y 2^k once, exactly as the two steps do (their first is
// exact: y 2^k1 is normal). No NaN passes the test. tests/core/exp_test.cpp
// checks both paths against each other for every float.
KVSIM_HD inline float exp_f32(float x) {
  const float t = x * 1.44269504088896341f;
  const float magic = t + 12582912.0f;  // |t| < 2^22 on the paths that use it
  const float kf = magic - 12582912.0f;  // round to nearest even
  float r = fma_f32(-kf, 0.693359375f, x);
  r = fma_f32(-kf, -2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = fma_f32(p, r, 1.3981999507e-3f);
  p = fma_f32(p, r, 8.3334519073e-3f);
  p = fma_f32(p, r, 4.1665795894e-2f);
  p = fma_f32(p, r, 1.6666665459e-1f);
  p = fma_f32(p, r, 5.0000001201e-1f);
  const float r2 = r * r;
  float y = fma_f32(p, r2, r);
  y = y + 1.0f;
  if (bits_float(float_bits(x) & 0x7FFFFFFFu) <= 87.0f) return y * bits_float((float_bits(magic) + 127u) << 23);
  if (is_nan(x)) return x;
  if (x > 88.72283935546875f) return pos_inf();
  if (x < -103.97208404541015625f) return 0.0f;
  const int k = static_cast<int>(kf);
  const int k1 = k / 2;
  const int k2 = k - k1;
  return (y * pow2i(k1)) * pow2i(k2);
}

// core's fp32 natural log (the LSE of attention, log_sum_exp below): x =
// 2^e * m with m in [sqrt(1/2), sqrt(2)] read from the bits (a subnormal is
// scaled by 2^23 first), f = m - 1 exactly (Sterbenz), Cephes logf's degree-8
// polynomial in f in Horner form with fma, then log x = f - f^2/2 + f^3 P(f)
// + e ln 2 with ln 2 split in a short high part and a correction, each
// applied with fma. Maximum error against double log: measured in
// tests/core/exp_test.cpp and quoted in docs/canonical-arithmetic.md.
// log(0) = -inf, log(+inf) = +inf, log(x < 0) = NaN, log(NaN) = NaN.
KVSIM_HD inline float log_f32(float x) {
  if (is_nan(x)) return x;
  if (x < 0.0f) return bits_float(0x7FC00000u);
  if (x == 0.0f) return neg_inf();
  if (x == pos_inf()) return x;
  int e = 0;
  if (float_bits(x) < 0x00800000u) {  // subnormal: exact scaling into the normal range
    x = x * 8388608.0f;
    e = -23;
  }
  const uint32_t b = float_bits(x);
  e += static_cast<int>((b >> 23) & 0xFFu) - 127;
  float m = bits_float((b & 0x007FFFFFu) | 0x3F800000u);  // [1, 2)
  if (m > 1.41421353816986083984375f) {                    // fp32 below sqrt(2): m / 2 is exact
    m = m * 0.5f;
    e += 1;
  }
  const float f = m - 1.0f;
  const float z = f * f;
  float p = 7.0376836292e-2f;
  p = fma_f32(p, f, -1.1514610310e-1f);
  p = fma_f32(p, f, 1.1676998740e-1f);
  p = fma_f32(p, f, -1.2420140846e-1f);
  p = fma_f32(p, f, 1.4249322787e-1f);
  p = fma_f32(p, f, -1.6668057665e-1f);
  p = fma_f32(p, f, 2.0000714765e-1f);
  p = fma_f32(p, f, -2.4999993993e-1f);
  p = fma_f32(p, f, 3.3333331174e-1f);
  const float ef = static_cast<float>(e);
  float y = (p * f) * z;
  y = fma_f32(ef, -2.12194440e-4f, y);
  y = fma_f32(-0.5f, z, y);
  float r = f + y;
  r = fma_f32(ef, 0.693359375f, r);
  return r;
}

// log2(e) rounded to fp32: FlashInfer-convention (base-2) LSEs are the
// natural LSE times this, rounded once.
inline constexpr float kLog2e = 1.44269504088896341f;

// The log-sum-exp of one query head's scores from the merge's global max M
// and merged sum L (natural log): M + log(L), rounded once after log_f32.
KVSIM_HD inline float log_sum_exp(float global_max, float sum) { return global_max + log_f32(sum); }

// A natural-log LSE in base 2 (FlashInfer's convention).
KVSIM_HD inline float lse_base2(float lse) { return lse * kLog2e; }

// The xor butterfly of a warp: level by level v[l] = v[l] + v[l ^ off] for
// off = 16, 8, 4, 2, 1. Addition is commutative, so every lane ends with the
// same float; __shfl_xor_sync computes exactly this on the device.
KVSIM_HD inline float butterfly_sum32(float* v) {
  for (int off = kWarp / 2; off >= 1; off >>= 1) {
    float next[kWarp];
    for (int l = 0; l < kWarp; ++l) next[l] = v[l] + v[l ^ off];
    for (int l = 0; l < kWarp; ++l) v[l] = next[l];
  }
  return v[0];
}

// Canonical dot product over head_dim (before the score scale).
KVSIM_HD inline float dot(const float* q, const float* k, int head_dim) {
  const int c = (head_dim + kWarp - 1) / kWarp;
  float partial[kWarp];
  for (int l = 0; l < kWarp; ++l) {
    float acc = 0.0f;
    for (int j = 0; j < c; ++j) {
      const int d = l * c + j;
      if (d < head_dim) acc = fma_f32(q[d], k[d], acc);
    }
    partial[l] = acc;
  }
  return butterfly_sum32(partial);
}

// Max of a partition's scores (masked keys hold -inf).
KVSIM_HD inline float partition_max(const float* s, int n) {
  float m = neg_inf();
  for (int j = 0; j < n; ++j) m = s[j] > m ? s[j] : m;
  return m;
}

// Probability of one key: exactly 0 for a masked key (score -inf).
KVSIM_HD inline float probability(float s, float m) {
  if (s == neg_inf()) return 0.0f;
  return exp_f32(s - m);
}

// Partition sum of probabilities: lane runs in order, then the butterfly.
KVSIM_HD inline float partition_sum(const float* p, int n) {
  float partial[kWarp];
  for (int l = 0; l < kWarp; ++l) {
    float acc = 0.0f;
    for (int j = l * kLaneRun; j < (l + 1) * kLaneRun && j < n; ++j) acc = acc + p[j];
    partial[l] = acc;
  }
  return butterfly_sum32(partial);
}

// Merge weight of a partition with max m_p under the global max M.
KVSIM_HD inline float merge_weight(float m_p, float global_max) {
  if (m_p == neg_inf()) return 0.0f;
  return exp_f32(m_p - global_max);
}

// ---------------------------------------------------------------- FMA ceiling probe
// kvsim bench's fma_throughput row: lane i runs kFmaProbeChains independent
// chains x = fma(x, a, b) for `steps` rounds (x converges to b / (1 - a) = 1,
// rounding at every step). The same chain on every backend, so the probe's
// output is checked byte for byte like an op's.
inline constexpr int kFmaProbeChains = 8;
inline constexpr float kFmaProbeA = 0.99951171875f;  // 1 - 2^-11
inline constexpr float kFmaProbeB = 0.00048828125f;  // 2^-11
KVSIM_HD inline float fma_probe_seed(int64_t lane, int chain) {
  return 1.0f + static_cast<float>((lane * kFmaProbeChains + chain) % 4096) * 0x1p-13f;
}

}  // namespace kvsim::canon

// ---------------------------------------------------------------- packed decoders
// Cache codes packed little-endian in a 32-bit word (code i in bits
// [8i, 8i + 8) for fp8, [16i, 16i + 16) for fp16), decoded to their exact fp32
// values: bit-identical to codec::e4m3_to_f32 / e5m2_to_f32 / f16_to_f32 for
// every code (tests/cuda/attention_differential_test.cu checks every code in
// every position on the device). On the device, finite codes go through the
// hardware's exact conversions (fp8 -> f16 -> f32: every fp8 value is a
// normal f16); a word holding an Inf or NaN code takes core's codec instead,
// so NaN payloads and signs are core's too.
namespace kvsim::canon {

namespace detail {
// True when some byte (or, for halves, some 16-bit half) of v is zero.
KVSIM_HD constexpr bool has_zero_byte(uint32_t v) { return ((v - 0x01010101u) & ~v & 0x80808080u) != 0; }
KVSIM_HD constexpr bool has_zero_half(uint32_t v) { return ((v - 0x00010001u) & ~v & 0x80008000u) != 0; }
#if defined(__CUDA_ARCH__)
__device__ __forceinline__ float f16_bits_to_f32(uint16_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ void f16x2_to_f32(uint32_t pair, float* out) {
  out[0] = f16_bits_to_f32(static_cast<uint16_t>(pair & 0xFFFFu));
  out[1] = f16_bits_to_f32(static_cast<uint16_t>(pair >> 16));
}
#endif
}  // namespace detail

KVSIM_HD inline void decode_e4m3x4(uint32_t word, float* out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if (!detail::has_zero_byte(~(word | 0x80808080u))) {  // no byte is NaN (magnitude 0x7F)
    uint32_t lo, hi;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(lo) : "h"(static_cast<uint16_t>(word & 0xFFFFu)));
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(hi) : "h"(static_cast<uint16_t>(word >> 16)));
    detail::f16x2_to_f32(lo, out);
    detail::f16x2_to_f32(hi, out + 2);
    return;
  }
#endif
  for (int i = 0; i < 4; ++i) out[i] = codec::e4m3_to_f32(static_cast<uint8_t>(word >> (8 * i)));
}

KVSIM_HD inline void decode_e5m2x4(uint32_t word, float* out) {
#if defined(__CUDA_ARCH__)
  if (!detail::has_zero_byte(~(word | 0x83838383u))) {  // no byte is Inf/NaN (exponent all ones)
    // An e5m2 code is the high byte of the f16 with the same value.
    detail::f16x2_to_f32(__byte_perm(word, 0, 0x1404), out);      // bytes 0, 1 -> high bytes of halves
    detail::f16x2_to_f32(__byte_perm(word, 0, 0x3424), out + 2);  // bytes 2, 3
    return;
  }
#endif
  for (int i = 0; i < 4; ++i) out[i] = codec::e5m2_to_f32(static_cast<uint8_t>(word >> (8 * i)));
}

KVSIM_HD inline void decode_f16x2(uint32_t word, float* out) {
#if defined(__CUDA_ARCH__)
  if (!detail::has_zero_half(~(word | 0x83FF83FFu))) {  // no half is Inf/NaN
    detail::f16x2_to_f32(word, out);
    return;
  }
#endif
  for (int i = 0; i < 2; ++i) out[i] = codec::f16_to_f32(static_cast<uint16_t>(word >> (16 * i)));
}

}  // namespace kvsim::canon

// ---------------------------------------------------------------- decoders for arithmetic
// Packed decoders for cache codes that only ever enter fp32 arithmetic (the
// score and P.V fma chains of attention): bit-identical to codec::e4m3_to_f32 /
// e5m2_to_f32 / f16_to_f32 for every code that is not a NaN, and a NaN for
// every NaN code -- but not necessarily core's NaN payload or sign. That is
// enough wherever the value only feeds arithmetic: every device fp32 operation
// with a NaN operand gives 0x7FFFFFFF, and store_float canonicalises a NaN
// output on the host, so no payload can reach an output byte. On the device
// they are the hardware's exact conversions alone (no Inf/NaN check, no
// branch), the fewest instructions per code the fp8 decode-attention kernel
// can spend. tests/cuda/attention_differential_test.cu checks every code in
// every position on the device. Never use them where a decoded value is
// stored as it is (gather, copies): use the decoders above.
namespace kvsim::canon {

KVSIM_HD inline void decode_e4m3x2_arith(uint16_t pair, float* out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(pair));
  detail::f16x2_to_f32(h, out);
#else
  for (int i = 0; i < 2; ++i) out[i] = codec::e4m3_to_f32(static_cast<uint8_t>(pair >> (8 * i)));
#endif
}

KVSIM_HD inline void decode_e4m3x4_arith(uint32_t word, float* out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t lo, hi;  // the word's halves as 16-bit registers (no shift for the upper pair)
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}"
      : "=r"(lo), "=r"(hi)
      : "r"(word));
  detail::f16x2_to_f32(lo, out);
  detail::f16x2_to_f32(hi, out + 2);
#else
  decode_e4m3x2_arith(static_cast<uint16_t>(word & 0xFFFFu), out);
  decode_e4m3x2_arith(static_cast<uint16_t>(word >> 16), out + 2);
#endif
}

KVSIM_HD inline void decode_e5m2x4_arith(uint32_t word, float* out) {
#if defined(__CUDA_ARCH__)
  // An e5m2 code is the high byte of the f16 with the same value (Inf and NaN too).
  detail::f16x2_to_f32(__byte_perm(word, 0, 0x1404), out);
  detail::f16x2_to_f32(__byte_perm(word, 0, 0x3424), out + 2);
#else
  for (int i = 0; i < 4; ++i) out[i] = codec::e5m2_to_f32(static_cast<uint8_t>(word >> (8 * i)));
#endif
}

KVSIM_HD inline void decode_e5m2x2_arith(uint16_t pair, float* out) {
  float w[4];
  decode_e5m2x4_arith(pair, w);
  out[0] = w[0];
  out[1] = w[1];
}

KVSIM_HD inline void decode_f16x2_arith(uint32_t word, float* out) {
#if defined(__CUDA_ARCH__)
  detail::f16x2_to_f32(word, out);
#else
  for (int i = 0; i < 2; ++i) out[i] = codec::f16_to_f32(static_cast<uint16_t>(word >> (16 * i)));
#endif
}

}  // namespace kvsim::canon
