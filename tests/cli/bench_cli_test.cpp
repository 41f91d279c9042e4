// kvsim bench: runs every op of contract §5 and reports consistent numbers. Speed
// itself is never asserted; the shape and arithmetic of the report are.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace {
struct Result {
  int status = -1;
  std::string out;
};
// env: assignments put before the command (e.g. "KVSIM_CPU_ISA=avx2").
Result run(const std::string& args, const std::string& env = "") {
  const std::string cmd = env + (env.empty() ? "" : " ") + "'" + KVSIM_BINARY + "' " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  Result r;
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}
}  // namespace

TEST_CASE("kvsim bench --json measures every op, checked against the oracle, with the copy bandwidth of the same run") {
  const Result r = run("bench --backend cpu --threads 1 --threads 2 --sequences 3 --tokens 37 --min-seconds 0 --json");
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["backend"] == "cpu");
  CHECK(j["suite"] == "small");
  const std::set<std::string> expected{"append_paged",      "reshape_and_cache", "qkv_preprocess_write",
                                       "append_mla",        "indexer_k_scatter", "gather_paged",
                                       "decode_attention",  "prefill_attention", "partial_copy",
                                       "copy_blocks",       "offload",           "onboard",
                                       "scenario_replay",   "fma_throughput"};
  std::set<std::string> seen[3];
  for (const auto& row : j["results"]) {
    INFO(row.dump());
    const int threads = row["threads"];
    REQUIRE((threads == 1 || threads == 2));
    seen[threads].insert(row["op"].get<std::string>());
    const double kernel = row["kernel_seconds"], op = row["op_seconds"], bytes = row["bytes"], gbs = row["gb_per_s"],
                 copy = row["copy_gb_per_s"];
    CHECK(kernel > 0);
    CHECK(op > 0);
    CHECK(bytes > 0);
    CHECK(int(row["launches"]) >= 5);
    CHECK(gbs == doctest::Approx(bytes / kernel / 1e9));
    CHECK(copy > 0);
    CHECK(double(row["fraction_of_copy"]) == doctest::Approx(gbs / copy));
    CHECK(row["oracle"]["ok"] == true);
    CHECK(int64_t(row["oracle"]["bytes_compared"]) > 0);
    CHECK(int64_t(row["oracle"]["bytes_differing"]) == 0);
    if (row["op"] == "fma_throughput" || row["op"] == "prefill_attention" ) {
      // FLOP rows: GFLOP/s from the counted FLOPs, quoted against the fma row (measured first).
      CHECK(double(row["gflop_per_s"]) == doctest::Approx(double(row["flops"]) / kernel / 1e9));
      CHECK(double(row["fraction_of_fma"]) > 0);
    }
  }
  CHECK(seen[1] == expected);
  CHECK(seen[2] == expected);
}

TEST_CASE("kvsim bench --list: the full suite holds issue 8's configurations") {
  const Result r = run("bench --backend cpu --suite full --list --json");
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  std::set<std::string> names;
  for (const auto& c : j["cases"]) {
    names.insert(c["name"].get<std::string>());
    CHECK(double(c["bytes"]) > 0);
  }
  for (const char* batch : {"B1 ", "B16 ", "B64 ", "B256 "})
    for (const char* ctx : {"ctx1024", "ctx8192", "ctx32768"})
      CHECK(names.count(std::string("decode_attention bf16 hnd P16 GQA32:8 D128 ") + batch + ctx) == 1);
  for (const char* name : {"decode_attention fp8_e4m3 hnd P16 GQA32:8 D128 B64 ctx8192",
                           "decode_attention nvfp4 hnd P16 GQA32:8 D128 B64 ctx8192",
                           "decode_attention bf16 hnd P16 GQA64:8 D128 B64 ctx8192",
                           "decode_attention bf16 hnd P64 GQA32:8 D128 B64 ctx8192",
                           "append_paged bf16 hnd P16 H8 D128 16x1024 tokens",
                           "reshape_and_cache bf16 split-x P16 H8 D128 16x1024 tokens",
                           "reshape_and_cache bf16 nhd P16 H8 D128 16x1024 tokens",
                           "qkv_preprocess_write nvfp4 hnd P16 GQA32:8 D128 neox 16x1024 tokens",
                           "qkv_preprocess_write fp8_e4m3 hnd P16 GQA32:8 D128 neox 16x1024 tokens",
                           "prefill_attention bf16 hnd P16 GQA32:8 D128 causal 16384 tokens",
                           "prefill_attention bf16 hnd P16 GQA32:8 D128 causal 65536 tokens",
                           "fma_throughput fp32 1048576 lanes x 8 chains x 4096 steps",
                           "copy_blocks bf16 hnd P16 H8 D128 4096 blocks"}) {
    INFO(name);
    CHECK(names.count(name) == 1);
  }
}

TEST_CASE("kvsim bench --baseline: PyTorch's time per configuration and kvsim's speed-up") {
  const std::string path = "bench_cli_test_baseline.json";
  {
    FILE* f = fopen(path.c_str(), "w");
    REQUIRE(f != nullptr);
    fputs("{\"device\": \"test\", \"torch\": \"0\", \"copy_gbs\": 1.0, \"rows\": ["
          "{\"case\": \"copy_blocks bf16 hnd P16 H8 D128 4 blocks\", \"seconds\": 2.0}]}",
          f);
    fclose(f);
  }
  const Result r = run("bench --threads 1 --sequences 3 --tokens 37 --min-seconds 0 --only copy_blocks --json --baseline " +
                       path);
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  REQUIRE(j["results"].size() == 1);
  const auto& row = j["results"][0];
  CHECK(row["name"] == "copy_blocks bf16 hnd P16 H8 D128 4 blocks");
  CHECK(double(row["torch_seconds"]) == 2.0);
  CHECK(double(row["speedup_over_torch"]) == doctest::Approx(2.0 / double(row["kernel_seconds"])));
  std::remove(path.c_str());
}

TEST_CASE("kvsim bench: option errors are named") {
  const Result sizes = run("bench --suite full --sequences 3");
  CHECK(sizes.status == 2);
  CHECK(sizes.out.find("bad_argument") != std::string::npos);
  const Result only = run("bench --sequences 3 --tokens 5 --only no-such-op");
  CHECK(only.status == 2);
  CHECK(only.out.find("--only matches no configuration") != std::string::npos);
  for (const char* args : {"--only ''", "--baseline ''", "--output ''", "--output /nonexistent/dir/report.json",
                           "--only copy_blocks --baseline /dev/null"}) {
    INFO(args);
    const std::string cmd = std::string("bench --sequences 3 --tokens 5 --threads 1 --min-seconds 0 ") + args;
    const std::string both = std::string("'") + KVSIM_BINARY + "' " + cmd + " 2>/dev/null";
    FILE* p = popen(both.c_str(), "r");
    REQUIRE(p != nullptr);
    std::string out;
    char buf[256];
    size_t n = 0;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    const int st = pclose(p);
    CHECK(WEXITSTATUS(st) == 2);
    CHECK(out.empty());  // nothing on stdout: the table never starts
    const Result r = run(cmd);
    CHECK(r.out.find("bad_argument") != std::string::npos);
  }
  {
    FILE* f = fopen("bench_cli_test_negative.json", "w");
    REQUIRE(f != nullptr);
    fputs("{\"rows\": [{\"case\": \"x\", \"seconds\": -1}]}", f);
    fclose(f);
    const Result r = run("bench --sequences 3 --tokens 5 --baseline bench_cli_test_negative.json");
    CHECK(r.status == 2);
    CHECK(r.out.find("expected a finite time > 0") != std::string::npos);
    std::remove("bench_cli_test_negative.json");
  }
  const Result baseline = run("bench --sequences 3 --tokens 5 --baseline /nonexistent.json");
  CHECK(baseline.status == 2);
  CHECK(baseline.out.find("--baseline /nonexistent.json: cannot open") != std::string::npos);
  const Result empty_scenario = run("bench --scenario ''");
  CHECK(empty_scenario.status == 2);
  CHECK(empty_scenario.out.find("bad_argument: --scenario = '': empty value") != std::string::npos);
}

TEST_CASE("kvsim bench --backend cuda: a table on a GPU machine, else a named error and no table") {
  const Result r = run("bench --backend cuda --sequences 3 --tokens 37 --min-seconds 0");
  if (r.status == 0) {  // CUDA compiled in and a device present: every op measured
    for (const char* op : {"append_paged", "decode_attention", "prefill_attention", "copy_blocks", "onboard"})
      CHECK(r.out.find(op) != std::string::npos);
  } else {  // no CUDA in this build, or no device: exit 2 before any table
    CHECK(r.status == 2);
    CHECK((r.out.find("CUDA backend not compiled") != std::string::npos ||
           r.out.find("no CUDA device") != std::string::npos));
    CHECK(r.out.find("kernel ms") == std::string::npos);
  }
}

TEST_CASE("kvsim bench --scenario: one replay per row, its wall time split into kernels and host parts") {
  const std::string file = std::string(KVSIM_SOURCE_DIR) + "/scenarios/prefix_reuse_system_prompt.toml";
  const Result r = run("bench --scenario '" + file + "' --threads 1 --json");
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  REQUIRE(j["results"].size() == 1);
  const auto& row = j["results"][0];
  INFO(row.dump());
  CHECK(row["op"] == "scenario_replay_real");
  CHECK(row["ok"] == true);
  CHECK(int(row["runs"]) > 1);  // the comparison invariants re-ran it
  CHECK(int64_t(row["token_layers_main"]) > 0);
  const double wall = row["wall_seconds"];
  double parts = 0;
  for (const auto& [name, seconds] : row["seconds"].items()) {
    CHECK(double(seconds) >= 0);
    parts += double(seconds);
  }
  CHECK(double(row["seconds"]["kernels"]) > 0);
  CHECK(double(row["seconds"]["inputs"]) > 0);
  // Every instant of the replay is charged to exactly one part.
  CHECK(parts == doctest::Approx(wall).epsilon(0.02));
  CHECK(double(row["host_fraction"]) > 0);
  CHECK(double(row["host_fraction"]) < 1);
  CHECK(int64_t(row["max_rss_bytes"]) > 0);
  // The bytes the transfers moved (uploads of every op's inputs at least).
  CHECK(double(row["transfer_bytes"]) > 0);

  // --invariants none: one run, no comparison time.
  const auto none = nlohmann::json::parse(run("bench --scenario '" + file + "' --threads 1 --invariants none --json").out);
  CHECK(int(none["results"][0]["runs"]) == 1);
  CHECK(double(none["results"][0]["seconds"]["dense"]) == 0);
  // Fewer bytes without the comparison runs and the dense check's read-backs.
  CHECK(double(none["results"][0]["transfer_bytes"]) > 0);
  CHECK(double(none["results"][0]["transfer_bytes"]) < double(row["transfer_bytes"]));

  const Result mixed = run("bench --scenario '" + file + "' --only decode");
  CHECK(mixed.status == 2);
  CHECK(mixed.out.find("--scenario") != std::string::npos);
  const Result stray = run("bench --invariants none --sequences 1 --tokens 1");
  CHECK(stray.status == 2);
  CHECK(stray.out.find("--invariants") != std::string::npos);
}

TEST_CASE("kvsim bench names the CPU ISA that ran; KVSIM_CPU_ISA forces one, same bytes at each") {
  const std::string args = "bench --backend cpu --only decode --threads 1 --sequences 1 --tokens 17 --min-seconds 0 --json";
  const Result best = run(args);
  REQUIRE(best.status == 0);
  const std::string widest = nlohmann::json::parse(best.out)["cpu_isa"].get<std::string>();
  const std::vector<std::string> isas{"portable", "avx2", "avx512"};
  const auto rank = [&](const std::string& isa) { return std::find(isas.begin(), isas.end(), isa) - isas.begin(); };
  REQUIRE(rank(widest) < 3);
  for (const std::string& isa : isas) {
    const Result r = run(args, "KVSIM_CPU_ISA=" + isa);
    INFO("KVSIM_CPU_ISA=" << isa << ": " << r.out);
    if (rank(isa) <= rank(widest)) {  // one this CPU runs: named, and the rows are the oracle's bytes
      REQUIRE(r.status == 0);
      const auto j = nlohmann::json::parse(r.out);
      CHECK(j["cpu_isa"] == isa);
      for (const auto& row : j["results"]) CHECK(row["oracle"]["ok"] == true);
    } else {  // wider than this CPU: a named error before any output
      CHECK(r.status == 2);
      CHECK(r.out.find("backend_unavailable: KVSIM_CPU_ISA = " + isa) != std::string::npos);
    }
  }
}
