// Golden replays: every built-in scenario replayed on the CPU backend, its
// counters, invariant outcomes and content hash (final pools and every
// attention output) compared with tests/sim/golden/<name>.json. A change in
// any byte the replay produces changes the hash.
//
// To update after an intended change (docs/scenarios.md, "Golden files"):
//   KVSIM_UPDATE_GOLDEN=1 ./golden_test
// rewrites every file; review the diff with git before committing it.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "backends/backend.hpp"
#include "kvsim/sim/replay.hpp"
#include "kvsim/sim/scenario_file.hpp"

namespace fs = std::filesystem;
using nlohmann::ordered_json;
using namespace kvsim;
using namespace kvsim::sim;

namespace {

const fs::path kGoldenDir = fs::path(KVSIM_SOURCE_DIR) / "tests" / "sim" / "golden";

bool updating() {
  const char* v = std::getenv("KVSIM_UPDATE_GOLDEN");
  return v && std::string(v) == "1";
}

std::string hex(uint64_t x) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(x));
  return buf;
}

// What a golden file pins: every counter, every invariant's outcome, the
// content hash and the verdict. Timings are left out (they vary).
ordered_json golden_of(const ScenarioReport& r) {
  const ReplayCounters& c = r.counters;
  ordered_json j;
  j["scenario"] = r.name;
  j["counters"] = {{"steps", c.steps},
                   {"prefill_tokens", c.prefill_tokens},
                   {"decode_tokens", c.decode_tokens},
                   {"reuse_hit_tokens", c.reuse_hit_tokens},
                   {"partial_reuse_tokens", c.partial_reuse_tokens},
                   {"evicted_blocks", c.evicted_blocks},
                   {"offloaded_blocks", c.offloaded_blocks},
                   {"onboarded_blocks", c.onboarded_blocks},
                   {"preemptions", c.preemptions},
                   {"ops", c.ops},
                   {"token_layers", c.token_layers}};
  ordered_json inv = ordered_json::object();
  for (const InvariantReport& i : r.invariants)
    inv[std::string(invariant_name(i.invariant))] = std::string(invariant_status_name(i.status));
  j["invariants"] = inv;
  j["content_hash"] = hex(r.content_hash);
  j["ok"] = r.ok;
  return j;
}

std::string failure_details(const ScenarioReport& r) {
  std::string out;
  for (const InvariantReport& i : r.invariants)
    if (i.status == InvariantStatus::fail)
      out += "  invariant " + std::string(invariant_name(i.invariant)) + " failed: " + i.detail + "\n";
  for (const std::string& e : r.expectation_failures) out += "  " + e + "\n";
  return out;
}

}  // namespace

TEST_CASE("golden replays: every built-in scenario on the CPU backend matches tests/sim/golden") {
  const std::vector<std::string> paths = builtin_scenario_paths();
  REQUIRE(paths.size() >= 30);
  // Two threads: the oracle's results must not depend on the thread count, so
  // the files hold for any machine.
  const std::unique_ptr<Backend> cpu = make_backend("cpu", BackendOptions{.threads = 2});
  if (updating()) fs::create_directories(kGoldenDir);
  std::set<std::string> names;
  int compared = 0, written = 0;
  for (const std::string& path : paths) {
    const Scenario s = load_scenario_file(path);
    names.insert(s.name);
    INFO("scenario " << s.name << " (" << path << ")");
    ScenarioReport report;
    try {
      report = replay(s, *cpu);
    } catch (const std::exception& e) {
      // A built-in scenario must replay; a throw is a failure, never a skip.
      FAIL_CHECK("replay threw: " << e.what());
      continue;
    }
    INFO(failure_details(report));
    CHECK(report.ok);
    const ordered_json got = golden_of(report);
    const fs::path file = kGoldenDir / (s.name + ".json");
    if (updating()) {
      std::ofstream(file) << got.dump(2) << "\n";
      ++written;
      continue;
    }
    std::ifstream in(file);
    if (!in) {
      FAIL_CHECK("no golden file " << file.string() << "; run KVSIM_UPDATE_GOLDEN=1 golden_test to create it");
      continue;
    }
    const ordered_json want = ordered_json::parse(in);
    for (const auto& [key, value] : want["counters"].items()) {
      INFO("counter " << key);
      CHECK(got["counters"].value(key, ordered_json()) == value);
    }
    CHECK(got["counters"].size() == want["counters"].size());
    CHECK(got["invariants"] == want["invariants"]);
    CHECK(got["content_hash"] == want["content_hash"]);
    CHECK(got["ok"] == want["ok"]);
    ++compared;
  }
  if (updating()) {
    MESSAGE("KVSIM_UPDATE_GOLDEN=1: wrote " << written << " golden files to " << kGoldenDir.string());
    CHECK(written == static_cast<int>(paths.size()));
  } else {
    CHECK(compared == static_cast<int>(paths.size()));
    // No golden file may outlive its scenario.
    for (const auto& entry : fs::directory_iterator(kGoldenDir))
      if (entry.path().extension() == ".json") {
        INFO("stale golden file " << entry.path().string());
        CHECK(names.count(entry.path().stem().string()) == 1);
      }
  }
}

TEST_CASE("a replay is deterministic: the same scenario twice gives the same hash and counters") {
  const std::unique_ptr<Backend> one = make_backend("cpu", BackendOptions{.threads = 1});
  const std::unique_ptr<Backend> two = make_backend("cpu", BackendOptions{.threads = 2});
  const Scenario s =
      load_scenario_file(std::string(KVSIM_SOURCE_DIR) + "/scenarios/prefix_reuse_offload_onboard.toml");
  ReplayOptions quick;
  quick.comparison_invariants = false;
  const ScenarioReport a = replay(s, *one, quick), b = replay(s, *two, quick);
  CHECK(golden_of(a) == golden_of(b));
  CHECK(a.content_hash != 0);
  CHECK(a.counters.steps > 0);
}
