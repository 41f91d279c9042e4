// The fast CPU backend (AVX-512/portable attention, oneTBB) held to the
// reference backend (backends/reference/: plain loops over core's work items)
// by the same `...IsEquivalentToRef` suite as CUDA (tests/cuda/
// ops_differential_test.cpp): every generated op, both attention orders, odd
// and even page sizes, every dtype / layout / placement, finite and with
// NaN/Inf, compared byte for byte after every op
// (tests/support/differential_sweep.hpp); mla_attention over its own fixture.
// The cpu side runs 2 threads, so work is really split between threads.
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/differential_sweep.hpp"

using namespace kvsim;
using namespace kvsim::test;

namespace {

std::unique_ptr<DifferentialBackend> reference_against_cpu() { return make_diff_or_skip("reference", "cpu"); }

}  // namespace

KVSIM_IS_EQUIVALENT_TO_REF_TEST_CASES(reference_against_cpu)

TEST_CASE("MlaAttentionIsEquivalentToRef") {
  std::unique_ptr<DifferentialBackend> diff = reference_against_cpu();
  REQUIRE(diff);
  check_mla_attention_is_equivalent(*diff);
}

TEST_CASE("The reference backend is registered, named and compared as the reference side") {
  const std::vector<std::string> names = backend_names();
  CHECK(std::find(names.begin(), names.end(), "reference") != names.end());
  std::unique_ptr<Backend> ref = make_backend("reference", BackendOptions{8});  // threads: ignored
  CHECK(ref->name() == "reference");
  std::unique_ptr<DifferentialBackend> diff = reference_against_cpu();
  REQUIRE(diff);
  CHECK(diff->reference().name() == "reference");
  CHECK(diff->candidate().name() == "cpu");
}
