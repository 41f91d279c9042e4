// kvsim: the command line. Each subcommand lives in its own cmd_*.cpp and
// registers itself here; main() only parses and maps errors to exit codes
// (see commands.hpp for the protocol).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "backends/backend.hpp"
#include "commands.hpp"
#include "kvsim/validation.hpp"

namespace {

// CLI11 reports an unknown subcommand as an unexpected extra argument without
// naming it as such; kvsim names it and lists the choices. Walks the leading
// words of argv down the subcommand tree (`kvsim codec encode ...`) and stops
// at the first flag or at a command without subcommands.
void reject_unknown_subcommand(CLI::App& app, int argc, char** argv) {
  CLI::App* level = &app;
  std::string path = "kvsim";
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    const std::vector<CLI::App*> subs = level->get_subcommands([](CLI::App*) { return true; });
    if (subs.empty()) return;
    CLI::App* next = nullptr;
    std::string names;
    for (CLI::App* sub : subs) {
      if (sub->check_name(word)) next = sub;
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    // A flag where a subcommand belongs: name the flag, not the missing
    // subcommand ("kvsim -x" is an unknown flag of kvsim, bad_usage).
    if (!word.empty() && word[0] == '-') {
      if (word != "--" && level->get_option_no_throw(word.substr(0, word.find('='))) == nullptr)
        throw CLI::ExtrasError("The following argument was not expected: " + word + " (" + path +
                                   " takes a subcommand first: one of " + names + ")",
                               static_cast<int>(CLI::ExitCodes::ExtrasError));
      return;
    }
    if (word.empty()) return;
    if (!next)
      throw kvsim::cli::UnknownSubcommand{"'" + word + "' is not a subcommand of " + path + " (one of: " + names + ")"};
    level = next;
    path += " " + word;
  }
}

// "--flag=" with nothing after '=': CLI11 would take the next argument as
// the value (`codec nvfp4 --global-scale= 1 2 ...` read "1" as the scale, and
// "--" as one), so an empty value of a flag that needs one is named here.
// Flags that may go without a value (explain's lists) keep their own message.
void reject_empty_values(CLI::App& app, int argc, char** argv) {
  CLI::App* level = &app;
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--") return;
    if (word.size() > 3 && word.starts_with("--") && word.back() == '=') {
      const std::string name = word.substr(0, word.size() - 1);
      const CLI::Option* opt = level->get_option_no_throw(name);
      if (opt != nullptr && opt->get_expected_min() >= 1)
        throw kvsim::ValidationError(kvsim::ErrorCode::bad_argument,
                                     name + " = '': empty value: expected a value after '='");
      continue;
    }
    for (CLI::App* sub : level->get_subcommands([](CLI::App*) { return true; }))
      if (sub->check_name(word)) level = sub;
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kvsim::cli;

  CLI::App app{"kvsim: a CPU-first reference simulator of paged LLM KV caches", "kvsim"};
  app.set_version_flag("--version", std::string("kvsim ") + kvsim::kVersion);
  app.require_subcommand(1);
  // Same form as kvsim's own errors (docs/errors.md): CLI11's parse errors
  // (unknown flag, missing required flag, a value not among its choices,
  // extra arguments) are the error named bad_usage.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return "kvsim: error: bad_usage: " + std::string(e.what()) + "\nRun with --help for more information.\n";
  });

  register_layout(app);
  register_explain(app);
  register_codec(app);
  register_bench(app);
  register_validate(app);
  register_run(app);
  register_diff(app);
  register_trace(app);
  register_mma_check(app);
  register_events(app);

  int status = kExitOk;
  try {
    reject_unknown_subcommand(app, argc, argv);
    reject_empty_values(app, argc, argv);
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help / --version are "errors" with exit code 0 that print to stdout.
    status = app.exit(e, std::cout, std::cerr) == 0 ? kExitOk : kExitUsage;
  } catch (const UnknownSubcommand& e) {
    std::cerr << "kvsim: error: unknown_subcommand: " << e.message << "\nRun with --help for more information.\n";
    status = kExitUsage;
  } catch (const kvsim::ValidationError& e) {
    std::cout.flush();  // keep whatever was already reported ahead of the error
    std::cerr << "kvsim: error: " << e.what() << '\n';
    status = kExitUsage;
  } catch (const kvsim::BackendUnavailable& e) {
    std::cout.flush();
    std::cerr << "kvsim: error: backend_unavailable: " << e.what() << '\n';
    status = kExitUsage;
  } catch (const ExitStatus& e) {
    status = e.code;
  } catch (const std::exception& e) {
    std::cout.flush();
    std::cerr << "kvsim: internal error: " << e.what() << '\n';
    status = kExitInternal;
  }
  // Output may go to a pipe (block buffered): flush both before exit so a
  // caller reading with popen sees everything, in order. A write that failed
  // (a full disk, > /dev/full, a closed pipe) is an error, never exit 0.
  std::cout.flush();
  if (std::fflush(stdout) != 0 || std::ferror(stdout) || std::cout.fail()) {
    const int err = errno;
    std::cerr << "kvsim: error: output_failed: writing to stdout failed"
              << (err ? std::string(": ") + std::strerror(err) : std::string()) << '\n';
    if (status == kExitOk) status = kExitUsage;
  }
  std::cerr.flush();
  return status;
}
