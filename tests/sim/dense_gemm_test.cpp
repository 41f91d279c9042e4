// The dense invariant's double products (sim/include/kvsim/sim/dense_gemm.hpp)
// at every ISA this CPU runs, against a plain triple loop. Inputs are small
// integers, so every product and every partial sum is exact in double and any
// order gives the same bits: a wrong block edge, mask, stride or accumulate
// shows as a different number, not as rounding.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include <kvsim/core/splitmix64.hpp>

#include "kvsim/sim/dense_gemm.hpp"

using namespace kvsim;
using namespace kvsim::sim;

namespace {

// A(r, k) from `a` in either layout: row-major [rows][depth] or transposed [depth][rows].
struct Shape {
  int64_t rows, cols, depth;
  bool a_transposed, accumulate;
};

void check_shape(const Shape& sh, CpuIsa isa, uint64_t& seed) {
  const auto next = [&] { return static_cast<double>(static_cast<int64_t>(splitmix64_next(seed) >> 59) - 16); };  // -16 .. 15
  const int64_t ldb = sh.cols + 3, ldc = sh.cols + 5;  // padded rows: only [0, cols) is touched
  std::vector<double> a(static_cast<size_t>(sh.rows * sh.depth)), b(static_cast<size_t>(sh.depth * ldb)),
      c(static_cast<size_t>(sh.rows * ldc));
  for (double& x : a) x = next();
  for (double& x : b) x = next();
  for (double& x : c) x = next();
  const int64_t a_row = sh.a_transposed ? 1 : sh.depth, a_depth = sh.a_transposed ? sh.rows : 1;
  std::vector<double> want = c;
  for (int64_t r = 0; r < sh.rows; ++r)
    for (int64_t col = 0; col < sh.cols; ++col) {
      double sum = sh.accumulate ? c[r * ldc + col] : 0.0;
      for (int64_t k = 0; k < sh.depth; ++k) sum += a[r * a_row + k * a_depth] * b[k * ldb + col];
      want[r * ldc + col] = sum;
    }
  dense_gemm({sh.rows, sh.cols, sh.depth, a.data(), a_row, a_depth, b.data(), ldb, c.data(), ldc, sh.accumulate}, isa);
  for (size_t i = 0; i < c.size(); ++i) {
    INFO(cpu_isa_name(isa) << ": rows " << sh.rows << ", cols " << sh.cols << ", depth " << sh.depth
                           << (sh.a_transposed ? ", A transposed" : "") << (sh.accumulate ? ", accumulate" : "")
                           << ", element " << i);
    REQUIRE(c[i] == want[i]);  // padding past cols is left as it was
  }
}

}  // namespace

TEST_CASE("dense_gemm equals a plain triple loop at every ISA (odd sizes, both A layouts, accumulate)") {
  uint64_t seed = 7;
  int shapes = 0;
  for (CpuIsa isa : {CpuIsa::portable, CpuIsa::avx2, CpuIsa::avx512}) {
    if (!cpu_isa_supported(isa)) {
      MESSAGE("this CPU lacks " << cpu_isa_name(isa) << ": its kernel is not tested here");
      continue;
    }
    for (int64_t rows : {1, 3, 4, 5, 8, 9, 13})
      for (int64_t cols : {1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 24, 33, 64})
        for (int64_t depth : {0, 1, 2, 7, 16})
          for (bool transposed : {false, true})
            for (bool accumulate : {false, true}) {
              check_shape({rows, cols, depth, transposed, accumulate}, isa, seed);
              ++shapes;
            }
  }
  CHECK(shapes >= 1820);  // the portable kernel's shapes at least
}
