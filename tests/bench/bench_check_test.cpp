// kvsim bench's oracle check (bench/, issue 8): every configuration of the
// small suite runs and matches the oracle byte for byte, and a backend that
// corrupts one output byte of the op is caught -- a fast wrong kernel cannot
// report a number.
#include <doctest/doctest.h>

#include <set>
#include <string>

#include "backends/cpu/cpu_backend.hpp"
#include "kvsim/bench/bench.hpp"
#include "tests/support/corrupting_backend.hpp"

using namespace kvsim;

namespace {
bench::SuiteOptions tiny() {
  bench::SuiteOptions o;
  o.suite = bench::Suite::small;
  o.sequences = 3;
  o.tokens = 37;
  return o;
}
}  // namespace

TEST_CASE("bench: every small-suite configuration matches the oracle (cpu at 2 threads against cpu at 3)") {
  CpuBackend be(2), oracle(3);
  for (const bench::Case& c : bench::make_suite(tiny())) {
    INFO(c.name());
    CHECK(c.bytes > 0);
    auto f = c.prepare(be);
    be.set_kernel_timing(true);
    const double seconds = f->run();
    CHECK(seconds >= 0);
    const bench::CheckResult r = f->check(oracle);
    CHECK(r.bytes_compared > 0);
    CHECK(r.bytes_differing == 0);
    CHECK(r.ok());
  }
}

TEST_CASE("bench: a backend that corrupts one byte of an op's output is caught") {
  // Where each op's corruption lands: its pool or its output tensor.
  const std::set<std::string> pool_ops{"append_paged", "reshape_and_cache", "append_mla", "copy_blocks",
                                       "partial_copy", "offload", "onboard"};
  const std::set<std::string> out_ops{"qkv_preprocess_write", "indexer_k_scatter", "gather_paged",
                                      "decode_attention", "prefill_attention"};
  CpuBackend oracle(2);
  int caught = 0;
  for (const bench::Case& c : bench::make_suite(tiny())) {
    if (!pool_ops.count(c.op) && !out_ops.count(c.op)) continue;  // scenario_replay: many ops, hash-checked
    INFO(c.name());
    testing::CorruptingBackend bad;
    bad.corrupt_op = c.op;
    bad.corruptions = 1;
    // Both pools of a block move are compared, so a flipped primary byte counts for offload too.
    if (pool_ops.count(c.op)) bad.pool_byte = 0;
    else bad.out_byte = 0;
    auto f = c.prepare(bad);
    f->run();
    const bench::CheckResult r = f->check(oracle);
    CHECK(r.bytes_differing > 0);
    CHECK_FALSE(r.ok());
    CHECK_FALSE(r.first_difference.empty());
    ++caught;
  }
  CHECK(caught == 12);
}
