// Every non-attention op of the CUDA backend (and the attention entry points
// through the Backend interface, both attention orders) against the reference
// backend, byte for byte, through the sweeps of
// tests/support/differential_sweep.hpp (axes, NaN/Inf, what is compared).
// Skips without a GPU.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "tests/support/differential_sweep.hpp"

using namespace kvsim;
using namespace kvsim::test;

namespace {

// KVSIM_DIFF_CANDIDATE=cpu runs the same sweep reference against cpu (what
// tests/oracle/cpu_is_equivalent_to_ref_test does) on a machine without a GPU.
std::unique_ptr<DifferentialBackend> make_diff() {
  const char* candidate = std::getenv("KVSIM_DIFF_CANDIDATE");
  return make_diff_or_skip("reference", candidate ? candidate : "cuda");
}

}  // namespace

KVSIM_IS_EQUIVALENT_TO_REF_TEST_CASES(make_diff)

TEST_CASE("CudaBackendPutsTheSecondaryPoolInHostMemory") {
  std::unique_ptr<Backend> cuda;
  try {
    cuda = make_backend("cuda");
  } catch (const BackendUnavailable& e) {
    std::printf("SKIPPED (differential test needs a GPU): %s\n", e.what());
    return;
  }
  PoolGeometry g{.head_dim = 32, .dtype = CacheDtype::nvfp4, .primary_blocks = 3, .secondary_blocks = 2};
  KvPools pools = cuda->allocate_pools(g, 0x5A);
  // Pinned host memory is readable by the host directly; the fill reached it.
  const uint8_t* secondary = static_cast<const uint8_t*>(pools.data[1]);
  const uint8_t* secondary_scales = static_cast<const uint8_t*>(pools.scales[1]);
  CHECK(secondary[0] == 0x5A);
  CHECK(secondary[g.pool_bytes(PoolKind::secondary) - 1] == 0x5A);
  CHECK(secondary_scales[0] == 0x5A);
  cuda->release_pools(pools);
}
