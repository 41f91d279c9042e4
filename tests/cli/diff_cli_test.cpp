// `kvsim diff --backends REF,CAND` end to end (cli/cmd_diff.cpp): any two
// compiled-in backends are paired (reference against cpu here, on every
// machine), the summary names them, and a bad pair is refused by name with
// exit 2 before anything runs.
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "../support/shell_command.hpp"

namespace {

using Result = kvsim::test::ShellResult;

Result run(const std::string& args) {
  return kvsim::test::run_shell("env -u KVSIM_DIFF_CANDIDATE " + std::string(KVSIM_BINARY) + " " + args + " 2>&1");
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("kvsim diff --backends reference,cpu compares the two over generated ops and a scenario") {
  const Result generated = run("diff --backends reference,cpu --generated 2 --seed 5 --json");
  CHECK(generated.code == 0);
  const nlohmann::json j = nlohmann::json::parse(generated.out);
  CHECK(j["ok"] == true);
  CHECK(j["ops"].get<int64_t>() == 2 * 25);  // 24 ops per sequence, plus its geometry's append_mla
  CHECK(j["bytes_compared"].get<int64_t>() > 0);
  CHECK(j["runs"][0]["first_difference"].is_null());

  const Result scenario =
      run("diff --backends reference,cpu " + std::string(KVSIM_SOURCE_DIR) + "/scenarios/prefix_reuse_offload_onboard.toml");
  CHECK(scenario.code == 0);
  CHECK(contains(scenario.out, "1 run(s), reference against cpu: "));
  CHECK(contains(scenario.out, "0 bytes differ"));

  const Result swapped = run("diff --backends cpu,reference --generated 1");
  CHECK(swapped.code == 0);
  CHECK(contains(swapped.out, "cpu against reference"));
}

TEST_CASE("generated op sequences do not depend on the compiler: a pinned seed gives pinned sizes") {
  // Every random draw of the op generator is its own statement: a call whose arguments each drew
  // (unspecified order) gave other sequences under g++ and clang. The sanitizer suite builds with
  // clang and the main build with g++, so both hold these numbers (they change, on purpose, only with
  // the generator).
  const Result r = run("diff --backends reference,cpu --generated 30 --seed 7 --json");
  REQUIRE(r.code == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j["ops"].get<int64_t>() == 750);
  CHECK(j["bytes_compared"].get<int64_t>() == 104597412);  // session 25: prefill slot runs for reshape_and_cache
}

TEST_CASE("kvsim diff --backends refuses anything but two known backends, exit 2") {
  for (const char* bad : {"reference", "reference,cpu,cpu", "reference,", ""}) {
    INFO("--backends '" << bad << "'");
    const Result r = run(std::string("diff --generated 1 --backends '") + bad + "'");
    CHECK(r.code == 2);
    CHECK(contains(r.out, "kvsim: error: bad_argument: --backends"));
  }
  const Result unknown = run("diff --generated 1 --backends reference,gpu");
  CHECK(unknown.code == 2);
  CHECK(contains(unknown.out, "kvsim diff needs the gpu backend: unknown backend 'gpu' (available: reference, cpu, cuda)"));
}

TEST_CASE("kvsim diff on a terminal shows the progress line; not on a terminal, nothing on stderr") {
  if (std::system("command -v script > /dev/null 2>&1") != 0) {
    MESSAGE("skipped: util-linux's script (a pseudo-terminal) is not installed");
    return;
  }
  const std::string file = std::string(KVSIM_SOURCE_DIR) + "/scenarios/prefix_reuse_system_prompt.toml";
  const Result tty = kvsim::test::run_shell("script -qec \"" + std::string(KVSIM_BINARY) +
                                            " diff --backends reference,cpu " + file + " > /dev/null\" /dev/null");
  CHECK(tty.code == 0);
  INFO(tty.out);
  CHECK(contains(tty.out, "prefix_reuse_system_prompt: run 1/1 replay: step 1 of "));
  CHECK(contains(tty.out, " tokens/s, about "));
  const Result quiet = kvsim::test::run_shell(std::string(KVSIM_BINARY) + " diff --backends reference,cpu " + file +
                                              " 2>&1 >/dev/null");
  CHECK(quiet.code == 0);
  CHECK(quiet.out.empty());
}
