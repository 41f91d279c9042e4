// `kvsim validate [SCENARIO...]`: parse and check scenario files without
// running them (default: every built-in scenario). One line per good file on
// stdout; each bad file's error on stderr in main()'s format; exit 2 if any
// file was bad, after all of them were checked.
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "kvsim/sim/estimate.hpp"
#include "kvsim/sim/scenario_file.hpp"

namespace kvsim::cli {
namespace {

struct ValidateOptions {
  std::vector<std::string> files;
};

std::string summary(const sim::Scenario& s) {
  int64_t prompt_tokens = 0, decode_tokens = 0;
  for (const sim::RequestSpec& r : s.requests) {
    for (const std::string& name : r.prefixes)
      for (const sim::PrefixSpec& p : s.prefixes)
        if (p.name == name) prompt_tokens += static_cast<int64_t>(p.tokens.size());
    prompt_tokens += static_cast<int64_t>(r.tokens.size()) + r.generated;
    decode_tokens += r.decode_tokens;
  }
  std::string out = std::to_string(s.requests.size()) + (s.requests.size() == 1 ? " request, " : " requests, ") +
                    std::to_string(prompt_tokens) + " prompt + " + std::to_string(decode_tokens) + " decode tokens, " +
                    geometry_summary(sim::pool_geometry(s));
  if (s.window.mode != sim::WindowMode::none)
    out += ", " + std::string(sim::window_mode_name(s.window.mode)) + " window " + std::to_string(s.window.window);
  if (!s.faults.empty()) {
    out += ", faults:";
    for (sim::Fault f : s.faults) out += " " + std::string(sim::fault_name(f));
  }
  return out;
}

// The second line: what `kvsim run` will need for it with every invariant.
std::string estimate_line(const sim::Scenario& s) {
  const sim::ReplayEstimate e = sim::estimate_replay(s);
  char work[160];
  std::snprintf(work, sizeof work, "%lld %s%s, %.3g token-layers, %.3g attention FLOP", static_cast<long long>(e.runs),
                e.runs == 1 ? "run" : "runs", e.concurrent_runs > 1 ? " (at once on a host backend)" : "",
                e.token_layers, e.attention_flops);
  std::string out = std::string("  estimate with every invariant: ") + work + "; peak backend memory " +
                    sim::format_bytes(e.backend_peak()) + " (pools " + sim::format_bytes(e.pool_bytes) +
                    "), host memory " + sim::format_bytes(e.host_peak());
  if (e.spill_disk_bytes > 0) out += ", disk " + sim::format_bytes(e.spill_disk_bytes);
  return out;
}

void run_validate(const ValidateOptions& opts) {
  std::vector<std::string> files = opts.files;
  if (files.empty()) {
    files = sim::builtin_scenario_paths();
    if (files.empty())
      fail(ErrorCode::bad_argument, "no scenario files given and no built-in scenarios found (scenarios/*.toml)");
  }
  bool all_ok = true;
  for (const std::string& file : files) {
    try {
      const sim::Scenario s = sim::load_scenario_file(file);
      std::cout << file << ": ok (" << summary(s) << ")\n" << estimate_line(s) << '\n';
    } catch (const ValidationError& e) {
      std::cout.flush();  // keep the report in file order when both go to one terminal
      std::cerr << "kvsim: error: " << e.what() << '\n';
      std::cerr.flush();
      all_ok = false;
    }
  }
  if (!all_ok) throw ExitStatus{kExitUsage};
}

}  // namespace

void register_validate(CLI::App& app) {
  auto opts = std::make_shared<ValidateOptions>();
  CLI::App* cmd = app.add_subcommand("validate", "Parse and check scenario files without running them");
  cmd->add_option("scenarios", opts->files, "scenario files (default: every built-in scenario)");
  cmd->callback([opts] { run_validate(*opts); });
}

}  // namespace kvsim::cli
