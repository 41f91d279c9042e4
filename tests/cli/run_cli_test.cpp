// `kvsim run` end to end (cli/cmd_run.cpp): the --json object's exact
// shape (docs/run.md), the terminal table and its throughput line, and the
// exit codes: 0 all ok, 1 a failed invariant or expectation, 2 bad input.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>
#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include "../support/sanitizer.hpp"
#include "../support/shell_command.hpp"

namespace {

using Result = kvsim::test::ShellResult;

Result run(const std::string& args) {
  return kvsim::test::run_shell(std::string(KVSIM_BINARY) + " " + args + " 2>/dev/null");
}

std::string scenario(const std::string& name) { return std::string(KVSIM_SOURCE_DIR) + "/scenarios/" + name; }

std::string write_temp(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / name;
  std::ofstream(path) << text;
  return path.string();
}

}  // namespace

TEST_CASE("kvsim run --json: one object of the documented shape, exit 0") {
  const Result r = run("run --json " + scenario("chunked_prefill_page_one.toml") + " " +
                       scenario("fault_past_len_zero.toml"));
  CHECK(r.code == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j.size() == 2);
  CHECK(j.at("ok") == true);
  REQUIRE(j.at("scenarios").size() == 2);
  const std::vector<std::string> keys{"decode_tokens",    "evicted_blocks",   "failures",
                                      "invariants",       "name",             "offloaded_blocks",
                                      "ok",               "onboarded_blocks", "partial_reuse_tokens",
                                      "preemptions",      "prefill_tokens",   "reuse_hit_tokens",
                                      "steps"};
  for (const auto& s : j["scenarios"]) {
    std::vector<std::string> got;
    for (const auto& [k, v] : s.items()) got.push_back(k);
    CHECK(got == keys);
    for (const char* k : {"steps", "prefill_tokens", "decode_tokens", "reuse_hit_tokens", "partial_reuse_tokens",
                          "evicted_blocks", "offloaded_blocks", "onboarded_blocks", "preemptions"})
      CHECK(s[k].is_number_integer());
    for (const auto& [name, status] : s["invariants"].items())
      CHECK((status == "pass" || status == "fail" || status == "caught"));
    CHECK(s["failures"] == nlohmann::json::array());  // ok: no reason to give
  }
  CHECK(j["scenarios"][0]["name"] == "chunked_prefill_page_one");
  CHECK(j["scenarios"][0]["invariants"]["conservation"] == "pass");
  CHECK(j["scenarios"][1]["invariants"]["chunking"] == "caught");
}

TEST_CASE("kvsim run: the table and the throughput line") {
  const Result r = run("run --threads 2 " + scenario("chunked_prefill_page_one.toml"));
  CHECK(r.code == 0);
  CHECK(r.out.find("scenario") == 0);
  CHECK(r.out.find("chunked_prefill_page_one") != std::string::npos);
  CHECK(r.out.find("token-layers/s") != std::string::npos);
  CHECK(r.out.find("all ok") != std::string::npos);
}

TEST_CASE("kvsim run: exit 1 when an expectation fails, 2 for bad input") {
  const std::string unmet = write_temp("kvsim_run_unmet.toml",
                                       "[[request]]\nid = \"a\"\ngenerated = 9\n\n[expect]\npreemptions = 3\n");
  const Result r1 = run("run --json " + unmet);
  CHECK(r1.code == 1);
  const nlohmann::json j = nlohmann::json::parse(r1.out);
  CHECK(j["ok"] == false);
  CHECK(j["scenarios"][0]["ok"] == false);

  const std::string bad = write_temp("kvsim_run_bad.toml", "[cache]\npage_size = \"sixteen\"\n");
  CHECK(run("run " + bad).code == 2);
  CHECK(run("run /nonexistent/scenario.toml").code == 2);
  CHECK(run("run --threads -1 " + scenario("chunked_prefill_page_one.toml")).code == 2);
  CHECK(run("run --threads 0 " + scenario("chunked_prefill_page_one.toml")).code == 2);
  CHECK(run("run --threads 010 " + scenario("chunked_prefill_page_one.toml")).code == 2);
  const Result empty_dump = run("run --dump '' " + scenario("chunked_prefill_page_one.toml"));
  CHECK(empty_dump.code == 2);
  CHECK(empty_dump.out.empty());  // a rejection prints nothing on stdout
  CHECK(run("run --backend nosuch " + scenario("chunked_prefill_page_one.toml")).code == 2);
}

TEST_CASE("kvsim run --dump: files numpy can load and a manifest") {
  const auto dir = std::filesystem::temp_directory_path() / "kvsim_run_dump";
  std::filesystem::remove_all(dir);
  const Result r = run("run --dump " + dir.string() + " " + scenario("chunked_prefill_page_one.toml"));
  CHECK(r.code == 0);
  std::ifstream m(dir / "manifest.json");
  REQUIRE(m.good());
  const nlohmann::json j = nlohmann::json::parse(m);
  CHECK(j["files"].size() > 2);
  // What another kernel needs, per op: inputs, tables, positions, slots, scales (this scenario writes with
  // append_paged).
  std::set<std::string> names;
  for (const auto& f : j["files"]) names.insert(f["file"].get<std::string>());
  INFO(j.dump());
  for (const char* k : {"prefill_attention_q.npy", "prefill_attention_out.npy", "prefill_attention_block_table.npy",
                        "prefill_attention_seq_lens.npy", "prefill_attention_q_indptr.npy",
                        "prefill_attention_positions.npy", "prefill_attention_scales.npy", "append_paged_k.npy",
                        "append_paged_v.npy", "append_paged_block_table.npy", "append_paged_cache_lens.npy",
                        "append_paged_positions.npy", "append_paged_slots.npy", "append_paged_indptr.npy",
                        "append_paged_batch_indices.npy", "append_paged_scales.npy"})
    CHECK(names.count(std::string("step0_layer0_") + k) == 1);
  for (const auto& f : j["files"]) {
    CHECK(f.contains("step"));
    CHECK(f.contains("op"));
    CHECK(f.contains("layer"));
    CHECK(f.contains("dtype"));
    CHECK(f.contains("shape"));
    // The .npy format numpy.load reads (version 1.0): magic, header length,
    // a dict padded so the data starts at a multiple of 64, then the data.
    std::ifstream npy(dir / f["file"].get<std::string>(), std::ios::binary);
    REQUIRE(npy.good());
    std::string bytes((std::istreambuf_iterator<char>(npy)), std::istreambuf_iterator<char>());
    REQUIRE(bytes.size() > 10);
    CHECK(bytes.substr(0, 8) == std::string("\x93NUMPY\x01\x00", 8));
    const size_t header_len = static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8);
    CHECK((10 + header_len) % 64 == 0);
    const std::string header = bytes.substr(10, header_len);
    CHECK(header.back() == '\n');
    std::string shape = "(";
    int64_t elements = 1;
    for (size_t i = 0; i < f["shape"].size(); ++i) {
      shape += std::to_string(f["shape"][i].get<int64_t>()) + (f["shape"].size() == 1 || i + 1 < f["shape"].size() ? "," : "");
      elements *= f["shape"][i].get<int64_t>();
    }
    shape += ")";
    CHECK(header.find("'shape': " + shape) != std::string::npos);
    CHECK(header.find("'fortran_order': False") != std::string::npos);
    size_t item = 1;
    for (const auto& [descr, bytes_per] : {std::pair<const char*, size_t>{"<f4", 4}, {"<i4", 4}, {"<i8", 8}, {"<u2", 2}, {"<f2", 2}})
      if (header.find(descr) != std::string::npos) item = bytes_per;
    CHECK(bytes.size() - 10 - header_len == static_cast<size_t>(elements) * item);
  }
  std::filesystem::remove_all(dir);
}

namespace {
Result run_with_stderr(const std::string& shell_prefix, const std::string& args) {
  return kvsim::test::run_shell(shell_prefix + std::string(KVSIM_BINARY) + " " + args + " 2>&1");
}

// Llama-3.1-8B's KV geometry, per-layer bf16 pools of `blocks` pages: the
// last layers' bytes lie beyond 2^32 once blocks x 32 layers x 64 KiB > 4 GiB.
// block_order = "highest": the request's blocks are the pool's last ones; with 2304 blocks the 32
// layers' stack holds 2.4e9 elements, so the upper layers' tokens sit past 2^31 (64-bit offsets).
std::string big_pool_scenario(const std::string& name, int blocks) {
  return write_temp(name, "[model]\nlayers = 32\nq_heads = 32\nkv_heads = 8\nhead_dim = 128\n\n[cache]\n"
                          "placement = \"per_layer\"\nlayout = \"hnd\"\nblock_order = \"highest\"\nprimary_blocks = " +
                              std::to_string(blocks) + "\n\n[[request]]\ngenerated = 40\ndecode_tokens = 2\n");
}
}  // namespace

TEST_CASE("kvsim run --invariants: only the listed invariants run, the others are reported skipped") {
  Result r = run("run --json --invariants dense,quantization " + scenario("quant_int8.toml"));
  CHECK(r.code == 0);
  nlohmann::json j = nlohmann::json::parse(r.out);
  const nlohmann::json inv = j["scenarios"][0]["invariants"];
  CHECK(inv["dense"] == "pass");
  CHECK(inv["quantization"] == "pass");
  CHECK(inv["chunking"] == "skipped");
  CHECK(inv["layout"] == "skipped");
  CHECK_FALSE(inv.contains("reuse"));  // the scenario would not check it anyway
  // none: nothing compared, and the scenario's must_pass / must_catch about them are left out too.
  r = run("run --invariants none " + scenario("fault_past_len_zero.toml"));
  CHECK(r.code == 0);
  CHECK(r.out.find("0/0 pass, 4 skipped") != std::string::npos);
  r = run_with_stderr("", "run --invariants dense,chunkin " + scenario("quant_int8.toml"));
  CHECK(r.code == 2);
  CHECK(r.out.find("bad_argument: --invariants = 'dense,chunkin': unknown invariant 'chunkin'") != std::string::npos);
}

TEST_CASE("kvsim run: a scenario larger than the memory left is refused by name before anything is allocated") {
  // 3 GiB of pools validate (no size cap), then do not fit under ulimit -v of 2 GB.
  const std::string file = big_pool_scenario("kvsim_run_too_big.toml", 1536);
  const Result v = run("validate " + file);
  CHECK(v.code == 0);
  if (kAddressSanitizer) {
    MESSAGE("skipped the ulimit -v run: it cannot start under AddressSanitizer");
    return;
  }
  const Result r = run_with_stderr("ulimit -v 2000000; ", "run " + file);
  CHECK(r.code == 2);
  CHECK(r.out.find("kvsim: error: insufficient_memory: kvsim_run_too_big: the replay needs about 3.") == 0);
  CHECK(r.out.find("of host memory, ") != std::string::npos);
  CHECK(r.out.find("shrink cache.primary_blocks") != std::string::npos);
  CHECK(r.out.find("bad_alloc") == std::string::npos);
}

TEST_CASE("kvsim run: pools beyond 4 GiB replay (KVSIM_LARGE_POOL_TEST=1; scripts/gpu-check.sh sets it)") {
  // The first block handed out (block_order = "highest"), in the last layer, lies past 2^31 elements.
  const Result where = run("explain --json --layers 32 --kv-heads 8 --head-dim 128 --placement per_layer --layout hnd "
                           "--blocks 2304 --block-table 2303 --token 0 --layer 31");
  REQUIRE(where.code == 0);
  CHECK(nlohmann::json::parse(where.out)["k_offset"].get<int64_t>() > (int64_t{1} << 31));
  const char* on = std::getenv("KVSIM_LARGE_POOL_TEST");
  if (!on || std::string(on) != "1") {
    MESSAGE("skipped: set KVSIM_LARGE_POOL_TEST=1 to replay 4.5 GiB of pools (needs ~5 GiB free)");
    return;
  }
  const char* backend = std::getenv("KVSIM_LARGE_POOL_BACKEND");
  const std::string file = big_pool_scenario("kvsim_run_large_pool.toml", 2304);  // 4.5 GiB
  const Result r = run("run --json --invariants conservation,dense,chunking --backend " +
                       std::string(backend ? backend : "cpu") + " " + file);
  CHECK(r.code == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j["scenarios"][0]["invariants"]["dense"] == "pass");
  CHECK(j["scenarios"][0]["invariants"]["chunking"] == "pass");
}

TEST_CASE("kvsim run --backend reference replays like the cpu backend: same counters, same invariant outcomes") {
  const std::string files = scenario("prefix_reuse_offload_onboard.toml") + " " + scenario("fault_past_len_zero.toml");
  const Result reference = run("run --json --backend reference " + files);
  const Result cpu = run("run --json --backend cpu " + files);
  CHECK(reference.code == cpu.code);
  CHECK(nlohmann::json::parse(reference.out) == nlohmann::json::parse(cpu.out));
  CHECK(nlohmann::json::parse(reference.out)["scenarios"].size() == 2);
}

TEST_CASE("kvsim run --json: a failed scenario gives every reason, each with what was expected and what came") {
  const std::string unmet =
      write_temp("kvsim_run_reasons.toml",
                 "[scheduler]\nmax_steps = 3\n\n[[request]]\nid = \"a\"\ngenerated = 9\ndecode_tokens = 6\n\n"
                 "[expect]\npreemptions = 2\nevicted_blocks = 1\n");
  const Result r = run("run --json " + unmet);
  CHECK(r.code == 1);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const nlohmann::json& f = j["scenarios"][0]["failures"];
  INFO(f.dump());
  auto reason = [&](const std::string& expectation) {
    for (const auto& x : f)
      if (x.value("expectation", "") == expectation) return x;
    FAIL("no failure for " << expectation);
    return nlohmann::json();
  };
  CHECK(reason("evicted_blocks") == nlohmann::json{{"kind", "expectation"}, {"expectation", "evicted_blocks"},
                                                   {"expected", 1}, {"got", 0},
                                                   {"message", "expected evicted_blocks = 1, got 0"}});
  CHECK(reason("preemptions")["expected"] == 2);
  CHECK(reason("preemptions")["got"] == 0);
  const nlohmann::json steps = reason("max_steps");
  CHECK(steps["kind"] == "max_steps");
  CHECK(steps["expected"] == 3);
  CHECK(steps["got"] == 3);
  CHECK(steps["message"] == "did not finish within scheduler.max_steps = 3");
  for (const auto& x : f) CHECK((x["kind"] == "expectation" || x["kind"] == "max_steps" || x["kind"] == "invariant"));
}

TEST_CASE("kvsim run: the table counts onboarded blocks") {
  const Result r = run("run " + scenario("prefix_reuse_offload_onboard.toml"));
  CHECK(r.code == 0);
  const size_t header = r.out.find("offld  onbrd  preem");
  CHECK(header != std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(run("run --json " + scenario("prefix_reuse_offload_onboard.toml")).out);
  const int64_t onboarded = j["scenarios"][0]["onboarded_blocks"];
  CHECK(onboarded > 0);
  // The row's cells: name, steps, prefill, decode, reused, evict, offld, onbrd, preem, ...
  const size_t row = r.out.find("\nprefix_reuse_offload_onboard");
  REQUIRE(row != std::string::npos);
  std::istringstream cells(r.out.substr(row + 1, r.out.find('\n', row + 1) - row - 1));
  std::vector<std::string> cell;
  for (std::string c; cells >> c;) cell.push_back(c);
  REQUIRE(cell.size() > 8);
  CHECK(std::stoll(cell[7]) == onboarded);
}

TEST_CASE("kvsim run --dump: block moves, MLA attention and the indexer scatter are dumped too") {
  const auto dir = std::filesystem::temp_directory_path() / "kvsim_run_dump_moves";
  std::filesystem::remove_all(dir);
  const std::vector<std::string> names{"prefix_reuse_offload_onboard", "prefix_reuse_partial_copy",
                                       "mla_attention_128_heads", "mla_indexer_k_scatter"};
  std::string files;
  for (const std::string& n : names) files += " " + scenario(n + ".toml");
  REQUIRE(run("run --dump " + dir.string() + files).code == 0);
  const nlohmann::json counts = nlohmann::json::parse(run("run --json" + files).out);
  // Per scenario: how many files of each op, and the shape of each block move's ids.
  auto files_of = [&](const std::string& scenario_name) {
    std::ifstream m(dir / scenario_name / "manifest.json");
    REQUIRE(m.good());
    std::map<std::string, int> per_op;
    const nlohmann::json manifest = nlohmann::json::parse(m);  // kept: a loop over parse(m)["files"] would dangle
    for (const auto& f : manifest["files"]) {
      const std::string op = f["op"];
      ++per_op[op];
      if (op == "partial_copy" || op == "offload" || op == "onboard") {
        CHECK(f["layer"] == -1);  // a block move has no layer
        CHECK(f["dtype"] == "int32");
      }
      if (f["file"].get<std::string>().find("partial_copy0_blocks") != std::string::npos)
        CHECK(f["shape"] == nlohmann::json::array({2}));  // [src, dst]
    }
    return per_op;
  };
  const auto moved = files_of("prefix_reuse_offload_onboard");
  // Two files (primary and secondary ids) per moved block: every offload and onboard the run counted.
  CHECK(moved.at("offload") == 2 * counts["scenarios"][0]["offloaded_blocks"].get<int>());
  CHECK(moved.at("onboard") == 2 * counts["scenarios"][0]["onboarded_blocks"].get<int>());
  CHECK(files_of("prefix_reuse_partial_copy").at("partial_copy") >= 2);
  const auto mla = files_of("mla_attention_128_heads");
  CHECK(mla.at("mla_attention") % 7 == 0);  // q, out, block_table, seq_lens, q_indptr, positions, scales per op
  CHECK(mla.at("mla_attention") > 0);
  CHECK(std::filesystem::exists(dir / "mla_attention_128_heads" / "step0_layer0_mla_attention_q.npy"));
  CHECK(std::filesystem::exists(dir / "mla_attention_128_heads" / "step0_layer0_mla_attention_scales.npy"));
  const auto indexer = files_of("mla_indexer_k_scatter");
  CHECK(indexer.at("indexer_k_scatter") % 4 == 0);  // k_fp8, k_scale and both slot mappings per op
  CHECK(std::filesystem::exists(dir / "mla_indexer_k_scatter" / "step0_layer0_indexer_k_scatter_slot_mapping_scale.npy"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("kvsim run --dump: a folder holding files is refused unless --force; repeated names get their own folders") {
  const auto dir = std::filesystem::temp_directory_path() / "kvsim_run_dump_refuse";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "old.npy") << "x";
  const Result refused =
      kvsim::test::run_shell(std::string(KVSIM_BINARY) + " run --dump " + dir.string() + " " +
                             scenario("chunked_prefill_page_one.toml") + " 2>&1");
  CHECK(refused.code == 2);
  CHECK(refused.out.find("kvsim: error: dump_not_empty: --dump " + dir.string()) == 0);
  CHECK(refused.out.find("--force") != std::string::npos);
  CHECK(!std::filesystem::exists(dir / "manifest.json"));  // nothing written
  CHECK(run("run --force --dump " + dir.string() + " " + scenario("chunked_prefill_page_one.toml")).code == 0);
  CHECK(std::filesystem::exists(dir / "manifest.json"));

  // Two files named alike in two folders: DIR/NAME and DIR/NAME-2.
  const auto other = std::filesystem::temp_directory_path() / "kvsim_run_dump_twin";
  std::filesystem::create_directories(other);
  std::filesystem::copy_file(scenario("chunked_prefill_page_one.toml"), other / "chunked_prefill_page_one.toml",
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::remove_all(dir);
  CHECK(run("run --dump " + dir.string() + " " + scenario("chunked_prefill_page_one.toml") + " " +
            (other / "chunked_prefill_page_one.toml").string())
            .code == 0);
  CHECK(std::filesystem::exists(dir / "chunked_prefill_page_one" / "manifest.json"));
  CHECK(std::filesystem::exists(dir / "chunked_prefill_page_one-2" / "manifest.json"));
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(other);
}

TEST_CASE("kvsim run on a terminal: the progress line names every run, its step, tokens/s and the time left") {
  if (std::system("command -v script > /dev/null 2>&1") != 0) {
    MESSAGE("skipped: util-linux's script (a pseudo-terminal) is not installed");
    return;
  }
  // stderr on a pseudo-terminal (script), stdout to /dev/null: what a terminal shows while it runs.
  const Result r = kvsim::test::run_shell("script -qec \"" + std::string(KVSIM_BINARY) + " run " +
                                          scenario("prefix_reuse_system_prompt.toml") + " > /dev/null\" /dev/null");
  CHECK(r.code == 0);
  INFO(r.out);
  for (const char* run : {"run 1/7 replay: step 1 of ", "run 2/7 chunking (prefill in chunks of 5): step",
                          "run 3/7 reuse (reuse off): step", "run 4/7 layout (", "run 6/7 batch (the batch in reverse order)",
                          "run 7/7 batch (request first alone)"})
    CHECK(r.out.find(std::string("prefix_reuse_system_prompt: ") + run) != std::string::npos);
  CHECK(r.out.find(" tokens/s, about ") != std::string::npos);
  CHECK(r.out.find(" left") != std::string::npos);
  // "step k of n": the scheduler's dry run (sim::planned_steps) knows n before the run, and no step passes it.
  const std::string first = "prefix_reuse_system_prompt: run 1/7 replay: step 1 of ";
  const size_t at = r.out.find(first);
  REQUIRE(at != std::string::npos);
  const long n = std::strtol(r.out.c_str() + at + first.size(), nullptr, 10);
  CHECK(n > 1);
  for (size_t p = r.out.find("replay: step "); p != std::string::npos; p = r.out.find("replay: step ", p + 1)) {
    char* end = nullptr;
    const long k = std::strtol(r.out.c_str() + p + 13, &end, 10);
    if (std::string(end, 4) == " of ") CHECK(k <= std::strtol(end + 4, nullptr, 10));
  }
  // Not a terminal: nothing on stderr.
  const Result quiet = kvsim::test::run_shell(std::string(KVSIM_BINARY) + " run " +
                                              scenario("prefix_reuse_system_prompt.toml") + " 2>&1 >/dev/null");
  CHECK(quiet.out.empty());
}
