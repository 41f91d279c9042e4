// `kvsim validate`: the built binary, run through the shell. Good files get
// one "ok" line on stdout; each bad file its bad_scenario error, with
// FILE:LINE:COLUMN, on stderr; exit 0 only if every file was good, else 2
// after all files were checked.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "kvsim/sim/scenario_file.hpp"

namespace fs = std::filesystem;

namespace {

struct Run {
  int status = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `kvsim ARGS` with stdout and stderr captured apart.
Run run_kvsim(const std::string& args) {
  const fs::path dir = fs::temp_directory_path();
  const fs::path out = dir / "kvsim_validate_cli_test.out", err = dir / "kvsim_validate_cli_test.err";
  const std::string command =
      std::string("'") + KVSIM_BINARY + "' " + args + " >'" + out.string() + "' 2>'" + err.string() + "'";
  FILE* p = popen(command.c_str(), "r");
  REQUIRE(p != nullptr);
  const int raw = pclose(p);
  Run r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  fs::remove(out);
  fs::remove(err);
  return r;
}

size_t count_lines(const std::string& s, const std::string& containing) {
  std::istringstream in(s);
  size_t n = 0;
  for (std::string line; std::getline(in, line);) n += line.find(containing) != std::string::npos;
  return n;
}

fs::path write_file(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / name;
  std::ofstream(p) << text;
  return p;
}

}  // namespace

TEST_CASE("kvsim validate with no file checks every built-in scenario and exits 0") {
  const auto builtins = kvsim::sim::builtin_scenario_paths();
  REQUIRE_FALSE(builtins.empty());
  const Run r = run_kvsim("validate");
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK(r.err.empty());
  CHECK(count_lines(r.out, ": ok (") == builtins.size());
  for (const std::string& path : builtins) CHECK(r.out.find(path + ": ok (") != std::string::npos);
}

TEST_CASE("kvsim validate: one ok line per good file, naming requests, tokens and geometry") {
  const std::string file = std::string(KVSIM_SOURCE_DIR) + "/scenarios/window_cyclic_sinks_bubble.toml";
  const Run r = run_kvsim("validate '" + file + "'");
  CHECK(r.status == 0);
  CHECK(r.out == file + ": ok (2 requests, 42 prompt + 160 decode tokens, L=2 F=2 H=2 P=16 D=64 bf16 nhd in_block, "
                        "cyclic window 40)\n"
                        "  estimate with every invariant: 7 runs (at once on a host backend), 2.7e+03 token-layers, 2.02e+08 "
                        "attention FLOP; peak backend memory 9.51 MiB (pools 384 KiB), host memory 12.4 MiB\n");
  CHECK(r.err.empty());
}

TEST_CASE("kvsim validate: every bad file is reported with its location, the good ones still pass, exit 2") {
  const fs::path typo = write_file("kvsim_validate_typo.toml", "# a typo\n[cache]\npage_sise = 16\n");
  const fs::path pool = write_file("kvsim_validate_pool.toml",
                                   "[cache]\nprimary_blocks = 2\n\n[[request]]\ngenerated = 100\n");
  const fs::path good = write_file("kvsim_validate_good.toml", "[[request]]\ngenerated = 3\n");
  const Run r = run_kvsim("validate '" + typo.string() + "' '" + good.string() + "' '" + pool.string() + "'");
  CHECK(r.status == 2);
  CHECK(r.out == good.string() + ": ok (1 request, 3 prompt + 0 decode tokens, L=2 F=2 H=2 P=16 D=64 bf16 nhd "
                                 "in_block)\n  estimate with every invariant: 4 runs (at once on a host backend), 24 token-layers, "
                                 "9.83e+04 attention FLOP; peak backend memory 4.06 MiB (pools 1.00 MiB), host memory 143 KiB\n");
  CHECK(r.err == "kvsim: error: bad_scenario: " + typo.string() +
                     ":3:1: cache.page_sise: unknown key; did you mean page_size?\n"
                     "kvsim: error: bad_scenario: " + pool.string() +
                     ":4:1: request[0]: expected to fit the primary pool: 100 tokens need 7 blocks of 16 tokens, got "
                     "cache.primary_blocks = 2\n");
  for (const fs::path& p : {typo, pool, good}) fs::remove(p);
}

TEST_CASE("kvsim validate: a missing file and malformed TOML exit 2 with the position") {
  const Run missing = run_kvsim("validate /nonexistent/kvsim/x.toml");
  CHECK(missing.status == 2);
  CHECK(missing.out.empty());
  CHECK(missing.err ==
        "kvsim: error: bad_scenario: /nonexistent/kvsim/x.toml:0:0: file: expected a readable scenario file, got no "
        "such file\n");
  const fs::path broken = write_file("kvsim_validate_broken.toml", "[model]\nlayers = [2\n");
  const Run r = run_kvsim("validate '" + broken.string() + "'");
  CHECK(r.status == 2);
  CHECK(r.err.rfind("kvsim: error: bad_scenario: " + broken.string() + ":2:13: toml: expected valid TOML: Error while parsing array: encountered end-of-file", 0) == 0);
  fs::remove(broken);
}
