// The trace flags shared by `kvsim trace stats|import` and `kvsim run --trace`
// (docs/traces.md): which file, in which format, and how a window of it
// becomes a scenario.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "kvsim/workload/trace.hpp"
#include "kvsim/workload/trace_import.hpp"
#include "kvsim/workload/trace_schedule.hpp"

namespace kvsim::cli {

struct TraceFileOptions {
  std::string path;
  std::string format = "mooncake";
  int32_t trace_block_size = 0;  // 0 = the format's
};

struct TraceScenarioOptions {
  workload::TraceImportOptions import;
  std::string scale_text = "1";  // "0.03125" or "1/32"
  std::string model_toml_path;
  std::string model_preset;  // --model NAME: [model] preset = "NAME" (sim/model_presets.hpp)
};

// FILE as a positional argument (positional = false: as --trace FILE, for run).
void add_trace_file_options(CLI::App& cmd, TraceFileOptions& o, bool positional = true);
void add_trace_scenario_options(CLI::App& cmd, TraceScenarioOptions& o);

workload::Trace load_trace_file(const TraceFileOptions& o);
// The scenario text (checked options, model file read) and its name.
std::string trace_scenario_toml(const workload::Trace& t, const TraceScenarioOptions& o);
std::string trace_scenario_name(const workload::Trace& t, const TraceScenarioOptions& o);
// The same scenario built in memory (workload::trace_scenario), for whole traces.
sim::Scenario trace_scenario_in_memory(const workload::Trace& t, const TraceScenarioOptions& o);

}  // namespace kvsim::cli
