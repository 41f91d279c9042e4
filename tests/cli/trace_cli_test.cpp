// `kvsim trace stats|import` and `kvsim run --trace` end to end
// (cli/cmd_trace.cpp, cli/trace_options.cpp): the --json object, the imported
// file `kvsim validate` accepts, a trace window replayed with every
// invariant, bad input rejected by name (exit 2, nothing on stdout), and
// `kvsim events check|replay` with their exit codes.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "../support/shell_command.hpp"

namespace {

using Result = kvsim::test::ShellResult;

Result run(const std::string& args) { return kvsim::test::run_shell(std::string(KVSIM_BINARY) + " " + args); }

std::string temp_file(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / name;
  std::ofstream(path) << text;
  return path.string();
}

const std::string kTrace = std::string(KVSIM_SOURCE_DIR) + "/traces/mooncake_synthetic_trace.jsonl";

// Three requests, the second sharing two 512-token blocks with the first.
const char* kSmall =
    "{\"timestamp\": 0, \"input_length\": 1100, \"output_length\": 64, \"hash_ids\": [1, 2, 3]}\n"
    "{\"timestamp\": 120, \"input_length\": 1100, \"output_length\": 32, \"hash_ids\": [1, 2, 4]}\n"
    "{\"timestamp\": 260, \"input_length\": 700, \"output_length\": 1, \"hash_ids\": [5, 6]}\n";

}  // namespace

TEST_CASE("trace stats --json: the reuse of a small trace at two capacities") {
  const std::string f = temp_file("kvsim_trace_cli_small.jsonl", kSmall);
  const Result r = run("trace stats " + f + " --capacity-tokens 512,100000 --json 2>/dev/null");
  REQUIRE(r.code == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j["requests"] == 3);
  CHECK(j["prompt_tokens"] == 2900);
  CHECK(j["block_size"] == 512);
  CHECK(j["unbounded"]["hit_tokens"] == 1024);
  REQUIRE(j["capacities"].size() == 2);
  CHECK(j["capacities"][0]["blocks"] == 1);
  CHECK(j["capacities"][0]["unfit_requests"] == 3);
  CHECK(j["capacities"][0]["hit_tokens"] == 0);
  CHECK(j["capacities"][1]["hit_tokens"] == 1024);
  CHECK(j["capacities"][1]["fraction_of_max"] == 1.0);
  // 16-token cache pages: the two shared blocks are 64 pages; the third trace block differs.
  const Result p16 = run("trace stats " + f + " --block-size 16 --capacity-tokens 100000 --json 2>/dev/null");
  REQUIRE(p16.code == 0);
  CHECK(nlohmann::json::parse(p16.out)["unbounded"]["hit_tokens"] == 1024);
}

TEST_CASE("trace import writes a scenario kvsim validate accepts; run --trace replays it with every invariant") {
  const std::string f = temp_file("kvsim_trace_cli_small.jsonl", kSmall);
  const std::string out = (std::filesystem::temp_directory_path() / "kvsim_trace_cli_import.toml").string();
  std::filesystem::remove(out);
  REQUIRE(run("trace import " + f + " --scale 1/32 --page-size 8 -o " + out + " 2>&1").code == 0);
  const Result v = run("validate " + out + " 2>&1");
  CHECK(v.code == 0);
  CHECK(v.out.find(": ok (3 requests, 92 prompt + 4 decode tokens") != std::string::npos);
  const Result rr = run("run --json --trace " + f + " --scale 1/32 --page-size 8 2>/dev/null");
  REQUIRE(rr.code == 0);
  const nlohmann::json j = nlohmann::json::parse(rr.out);
  REQUIRE(j["scenarios"].size() == 1);
  CHECK(j["scenarios"][0]["name"] == "kvsim_trace_cli_small_r0-2");
  CHECK(j["scenarios"][0]["reuse_hit_tokens"] == 32);  // the two shared blocks, 16 tokens each at 1/32
  CHECK(j["scenarios"][0]["ok"] == true);
  CHECK(j["scenarios"][0]["invariants"]["reuse"] == "pass");
  CHECK(j["scenarios"][0]["invariants"]["conservation"] == "pass");
}

TEST_CASE("trace import --model PRESET: the scenario names the model preset; a bad name or both model flags exit 2") {
  const std::string f = temp_file("kvsim_trace_cli_small.jsonl", kSmall);
  const std::string out = (std::filesystem::temp_directory_path() / "kvsim_trace_cli_preset.toml").string();
  std::filesystem::remove(out);
  REQUIRE(run("trace import " + f + " --scale 1/32 --page-size 8 --model llama-3.1-8b -o " + out + " 2>&1").code == 0);
  std::ifstream in(out);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text.find("# [model] from --model llama-3.1-8b\n[model]\npreset = \"llama-3.1-8b\"\n") != std::string::npos);
  const Result v = run("validate " + out + " 2>&1");
  CHECK(v.code == 0);
  CHECK(v.out.find(": ok (3 requests, 92 prompt + 4 decode tokens") != std::string::npos);
  Result r = run("trace import " + f + " --scale 1/32 --model llama-9 2>&1");
  CHECK(r.code == 2);
  CHECK(r.out.rfind("kvsim: error: bad_argument: --model = 'llama-9': expected one of llama-3.1-8b, ", 0) == 0);
  const std::string m = temp_file("kvsim_trace_cli_model.toml", "[model]\nlayers = 2\n");
  r = run("trace import " + f + " --scale 1/32 --model llama-3.1-8b --model-toml " + m + " 2>&1");
  CHECK(r.code == 2);
  CHECK(r.out == "kvsim: error: bad_argument: --model and --model-toml: expected one of them, got both\n");
}

TEST_CASE("a window of the Mooncake trace replays with every invariant under pool pressure") {
  const Result r = run("run --json --trace " + kTrace + " --requests 56:62 --scale 1/32 --step-ms 100 --primary-blocks 40 2>/dev/null");
  REQUIRE(r.code == 0);
  const nlohmann::json s = nlohmann::json::parse(r.out)["scenarios"][0];
  CHECK(s["reuse_hit_tokens"] == 448);
  CHECK(s["evicted_blocks"].get<int>() > 0);
  CHECK(s["ok"] == true);
}

TEST_CASE("one cache set-up of a Mooncake window checks all eleven invariants: [layers] with an offload tier") {
  // fp8 + NaN-poisoned pages + a sliding and a full layer (vLLM hybrid) + an offload tier.
  const Result r = run("run --json --trace " + kTrace +
                       " --requests 56:62 --scale 1/32 --step-ms 100 --kv-dtype fp8_e4m3 --poison-nan"
                       " --primary-blocks 64 --secondary-blocks 64 --layer-windows 256,0 2>/dev/null");
  REQUIRE(r.code == 0);
  const nlohmann::json s = nlohmann::json::parse(r.out)["scenarios"][0];
  CHECK(s["ok"] == true);
  CHECK(s["reuse_hit_tokens"] == 448);
  CHECK(s["offloaded_blocks"].get<int>() > 0);
  std::set<std::string> passed;
  for (auto it = s["invariants"].begin(); it != s["invariants"].end(); ++it)
    if (it.value() == "pass") passed.insert(it.key());
  CHECK(passed == std::set<std::string>{"batch", "chunking", "conservation", "dense", "layout", "no_nan", "offload",
                                        "quantization", "reuse", "window", "write"});
}

TEST_CASE("two cache set-ups of one Mooncake window between them check every invariant, each passing") {
  // A window of its own splits the invariants: fp8 + NaN-poisoned pages + an offload tier, then
  // fp8 + NaN-poisoned pages + sliding/full layers.
  const std::string window = "--trace " + kTrace + " --requests 56:62 --scale 1/32 --step-ms 100 --kv-dtype fp8_e4m3 --poison-nan";
  const std::string offload = window + " --primary-blocks 40 --secondary-blocks 64";
  const std::string layers = window + " --primary-blocks 64 --layer-windows 256,0";
  const Result text = run("trace import " + offload.substr(8) + " 2>&1");  // the same flags, the file positional
  REQUIRE(text.code == 0);
  for (const char* line : {"dtype = \"fp8_e4m3\"\n", "secondary_blocks = 64\n", "poison_nan = true\nzero_v_tail = true\n",
                           "offload = true\n"})
    CHECK(text.out.find(line) != std::string::npos);
  CHECK(run("trace import " + layers.substr(8) + " 2>&1").out.find("[layers]\nwindows = [256, 0]\nallocation = \"hybrid\"\n") !=
        std::string::npos);
  std::set<std::string> passed;
  for (const std::string& flags : {offload, layers}) {
    CAPTURE(flags);
    const Result r = run("run --json " + flags + " 2>/dev/null");
    REQUIRE(r.code == 0);
    const nlohmann::json s = nlohmann::json::parse(r.out)["scenarios"][0];
    CHECK(s["ok"] == true);
    CHECK(s["reuse_hit_tokens"].get<int>() > 0);
    CHECK(s["evicted_blocks"].get<int>() > 0);
    for (auto it = s["invariants"].begin(); it != s["invariants"].end(); ++it) {
      CHECK((it.value() == "pass" || it.value() == "n/a"));
      if (it.value() == "pass") passed.insert(it.key());
    }
  }
  CHECK(passed == std::set<std::string>{"batch", "chunking", "conservation", "dense", "layout", "no_nan", "offload",
                                        "quantization", "reuse", "window", "write"});
  // Bad flags: exit 2 and the flag named: the whole message, its start, or somewhere in it.
  enum class Match { whole, start, inside };
  struct BadFlag {
    const char* flags;
    std::string says;
    Match match;
  };
  for (const BadFlag& f : {BadFlag{"--secondary-blocks 2147483647",
                                   "kvsim: error: bad_argument: --secondary-blocks = '2147483647': out of range: must be "
                                   "in [0, 2147483646]\n",
                                   Match::whole},
                           BadFlag{"--kv-dtype fp9", "kvsim: error: bad_argument: --kv-dtype = 'fp9': expected fp32,",
                                   Match::start},
                           BadFlag{"--layer-windows 256,-1",
                                   "--layer-windows entry 1 = '-1': out of range: must be in [0, 2147483647]", Match::inside}}) {
    CAPTURE(f.flags);
    const Result r = run("trace import " + kTrace + " --requests 0:2 " + f.flags + " 2>&1");
    CHECK(r.code == 2);
    if (f.match == Match::whole) CHECK(r.out == f.says);
    if (f.match == Match::start) CHECK(r.out.rfind(f.says, 0) == 0);
    if (f.match == Match::inside) CHECK(r.out.find(f.says) != std::string::npos);
  }
}

TEST_CASE("trace schedule (metadata only) reports the counters kvsim run reports for the same window") {
  const std::string window = kTrace + " --requests 56:62 --scale 1/32 --step-ms 100 --primary-blocks 32";
  const Result full = run("run --json --trace " + window + " 2>/dev/null");
  REQUIRE(full.code == 0);
  const nlohmann::json r = nlohmann::json::parse(full.out)["scenarios"][0];
  const Result meta = run("trace schedule --json " + window + " 2>/dev/null");
  REQUIRE(meta.code == 0);
  const nlohmann::json m = nlohmann::json::parse(meta.out);
  for (const char* k : {"steps", "prefill_tokens", "decode_tokens", "reuse_hit_tokens", "evicted_blocks", "preemptions"}) {
    CAPTURE(k);
    CHECK(m[k] == r[k]);
  }
  CHECK(m["evicted_blocks"].get<int>() > 0);
  CHECK(m["peak_blocks_in_use"].get<int>() <= 32);
  CHECK(m["peak_blocks_in_use"].get<int>() > 0);
  CHECK(m["finished"] == true);
}

TEST_CASE("bad trace input: exit 2, the error named, nothing on stdout") {
  const std::string bad = temp_file("kvsim_trace_cli_bad.jsonl",
                                    std::string(kSmall) + "{\"timestamp\": 300, \"input_length\": 10, \"output_length\": 1}\n");
  Result r = run("trace stats " + bad + " --capacity-tokens 4096 2>&1 >/dev/null");
  CHECK(r.code == 2);
  CHECK(r.out == "kvsim: error: bad_trace: " + bad +
                     ":4: hash_ids: expected an array of integers >= 0, got nothing (field missing)\n");
  CHECK(run("trace stats " + bad + " --capacity-tokens 4096 2>/dev/null").out.empty());
  CHECK(run("run --trace " + bad + " 2>/dev/null").code == 2);
  const std::string f = temp_file("kvsim_trace_cli_small.jsonl", kSmall);
  r = run("trace stats " + f + " --capacity-tokens 100 2>&1");
  CHECK(r.code == 2);
  CHECK(r.out == "kvsim: error: bad_argument: --capacity-tokens: 100 tokens hold no block of 512 tokens (expected >= 512)\n");
  r = run("trace import " + f + " --scale 0.3 2>&1");
  CHECK(r.code == 2);
  CHECK(r.out.rfind("kvsim: error: bad_argument: --scale = 0.300000: expected a factor that turns", 0) == 0);
  r = run("trace import " + f + " --requests 7:9 2>&1");
  CHECK(r.code == 2);
  CHECK(r.out.find("holds no request") != std::string::npos);
  CHECK(run("trace stats " + f + " 2>/dev/null").code == 2);  // --capacity-tokens is required
  CHECK(run("trace stats " + f + " --format vllm --capacity-tokens 4096 2>/dev/null").code == 2);
}

TEST_CASE("events check and replay --json: exit 0 for a consistent stream, 1 for a broken one, 2 for unreadable input") {
  const std::string stored =
      "{\"ts\": 1, \"events\": [{\"type\": \"BlockStored\", \"block_hashes\": [1, 2], \"parent_block_hash\": null, "
      "\"token_ids\": [1, 2, 3, 4], \"block_size\": 2, \"lora_id\": null, \"medium\": \"GPU\", \"lora_name\": null}]}\n";
  const std::string good = temp_file("kvsim_events_cli_good.jsonl", stored);
  Result r = run("events check --json " + good + " 2>/dev/null");
  CHECK(r.code == 0);
  nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j["engine"] == "vllm");
  CHECK(j["encoding"] == "jsonl-map");
  CHECK(j["stored_blocks"] == 2);
  CHECK(j["invariants"]["removed_is_live"]["status"] == "pass");
  CHECK(j["invariants"]["sequence_contiguous"]["status"] == "n/a");
  CHECK(j["ok"] == true);
  const std::string broken = temp_file("kvsim_events_cli_broken.jsonl",
                                       stored + "{\"ts\": 2, \"events\": [{\"type\": \"BlockRemoved\", \"block_hashes\": [7]}]}\n");
  r = run("events check --json " + broken + " 2>/dev/null");
  CHECK(r.code == 1);
  j = nlohmann::json::parse(r.out);
  CHECK(j["invariants"]["removed_is_live"]["status"] == "fail");
  CHECK(j["invariants"]["removed_is_live"]["first"] == broken + ":2 batch 1 event 0: removed block 7 is not live");
  r = run("events replay --json " + good + " --capacity-blocks 8 2>/dev/null");
  CHECK(r.code == 0);
  j = nlohmann::json::parse(r.out);
  CHECK(j["replayed_stores"] == 1);
  CHECK(j["chain_tokens"] == 4);
  CHECK(j["block_size"] == 2);
  const std::string bad = temp_file("kvsim_events_cli_bad.jsonl", "{\"ts\": 1, \"events\": [{\"type\": \"BlockMoved\"}]}\n");
  r = run("events check " + bad + " 2>&1 >/dev/null");
  CHECK(r.code == 2);
  CHECK(r.out == "kvsim: error: bad_event_stream: " + bad +
                     ":1 batch 0 event 0: event tag: expected BlockStored, BlockRemoved or AllBlocksCleared, got \"BlockMoved\"\n");
  CHECK(run("events replay " + good + " 2>/dev/null").code == 2);  // --capacity-blocks is required
}
