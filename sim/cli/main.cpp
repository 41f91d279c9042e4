// kvsim: the command line. Each subcommand lives in its own cmd_*.cpp and
// registers itself here; main() only parses and maps errors to exit codes
// (see commands.hpp for the protocol).
#include <exception>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "commands.hpp"
#include "kvsim/core.hpp"

int main(int argc, char** argv) {
  using namespace kvsim::cli;

  CLI::App app{"kvsim: a CPU-first reference simulator of paged LLM KV caches", "kvsim"};
  app.set_version_flag("--version", std::string("kvsim ") + kvsim::kVersion);
  app.require_subcommand(1);
  // Same prefix as kvsim's own errors, so every failure reads alike on stderr.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return "kvsim: error: " + std::string(e.what()) + "\nRun with --help for more information.\n";
  });

  register_layout(app);
  register_explain(app);
  register_codec(app);
  register_bench(app);
  register_validate(app);
  register_run(app);

  int status = kExitOk;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help / --version are "errors" with exit code 0 that print to stdout.
    status = app.exit(e, std::cout, std::cerr) == 0 ? kExitOk : kExitUsage;
  } catch (const kvsim::ValidationError& e) {
    std::cout.flush();  // keep whatever was already reported ahead of the error
    std::cerr << "kvsim: error: " << e.what() << '\n';
    status = kExitUsage;
  } catch (const ExitStatus& e) {
    status = e.code;
  } catch (const std::exception& e) {
    std::cout.flush();
    std::cerr << "kvsim: internal error: " << e.what() << '\n';
    status = kExitInternal;
  }
  // Output may go to a pipe (block buffered): flush both before exit so a
  // caller reading with popen sees everything, in order.
  std::cout.flush();
  std::cerr.flush();
  return status;
}
