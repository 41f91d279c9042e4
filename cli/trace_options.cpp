// Trace flags: see trace_options.hpp.
#include "trace_options.hpp"

#include <cstdint>
#include <fstream>
#include <sstream>

#include "kvsim/validation/errors.hpp"
#include "kvsim/validation/geometry.hpp"
#include "kvsim/sim/model_presets.hpp"
#include "numbers.hpp"

namespace kvsim::cli {

namespace {

// "--scale": a decimal factor or a fraction N/D.
double parse_scale(const std::string& text) {
  const size_t slash = text.find('/');
  if (slash == std::string::npos) return parse_float("--scale", text, 1e-9, 1.0);
  const int64_t n = parse_int("--scale numerator", std::string_view(text).substr(0, slash), 1, 1 << 20);
  const int64_t d = parse_int("--scale denominator", std::string_view(text).substr(slash + 1), 1, 1 << 20);
  if (n > d) fail(ErrorCode::bad_argument, "--scale = '" + printable(text) + "': expected a factor <= 1");
  return static_cast<double>(n) / static_cast<double>(d);
}

workload::TraceImportOptions resolved(const TraceScenarioOptions& o) {
  workload::TraceImportOptions io = o.import;
  io.scale = parse_scale(o.scale_text);
  if (!o.model_preset.empty() && !o.model_toml_path.empty())
    fail(ErrorCode::bad_argument, "--model and --model-toml: expected one of them, got both");
  if (!o.model_preset.empty()) {
    if (!sim::find_model_preset(o.model_preset)) {
      std::string names;
      for (const sim::ModelPreset& p : sim::model_presets()) names += (names.empty() ? "" : ", ") + std::string(p.name);
      fail(ErrorCode::bad_argument, "--model = '" + printable(o.model_preset) + "': expected one of " + names);
    }
    // The preset goes into the scenario by name, so the file says which model it replays.
    io.model_toml = "[model]\npreset = \"" + o.model_preset + "\"\n";
    io.model_source = "--model " + o.model_preset;
  }
  if (!o.model_toml_path.empty()) {
    std::ifstream in(o.model_toml_path, std::ios::binary);
    if (!in) fail(ErrorCode::bad_argument, "--model-toml = '" + printable(o.model_toml_path) + "': not a readable file");
    std::ostringstream ss;
    ss << in.rdbuf();
    io.model_toml = ss.str();
    io.model_source = o.model_toml_path;
  }
  return io;
}

}  // namespace

void add_trace_file_options(CLI::App& cmd, TraceFileOptions& o, bool positional) {
  if (positional)
    cmd.add_option("file", o.path, "Trace file (JSON lines)")->required();
  else
    cmd.add_option("--trace", o.path, "Replay a window of this request trace (JSON lines) as a scenario");
  cmd.add_option("--format", o.format, "Trace format: mooncake, bailian, semianalysis (default mooncake)")
      ->check(CLI::IsMember({"mooncake", "bailian", "semianalysis"}));
  add_int_option(cmd, "--trace-block-size", o.trace_block_size,
                 "Tokens per hash id of the trace; 0 = the format's (512, 16, 64)", 0, 1 << 20);
}

void add_trace_scenario_options(CLI::App& cmd, TraceScenarioOptions& o) {
  cmd.add_option("--requests", o.import.requests, "Window: request indices A:B in arrival order (B exclusive)");
  cmd.add_option("--time", o.import.time, "Window: arrival times A:B in ms (B exclusive)");
  cmd.add_option("--scale", o.scale_text, "Length factor (decimal or N/D): trace blocks of B tokens become B x scale (default 1)");
  add_float_option(cmd, "--step-ms", o.import.step_ms, "Modelled step time: arrival_step = arrival ms / this (default 50)",
                   1e-6, 1e9);
  add_int_option(cmd, "--page-size", o.import.page_size, "Cache page size of the scenario", 1, 1024);
  add_int_option(cmd, "--primary-blocks", o.import.primary_blocks,
                 "Primary pool blocks; 0 = every block of the window at once", 0, kMaxBlocks);
  add_int_option(cmd, "--token-budget", o.import.token_budget, "Scheduler tokens per step", 1, 1 << 24);
  cmd.add_option("--model", o.model_preset,
                 "Model preset for the scenario ([model] preset = NAME: llama-3.1-8b, llama-3.1-70b, qwen3-32b, mistral-7b, "
                 "deepseek-v3)")
      ->check([](const std::string& v) { return v.empty() ? std::string("empty value: expected a preset name") : std::string(); });
  cmd.add_option("--model-toml", o.model_toml_path, "A TOML file holding one [model] table for the scenario");
  cmd.add_option("--kv-dtype", o.import.dtype, "Cache dtype of the scenario (fp32, fp16, bf16, fp8_e4m3, fp8_e5m2, int8, nvfp4)")
      ->check([](const std::string& v) { return v.empty() ? std::string("empty value: expected a cache dtype") : std::string(); });
  add_int_option(cmd, "--secondary-blocks", o.import.secondary_blocks,
                 "A secondary (offload) tier of this many blocks, reuse.offload on; 0 = none", 0, kMaxBlocks);
  cmd.add_flag("--poison-nan", o.import.poison_nan,
               "Fresh pages hold NaN and V tails are zeroed (cache.poison_nan, zero_v_tail: the no_nan invariant)")
      ->disable_flag_override();  // a switch: "--poison-nan=2" is an error, not true
  // Through the strict list grammar (numbers.hpp): "3,,4" is an error, not [3, 4].
  cmd.add_option_function<std::string>(
      "--layer-windows",
      [&o](const std::string& text) {
        o.import.layer_windows.clear();
        for (int64_t w : parse_int_list("--layer-windows", text, 0, INT32_MAX))
          o.import.layer_windows.push_back(static_cast<int32_t>(w));
      },
      "Per-layer sliding windows, comma-separated (0 = full attention): [layers] windows, vLLM's hybrid manager");
}

workload::Trace load_trace_file(const TraceFileOptions& o) {
  return workload::load_trace(o.path, *workload::parse_trace_format(o.format), o.trace_block_size);
}

std::string trace_scenario_toml(const workload::Trace& t, const TraceScenarioOptions& o) {
  return workload::trace_scenario_toml(t, resolved(o));
}

sim::Scenario trace_scenario_in_memory(const workload::Trace& t, const TraceScenarioOptions& o) {
  return workload::trace_scenario(t, resolved(o));
}

std::string trace_scenario_name(const workload::Trace& t, const TraceScenarioOptions& o) {
  return workload::trace_scenario_name(t, resolved(o));
}

}  // namespace kvsim::cli
