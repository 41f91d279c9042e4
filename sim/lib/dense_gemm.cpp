// dense_gemm (dense_gemm.hpp): register-blocked products, with AVX-512 and
// AVX2 + FMA kernels chosen at run time and plain C++ elsewhere. They replaced
// Eigen's products in the dense check: Eigen picks its vector width when it is
// included, so in this baseline x86-64 library it ran SSE2 double products.
#include "kvsim/sim/dense_gemm.hpp"


#include "backends/cpu/cpu_isa.hpp"
#include "backends/cpu/cpu_target.hpp"

#if KVSIM_CPU_X86
#include <immintrin.h>
#endif

namespace kvsim::sim {
namespace {

// Baseline x86-64 (and other hosts): rows [r0, r0 + R) x columns [c0, c0 + C)
// of C in registers over all of k; a product and a sum each (baseline x86-64
// has no fma instruction, and glibc's fma would be a call per product).
template <int R, int C>
inline void gemm_block(const DenseGemm& g, int64_t r0, int64_t c0) {
  double acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = g.accumulate ? g.c[(r0 + r) * g.ldc + c0 + c] : 0.0;
  for (int64_t k = 0; k < g.depth; ++k) {
    const double* b = g.b + k * g.ldb + c0;
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const double a = g.a[(r0 + r) * g.a_row + k * g.a_depth];
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[r][c] = acc[r][c] + a * b[c];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) g.c[(r0 + r) * g.ldc + c0 + c] = acc[r][c];
}

template <int R>
void gemm_rows(const DenseGemm& g, int64_t r0) {
  int64_t c0 = 0;
  for (; c0 + 8 <= g.cols; c0 += 8) gemm_block<R, 8>(g, r0, c0);
  for (; c0 + 4 <= g.cols; c0 += 4) gemm_block<R, 4>(g, r0, c0);
  for (; c0 < g.cols; ++c0) gemm_block<R, 1>(g, r0, c0);
}

void gemm_portable(const DenseGemm& g) {
  int64_t r0 = 0;
  for (; r0 + 4 <= g.rows; r0 += 4) gemm_rows<4>(g, r0);
  for (; r0 < g.rows; ++r0) gemm_rows<1>(g, r0);
}
}  // namespace

// The FMA ISAs: explicit vectors (GCC's vectorizer turned the generic blocks
// into permutes), one kernel (dense_gemm_block.inc) over each ISA's vector
// operations: blocks of 4 rows x 2 vectors of columns, the last vectors
// masked; per k, two loads of B, four broadcasts of A, eight fmas.
#if KVSIM_CPU_X86
KVSIM_CPU_TARGET_BEGIN(KVSIM_CPU_TARGET_AVX512)
namespace {
namespace on_avx512 {
using Vec = __m512d;
using Mask = __mmask8;
constexpr int64_t kWidth = 8;
inline Mask lanes_below(int64_t n) { return static_cast<Mask>(n >= 8 ? 0xFF : n <= 0 ? 0 : (1u << n) - 1u); }
inline Vec load(Mask m, const double* p) { return _mm512_maskz_loadu_pd(m, p); }
inline void store(Mask m, double* p, Vec v) { _mm512_mask_storeu_pd(p, m, v); }
inline Vec splat(const double* p) { return _mm512_set1_pd(*p); }
inline Vec zero() { return _mm512_setzero_pd(); }
inline Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_pd(a, b, c); }
#include "dense_gemm_block.inc"
}  // namespace on_avx512
}  // namespace
KVSIM_CPU_TARGET_END

KVSIM_CPU_TARGET_BEGIN(KVSIM_CPU_TARGET_AVX2)
namespace {
namespace on_avx2 {
using Vec = __m256d;
using Mask = __m256i;  // maskload reads each lane's sign bit
constexpr int64_t kWidth = 4;
inline Mask lanes_below(int64_t n) { return _mm256_cmpgt_epi64(_mm256_set1_epi64x(n), _mm256_setr_epi64x(0, 1, 2, 3)); }
inline Vec load(Mask m, const double* p) { return _mm256_maskload_pd(p, m); }
inline void store(Mask m, double* p, Vec v) { _mm256_maskstore_pd(p, m, v); }
inline Vec splat(const double* p) { return _mm256_broadcast_sd(p); }
inline Vec zero() { return _mm256_setzero_pd(); }
inline Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_pd(a, b, c); }
#include "dense_gemm_block.inc"
}  // namespace on_avx2
}  // namespace
KVSIM_CPU_TARGET_END
#endif

void dense_gemm(const DenseGemm& g, CpuIsa isa) {
#if KVSIM_CPU_X86
  if (isa == CpuIsa::avx512) return on_avx512::gemm(g);
  if (isa == CpuIsa::avx2) return on_avx2::gemm(g);
#endif
  (void)isa;
  gemm_portable(g);
}

void dense_gemm(const DenseGemm& g) {
  static const CpuIsa isa = selected_cpu_isa();
  dense_gemm(g, isa);
}

}  // namespace kvsim::sim
