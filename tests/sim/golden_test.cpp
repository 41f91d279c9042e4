// Golden replays: every built-in scenario replayed on the CPU backend and on
// the reference backend, its counters, invariant outcomes and content hash
// (final pools and every attention output) compared with
// tests/sim/golden/<name>.json. A change in any byte the replay produces
// changes the hash.
//
// To update after an intended change (docs/scenarios.md, "Golden files"):
//   KVSIM_UPDATE_GOLDEN=1 ./golden_test
// rewrites every file; review the diff with git before committing it.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

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
  ordered_json counters = ordered_json::object();  // the reported counters in their order, then the op counts
  for (const CounterField& f : kReportedCounters) counters[std::string(f.name)] = c.*f.value;
  counters["ops"] = c.ops;
  counters["token_layers"] = c.token_layers;
  j["counters"] = counters;
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

// Replays every built-in scenario on `backend` and compares each with its
// golden file (KVSIM_UPDATE_GOLDEN=1 and `may_update`: rewrites them instead).
void check_golden_replays(Backend& backend, bool may_update) {
  const std::vector<std::string> paths = builtin_scenario_paths();
  REQUIRE(paths.size() >= 30);
  const bool update = may_update && updating();
  if (update) fs::create_directories(kGoldenDir);
  std::set<std::string> names;
  int compared = 0, written = 0;
  for (const std::string& path : paths) {
    const Scenario s = load_scenario_file(path);
    names.insert(s.name);
    INFO("scenario " << s.name << " (" << path << ") on " << std::string(backend.name()));
    ScenarioReport report;
    try {
      report = replay(s, backend);
    } catch (const std::exception& e) {
      // A built-in scenario must replay; a throw is a failure, never a skip.
      FAIL_CHECK("replay threw: " << std::string(e.what()));
      continue;
    }
    INFO(failure_details(report));
    CHECK(report.ok);
    const ordered_json got = golden_of(report);
    const fs::path file = kGoldenDir / (s.name + ".json");
    if (update) {
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
    for (const auto& item : want["counters"].items()) {  // no structured binding: INFO captures it (clang 14)
      const std::string key = item.key();
      const ordered_json& value = item.value();
      INFO("counter " << key);
      CHECK(got["counters"].value(key, ordered_json()) == value);
    }
    CHECK(got["counters"].size() == want["counters"].size());
    CHECK(got["invariants"] == want["invariants"]);
    CHECK(got["content_hash"] == want["content_hash"]);
    CHECK(got["ok"] == want["ok"]);
    ++compared;
  }
  if (update) {
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

}  // namespace

TEST_CASE("golden replays: every built-in scenario on the CPU backend matches tests/sim/golden") {
  // Two threads: the fast backend's results must not depend on the thread
  // count, so the files hold for any machine.
  const std::unique_ptr<Backend> cpu = make_backend("cpu", BackendOptions{.threads = 2});
  check_golden_replays(*cpu, /*may_update=*/true);
}

// The same files hold on the reference backend (plain loops over core's work
// items): every built-in scenario, every invariant (about 36 s on 2 cores).
// Golden files are only ever written from the CPU replay above.
TEST_CASE("golden replays: every built-in scenario on the reference backend matches tests/sim/golden") {
  const std::unique_ptr<Backend> reference = make_backend("reference");
  check_golden_replays(*reference, /*may_update=*/false);
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

// Validation before mutation, end to end: a scenario that passes the file
// checks must never be rejected by the replay itself. Swept over every cache
// dtype x layout x placement x write path, MLA per dtype, and cyclic/release
// windows with sinks, extra block and chunk sizes (inner replays only: the
// comparison invariants would repeat the same ops).
TEST_CASE("every scenario that passes validation replays without a ValidationError") {
  const std::unique_ptr<Backend> cpu = make_backend("cpu", BackendOptions{.threads = 2});
  ReplayOptions quick;
  quick.comparison_invariants = false;
  const char* requests = "[[request]]\ngenerated = 20\ndecode_tokens = 3\n[[request]]\ngenerated = 5\ndecode_tokens = 2\n";
  std::vector<std::string> texts;
  for (CacheDtype dtype : kAllCacheDtypes)
    for (const char* layout : {"nhd", "hnd", "split-x"})
      for (const char* placement : {"in_block", "per_layer"}) {
        const std::string input = is_float_input(dtype) ? std::string(dtype_name(dtype)) : "bf16";
        const std::string cache = "[model]\ninput_dtype = \"" + input + "\"\nq_heads = 4\n[cache]\ndtype = \"" +
                                  std::string(dtype_name(dtype)) + "\"\nlayout = \"" + layout + "\"\nplacement = \"" +
                                  placement + "\"\npage_size = 8\nprimary_blocks = 16\nk_scale = 0.05\nv_scale = 0.05\n" +
                                  "k_global_scale = 0.01\nv_global_scale = 0.01\n";
        for (const char* write_path : {"qkv_preprocess", "append_paged", "reshape_and_cache"})
          texts.push_back(cache + "write_path = \"" + write_path + "\"\n[scheduler]\nchunk_size = 8\n" + requests);
        if (std::string(layout) == "nhd")
          texts.push_back(cache + "[mla]\nenabled = true\nd_ckv = 128\nd_kpe = 32\n[indexer]\nk_scatter = true\n" +
                          "[[request]]\ngenerated = 40\ndecode_tokens = 3\n");
      }
  for (int window : {8, 33})
    for (int sinks : {0, 3})
      for (bool extra : {false, true})
        for (int page : {4, 7})
          for (int chunk : {0, 1, 5})
            for (const char* mode : {"cyclic", "release"})
              texts.push_back(std::string("[cache]\nprimary_blocks = 40\npage_size = ") + std::to_string(page) +
                              "\n[window]\nmode = \"" + mode + "\"\nwindow = " + std::to_string(window) +
                              "\nsinks = " + std::to_string(sinks) + "\none_more_block = " + (extra ? "true" : "false") +
                              "\n[scheduler]\nchunk_size = " + std::to_string(chunk) + "\n" +
                              "[[request]]\ngenerated = 40\ndecode_tokens = 30\n[[request]]\narrival_step = 3\n"
                              "generated = 6\ndecode_tokens = 12\n");
  // Per-layer windows: both allocation models (VSWA's cyclic and release rules), patterns, sinks, reuse.
  for (const char* alloc : {"allocation = \"hybrid\"", "allocation = \"vswa\"\nrule = \"release\"",
                            "allocation = \"vswa\"\nrule = \"cyclic\"\none_more_block = true"})
    for (const char* windows : {"[12, 12, 0]", "[9]", "[0, 20]"})
      for (int sinks : {0, 3})
        for (int page : {4, 5})
          for (int chunk : {0, 4})
            for (bool reuse : {false, true})
              texts.push_back(std::string("[model]\nlayers = 6\nq_heads = 4\n[cache]\nprimary_blocks = 60\npage_size = ") +
                              std::to_string(page) + "\n[layers]\nwindows = " + windows + "\n" + alloc +
                              "\nsinks = " + std::to_string(sinks) + "\n[reuse]\nenabled = " + (reuse ? "true" : "false") +
                              "\n[scheduler]\nchunk_size = " + std::to_string(chunk) +
                              "\n[[prefix]]\nname = \"p\"\nlength = 23\n[[request]]\nprefixes = [\"p\"]\ngenerated = 9\n"
                              "decode_tokens = 14\n[[request]]\narrival_step = 4\nprefixes = [\"p\"]\ngenerated = 3\n"
                              "decode_tokens = 6\n");
  int valid = 0, rejected = 0;
  for (const std::string& text : texts) {
    Scenario s;
    try {
      s = parse_scenario(text, "sweep.toml");
    } catch (const ValidationError&) {
      ++rejected;
      continue;
    }
    ++valid;
    INFO("scenario:\n" << text);
    try {
      const ScenarioReport r = replay(s, *cpu, quick);
      CHECK(r.counters.steps > 0);
    } catch (const std::exception& e) {
      FAIL_CHECK("validated, then the replay threw: " << std::string(e.what()));
    }
  }
  MESSAGE(valid << " validated scenarios replayed, " << rejected << " rejected by validation");
  CHECK(valid >= 150);
  CHECK(rejected > 0);  // the sweep reaches impossible settings too (nvfp4 with split-x, wrapping chunks, ...)
}

// validate <=> run (issue 13 item 8), swept: every combination of the scenario
// knobs (cache dtype x layout and write path x one structure: chunks, both
// window modes, prefix reuse with partial copies or offload, [layers] in both
// allocation models, [recurrent], NaN-poisoned pools, MLA with its indexer)
// with no fault and with each fault in turn, expecting the fault caught
// (must_catch) and every invariant the validator accepts in must_pass. Each
// that validates is replayed with every comparison invariant and must meet
// every expectation: a scenario that validates never fails for a reason
// validation could have known. Those that do not validate are counted.
namespace {

// A scenario file built section by section (TOML allows each table once).
struct ScenarioText {
  std::map<std::string, std::string> sections;  // "[cache]" -> its lines
  std::string tail;                              // [[prefix]] and [[request]] tables
  ScenarioText& set(const std::string& section, const std::string& lines) {
    sections[section] += lines;
    return *this;
  }
  std::string str() const {
    std::string out;
    for (const auto& [name, lines] : sections) out += name + "\n" + lines;
    return out + tail;
  }
};

std::string quoted_list(const std::vector<std::string_view>& names) {
  std::string out = "[";
  for (size_t i = 0; i < names.size(); ++i) out += (i ? ", \"" : "\"") + std::string(names[i]) + "\"";
  return out + "]";
}

bool validates(const std::string& text) {
  try {
    parse_scenario(text, "sweep.toml");
    return true;
  } catch (const ValidationError&) {
    return false;
  }
}

}  // namespace

TEST_CASE("validate <=> run: every knob and expectation combination that validates replays as it promises") {
  const std::unique_ptr<Backend> cpu = make_backend("cpu", BackendOptions{.threads = 2});
  const std::string two_requests =
      "[[request]]\ngenerated = 21\ndecode_tokens = 3\n[[request]]\narrival_step = 2\ngenerated = 9\ndecode_tokens = 4\n";
  const std::string shared_prefix =
      "[[prefix]]\nname = \"p\"\nlength = 24\n[[request]]\nprefixes = [\"p\"]\ngenerated = 5\ndecode_tokens = 3\n"
      "[[request]]\narrival_step = 6\nprefixes = [\"p\"]\ngenerated = 7\ndecode_tokens = 3\n";
  // Offload needs pressure: three prefixes through a pool of 10 blocks, then a hit on the first.
  std::string offload_requests;
  for (const char* doc : {"a", "b", "c"})
    offload_requests += std::string("[[prefix]]\nname = \"") + doc + "\"\nlength = 24\n";
  int arrival = 0;
  for (const char* doc : {"a", "b", "c", "a"}) {
    offload_requests += std::string("[[request]]\narrival_step = ") + std::to_string(arrival) + "\nprefixes = [\"" + doc +
                        "\"]\ngenerated = 4\ndecode_tokens = 4\n";
    arrival += 8;
  }
  struct Structure {
    const char* name;
    std::function<void(ScenarioText&)> apply;
  };
  const std::vector<Structure> structures = {
      {"two requests", [&](ScenarioText& t) { t.tail = two_requests; }},
      {"chunks of 8", [&](ScenarioText& t) { t.set("[scheduler]", "chunk_size = 8\n").tail = two_requests; }},
      {"cyclic window with sinks",
       [&](ScenarioText& t) {
         t.set("[window]", "mode = \"cyclic\"\nwindow = 13\nsinks = 3\none_more_block = true\n")
             .set("[scheduler]", "chunk_size = 4\n")
             .tail = two_requests;
       }},
      {"release window",
       [&](ScenarioText& t) { t.set("[window]", "mode = \"release\"\nwindow = 12\n").tail = two_requests; }},
      {"prefix reuse, partial copies",
       [&](ScenarioText& t) { t.set("[reuse]", "enabled = true\npartial = true\n").tail = shared_prefix; }},
      {"prefix reuse with offload",
       [&](ScenarioText& t) {
         t.set("[cache]", "primary_blocks = 10\nsecondary_blocks = 16\n")
             .set("[reuse]", "enabled = true\noffload = true\n")
             .tail = offload_requests;
       }},
      {"[layers] hybrid, reuse",
       [&](ScenarioText& t) {
         t.set("[model]", "layers = 4\n")
             .set("[layers]", "windows = [12, 0]\nallocation = \"hybrid\"\n")
             .set("[reuse]", "enabled = true\n")
             .set("[scheduler]", "chunk_size = 8\n")
             .tail = shared_prefix;
       }},
      {"[layers] vswa cyclic",
       [&](ScenarioText& t) {
         t.set("[model]", "layers = 2\n")
             .set("[layers]", "windows = [16, 0]\nallocation = \"vswa\"\nrule = \"cyclic\"\none_more_block = true\n")
             .set("[scheduler]", "chunk_size = 8\n")
             .tail = two_requests;
       }},
      {"[recurrent] with reuse",
       [&](ScenarioText& t) {
         // fault_snapshot_off_block_boundary's shape: chunks of 24 over pages of 16 cross boundaries.
         t.set("[recurrent]", "layers = 2\nstate_size = 16\n")
             .set("[cache]", "page_size = 16\n")
             .set("[reuse]", "enabled = true\n")
             .set("[scheduler]", "chunk_size = 24\n")
             .tail = "[[prefix]]\nname = \"p\"\nlength = 64\n[[request]]\nprefixes = [\"p\"]\ngenerated = 20\n"
                     "decode_tokens = 4\n[[request]]\narrival_step = 12\nprefixes = [\"p\"]\ngenerated = 30\n"
                     "decode_tokens = 4\n";
       }},
      {"fp8 queries",
       [&](ScenarioText& t) {
         t.set("[model]", "query_dtype = \"fp8_e5m2\"\nq_scale = 0.01\n").set("[scheduler]", "chunk_size = 8\n").tail =
             two_requests;
       }},
      {"NaN-poisoned pools",
       [&](ScenarioText& t) { t.set("[cache]", "poison_nan = true\n").tail = two_requests; }},
      {"MLA attention and indexer",
       [&](ScenarioText& t) {
         t.set("[mla]", "enabled = true\nd_ckv = 64\nd_kpe = 16\nattention = true\n")
             .set("[indexer]", "k_scatter = true\n")
             .set("[cache]", "block_order = \"highest\"\nprimary_blocks = 16\n")
             .set("[scheduler]", "chunk_size = 8\n")
             .tail = two_requests;
       }},
      {"wide split-x heads",
       [&](ScenarioText& t) {
         t.set("[model]", "q_heads = 34\nkv_heads = 34\nhead_dim = 128\n").tail =
             "[[request]]\ngenerated = 20\ndecode_tokens = 2\n[[request]]\ngenerated = 9\ndecode_tokens = 2\n";
       }},
  };
  struct CacheKind {
    const char* dtype;
    const char* scales;
  };
  const CacheKind dtypes[] = {{"bf16", ""},
                              {"fp16", ""},
                              {"fp8_e4m3", "k_scale = 0.25\nv_scale = 0.125\n"},
                              {"int8", "k_scale = 0.05\nv_scale = 0.025\n"},
                              {"nvfp4", "k_global_scale = 0.01\nv_global_scale = 0.005\n"}};
  const std::pair<const char*, const char*> layouts[] = {
      {"nhd", "qkv_preprocess"}, {"hnd", "append_paged"}, {"split-x", "reshape_and_cache"}};

  int replayed = 0, rejected = 0, with_fault = 0;
  std::set<std::string> faults_replayed;
  double seconds = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (const Structure& st : structures)
    for (const CacheKind& kind : dtypes)
      for (const auto& layout_and_path : layouts) {  // no structured binding: INFO captures it (clang 14)
        const char* const layout = layout_and_path.first;
        const char* const write_path = layout_and_path.second;
        ScenarioText base;
        const bool float_cache = std::string(kind.dtype) == "bf16" || std::string(kind.dtype) == "fp16";
        base.set("[model]", std::string("layers = 2\nq_heads = 4\nkv_heads = 2\nhead_dim = 32\ninput_dtype = \"") +
                                (float_cache ? kind.dtype : "bf16") + "\"\n");
        base.set("[cache]", std::string("dtype = \"") + kind.dtype + "\"\nlayout = \"" + layout +
                                "\"\nwrite_path = \"" + write_path + "\"\npage_size = 4\n" + kind.scales);
        st.apply(base);
        if (base.sections["[cache]"].find("primary_blocks") == std::string::npos)
          base.set("[cache]", "primary_blocks = 48\n");
        // Each key once (TOML): a structure's line replaces the base's.
        for (auto& [name, lines] : base.sections) {
          std::map<std::string, std::string> keyed;
          for (std::string_view rest = lines; !rest.empty();) {
            const size_t nl = rest.find('\n');
            const std::string line(rest.substr(0, nl));
            keyed[line.substr(0, line.find(' '))] = line;
            rest.remove_prefix(nl + 1);
          }
          lines.clear();
          for (const auto& [key, line] : keyed) lines += line + "\n";
        }
        if (base.sections.count("[mla]")) {  // the latent row sets head_dim; MLA has its own write path and heads
          base.sections["[model]"] = "layers = 2\n";
          base.sections["[cache]"] = std::string("dtype = \"") + kind.dtype + "\"\npage_size = 4\n" + kind.scales +
                                     "block_order = \"highest\"\nprimary_blocks = 16\n";
          if (std::string(layout) != "nhd") continue;
        }
        std::vector<std::optional<FaultInfo>> variants{std::nullopt};
        for (const FaultInfo& f : fault_table()) variants.push_back(f);
        for (const std::optional<FaultInfo>& fault : variants) {
          ScenarioText t = base;
          if (fault)
            t.set("[faults]", std::string(fault->name) + " = true\n")
                .set("[expect]", "must_catch = [\"" + std::string(fault->name) + "\"]\n");
          if (!validates(t.str())) {
            ++rejected;
            continue;
          }
          // must_pass: every invariant validation accepts for this scenario.
          std::vector<std::string_view> must_pass;
          for (const InvariantInfo& i : invariant_table()) {
            ScenarioText one = t;
            one.set("[expect]", "must_pass = [\"" + std::string(i.name) + "\"]\n");
            if (validates(one.str())) must_pass.push_back(i.name);
          }
          t.set("[expect]", "must_pass = " + quoted_list(must_pass) + "\n");
          const std::string text = t.str();
          INFO(std::string(st.name) << ", " << std::string(kind.dtype) << " " << std::string(layout) << " " << std::string(write_path) << ", fault "
                       << (fault ? std::string(fault->name) : "none") << ":\n" << text);
          Scenario s;
          try {
            s = parse_scenario(text, "sweep.toml");
          } catch (const ValidationError& e) {
            FAIL_CHECK("each must_pass validated alone but not together: " << std::string(e.what()));
            continue;
          }
          ScenarioReport r;
          try {
            r = replay(s, *cpu);
          } catch (const std::exception& e) {
            FAIL_CHECK("validated, then the replay threw: " << std::string(e.what()));
            continue;
          }
          INFO(failure_details(r));
          CHECK(r.ok);
          ++replayed;
          if (fault) {
            ++with_fault;
            faults_replayed.insert(std::string(fault->name));
          }
        }
      }
  seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE(replayed << " validated combinations replayed with every invariant (" << with_fault << " with a fault), "
                   << rejected << " rejected by validation, " << seconds << " s");
  CHECK(replayed >= 150);
  CHECK(rejected > 0);
  // Every fault is switched on somewhere the sweep reaches.
  for (const FaultInfo& f : fault_table()) {
    INFO("fault " << std::string(f.name) << " never validated in the sweep");
    CHECK(faults_replayed.count(std::string(f.name)) == 1);
  }
}
