// One registration function per subcommand; each lives in its own cmd_*.cpp,
// binds an options struct to CLI11 and calls the library. main.cpp only
// collects them.
//
// Error protocol for subcommand callbacks (main.cpp turns each into an exit
// code after flushing stdout):
//   * kvsim::ValidationError (core's named errors; also used by the CLI for
//     its own input checks, e.g. bad_argument)  -> "kvsim: error: NAME: ..."
//     on stderr, exit kExitUsage;
//   * CLI::ParseError (bad flag, bad flag value)  -> CLI11's message, exit
//     kExitUsage (--help and --version exit kExitOk);
//   * throw ExitStatus{code} to finish with another status (kExitCheckFailed
//     when an invariant or comparison failed) after printing the report.
#pragma once

#include <optional>
#include <set>
#include <string>

#include <CLI/CLI.hpp>

#include "kvsim/sim/scenario.hpp"

namespace kvsim::cli {

// Exit codes shared by every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitCheckFailed = 1;  // an invariant or comparison failed
inline constexpr int kExitUsage = 2;        // bad flag, bad input, validation error
inline constexpr int kExitInternal = 3;     // an unexpected exception (a kvsim bug)

// Thrown by a subcommand callback that wants main() to return `code`.
struct ExitStatus {
  int code = kExitOk;
};

// A word where a subcommand belongs that names none (main.cpp): exit kExitUsage.
struct UnknownSubcommand {
  std::string message;
};

// --invariants LIST|none (run, bench --scenario): the selected invariants;
// bad_argument naming an unknown or empty name.
std::optional<std::set<sim::Invariant>> parse_invariant_list(const std::string& text);

void register_layout(CLI::App& app);
void register_explain(CLI::App& app);
void register_codec(CLI::App& app);
void register_bench(CLI::App& app);
void register_validate(CLI::App& app);
void register_run(CLI::App& app);
void register_diff(CLI::App& app);
void register_trace(CLI::App& app);
void register_mma_check(CLI::App& app);
void register_events(CLI::App& app);

}  // namespace kvsim::cli
