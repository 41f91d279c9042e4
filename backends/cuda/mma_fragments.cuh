// The tensor-core instruction of the mma attention order and the shared-memory
// loads that build its fragments (attention_mma.cu, attention_prefill_mma.cu).
// mma.sync m16n8k16 with fp32 accumulation is the instruction core's model
// describes (core/include/kvsim/core/mma_model.hpp); each output element
// depends only on its row of A, its column of B and its c.
//
// Fragments (PTX ISA, "Matrix fragments for mma.m16n8k16"), g = lane / 4,
// t = lane % 4:  A: a0 = (row g, k 2t, 2t+1), a1 = (row g+8, k 2t..),
// a2 = (row g, k 2t+8..), a3 = (row g+8, k 2t+8..); B: b0 = (k 2t, 2t+1,
// column g), b1 = (k 2t+8, 2t+9, column g); C: c0, c1 = (row g, columns 2t,
// 2t+1), c2, c3 = (row g+8, columns 2t, 2t+1). The lower k of a pair is the
// register's low half.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include <kvsim/core/attention_mma.hpp>

namespace kvsim::cuda {

// Two 16-bit codes in one register, the first (lower k) in the low half.
__device__ __forceinline__ uint32_t pack_codes(uint32_t lo, uint32_t hi) { return (lo & 0xFFFFu) | (hi << 16); }

// d = a * b + c for one m16n8k16 (c and d in place).
__device__ __forceinline__ void mma_16816(mma::Operand f, float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if (f == mma::Operand::fp16)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8 x 8 matrices of 16-bit codes from shared memory: lane l gives the
// address of row l % 8 of matrix l / 8; register i receives matrix i's
// (row lane / 4, elements 2 (lane % 4), + 1). With .trans it receives the
// transposed matrix's: (rows 2 (lane % 4), + 1, column lane / 4).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s)
               : "memory");
}

// Two fp8 codes (the first in the low byte) as two bf16 codes (the first in
// the low half): the exact value of each, as core's cache_operand_code gives
// it (every e4m3 and e5m2 value is an fp16 and a bf16 value; a NaN stays a
// NaN, whose payload the instruction ignores: mma_model.hpp's kMmaNanBits).
// Pinned instructions: fp8x2 -> f16x2, each f16 -> f32, f32x2 -> bf16x2 (RNE,
// exact here). Checked for all 65,536 pairs of each format by
// Fp8PairsBecomeTheOraclesBf16Codes (tests/cuda/attention_differential_test.cu).
template <bool kE5m2>
__device__ __forceinline__ uint32_t fp8x2_to_bf16x2(uint32_t pair) {
  const uint16_t codes = static_cast<uint16_t>(pair);
  uint32_t h2;
  if constexpr (kE5m2)
    asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(h2) : "h"(codes));
  else
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(codes));
  float lo, hi;
  asm("{\n .reg .f16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;\n}" : "=f"(lo), "=f"(hi) : "r"(h2));
  uint32_t out;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(hi), "f"(lo));
  return out;
}

}  // namespace kvsim::cuda
