// kvsim bench: the throughput of every op (contract §8, issue 8) on a backend,
// quoted against the copy bandwidth measured in the same run (and, for rows
// that count FLOPs, against the same run's fma_throughput row), every row's
// output checked against the CPU oracle. The configurations, fixtures, timing
// and checks live in bench/ (kvsim::bench); this file parses options, runs
// the suite and prints the table or JSON. Speed is measured here, never
// asserted in tests.
//
//   kvsim bench                         cpu, the small suite, thread counts 1, 2, 4, ..., all
//   kvsim bench --backend cuda          the full suite (GPU-filling sizes)
//   kvsim bench --list --json           the configurations, for bench/pytorch_baseline.py --cases
//   kvsim bench --baseline torch.json   adds PyTorch's time per row and kvsim's speed-up over it
//   kvsim bench --scenario FILE ...     real-size rows: one replay each, wall time, token-layers/s and
//                                       its split into kernels and host work (docs/benchmarks.md)
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "backends/backend.hpp"
#include "backends/cpu/cpu_isa.hpp"
#include "commands.hpp"
#include "kvsim/sim/estimate.hpp"
#include "kvsim/bench/bench.hpp"
#include "kvsim/sim/scenario_file.hpp"
#include "numbers.hpp"

namespace kvsim::cli {
namespace {

struct BenchOptions {
  std::string backend = "cpu";
  std::string suite;  // "" = small on cpu (or with --sequences / --tokens), full on cuda
  std::vector<int> threads;
  int sequences = 16;
  int tokens = 1024;
  double min_seconds = 0.3;
  std::vector<std::string> only;
  std::string baseline;
  std::string output;  // also write the JSON report here
  std::vector<std::string> scenarios;  // --scenario FILE: real-size rows instead of the op suite
  std::string invariants;              // --invariants for those rows; "" = every invariant
  bool list = false;
  bool json = false;
  bool sizes_given = false;
  bool baseline_given = false;
  bool output_given = false;
};

// Bytes the largest fixture of the small suite holds at once on the backend
// and on the oracle (pools, inputs and their host copies, outputs, the copy
// buffers), so sizes beyond memory fail before anything runs.
double small_suite_bytes(const BenchOptions& o) {
  const double P = 16, row = 8 * 128, hq_row = 32 * row;  // kv_heads 8, head_dim 128, GQA 32:8
  const double nnz = static_cast<double>(o.sequences) * o.tokens;
  const double pool = (o.sequences * std::ceil(o.tokens / P) + 8) * 2 * P * row * 2;
  const double qkv = nnz * (hq_row + 2 * row) * 2 + nnz * hq_row * 2;  // fused input, Q out
  const double largest = std::max({pool + 2 * nnz * row * 2, pool + qkv, 3 * pool});
  return 3.0 * largest + 512.0 * (1 << 20);
}

double available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (meminfo >> key >> kib)
    if (key == "MemAvailable:") return kib * 1024.0;
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
}

bool selected(const bench::Case& c, const std::vector<std::string>& only) {
  if (only.empty()) return true;
  const std::string name = c.name();
  return std::any_of(only.begin(), only.end(), [&](const std::string& s) { return name.find(s) != std::string::npos; });
}

// PyTorch's seconds per configuration name, from bench/pytorch_baseline.py --json.
struct Baseline {
  std::map<std::string, double> seconds;
  nlohmann::json about;
};
Baseline load_baseline(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(ErrorCode::bad_argument, "--baseline " + path + ": cannot open");
  Baseline b;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    for (const auto& row : j.at("rows")) {
      if (!row.contains("case") || !row.contains("seconds")) continue;  // a skipped configuration
      const std::string name = row["case"].get<std::string>();
      const double seconds = row["seconds"].get<double>();
      if (!std::isfinite(seconds) || seconds <= 0)
        fail(ErrorCode::bad_argument, "--baseline " + path + ": row '" + name + "' has seconds = " +
                                          std::to_string(seconds) + ": expected a finite time > 0");
      b.seconds[name] = seconds;
    }
    b.about = {{"device", j.value("device", "")}, {"torch", j.value("torch", "")},
               {"copy_gb_per_s", j.value("copy_gbs", 0.0)}};
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorCode::bad_argument, "--baseline " + path + ": not a pytorch_baseline.py --json report (" + e.what() + ")");
  }
  return b;
}

// The JSON report: on stdout with --json, and into --output's file when given.
void print_report(const BenchOptions& o, const nlohmann::json& out, std::ofstream& report) {
  if (o.json) std::cout << out.dump(2) << '\n';
  if (!report.is_open()) return;
  report << out.dump(2) << '\n';
  report.flush();
  if (!report) fail(ErrorCode::bad_argument, "--output " + o.output + ": cannot write the report");
}

// The real-size rows: one replay per scenario file and thread count, every
// part of its wall time (sim::ReplayTimings) printed and in the JSON.
void run_scenario_rows(const BenchOptions& o) {
  if (o.list || !o.only.empty() || o.baseline_given || o.sizes_given || !o.suite.empty())
    fail(ErrorCode::bad_argument, "--scenario replays scenario files; --list, --only, --baseline, --suite, --sequences "
                                  "and --tokens choose op rows and do not go with it");
  const std::optional<std::set<sim::Invariant>> selected =
      o.invariants.empty() ? std::nullopt : parse_invariant_list(o.invariants);
  std::vector<sim::Scenario> scenarios;
  for (const std::string& f : o.scenarios) scenarios.push_back(sim::load_scenario_file(f));  // all checked first
  std::ofstream report;
  if (!o.output.empty()) {
    report.open(o.output);
    if (!report) fail(ErrorCode::bad_argument, "--output " + o.output + ": cannot write the report");
  }
  const std::vector<int> threads = o.threads.empty() ? std::vector<int>{machine_threads()} : o.threads;
  make_backend(o.backend);  // backend_unavailable before any output
  nlohmann::json out = {{"backend", o.backend},
                        {"method", "one replay per row with the backend's kernel timing on; wall time on the host "
                                   "clock, each instant charged to one part (sim::ReplayTimings); peak RSS from "
                                   "getrusage after the row (the process's peak so far)"},
                        {"results", nlohmann::json::array()}};
  if (o.invariants.size()) out["invariants"] = o.invariants;
  int failed = 0;
  if (!o.json)
    std::cout << "scenario                                 thr  runs  token-layers    wall s  token-layers/s  kernels s  "
                 "host s  host%  peak RSS  invariants\n";
  for (int t : threads)
    for (const sim::Scenario& s : scenarios) {
      auto be = make_backend(o.backend, BackendOptions{t});
      sim::ReplayOptions base;
      base.threads = t;  // the replay's host work on t threads too, not only the cpu backend's ops
      const bench::ScenarioMeasurement m = bench::measure_scenario(*be, s, selected, base);
      const sim::ScenarioReport& r = m.report;
      const sim::ReplayTimings& tm = r.timings;
      const int64_t runs = sim::estimate_replay(s, selected).runs;  // its own run and the comparison re-runs
      std::string verdict;
      int pass = 0, checked = 0;
      for (const sim::InvariantReport& i : r.invariants) {
        if (i.status == sim::InvariantStatus::not_applicable || i.status == sim::InvariantStatus::skipped) continue;
        ++checked;
        pass += i.status == sim::InvariantStatus::pass || i.status == sim::InvariantStatus::caught;
      }
      verdict = std::to_string(pass) + "/" + std::to_string(checked) + (r.ok ? " ok" : " NOT OK");
      failed += !r.ok;
      const double all_token_layers = m.estimated_token_layers;
      nlohmann::json row = {{"op", "scenario_replay_real"},
                            {"scenario", s.name},
                            {"threads", t},
                            {"runs", runs},
                            {"token_layers_main", r.counters.token_layers},
                            {"token_layers_estimated_all_runs", all_token_layers},
                            {"attention_flops_estimated", m.estimated_flops},
                            {"wall_seconds", r.total_seconds},
                            {"main_run_seconds", r.main_seconds},
                            {"token_layers_per_s", all_token_layers / r.total_seconds},
                            {"max_rss_bytes", m.max_rss_bytes},
                            {"ok", r.ok},
                            {"seconds", {{"kernels", tm.kernels},
                                         {"op_host", tm.op_host},
                                         {"inputs", tm.inputs},
                                         {"transfers", tm.transfers},
                                         {"scheduling", tm.scheduling},
                                         {"recording", tm.recording},
                                         {"dense", tm.dense},
                                         {"checks", tm.checks},
                                         {"comparisons", tm.comparisons},
                                         {"other", tm.other}}},
                            {"transfer_bytes", tm.transfer_bytes},
                            {"host_fraction", tm.host() / tm.total()}};
      out["results"].push_back(row);
      if (!o.json) {
        char line[400];
        std::snprintf(line, sizeof line, "%-40s %3d %5lld %13.4g %9.2f %15.4g %10.2f %7.2f %5.1f%% %9s  %s\n",
                      s.name.c_str(), t, static_cast<long long>(runs), all_token_layers, r.total_seconds,
                      all_token_layers / r.total_seconds, tm.kernels, tm.host(), 100.0 * tm.host() / tm.total(),
                      sim::format_bytes(m.max_rss_bytes).c_str(), verdict.c_str());
        std::cout << line;
        std::snprintf(line, sizeof line,
                      "    host s: op calls %.2f, inputs %.2f, transfers %.2f (%s), scheduling %.2f, recording %.2f, "
                      "dense %.2f, checks %.2f, comparisons %.2f, other %.2f\n",
                      tm.op_host, tm.inputs, tm.transfers,
                      sim::format_bytes(static_cast<int64_t>(tm.transfer_bytes)).c_str(), tm.scheduling, tm.recording,
                      tm.dense, tm.checks, tm.comparisons, tm.other);
        std::cout << line << std::flush;
      }
    }
  print_report(o, out, report);
  if (failed > 0) {
    std::cerr << "kvsim: error: " << failed << " scenario row(s) failed an invariant or an expectation\n";
    std::exit(1);
  }
}

void run_bench(BenchOptions o) {
  if (!o.scenarios.empty()) return run_scenario_rows(o);
  if (!o.invariants.empty()) fail(ErrorCode::bad_argument, "--invariants chooses what --scenario rows check");
  for (const std::string& text : o.only)
    if (text.empty()) fail(ErrorCode::bad_argument, "--only = '': empty text: expected part of a configuration name");
  if (o.baseline_given && o.baseline.empty()) fail(ErrorCode::bad_argument, "--baseline = '': empty path");
  if (o.output_given && o.output.empty()) fail(ErrorCode::bad_argument, "--output = '': empty path");
  // The report file is opened before anything runs, so an unwritable path
  // fails with nothing on stdout.
  std::ofstream report;
  if (!o.output.empty()) {
    report.open(o.output);
    if (!report) fail(ErrorCode::bad_argument, "--output " + o.output + ": cannot write the report");
  }
  if (o.suite.empty()) o.suite = (o.backend == "cuda" && !o.sizes_given) ? "full" : "small";
  if (o.suite == "full" && o.sizes_given)
    fail(ErrorCode::bad_argument, "--sequences / --tokens size the small suite; --suite full has fixed sizes");
  bench::SuiteOptions so;
  so.suite = o.suite == "full" ? bench::Suite::full : bench::Suite::small;
  so.sequences = o.sequences;
  so.tokens = o.tokens;
  if (so.suite == bench::Suite::small) {
    const double needed = small_suite_bytes(o), available = available_memory_bytes();
    if (needed > available) {
      char text[200];
      std::snprintf(text, sizeof text, "needs about %.0f bytes (%.1f GiB) but %.0f bytes (%.1f GiB) are available",
                    needed, needed / (1u << 30), available, available / (1u << 30));
      fail(ErrorCode::bad_argument, "--sequences " + std::to_string(o.sequences) + " x --tokens " +
                                        std::to_string(o.tokens) + ": the benchmark " + text);
    }
  }
  std::vector<bench::Case> cases;
  for (bench::Case& c : bench::make_suite(so))
    if (selected(c, o.only)) cases.push_back(std::move(c));
  if (cases.empty()) fail(ErrorCode::bad_argument, "--only matches no configuration (kvsim bench --list shows them)");

  if (o.list) {
    nlohmann::json out = {{"suite", o.suite}, {"cases", nlohmann::json::array()}};
    for (const bench::Case& c : cases)
      out["cases"].push_back({{"name", c.name()}, {"op", c.op}, {"config", c.config}, {"params", c.params},
                              {"bytes", c.bytes}});
    if (o.json) {
      std::cout << out.dump(1) << '\n';
    } else {
      for (const bench::Case& c : cases) std::cout << c.name() << '\n';
    }
    return;
  }
  const Baseline baseline = o.baseline.empty() ? Baseline{} : load_baseline(o.baseline);

  std::vector<int> threads = o.threads;
  if (threads.empty()) {
    if (o.backend == "cpu") {
      const int max_threads = machine_threads();
      for (int t = 1; t < max_threads; t *= 2) threads.push_back(t);
      threads.push_back(max_threads);
    } else {
      threads.push_back(machine_threads());  // a device backend's host threads (validation only)
    }
  }
  make_backend(o.backend);  // fails here, before any output, when the backend is not available
  auto oracle = make_backend("cpu", BackendOptions{machine_threads()});

  bench::TimingOptions timing;
  timing.min_seconds = o.min_seconds;
  nlohmann::json out;
  out["backend"] = o.backend;
  out["suite"] = o.suite;
  out["method"] = "median over launches after 3 warm-up launches; kernel time from the backend (CUDA events around "
                  "the op's kernels on cuda, the host clock around the op's work on cpu); op time = the whole call "
                  "(validation, uploads, kernels, synchronize); copy = a same-run copy of 1 GiB (cuda) or 256 MiB (cpu), "
                  "bytes read + written";
  if (!baseline.seconds.empty()) out["baseline"] = baseline.about;
  out["results"] = nlohmann::json::array();
  // The CPU backend's instruction set (the oracle's too): chosen at run time,
  // KVSIM_CPU_ISA forces a lower one; every ISA gives the same bytes.
  const char* cpu_isa = cpu_isa_name(selected_cpu_isa());
  out["cpu_isa"] = cpu_isa;
  int differing = 0;
  if (!o.json)
    std::cout << "cpu isa: " << cpu_isa << " (widest this CPU runs: " << cpu_isa_name(best_cpu_isa())
              << "; KVSIM_CPU_ISA=portable|avx2|avx512 forces one)\n";
  if (!o.json)
    std::cout << "op                   config                                     thr  kernel ms     op ms      GB/s "
                 " %copy  oracle  vs torch\n";
  for (int t : threads) {
    auto be = make_backend(o.backend, BackendOptions{t});
    const double copy = bench::copy_bandwidth(*be, o.backend == "cuda" ? (size_t{1} << 30) : (size_t{256} << 20), timing);
    if (!o.json) {
      char line[160];
      std::snprintf(line, sizeof line, "copy                 %-42s %3d  (%.1f GB/s, the 100%% of this run)\n",
                    o.backend == "cuda" ? "device to device, 1 GiB" : "memcpy, 256 MiB", t, copy);
      std::cout << line << std::flush;
    }
    double fma_gflops = 0;  // this thread count's fma_throughput row, once measured
    for (const bench::Case& c : cases) {
      nlohmann::json row = {{"op", c.op}, {"config", c.config}, {"name", c.name()}, {"params", c.params},
                            {"threads", t}, {"bytes", c.bytes}, {"copy_gb_per_s", copy}};
      std::unique_ptr<bench::Fixture> f;
      bench::Measurement m;
      bench::CheckResult check;
      std::string error;
      try {
        // The row's host work on t threads too (scenario_replay's digests, inputs and checks), not
        // only the cpu backend's ops: the thread column is the whole row's.
        tbb::task_arena arena(t);
        arena.execute([&] {
          f = c.prepare(*be);
          m = bench::measure(*be, *f, timing);
        });
        check = f->check(*oracle);
      } catch (const BackendError& e) {
        error = e.what();
      }
      f.reset();
      if (!error.empty()) {
        row["error"] = error;
        ++differing;
        if (!o.json) std::cout << c.op << " " << c.config << ": not run: " << error << '\n';
        out["results"].push_back(row);
        continue;
      }
      row["launches"] = m.launches;
      row["kernel_seconds"] = m.kernel_seconds;
      row["op_seconds"] = m.op_seconds;
      row["oracle"] = {{"bytes_compared", check.bytes_compared}, {"bytes_differing", check.bytes_differing},
                       {"ok", check.ok()}};
      if (!check.first_difference.empty()) row["oracle"]["first_difference"] = check.first_difference;
      double gbs = 0;
      if (check.ok()) {  // a row that differs from the oracle reports no speed
        gbs = c.bytes / m.kernel_seconds / 1e9;
        row["gb_per_s"] = gbs;
        row["fraction_of_copy"] = gbs / copy;
        row["items_per_s"] = c.items / m.kernel_seconds;
        if (c.flops > 0) {
          row["flops"] = c.flops;
          row["gflop_per_s"] = c.flops / m.kernel_seconds / 1e9;
          if (c.op == "fma_throughput") fma_gflops = row["gflop_per_s"].get<double>();
          if (fma_gflops > 0) row["fraction_of_fma"] = row["gflop_per_s"].get<double>() / fma_gflops;
        }
      } else {
        ++differing;
      }
      const auto torch = baseline.seconds.find(c.name());
      if (torch != baseline.seconds.end() && check.ok()) {
        row["torch_seconds"] = torch->second;
        row["speedup_over_torch"] = torch->second / m.kernel_seconds;
      }
      out["results"].push_back(row);
      if (!o.json) {
        char line[320];
        const std::string verdict = check.ok() ? "same" : "DIFFERS";
        char speed[40] = "-", ratio[16] = "-", vs[24] = "";
        if (check.ok()) {
          std::snprintf(speed, sizeof speed, "%9.1f", gbs);
          std::snprintf(ratio, sizeof ratio, "%5.1f%%", 100.0 * gbs / copy);
        }
        if (row.contains("speedup_over_torch"))
          std::snprintf(vs, sizeof vs, "%7.2fx", row["speedup_over_torch"].get<double>());
        std::snprintf(line, sizeof line, "%-20s %-42s %3d %10.4f %9.4f %9s %6s  %-7s %s\n", c.op.c_str(),
                      c.config.c_str(), t, m.kernel_seconds * 1e3, m.op_seconds * 1e3, speed, ratio, verdict.c_str(), vs);
        std::cout << line << std::flush;
        if (row.contains("gflop_per_s")) {
          std::snprintf(line, sizeof line, "    %.1f GFLOP/s", row["gflop_per_s"].get<double>());
          std::cout << line;
          if (row.contains("fraction_of_fma") && c.op != "fma_throughput") {
            std::snprintf(line, sizeof line, ", %.1f%% of this run's fma_throughput", 100.0 * row["fraction_of_fma"].get<double>());
            std::cout << line;
          }
          std::cout << '\n' << std::flush;
        }
        if (!check.ok()) std::cout << "    first difference: " << check.first_difference << '\n';
      }
    }
  }
  print_report(o, out, report);
  if (differing > 0) {
    std::cerr << "kvsim: error: " << differing
              << " configuration(s) differ from the CPU oracle or did not run; their speed is not reported\n";
    std::exit(1);
  }
}

}  // namespace

void register_bench(CLI::App& app) {
  auto opts = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Measure every op: kernel and op time, GB/s, % of the same run's copy bandwidth, checked against the "
               "CPU oracle");
  cmd->add_option("--backend", opts->backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--suite", opts->suite,
                  "small: one configuration per op at --sequences x --tokens (cpu default); full: issue 8's "
                  "GPU-filling configurations (cuda default)")
      ->check(CLI::IsMember({"small", "full"}));
  // Numbers through numbers.hpp: thread counts 1..this machine's cores (oneTBB
  // cannot build an arena of millions of threads), a finite time >= 0.
  add_int_list_option(*cmd, "--threads", opts->threads,
                      "oneTBB thread counts to measure, 1.." + std::to_string(machine_threads()) +
                          " (default 1, 2, 4, ..., all)",
                      1, machine_threads());
  add_int_option(*cmd, "--sequences", opts->sequences, "sequences in the batch (small suite)", 1, 4096);
  add_int_option(*cmd, "--tokens", opts->tokens, "tokens per sequence (small suite)", 1, 1 << 20);
  add_float_option(*cmd, "--min-seconds", opts->min_seconds, "time spent per measurement, 0..3600", 0.0, 3600.0);
  cmd->add_option("--only", opts->only, "run only configurations whose name contains this text (repeatable)");
  cmd->add_option("--baseline", opts->baseline,
                  "JSON of bench/pytorch_baseline.py --cases ... --json: adds PyTorch's time and the speed-up per row");
  cmd->add_option("--output", opts->output, "also write the JSON report to this file (the table still prints)");
  cmd->add_option("--scenario", opts->scenarios,
                  "real-size rows: replay this scenario file (repeatable; e.g. scenarios/real/*.toml) once per thread "
                  "count and split its wall time into kernels and host work");
  cmd->add_option("--invariants", opts->invariants,
                  "with --scenario: check only these invariants (comma-separated names, or none); default every one");
  cmd->add_flag("--list", opts->list, "print the configurations and exit (with --json: for pytorch_baseline.py --cases)");
  cmd->add_flag("--json", opts->json, "print one JSON object");
  cmd->callback([opts, cmd] {
    opts->sizes_given = cmd->count("--sequences") + cmd->count("--tokens") > 0;
    opts->baseline_given = cmd->count("--baseline") > 0;
    opts->output_given = cmd->count("--output") > 0;
    if (cmd->count("--invariants") && opts->invariants.empty())
      fail(ErrorCode::bad_argument, "--invariants = '': empty value: expected none or a comma-separated list of invariants");
    for (const std::string& file : opts->scenarios)
      if (file.empty()) fail(ErrorCode::bad_argument, "--scenario = '': empty value: expected a scenario file");
    run_bench(*opts);
  });  // BackendUnavailable: main's backend_unavailable, exit 2
}

}  // namespace kvsim::cli
