// The arithmetic of the `mma` attention order (docs/canonical-arithmetic.md,
// "The mma order"), written once for host and device: every inner product is
// one modelled Hopper mma.sync m16n8k16 (mma_model.hpp), so a tensor-core
// kernel and the CPU oracle (which runs the model) give the same bits.
//
//  operand        : bf16 caches and fp8/int8 caches (codes decoded exactly to
//                   bf16) use the bf16 instruction, fp16 caches the fp16 one;
//                   q is rounded to the operand type (RNE, core's codecs)
//  score(q, k)    : acc = +0; for chunk t = 0, 1, .. ceil(D/16) - 1 (dims
//                   [16t, 16t + 16), past D zero): acc = mma(q_t, k_t, acc);
//                   then one fp32 multiply by the effective scale
//  softmax        : today's canonical fp32 steps (partition max, exp_f32,
//                   lane-run sum) -- attention_math.hpp
//  P split        : hi = round(p) to the operand type, lo = round(p - hi)
//                   (p - hi is exact: Sterbenz)
//  P.V            : per (head, dim), over the partition's keys in groups of
//                   8 (group j: keys 8j .. 8j + 7, past the partition zero):
//                   acc = +0; acc = mma([hi_8j..hi_8j+7, lo_8j..lo_8j+7],
//                   [v_8j..v_8j+7, v_8j..v_8j+7], acc), j ascending
//  merge          : today's (attention_math.hpp).
#pragma once

#include "codecs.hpp"
#include "dtype.hpp"
#include "mma_model.hpp"

namespace kvsim {

// The arithmetic order of an attention op. fp32: the canonical CUDA-core
// order (attention_math.hpp); mma: tensor-core inner products (this file).
enum class AttentionOrder : uint8_t { fp32, mma };

constexpr const char* attention_order_name(AttentionOrder o) { return o == AttentionOrder::mma ? "mma" : "fp32"; }

}  // namespace kvsim

namespace kvsim::mma_order {

// Elements of one instruction's k (m16n8k16) and keys per P.V instruction.
inline constexpr int kChunk = 16;
inline constexpr int kKeysPerStep = 8;

// Cache dtypes the mma order is offered for: their codes are exact values of
// the instruction's operand type.
KVSIM_HD constexpr bool offered_for(CacheDtype t) {
  return t == CacheDtype::bf16 || t == CacheDtype::fp16 || is_fp8(t) ||
         t == CacheDtype::int8;
}

// The instruction's operand type for a cache dtype (offered_for only).
KVSIM_HD constexpr mma::Operand operand_for(CacheDtype t) {
  return t == CacheDtype::fp16 ? mma::Operand::fp16 : mma::Operand::bf16;
}

// An fp32 value as an operand code, rounded to nearest even (core's codecs).
KVSIM_HD constexpr uint32_t operand_code(mma::Operand f, float x) {
  return f == mma::Operand::fp16 ? codec::f32_to_f16(x) : codec::f32_to_bf16(x);
}

// A cache element's code (bf16/fp16 as stored; fp8/int8 decoded exactly and
// written as bf16: every such value is a bf16 value) as an operand code.
KVSIM_HD inline uint32_t cache_operand_code(CacheDtype t, uint32_t stored) {
  switch (t) {
    case CacheDtype::bf16:
    case CacheDtype::fp16: return stored & 0xFFFFu;
    case CacheDtype::fp8_e4m3: return codec::f32_to_bf16(codec::e4m3_to_f32(static_cast<uint8_t>(stored)));
    case CacheDtype::fp8_e5m2: return codec::f32_to_bf16(codec::e5m2_to_f32(static_cast<uint8_t>(stored)));
    case CacheDtype::int8: return codec::f32_to_bf16(codec::int8_to_f32(static_cast<int8_t>(stored)));
    default: return 0u;
  }
}

// The operand code of cache element `elem` of a pool of dtype t.
KVSIM_HD inline uint32_t load_cache_operand(const uint8_t* pool, CacheDtype t, int64_t elem) {
  const uint32_t stored = bits_per_element(t) == 16 ? reinterpret_cast<const uint16_t*>(pool)[elem] : pool[elem];
  return cache_operand_code(t, stored);
}

// q . k over D elements (operand codes): the chain of ceil(D/16)
// instructions from +0, chunk 0 first (before the score scale).
KVSIM_HD inline float score_chain(mma::Operand f, const uint32_t* q, const uint32_t* k, int D) {
  float acc = 0.0f;
  for (int d0 = 0; d0 < D; d0 += kChunk) {
    uint32_t a[kChunk], b[kChunk];
    for (int i = 0; i < kChunk; ++i) {
      const bool in = d0 + i < D;
      a[i] = in ? q[d0 + i] : 0u;
      b[i] = in ? k[d0 + i] : 0u;
    }
    acc = mma::mma_inner_product(f, a, b, acc);
  }
  return acc;
}

// p as hi + lo operand codes.
struct SplitProbability {
  uint32_t hi, lo;
};
KVSIM_HD constexpr float operand_value(mma::Operand f, uint32_t code) {
  return f == mma::Operand::fp16 ? codec::f16_to_f32(static_cast<uint16_t>(code))
                                 : codec::bf16_to_f32(static_cast<uint16_t>(code));
}
KVSIM_HD constexpr SplitProbability split_probability_formula(mma::Operand f, float p) {
  const uint32_t hi = operand_code(f, p);
  const float rest = p - operand_value(f, hi);  // exact (Sterbenz); NaN stays NaN
  return {hi, operand_code(f, rest)};
}
// operand_code on the device by its conversion instruction (RNE, a NaN to
// the canonical 0x7FFF, subnormals kept: operand_code's bits for every
// float, checked for all 2^32 of them through split_probability by
// SplitProbabilityInstructionsAreTheFormula in tests/cuda/core_device_test.cu),
// one instruction instead of ~8; on the host operand_code itself.
KVSIM_HD inline uint32_t round_to_operand(mma::Operand f, float x) {
#if defined(__CUDA_ARCH__)
  unsigned short code;
  if (f == mma::Operand::fp16) asm("cvt.rn.f16.f32 %0, %1;" : "=h"(code) : "f"(x));
  else asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(code) : "f"(x));
  return code;
#else
  return operand_code(f, x);
#endif
}

// The same split by round_to_operand (and on the device the operand's value
// by its instruction too): 4 instructions instead of ~20 for each
// probability of the P.V kernels.
KVSIM_HD inline SplitProbability split_probability(mma::Operand f, float p) {
#if defined(__CUDA_ARCH__)
  const uint32_t hi = round_to_operand(f, p);
  float value;
  if (f == mma::Operand::fp16) asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(static_cast<unsigned short>(hi)));
  else value = bits_float(hi << 16);
  return {hi, round_to_operand(f, p - value)};
#else
  return split_probability_formula(f, p);
#endif
}

// One P.V instruction for one (head, dim): 8 keys' hi and lo parts against
// the 8 V codes, twice; `acc` enters as the instruction's c.
KVSIM_HD inline float pv_step(mma::Operand f, const uint32_t* hi, const uint32_t* lo, const uint32_t* v, float acc) {
  uint32_t a[kChunk], b[kChunk];
  for (int i = 0; i < kKeysPerStep; ++i) {
    a[i] = hi[i];
    a[i + kKeysPerStep] = lo[i];
    b[i] = v[i];
    b[i + kKeysPerStep] = v[i];
  }
  return mma::mma_inner_product(f, a, b, acc);
}

}  // namespace kvsim::mma_order
