// mla_attention on the CUDA backend against the reference backend, byte for
// byte, through a DifferentialBackend(reference, cuda): the cases and what is
// compared are check_mla_attention_is_equivalent's
// (tests/support/differential_sweep.hpp). Skips without a GPU;
// KVSIM_DIFF_CANDIDATE=cpu runs it against the fast CPU backend instead.
#include <doctest/doctest.h>

#include <cstdlib>
#include <memory>

#include "tests/support/differential_sweep.hpp"

using namespace kvsim;
using namespace kvsim::test;

TEST_CASE("mla_attention: CUDA equals the reference byte for byte") {
  const char* candidate = std::getenv("KVSIM_DIFF_CANDIDATE");
  if (std::unique_ptr<DifferentialBackend> diff = make_diff_or_skip("reference", candidate ? candidate : "cuda"))
    check_mla_attention_is_equivalent(*diff);
}
