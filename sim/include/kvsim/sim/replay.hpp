// Replaying a scenario on a backend (contract §6-§7): the block manager builds
// every page table, the scheduler forms steps, the synthetic model makes the
// inputs, and every step becomes backend ops for every layer. Invariants are
// checked during and after the replay. The runner drives backends only
// through kvsim::Backend (backends/backend.hpp), so every backend replays the
// same scenarios unchanged.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "backends/backend.hpp"
#include "scenario.hpp"

namespace kvsim::sim {

class StepObserver;  // step_observer.hpp

enum class InvariantStatus : uint8_t {
  pass,        // checked, held
  fail,        // checked, violated (and no fault explains it)
  caught,      // violated by a switched-on fault, as expected
  not_applicable,
  skipped,     // not selected (ReplayOptions::invariants, kvsim run --invariants): not checked
};
std::string_view invariant_status_name(InvariantStatus s);

struct InvariantReport {
  Invariant invariant;
  InvariantStatus status = InvariantStatus::not_applicable;
  std::string detail;  // the first violation (what, where, both values), or the bound that held
};

struct ReplayCounters {
  int64_t steps = 0;
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;
  int64_t reuse_hit_tokens = 0;
  int64_t partial_reuse_tokens = 0;
  int64_t evicted_blocks = 0;
  int64_t offloaded_blocks = 0;
  int64_t onboarded_blocks = 0;
  int64_t preemptions = 0;
  int64_t ops = 0;
  int64_t token_layers = 0;  // tokens written x layers (replay throughput unit)
};

// The counters a report names, by the names every JSON uses (kvsim run --json,
// kvsim trace schedule --json, the report's page), written once.
struct CounterField {
  std::string_view name;
  int64_t ReplayCounters::*value;
};
inline constexpr CounterField kReportedCounters[] = {
    {"steps", &ReplayCounters::steps},
    {"prefill_tokens", &ReplayCounters::prefill_tokens},
    {"decode_tokens", &ReplayCounters::decode_tokens},
    {"reuse_hit_tokens", &ReplayCounters::reuse_hit_tokens},
    {"partial_reuse_tokens", &ReplayCounters::partial_reuse_tokens},
    {"evicted_blocks", &ReplayCounters::evicted_blocks},
    {"offloaded_blocks", &ReplayCounters::offloaded_blocks},
    {"onboarded_blocks", &ReplayCounters::onboarded_blocks},
    {"preemptions", &ReplayCounters::preemptions},
};

enum class OutputKind : int32_t {
  attention = 0,  // the attention output row of the query at `position`: [Hq, D] fp32
  k_cache = 1,    // a finished request's K (or MLA latent) row at `position`, read back by gather_paged: [H, D] fp32
  v_cache = 2,    // ... its V row
  recurrent_state = 3,  // a finished request's state of recurrent layer `layer` after its last token: [state_size] fp32
};

// Where a replay's wall time went (kvsim bench --scenario):
// host-clock seconds, each instant charged to exactly one part, summed over
// the runs of a scenario (its own and every comparison run).
struct ReplayTimings {
  double kernels = 0;      // backend op work: its kernel time when the backend times kernels (set_kernel_timing), else the whole op call
  double op_host = 0;      // the rest of each op call: host validation, index uploads, launches (0 without kernel timing)
  double inputs = 0;       // the synthetic model on the host: every op's inputs, the recurrent layers' states
  double transfers = 0;    // input uploads, output and read-back downloads, the offload check's block copies
  double scheduling = 0;   // scheduler and block manager (steps, tables, reuse, eviction), the conservation check
  double recording = 0;    // the content hash, output digests, the spill file, the NaN scan
  double dense = 0;        // the dense invariant's double reference (its gathers are kernels and transfers)
  double checks = 0;       // the other in-run invariants' references: the write oracle's expected rows, the
                           // states recomputed from token 0 (state_restore), the offload check's digests
  double comparisons = 0;  // comparing the runs' records once they are done (and the quantization error)
  double other = 0;        // the rest: buffers, pool allocation and release, tables and op descriptors,
                           // observers (progress line, report recorder), building the comparison scenarios
  double transfer_bytes = 0;  // bytes the transfers moved (not a time: outside total())
  double total() const {
    return kernels + op_host + inputs + transfers + scheduling + recording + dense + checks + comparisons + other;
  }
  double host() const { return total() - kernels; }
  ReplayTimings& operator+=(const ReplayTimings& o);
  // Every time times f (transfer_bytes unchanged): a run's share of runs made at once.
  ReplayTimings scaled(double f) const;
};

// Charges wall time to one part of a ReplayTimings at a time: enter() adds the
// time since the last switch to the current part and makes another current.
class PhaseClock {
 public:
  explicit PhaseClock(double* start);
  double* enter(double* part);  // returns the part that was current
  void stop();                  // charges the time so far; the clock then charges nothing
 private:
  double* current_;
  int64_t since_ns_;
};
// The scope of one part: entered on construction, the previous part again on destruction.
class Phase {
 public:
  Phase(PhaseClock& c, double* part) : clock_(c), previous_(c.enter(part)) {}
  ~Phase() { clock_.enter(previous_); }
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;

 private:
  PhaseClock& clock_;
  double* previous_;
};

struct OutputKey {
  std::string request;
  int32_t layer = 0;
  OutputKind kind = OutputKind::attention;
  int64_t position = 0;
  auto operator<=>(const OutputKey&) const = default;
};

// One missed expectation, field by field (kvsim run --json's "failures").
struct ExpectationFailure {
  // The [expect] key (a counter, must_pass, must_catch), or max_steps for a
  // replay that did not finish within scheduler.max_steps.
  std::string expectation;
  std::string subject;                      // must_pass: the invariant; must_catch: the fault; else empty
  std::variant<int64_t, std::string> expected, got;  // counters as numbers; statuses as text
};

struct ScenarioReport {
  std::string name;
  ReplayCounters counters;
  std::vector<InvariantReport> invariants;
  std::vector<std::string> expectation_failures;  // "expected evicted_blocks = 3, got 2"
  std::vector<ExpectationFailure> expectation_details;  // the same failures in the same order, field by field
  uint64_t content_hash = 0;  // FNV-1a over final pools and every attention output (golden replays)
  bool ok = false;            // every invariant pass/caught/n.a., every expectation met
  double main_seconds = 0.0;   // wall time of the scenario's own replay (throughput: counters.token_layers / this)
  double total_seconds = 0.0;  // ... plus the comparison invariants' replays
  ReplayTimings timings;       // total_seconds split by part (every run of the scenario)
  int32_t concurrent_runs = 1;  // runs made at once (replay.cpp: a small scenario's on a host backend), else 1
};

// Where the replay is, told to observers before each op runs.
struct OpContext {
  int64_t step = 0;
  int32_t layer = 0;
  std::string op;  // "qkv_preprocess_write", "decode_attention", ...
  // For mapping a pool byte back to (sequence, token): each batch entry's
  // request id and its dense block table row (cache slots -> blocks).
  std::vector<std::string> sequence_ids;
};

// Where replay() is: which run, and how far that run has got.
struct RunProgress {
  std::string run;        // "replay" (the scenario's own), else the comparison: "chunking (one-chunk prefill)", ...
  int32_t run_index = 0;  // 0 for the scenario's own run, then 1, 2, ... in the order they run
  int64_t step = 0;       // the step just done (steps count from 0)
  int64_t tokens = 0;     // tokens this run has prefilled and decoded so far
  int64_t token_layers = 0;  // token-layers of this run so far
  int64_t token_layers_before = 0;  // token-layers of the runs before this one
  int64_t steps_planned = 0;  // the run's step indices (planned_steps(): "step k of n")
};

struct ReplayOptions {
  // oneTBB threads of the replay's own host work (the per-row digests, the
  // dense and write checks, the synthetic inputs): replay() runs in an arena of
  // this many (kvsim run --threads, kvsim bench's thread counts), so that a
  // thread count limits the whole replay, not only the cpu backend's ops.
  // 0: the caller's arena (all cores by default). Results are the same for any count.
  int threads = 0;
  // Called before every backend op (kvsim diff labels differences with it).
  std::function<void(const OpContext&)> before_op;
  // Called after every step (progress display).
  std::function<void(int64_t step, const ReplayCounters&)> after_step;
  // Called after every step of every run replay() makes, its own and each
  // comparison re-run (kvsim run's progress line).
  std::function<void(const RunProgress&)> progress;
  // Told the start, every block event and the state after every step of the
  // scenario's own run (not the comparison re-runs); nullptr = none.
  StepObserver* observer = nullptr;
  // --dump DIR: write pools, scale pools, queries and attention outputs as
  // .npy plus manifest.json. Empty = no dump.
  std::string dump_dir;
  // Run the comparison invariants (they replay the scenario again with one
  // setting changed). Off for the inner replays themselves.
  bool comparison_invariants = true;
  // Let a host backend make a small scenario's runs at once, each on its own
  // thread (ScenarioReport::concurrent_runs); false: one after another, as on
  // a device. The report is the same either way.
  bool runs_at_once = true;
  // Check the dense invariant during the run (a gather and a double-precision
  // reference per attention op). replay() turns it off for the comparison
  // re-runs, whose dense results nobody reads.
  bool dense_check = true;
  // Check the write invariant during the run (every read-back cache row against
  // the value its write op was given, recomputed from the synthetic model);
  // off for the comparison re-runs, like dense_check.
  bool write_check = true;
  // The comparison invariants' inner runs (replay.cpp): keep every attention
  // output's bytes in a spill file (the quantization error needs values), and
  // keep the bytes of one output row (a failed comparison's first differing
  // row, to name the element).
  bool spill_attention = false;
  // Keep a digest of every output row for the comparisons (replay() turns it
  // off for a main run that no comparison reads).
  bool record_outputs = true;
  // Compute ScenarioReport::content_hash (FNV-1a over every output and the
  // final pools: sequential, a byte at a time). replay() turns it off for the
  // comparison re-runs, whose hash nobody reads.
  bool content_hash = true;
  // The invariants to check (kvsim run --invariants LIST|none); nullopt =
  // every one. The others are reported `skipped`; a comparison nobody
  // selected does not re-run the scenario.
  std::optional<std::set<Invariant>> invariants;
  std::optional<OutputKey> capture;
};

// Replays `scenario` on `backend`. Throws ValidationError (a bad scenario
// that slipped past validation, or a fault the backend rejected) or
// BackendError; otherwise returns the report (ok = false on a failed check).
ScenarioReport replay(const Scenario& scenario, Backend& backend, const ReplayOptions& options = {});

}  // namespace kvsim::sim
