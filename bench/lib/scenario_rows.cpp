// kvsim bench --scenario FILE (bench.hpp, measure_scenario): one timed replay
// of a real-size scenario, its wall time split into kernels and host work.
#include <sys/resource.h>

#include "kvsim/bench/bench.hpp"
#include "kvsim/sim/estimate.hpp"

namespace kvsim::bench {

ScenarioMeasurement measure_scenario(Backend& be, const sim::Scenario& s,
                                     const std::optional<std::set<sim::Invariant>>& invariants,
                                     const sim::ReplayOptions& base) {
  const sim::ReplayEstimate e = sim::estimate_replay(s, invariants);
  sim::check_fits(s, e, be);
  const bool was_timing = be.kernel_timing();
  be.set_kernel_timing(true);  // kernels apart from the rest of each op call
  sim::ReplayOptions o = base;
  o.invariants = invariants;
  // The row reports time, not the content hash: FNV-1a is a byte at a time (~1 GB/s), and at a
  // real size it was most of a replay's host work with --invariants none (3.3 of 5.7 s, H100).
  o.content_hash = false;
  ScenarioMeasurement m;
  try {
    m.report = sim::replay(s, be, o);
  } catch (...) {
    be.set_kernel_timing(was_timing);
    throw;
  }
  be.set_kernel_timing(was_timing);
  m.estimated_token_layers = e.token_layers;
  m.estimated_flops = e.attention_flops;
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  m.max_rss_bytes = static_cast<int64_t>(u.ru_maxrss) * 1024;  // Linux: KiB
  return m;
}

}  // namespace kvsim::bench
