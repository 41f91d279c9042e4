// The dense invariant's double-precision products (Runner::check_dense):
//   C[r][c] (+)= sum_k A(r, k) * B[k][c],  A(r, k) = A[r * a_r + k * a_k],
// B and C row-major (ldb, ldc), in k order: register blocks of 4 rows x 16
// columns at AVX-512, 4 x 8 at AVX2 (one fma per product, the last vector
// masked), 4 x 8, 4 or 1 in baseline x86-64 (a product and a sum), chosen at
// run time (backends/cpu/cpu_isa.hpp). A tolerance check's reference, not an
// output: it needs double's accuracy, not one order, so the ISAs may differ in
// the last bits (tests/sim/dense_gemm_test.cpp holds each to exact sums).
#pragma once

#include <cstdint>

#include "backends/cpu/cpu_isa.hpp"

namespace kvsim::sim {

struct DenseGemm {
  int64_t rows = 0, cols = 0, depth = 0;
  const double* a = nullptr;
  int64_t a_row = 0, a_depth = 0;  // A(r, k) = a[r * a_row + k * a_depth]
  const double* b = nullptr;
  int64_t ldb = 0;
  double* c = nullptr;
  int64_t ldc = 0;
  bool accumulate = false;  // C += A B (else C = A B)
};

void dense_gemm(const DenseGemm& g);               // at selected_cpu_isa()
void dense_gemm(const DenseGemm& g, CpuIsa isa);  // at `isa` (the CPU must run it)

}  // namespace kvsim::sim
