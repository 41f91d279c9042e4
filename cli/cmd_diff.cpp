// `kvsim diff [SCENARIO...] [--backends REF,CAND] [--generated N [--seed S]] [--json]`:
// two backends op by op, byte for byte (contract §7); by default the fast CPU
// backend against CUDA, `--backends reference,cpu` (or any two of
// backend_names()) pairs others. Each scenario (default: every built-in one)
// is replayed through sim::replay() on a DifferentialBackend(REF, CAND), which
// compares every pool, scale pool and output an op may write after every op;
// --generated N adds N random op sequences (every op, random geometry,
// shuffled page tables). The first difference is printed as op, step, layer,
// sequence, token, head, dim, byte offset, both values (hex and decoded) and
// the element_offset() arithmetic. Exit 0 with a summary of ops and bytes
// compared, 1 on any difference (or a backend failure), 2 when a backend is
// not available (no CUDA device) or the input is bad.
// --report DIR writes the scenarios' replay pages (docs/report.md) with the
// first difference drawn as its path (token -> slot -> page -> entry ->
// block -> element -> byte, both values).
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/differential_backend.hpp"
#include "backends/op_generator.hpp"
#include "commands.hpp"
#include "kvsim/report/report.hpp"
#include "kvsim/sim/estimate.hpp"
#include "kvsim/sim/replay.hpp"
#include "kvsim/sim/scenario_file.hpp"
#include "numbers.hpp"
#include "progress_line.hpp"

namespace kvsim::cli {
namespace {

struct DiffOptions {
  std::vector<std::string> files;
  std::optional<std::string> backends;  // "REF,CAND"; unset: cpu and KVSIM_DIFF_CANDIDATE (default cuda)
  int64_t generated = 0;
  int64_t seed = 1;
  int64_t ops_per_sequence = 24;
  int threads = 0;
  bool finite = false;
  bool json = false;
  std::optional<std::string> report_dir;
};

struct DiffRun {
  std::string name;  // scenario name, or "generated"
  std::string backends;  // "cpu against cuda"
  DiffCounters counters;
  std::optional<DiffReport> difference;
  std::string failure;  // a backend error that stopped the run
};

// The two backends of --backends (exactly two names of backend_names()).
// Without it: cpu against KVSIM_DIFF_CANDIDATE, default cuda (=cpu: the same
// comparison cpu against cpu, so the command is tested without a GPU).
struct BackendPair {
  std::string reference, candidate;
};
BackendPair backend_pair(const std::optional<std::string>& flag) {
  if (!flag) {
    const char* candidate = std::getenv("KVSIM_DIFF_CANDIDATE");
    return {"cpu", candidate ? candidate : "cuda"};
  }
  const size_t comma = flag->find(',');
  BackendPair pair;
  if (comma != std::string::npos) pair = {flag->substr(0, comma), flag->substr(comma + 1)};
  if (pair.reference.empty() || pair.candidate.empty() || pair.candidate.find(',') != std::string::npos)
    throw ValidationError(ErrorCode::bad_argument, "--backends = '" + *flag +
                                                       "': expected two backend names, REFERENCE,CANDIDATE "
                                                       "(e.g. reference,cpu)");
  return pair;
}

std::unique_ptr<DifferentialBackend> make_diff_backend(const BackendPair& pair, int threads) {
  BackendOptions options;
  options.threads = threads;  // cpu's; the reference backend is single-threaded
  std::unique_ptr<Backend> sides[2];
  const std::string* names[2] = {&pair.reference, &pair.candidate};
  for (int i = 0; i < 2; ++i) {
    try {
      sides[i] = make_backend(*names[i], options);
    } catch (const BackendUnavailable& e) {
      // docs/errors.md: a backend this build or machine cannot run is backend_unavailable, as for --backend.
      throw BackendUnavailable("kvsim diff needs the " + *names[i] + " backend: " + e.what());
    }
  }
  return std::make_unique<DifferentialBackend>(std::move(sides[0]), std::move(sides[1]));
}

nlohmann::json report_json(const DiffReport& r) {
  nlohmann::json j = {{"op", r.op},
                      {"context", r.context},
                      {"buffer", r.buffer},
                      {"dtype", std::string(dtype_name(r.dtype))},
                      {"byte_offset", r.byte_offset},
                      {"element", r.element},
                      {"reference", {{"hex", r.reference_hex}, {"value", r.reference_value}}},
                      {"candidate", {{"hex", r.candidate_hex}, {"value", r.candidate_value}}},
                      {"sequence", r.sequence},
                      {"sequence_id", r.sequence_id},
                      {"token", r.token},
                      {"token_meaning", r.token_meaning},
                      {"head", r.head},
                      {"dim", r.dim},
                      {"explain", r.explain}};
  if (r.pool_at)
    j["pool_at"] = {{"block", r.pool_at->block}, {"layer", r.pool_at->layer}, {"kv", r.pool_at->kv},
                    {"head", r.pool_at->head},   {"entry", r.pool_at->entry}, {"dim", r.pool_at->dim}};
  if (!r.tensor_index.empty()) j["tensor_index"] = r.tensor_index;
  return j;
}

// Runs `body` on a fresh DifferentialBackend and records what it found.
template <class Body>
DiffRun diff_one(const std::string& name, const BackendPair& pair, int threads, Body body) {
  DiffRun run;
  run.name = name;
  std::unique_ptr<DifferentialBackend> diff = make_diff_backend(pair, threads);
  run.backends = std::string(diff->reference().name()) + " against " + std::string(diff->candidate().name());
  try {
    body(*diff);
  } catch (const BackendError& e) {
    run.failure = e.what();
  }
  run.counters = diff->counters();
  run.difference = diff->first_difference();
  return run;
}

void run(const DiffOptions& o) {
  const BackendPair pair = backend_pair(o.backends);
  std::vector<std::string> files = o.files;
  if (files.empty() && o.generated == 0) files = sim::builtin_scenario_paths();
  if (files.empty() && o.generated == 0)
    throw ValidationError(ErrorCode::bad_argument, "no scenario given and no built-in scenarios found");
  std::vector<sim::Scenario> scenarios;
  for (const std::string& f : files) scenarios.push_back(sim::load_scenario_file(f));

  std::optional<report::ReportFolder> folder;
  if (o.report_dir) folder.emplace(*o.report_dir);
  std::vector<DiffRun> runs;
  ProgressLine progress;
  for (const sim::Scenario& s : scenarios) {
    progress.start(s.name, 1, sim::estimate_replay(s, std::nullopt, /*comparisons=*/false).token_layers);
    report::ReplayRecorder recorder;
    sim::ScenarioReport replayed;
    report::FirstDifferenceOp first_op;
    runs.push_back(diff_one(s.name, pair, o.threads, [&](DifferentialBackend& diff) {
      sim::ReplayOptions ro;
      ro.comparison_invariants = false;  // diff compares backends, not settings
      if (folder) ro.observer = &recorder;
      if (progress.on()) ro.progress = [&](const sim::RunProgress& p) { progress.update(p); };
      ro.before_op = [&](const sim::OpContext& c) {
        first_op.before_op(c, diff);
        diff.set_context("scenario " + s.name + ", step " + std::to_string(c.step) + ", layer " +
                             std::to_string(c.layer) + ", " + c.op,
                         c.sequence_ids);
      };
      replayed = sim::replay(s, diff, ro);
    }));
    if (folder) {
      std::vector<report::DrawnPath> paths;
      const DiffRun& r = runs.back();
      if (r.difference)
        paths.push_back(report::difference_path(s, recorder, *r.difference, first_op.op().step, first_op.op().layer));
      replayed.name = s.name;
      replayed.ok = !r.difference && r.failure.empty();
      folder->add(s, replayed, recorder,
                  r.difference ? "DIFFERENT" : (r.failure.empty() ? "identical" : "FAILED: " + r.failure), paths);
    }
    progress.clear();
    if (!o.json)
      std::printf("%-44s %8lld ops %14lld bytes  %s\n", s.name.c_str(),
                  static_cast<long long>(runs.back().counters.ops),
                  static_cast<long long>(runs.back().counters.bytes_compared),
                  runs.back().difference ? "DIFFERENT" : (runs.back().failure.empty() ? "identical" : "FAILED"));
  }
  if (o.generated > 0) {
    runs.push_back(diff_one("generated", pair, o.threads, [&](DifferentialBackend& diff) {
      run_generated_sequences(diff, static_cast<int>(o.generated), static_cast<uint64_t>(o.seed),
                              static_cast<int>(o.ops_per_sequence),
                              [&](const std::string& label) { diff.set_context("generated " + label); },
                              /*special_values=*/!o.finite);
    }));
    if (!o.json)
      std::printf("%-44s %8lld ops %14lld bytes  %s\n",
                  ("generated (" + std::to_string(o.generated) + " sequences, seed " + std::to_string(o.seed) + ")")
                      .c_str(),
                  static_cast<long long>(runs.back().counters.ops),
                  static_cast<long long>(runs.back().counters.bytes_compared),
                  runs.back().difference ? "DIFFERENT" : (runs.back().failure.empty() ? "identical" : "FAILED"));
  }

  if (folder) folder->write_index("kvsim diff");
  int64_t ops = 0, bytes = 0;
  const DiffRun* first_bad = nullptr;
  for (const DiffRun& r : runs) {
    ops += r.counters.ops;
    bytes += r.counters.bytes_compared;
    if (!first_bad && (r.difference || !r.failure.empty())) first_bad = &r;
  }
  if (o.json) {
    nlohmann::json list = nlohmann::json::array();
    for (const DiffRun& r : runs) {
      nlohmann::json j = {{"name", r.name},
                          {"ops", r.counters.ops},
                          {"bytes_compared", r.counters.bytes_compared},
                          {"identical", !r.difference && r.failure.empty()}};
      j["first_difference"] = r.difference ? report_json(*r.difference) : nlohmann::json(nullptr);
      if (!r.failure.empty()) j["failure"] = r.failure;
      list.push_back(j);
    }
    std::cout << nlohmann::json{{"runs", list}, {"ops", ops}, {"bytes_compared", bytes}, {"ok", first_bad == nullptr}}
                     .dump(2)
              << '\n';
  } else {
    std::printf("\n%zu run(s), %s: %lld ops, %lld bytes compared, %s\n", runs.size(), runs.front().backends.c_str(),
                static_cast<long long>(ops), static_cast<long long>(bytes),
                first_bad ? "DIFFERENCES FOUND" : "0 bytes differ");
    if (first_bad) {
      if (first_bad->difference) std::printf("%s: %s\n", first_bad->name.c_str(), first_bad->difference->text().c_str());
      if (!first_bad->failure.empty()) std::printf("%s: backend failure: %s\n", first_bad->name.c_str(), first_bad->failure.c_str());
    }
  }
  if (first_bad) throw ExitStatus{kExitCheckFailed};
}

}  // namespace

void register_diff(CLI::App& app) {
  auto opts = std::make_shared<DiffOptions>();
  CLI::App* cmd = app.add_subcommand("diff", "Replay scenarios on two backends (default cpu and cuda) and compare every op's bytes");
  cmd->add_option("scenarios", opts->files, "Scenario files (default: every built-in scenario, unless --generated)");
  cmd->add_option("--backends", opts->backends,
                  "The two backends compared, REFERENCE,CANDIDATE: any two of " + [] {
                    std::string names;
                    for (const std::string& n : backend_names()) names += (names.empty() ? "" : ", ") + n;
                    return names;
                  }() + " (default cpu,cuda)");
  add_int_option(*cmd, "--generated", opts->generated, "Also run N randomly generated op sequences", 0, 1000000);
  add_int_option(*cmd, "--seed", opts->seed, "Seed of the generated sequences", 0, INT64_MAX);
  add_int_option(*cmd, "--ops-per-sequence", opts->ops_per_sequence, "Ops in each generated sequence", 1, 100000);
  cmd->add_flag("--finite", opts->finite,
                "Generated inputs and pools hold finite values only (default: NaN payloads and Inf too)");
  add_int_option(*cmd, "--threads", opts->threads,
                 "oneTBB threads for a cpu side, 1.." + std::to_string(machine_threads()) + " (default all cores)", 1,
                 machine_threads());
  cmd->add_flag("--json", opts->json, "Print one JSON object: runs, ops, bytes_compared, first_difference, ok");
  cmd->add_option("--report", opts->report_dir,
                  "Write the scenarios' replay pages into DIR with the first difference drawn as its path "
                  "(docs/report.md)");
  cmd->callback([opts] { run(*opts); });
}

}  // namespace kvsim::cli
