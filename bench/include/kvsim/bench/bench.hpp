// kvsim's benchmark library (issue 8, contract §8): the configurations `kvsim
// bench` measures, how each is prepared on a backend, timed, and checked
// against the CPU oracle. The CLI (cli/cmd_bench.cpp) only parses options
// and prints.
//
// A case is one op at one configuration. Its fixture owns the inputs and
// pools on the benchmarked backend; run() is one launch through the Backend
// API (validation, uploads, kernels) and returns the kernel seconds the
// backend reported (CUDA events on cuda, the host clock around run_* on cpu);
// check() recomputes a sample of the outputs on the oracle from the same
// inputs and compares bytes. A row with differing bytes reports no speed.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/backend.hpp"
#include "kvsim/sim/replay.hpp"
#include "kvsim/sim/scenario.hpp"

namespace kvsim::bench {

struct CheckResult {
  int64_t bytes_compared = 0;
  int64_t bytes_differing = 0;
  std::string first_difference;  // "q_out byte 1234: 0x3f != 0x40"
  bool ok() const { return bytes_compared > 0 && bytes_differing == 0; }
};

class Fixture {
 public:
  virtual ~Fixture() = default;
  // One launch of the op (or the ops of one step, e.g. 64 partial copies).
  // Returns the kernel seconds the backend reported, summed over its ops.
  virtual double run() = 0;
  // Recomputes a sample of the outputs on `oracle` and compares bytes.
  virtual CheckResult check(Backend& oracle) = 0;
};

struct Case {
  std::string op;      // contract §5 name: "decode_attention"
  std::string config;  // "bf16 hnd P16 GQA32:8 D128 B64 ctx8192"
  nlohmann::json params;  // the configuration as fields (read by bench/pytorch_baseline.py)
  double bytes = 0;    // minimal bytes the op must move (header of cases.cpp)
  double items = 0;    // tokens written / queries / blocks copied
  // Floating-point operations of one launch, where arithmetic is the op's
  // ceiling (attention's 4 * D per (query head, attended key), the FMA probe's
  // 2 per fma); 0 = not counted. Quoted against the same run's fma_throughput row.
  double flops = 0;
  std::function<std::unique_ptr<Fixture>(Backend&)> prepare;

  std::string name() const { return op + " " + config; }
};

enum class Suite {
  small,  // one configuration per op at --sequences x --tokens (CPU default, tests)
  full,   // issue 8's configurations, sized to fill a GPU (CUDA default)
};

struct SuiteOptions {
  Suite suite = Suite::small;
  int sequences = 16;
  int tokens = 1024;
};

std::vector<Case> make_suite(const SuiteOptions& o);

struct Measurement {
  double kernel_seconds = 0;  // median over launches
  double op_seconds = 0;      // median wall time of run() + synchronize (validation and uploads included)
  int launches = 0;
};

struct TimingOptions {
  double min_seconds = 0.3;  // per case, after warm-up
  int warmup = 3;
  int min_launches = 5;
  int max_launches = 200;
};

Measurement measure(Backend& be, Fixture& f, const TimingOptions& t);

// Copy bandwidth of `be` in GB/s (bytes read + written) over `bytes`: the
// ceiling every row is quoted against, measured in the same run.
double copy_bandwidth(Backend& be, size_t bytes, const TimingOptions& t);

// A real-size row (kvsim bench --scenario FILE, issue 13 item 10): one replay
// of a scenario file with the chosen invariants (default every one), the
// backend's kernel timing on, timed once (a replay is seconds to minutes; a
// median over launches would multiply that). Its check is the replay's own:
// every invariant held or caught its fault and every expectation was met
// (the comparison invariants compare bytes against re-runs of the scenario).
struct ScenarioMeasurement {
  sim::ScenarioReport report;    // counters, invariants, wall time and its split (report.timings)
  double estimated_token_layers = 0;  // sim::estimate_replay's count over every run
  double estimated_flops = 0;
  int64_t max_rss_bytes = 0;     // the process's peak resident set after the replay (getrusage)
};
ScenarioMeasurement measure_scenario(Backend& be, const sim::Scenario& s,
                                     const std::optional<std::set<sim::Invariant>>& invariants,
                                     const sim::ReplayOptions& base = {});

}  // namespace kvsim::bench
