// kvsim bench: runs every op of SPEC §5 and reports consistent numbers. Speed
// itself is never asserted; the shape and arithmetic of the report are.
#include <doctest/doctest.h>

#include <array>
#include <cstdio>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

namespace {
struct Result {
  int status = -1;
  std::string out;
};
Result run(const std::string& args) {
  const std::string cmd = std::string("'") + KVSIM_BINARY + "' " + args + " 2>&1";
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

TEST_CASE("kvsim bench --json measures every op with the copy bandwidth of the same run") {
  const Result r = run("bench --backend cpu --threads 1 --threads 2 --sequences 3 --tokens 37 --min-seconds 0 --json");
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["backend"] == "cpu");
  const std::set<std::string> expected{"append_paged",      "reshape_and_cache", "qkv_preprocess_write",
                                       "append_mla",        "indexer_k_scatter", "gather_paged",
                                       "decode_attention",  "prefill_attention", "partial_copy",
                                       "copy_blocks",       "offload",           "onboard",
                                       "scenario_replay"};
  std::set<std::string> seen[3];
  for (const auto& row : j["results"]) {
    const int threads = row["threads"];
    REQUIRE((threads == 1 || threads == 2));
    seen[threads].insert(row["op"].get<std::string>());
    const double seconds = row["seconds"], bytes = row["bytes"], gbs = row["gb_per_s"], copy = row["copy_gb_per_s"];
    CHECK(seconds > 0);
    CHECK(bytes > 0);
    CHECK(gbs == doctest::Approx(bytes / seconds / 1e9));
    CHECK(copy > 0);
    CHECK(double(row["fraction_of_copy"]) == doctest::Approx(gbs / copy));
    CHECK(double(row["tokens_per_s"]) > 0);
  }
  CHECK(seen[1] == expected);
  CHECK(seen[2] == expected);
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
    CHECK(r.out.find("ms/call") == std::string::npos);
  }
}
