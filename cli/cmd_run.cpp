// `kvsim run [SCENARIO...] [--backend B] [--threads N] [--json] [--details] [--dump DIR] [--report DIR]`:
// replays scenario files (default: every built-in scenario) on a backend
// through sim::replay() and reports each one's counters and invariants.
// Exit 0 when every invariant held (or caught its fault) and every
// expectation was met, 1 otherwise, 2 for bad input (a malformed file, a bad
// flag). docs/run.md documents the table and the --json object.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/backend.hpp"
#include "commands.hpp"
#include "kvsim/sim/estimate.hpp"
#include "kvsim/report/report.hpp"
#include "kvsim/sim/replay.hpp"
#include "kvsim/sim/scenario_file.hpp"
#include "numbers.hpp"
#include "progress_line.hpp"
#include "trace_options.hpp"

namespace kvsim::cli {
namespace {

struct RunOptions {
  std::vector<std::string> files;
  std::string backend = "cpu";
  int threads = 0;
  bool json = false;
  bool details = false;
  std::string dump_dir;
  bool force = false;  // --force: --dump may write into a folder that holds files
  TraceFileOptions trace;  // --trace FILE: a window of a request trace as one more scenario
  TraceScenarioOptions trace_scenario;
  std::string invariants;  // --invariants LIST|none; "" = every invariant
  std::optional<std::string> report_dir;
  bool list_invariants = false;
};


std::string invariants_cell(const sim::ScenarioReport& r) {
  int passed = 0, applicable = 0, caught = 0, failed = 0, skipped = 0;
  for (const sim::InvariantReport& i : r.invariants) {
    skipped += i.status == sim::InvariantStatus::skipped;
    if (i.status == sim::InvariantStatus::not_applicable || i.status == sim::InvariantStatus::skipped) continue;
    ++applicable;
    passed += i.status == sim::InvariantStatus::pass;
    caught += i.status == sim::InvariantStatus::caught;
    failed += i.status == sim::InvariantStatus::fail;
  }
  std::string s = std::to_string(passed) + "/" + std::to_string(applicable) + " pass";
  if (caught) s += ", " + std::to_string(caught) + " caught";
  if (failed) s += ", " + std::to_string(failed) + " FAIL";
  if (skipped) s += ", " + std::to_string(skipped) + " skipped";
  return s;
}

// --json's "failures" of one scenario: every failed invariant with its
// message, every missed expectation with what was expected and what came.
nlohmann::json failures_json(const sim::ScenarioReport& r) {
  nlohmann::json out = nlohmann::json::array();
  for (const sim::InvariantReport& i : r.invariants)
    if (i.status == sim::InvariantStatus::fail)
      out.push_back({{"kind", "invariant"}, {"invariant", std::string(sim::invariant_name(i.invariant))},
                     {"message", i.detail}});
  auto value = [](const std::variant<int64_t, std::string>& v) {
    return std::holds_alternative<int64_t>(v) ? nlohmann::json(std::get<int64_t>(v)) : nlohmann::json(std::get<std::string>(v));
  };
  for (size_t k = 0; k < r.expectation_details.size(); ++k) {
    const sim::ExpectationFailure& f = r.expectation_details[k];
    nlohmann::json j{{"kind", f.expectation == "max_steps" ? "max_steps" : "expectation"},
                     {"expectation", f.expectation},
                     {"expected", value(f.expected)},
                     {"got", value(f.got)},
                     {"message", r.expectation_failures[k]}};
    if (!f.subject.empty()) j["subject"] = f.subject;
    out.push_back(j);
  }
  return out;
}

// --dump DIR: the folder of each scenario (DIR itself for one, DIR/NAME for
// several, DIR/NAME-2, -3, ... when names repeat: two files of one name in
// different folders), checked before anything runs: DIR must be empty or
// absent unless --force (dump_not_empty, exit 2).
std::vector<std::string> dump_folders(const RunOptions& o, const std::vector<sim::Scenario>& scenarios) {
  std::vector<std::string> dirs(scenarios.size());
  if (o.dump_dir.empty()) return dirs;
  std::error_code ec;
  const bool exists = std::filesystem::exists(o.dump_dir, ec);
  if (exists && !o.force && !std::filesystem::is_empty(o.dump_dir, ec)) {
    std::cout.flush();
    std::cerr << "kvsim: error: dump_not_empty: --dump " << o.dump_dir
              << ": the folder already holds files (a dump mixed with an older one is neither); give an empty or new "
                 "folder, or --force to write into it\n";
    throw ExitStatus{kExitUsage};
  }
  if (scenarios.size() == 1) return {o.dump_dir};
  std::set<std::string> used;
  for (size_t i = 0; i < scenarios.size(); ++i) {
    std::string name = scenarios[i].name;
    for (int n = 2; !used.insert(name).second; ++n) name = scenarios[i].name + "-" + std::to_string(n);
    dirs[i] = o.dump_dir + "/" + name;
  }
  return dirs;
}

void run(const RunOptions& o) {
  if (o.list_invariants) {
    std::fputs(sim::describe_invariant_table().c_str(), stdout);
    return;
  }
  const std::optional<std::set<sim::Invariant>> selected =
      o.invariants.empty() ? std::nullopt : parse_invariant_list(o.invariants);
  const bool traced = !o.trace.path.empty();
  std::vector<std::string> files = o.files.empty() && !traced ? sim::builtin_scenario_paths() : o.files;
  if (files.empty() && !traced)
    throw ValidationError(ErrorCode::bad_argument, "no scenario given and no built-in scenarios found");
  // Every file is checked before anything runs: a bad one is bad input (exit 2).
  std::vector<sim::Scenario> scenarios;
  for (const std::string& f : files) scenarios.push_back(sim::load_scenario_file(f));
  if (traced) {  // docs/traces.md: the same text `kvsim trace import` writes
    const workload::Trace t = load_trace_file(o.trace);
    scenarios.push_back(
        sim::parse_scenario(trace_scenario_toml(t, o.trace_scenario), trace_scenario_name(t, o.trace_scenario) + ".toml"));
  }
  BackendOptions bo;
  bo.threads = o.threads;
  std::unique_ptr<Backend> backend = make_backend(o.backend, bo);
  // Every scenario must fit the backend before the first one allocates (exit 2, insufficient_memory).
  std::vector<sim::ReplayEstimate> estimates;
  for (const sim::Scenario& s : scenarios) {
    estimates.push_back(sim::estimate_replay(s, selected));
    sim::check_fits(s, estimates.back(), *backend);
  }
  const std::vector<std::string> dump_dirs = dump_folders(o, scenarios);
  ProgressLine progress;
  std::optional<report::ReportFolder> folder;
  if (o.report_dir) folder.emplace(*o.report_dir);

  std::vector<sim::ScenarioReport> reports;
  for (size_t i = 0; i < scenarios.size(); ++i) {
    const sim::Scenario& s = scenarios[i];
    sim::ReplayOptions ro;
    ro.invariants = selected;
    ro.content_hash = false;  // kvsim run prints no content hash (the golden tests and Python read it)
    ro.threads = o.threads;   // the whole replay on N threads, its checks too (0: all cores)
    report::ReplayRecorder recorder;
    if (folder) ro.observer = &recorder;
    ro.dump_dir = dump_dirs[i];
    progress.start(s.name, estimates[i].runs, estimates[i].token_layers);
    if (progress.on()) ro.progress = [&](const sim::RunProgress& p) { progress.update(p); };
    reports.push_back(sim::replay(s, *backend, ro));
    if (folder) folder->add(s, reports.back(), recorder, invariants_cell(reports.back()));
    progress.clear();
  }

  bool all_ok = true;
  for (const auto& r : reports) all_ok = all_ok && r.ok;
  if (folder) folder->write_index("kvsim run on " + std::string(backend->name()));
  if (o.json) {
    nlohmann::json list = nlohmann::json::array();
    for (const sim::ScenarioReport& r : reports) {
      nlohmann::json inv = nlohmann::json::object();
      for (const sim::InvariantReport& i : r.invariants)
        if (i.status != sim::InvariantStatus::not_applicable)
          inv[std::string(sim::invariant_name(i.invariant))] = std::string(sim::invariant_status_name(i.status));
      nlohmann::json entry{{"name", r.name}, {"invariants", inv}, {"ok", r.ok}, {"failures", failures_json(r)}};
      for (const sim::CounterField& c : sim::kReportedCounters) entry[std::string(c.name)] = r.counters.*c.value;
      list.push_back(entry);
    }
    std::cout << nlohmann::json{{"scenarios", list}, {"ok", all_ok}}.dump(2) << '\n';
  } else {
    std::printf("%-40s %6s %8s %7s %7s %6s %6s %6s %6s  %s\n", "scenario", "steps", "prefill", "decode", "reused",
                "evict", "offld", "onbrd", "preem", "invariants");
    for (const sim::ScenarioReport& r : reports)
      std::printf("%-40s %6lld %8lld %7lld %7lld %6lld %6lld %6lld %6lld  %s%s\n", r.name.c_str(),
                  static_cast<long long>(r.counters.steps), static_cast<long long>(r.counters.prefill_tokens),
                  static_cast<long long>(r.counters.decode_tokens), static_cast<long long>(r.counters.reuse_hit_tokens),
                  static_cast<long long>(r.counters.evicted_blocks), static_cast<long long>(r.counters.offloaded_blocks),
                  static_cast<long long>(r.counters.onboarded_blocks), static_cast<long long>(r.counters.preemptions),
                  invariants_cell(r).c_str(), r.ok ? "" : "  NOT OK");
    double main_s = 0, total_s = 0;
    int64_t token_layers = 0;
    size_t at_once = 0;
    for (const sim::ScenarioReport& r : reports) {
      main_s += r.main_seconds;
      total_s += r.total_seconds;
      token_layers += r.counters.token_layers;
      at_once += r.concurrent_runs > 1;
    }
    // Where a scenario's comparison runs ran beside its own run, the rest is not all theirs.
    const std::string rest = at_once == 0 ? "the rest re-running them for the comparison invariants"
                                          : "for " + std::to_string(at_once) + " of them, the comparison runs " +
                                                "ran at the same time on other threads";
    std::printf("\n%zu scenarios on %s: %s; %.2f s in all (%.2f s replaying the scenarios, %s); replay throughput "
                "%.3g token-layers/s\n",
                reports.size(), std::string(backend->name()).c_str(), all_ok ? "all ok" : "FAILURES", total_s, main_s,
                rest.c_str(), main_s > 0 ? static_cast<double>(token_layers) / main_s : 0.0);
  }
  // What failed, and why (stderr under --json, so stdout stays one JSON object);
  // with --details, every checked invariant's finding.
  std::FILE* detail = o.json ? stderr : stdout;
  if (o.details)
    for (const sim::ScenarioReport& r : reports)
      for (const sim::InvariantReport& i : r.invariants)
        if (i.status != sim::InvariantStatus::not_applicable)
          std::fprintf(detail, "%s: %s %s: %s\n", r.name.c_str(), std::string(sim::invariant_name(i.invariant)).c_str(),
                       std::string(sim::invariant_status_name(i.status)).c_str(), i.detail.c_str());
  for (const sim::ScenarioReport& r : reports) {
    if (r.ok) continue;
    for (const sim::InvariantReport& i : r.invariants)
      if (i.status == sim::InvariantStatus::fail && !o.details)
        std::fprintf(detail, "%s: invariant %s failed: %s\n", r.name.c_str(),
                     std::string(sim::invariant_name(i.invariant)).c_str(), i.detail.c_str());
    for (const std::string& e : r.expectation_failures) std::fprintf(detail, "%s: %s\n", r.name.c_str(), e.c_str());
  }
  if (!all_ok) throw ExitStatus{kExitCheckFailed};
}

}  // namespace

// commands.hpp
std::optional<std::set<sim::Invariant>> parse_invariant_list(const std::string& text) {
  std::set<sim::Invariant> out;
  if (text == "none") return out;
  std::string names;
  for (std::string_view name : sim::invariant_names()) names += (names.empty() ? "" : ", ") + std::string(name);
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string name = text.substr(at, comma - at);
    const auto inv = sim::parse_invariant(name);
    if (!inv)
      fail(ErrorCode::bad_argument, "--invariants = '" + text + "': " +
                                        (name.empty() ? std::string("empty name") : "unknown invariant '" + name + "'") +
                                        ": expected none or a comma-separated list of " + names);
    out.insert(*inv);
    at = comma + 1;
  }
  return out;
}

void register_run(CLI::App& app) {
  auto opts = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "Replay scenario files on a backend and check their invariants");
  cmd->add_option("scenarios", opts->files, "Scenario files (default: every scenario in scenarios/)");
  cmd->add_option("--backend", opts->backend, "Backend: " + [] {
    std::string names;
    for (const std::string& n : backend_names()) names += (names.empty() ? "" : ", ") + n;
    return names;
  }() + " (default cpu)");
  add_int_option(*cmd, "--threads", opts->threads,
                 "oneTBB threads of the replay (the cpu backend's ops and its own checks), 1.." +
                     std::to_string(machine_threads()) + " (default all cores)",
                 1,
                 machine_threads());
  cmd->add_flag("--json", opts->json, "Print one JSON object (docs/run.md)");
  cmd->add_flag("--details", opts->details,
                "Also print what each checked invariant compared, its bound and its worst case");
  cmd->add_option("--dump", opts->dump_dir,
                  "Write pools, scale pools, every write and attention op's inputs, tables and scales and the "
                  "attention outputs as .npy files plus manifest.json to DIR "
                  "(DIR/SCENARIO/ for several scenarios, DIR/SCENARIO-2/ for a repeated name); DIR must be empty or new");
  cmd->add_flag("--force", opts->force, "With --dump: write into DIR even if it holds files");
  add_trace_file_options(*cmd, opts->trace, /*positional=*/false);
  add_trace_scenario_options(*cmd, opts->trace_scenario);
  cmd->add_option("--invariants", opts->invariants,
                  "Check only these invariants (comma-separated names, or none); default every invariant");
  cmd->add_flag("--list-invariants", opts->list_invariants,
                "Print every invariant (what it checks, where, the test that shows it, the faults it catches) and exit");
  cmd->add_option("--report", opts->report_dir,
                  "Write an HTML report per scenario (pools, page tables, window, prefix tree, timeline, invariants; "
                  "docs/report.md) plus index.html into DIR");
  cmd->callback([opts, cmd] {
    if (cmd->count("--invariants") && opts->invariants.empty())
      fail(ErrorCode::bad_argument, "--invariants = '': empty value: expected none or a comma-separated list of invariants");
    if (opts->list_invariants) {  // the table only: anything else given would be silently ignored
      std::string extra = opts->files.empty() ? "" : "'" + printable(opts->files.front()) + "'";
      for (const CLI::Option* o : cmd->get_options())
        if (o->count() > 0 && !o->get_lnames().empty() && o->get_lnames().front() != "list-invariants" && extra.empty())
          extra = "--" + o->get_lnames().front();
      if (!extra.empty())
        fail(ErrorCode::bad_argument, "--list-invariants prints the table and takes no scenario files or other flags, got " + extra);
    }
    if (cmd->count("--dump") && opts->dump_dir.empty())
      fail(ErrorCode::bad_argument, "--dump = '': empty value: expected a folder to write the .npy files into");
    run(*opts);
  });
}

}  // namespace kvsim::cli
