// `kvsim trace stats FILE ...` and `kvsim trace import FILE ... -o SCENARIO.toml`:
// published request traces (docs/traces.md). stats replays the whole trace
// metadata-only through the block manager at each capacity and prints the
// hit rate against the unbounded maximum (the Mooncake paper's Figure 9);
// import turns a window of it into a scenario file that `kvsim run` replays
// with KV contents and every invariant.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "kvsim/validation/errors.hpp"
#include "kvsim/workload/trace.hpp"
#include "kvsim/workload/trace_import.hpp"
#include "kvsim/workload/trace_schedule.hpp"
#include "kvsim/workload/trace_stats.hpp"
#include "numbers.hpp"
#include "trace_options.hpp"

namespace kvsim::cli {
namespace {

struct TraceStatsOptions {
  TraceFileOptions file;
  int32_t block_size = 0;  // 0 = the trace's block size
  std::vector<int64_t> capacity_tokens;
  bool json = false;
};

nlohmann::json capacity_json(const workload::CapacityStats& c) {
  return {{"capacity_tokens", c.capacity_tokens}, {"blocks", c.blocks},
          {"hit_tokens", c.hit_tokens},           {"hit_rate", c.hit_rate},
          {"fraction_of_max", c.fraction_of_max}, {"evicted_blocks", c.evicted_blocks},
          {"unfit_requests", c.unfit_requests}};
}

void run_stats(const TraceStatsOptions& o) {
  const workload::Trace t = load_trace_file(o.file);
  const int32_t block_size = o.block_size > 0 ? o.block_size : t.block_tokens;
  const workload::TraceStats s = workload::trace_stats(t, block_size, o.capacity_tokens);
  if (o.json) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& c : s.capacities) rows.push_back(capacity_json(c));
    std::cout << nlohmann::json{{"trace", t.source},
                                {"format", std::string(workload::trace_format_name(t.format))},
                                {"trace_block_tokens", t.block_tokens},
                                {"block_size", s.block_size},
                                {"requests", s.requests},
                                {"prompt_tokens", s.prompt_tokens},
                                {"unbounded", capacity_json(s.unbounded)},
                                {"capacities", rows}}
                     .dump(2)
              << '\n';
    return;
  }
  std::printf("%s: %lld requests, %lld prompt tokens (%s, %d-token trace blocks); cache blocks of %d tokens\n",
              t.source.c_str(), static_cast<long long>(s.requests), static_cast<long long>(s.prompt_tokens),
              std::string(workload::trace_format_name(t.format)).c_str(), t.block_tokens, s.block_size);
  std::printf("unbounded cache: %lld prompt tokens reused, hit rate %.4f (the maximum)\n",
              static_cast<long long>(s.unbounded.hit_tokens), s.unbounded.hit_rate);
  std::printf("%15s %9s %12s %8s %7s %9s %6s\n", "capacity_tokens", "blocks", "hit_tokens", "hit_rate", "of_max",
              "evicted", "unfit");
  for (const auto& c : s.capacities)
    std::printf("%15lld %9lld %12lld %8.4f %7.4f %9lld %6lld\n", static_cast<long long>(c.capacity_tokens),
                static_cast<long long>(c.blocks), static_cast<long long>(c.hit_tokens), c.hit_rate, c.fraction_of_max,
                static_cast<long long>(c.evicted_blocks), static_cast<long long>(c.unfit_requests));
}

struct TraceImportOptions {
  TraceFileOptions file;
  TraceScenarioOptions scenario;
  std::string output;
};

void run_import(const TraceImportOptions& o) {
  const workload::Trace t = load_trace_file(o.file);
  const std::string toml = trace_scenario_toml(t, o.scenario);
  if (o.output.empty() || o.output == "-") {
    std::cout << toml;
    return;
  }
  std::ofstream out(o.output, std::ios::binary);
  if (!out) fail(ErrorCode::bad_argument, "-o = '" + printable(o.output) + "': cannot be opened for writing");
  out << toml;
  out.close();
  if (!out) fail(ErrorCode::bad_argument, "-o = '" + printable(o.output) + "': writing failed");
}

struct TraceScheduleOptions {
  TraceFileOptions file;
  TraceScenarioOptions scenario;
  bool json = false;
};

void run_schedule(const TraceScheduleOptions& o) {
  const workload::Trace t = load_trace_file(o.file);
  const workload::ScheduleStats st = workload::schedule_metadata(trace_scenario_in_memory(t, o.scenario));
  if (o.json) {
    nlohmann::json j{{"trace", t.source},
                     {"requests", st.requests},
                     {"primary_blocks", st.primary_blocks},
                     {"peak_blocks_in_use", st.peak_blocks_in_use},
                     {"finished", st.finished}};
    for (const sim::CounterField& c : sim::kReportedCounters) j[std::string(c.name)] = st.counters.*c.value;
    std::cout << j.dump(2) << '\n';
  } else {
    std::printf("%s: %lld requests, primary pool of %lld blocks; metadata only\n", t.source.c_str(),
                static_cast<long long>(st.requests), static_cast<long long>(st.primary_blocks));
    std::printf("steps %lld, prefill %lld, decode %lld, reused %lld, evicted %lld, preemptions %lld, peak blocks in use "
                "%lld%s\n",
                static_cast<long long>(st.counters.steps), static_cast<long long>(st.counters.prefill_tokens),
                static_cast<long long>(st.counters.decode_tokens), static_cast<long long>(st.counters.reuse_hit_tokens),
                static_cast<long long>(st.counters.evicted_blocks), static_cast<long long>(st.counters.preemptions),
                static_cast<long long>(st.peak_blocks_in_use), st.finished ? "" : " (NOT finished within max_steps)");
  }
  if (!st.finished) throw ExitStatus{kExitCheckFailed};
}

}  // namespace

void register_trace(CLI::App& app) {
  CLI::App* trace = app.add_subcommand("trace", "Published request traces: hit rate against capacity, import as a scenario");
  trace->require_subcommand(1);

  auto stats = std::make_shared<TraceStatsOptions>();
  CLI::App* s = trace->add_subcommand(
      "stats", "Replay a trace through the block manager (metadata only) at each capacity; print hit rates");
  add_trace_file_options(*s, stats->file);
  add_int_option(*s, "--block-size", stats->block_size, "Cache block (page) size in tokens, 1..1024; 0 = the trace's", 0,
                 1024);
  add_int_list_option(*s, "--capacity-tokens", stats->capacity_tokens, "Cache capacities in tokens (comma-separated)", 1,
                      int64_t{1} << 40)
      ->required();
  s->add_flag("--json", stats->json, "Print one JSON object");
  s->callback([stats] { run_stats(*stats); });

  auto imp = std::make_shared<TraceImportOptions>();
  CLI::App* i = trace->add_subcommand("import", "Turn a window of a trace into a scenario file (docs/traces.md)");
  add_trace_file_options(*i, imp->file);
  add_trace_scenario_options(*i, imp->scenario);
  i->add_option("-o,--output", imp->output, "Scenario file to write (default: stdout)");
  i->callback([imp] { run_import(*imp); });

  auto sch = std::make_shared<TraceScheduleOptions>();
  CLI::App* c = trace->add_subcommand(
      "schedule", "Step a trace (or a window) through the scheduler and block manager, metadata only; print the counters");
  add_trace_file_options(*c, sch->file);
  add_trace_scenario_options(*c, sch->scenario);
  c->add_flag("--json", sch->json, "Print one JSON object");
  c->callback([sch] { run_schedule(*sch); });
}

}  // namespace kvsim::cli
