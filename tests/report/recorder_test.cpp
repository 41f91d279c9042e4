// The report's recording and drawing (report/): the recorded changes add up
// to what the block manager and the replay counted, the recording of a
// 2,048-block, 500-step replay stays bounded, invariant findings are located,
// paths carry core's numbers, pages fetch nothing, and `kvsim run --report`
// writes a page per scenario and rejects an unwritable folder before running.
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sys/wait.h>

#include "backends/backend.hpp"
#include "kvsim/report/report.hpp"
#include "kvsim/sim/scenario_file.hpp"
#include "tests/support/corrupting_backend.hpp"

using namespace kvsim;
using nlohmann::json;

namespace {

struct Recorded {
  sim::Scenario scenario;
  sim::ScenarioReport report;
  report::ReplayRecorder rec;
};

void record(const std::string& path, Recorded& out) {
  out.scenario = sim::load_scenario_file(path);
  auto backend = make_backend("cpu");
  sim::ReplayOptions o;
  o.observer = &out.rec;
  out.report = sim::replay(out.scenario, *backend, o);
}

std::string builtin(const std::string& name) { return std::string(KVSIM_SOURCE_DIR) + "/scenarios/" + name + ".toml"; }

int64_t count_events(const json& doc, const std::string& kind) {
  int64_t n = 0;
  for (const json& f : doc["frames"])
    for (const json& e : f["ev"]) n += e[0] == kind;
  return n;
}

// Replays the per-step block changes and checks each frame against the pool
// counts the block manager itself reported for that step.
void check_owner_changes_match_counts(const json& doc, int64_t blocks) {
  const size_t pools = doc["pools"].get<size_t>();
  std::vector<std::vector<int32_t>> owner(pools, std::vector<int32_t>(static_cast<size_t>(blocks), report::kFree));
  std::vector<std::vector<int32_t>> holders(pools, std::vector<int32_t>(static_cast<size_t>(blocks), 0));
  for (const json& x : doc["initial"]) owner[x[0].get<size_t>()][x[1].get<size_t>()] = x[2];
  std::map<std::pair<int32_t, int32_t>, std::vector<int32_t>> tables;  // (request, group)
  for (const json& f : doc["frames"]) {
    for (const json& x : f["p"]) {
      owner[x[0].get<size_t>()][x[1].get<size_t>()] = x[2];
      holders[x[0].get<size_t>()][x[1].get<size_t>()] = x[3];
    }
    for (const json& t : f["t"]) {
      const std::pair<int32_t, int32_t> key{t[0].get<int32_t>(), t[1].get<int32_t>()};
      if (t[2].get<int64_t>() < 0) {
        tables.erase(key);
        continue;
      }
      auto& row = tables[key];
      row.resize(t[2].get<size_t>(), -1);
      for (const json& c : t[3]) row[c[0].get<size_t>()] = c[1];
    }
    int64_t free = 0, referenced = 0, cached = 0;
    for (const auto& pool : owner)
      for (int32_t o : pool) {
        free += o == report::kFree;
        cached += o == report::kCached;
        referenced += o >= 0 || o == report::kReserved;
      }
    CHECK(f["counts"][0] == free);
    CHECK(f["counts"][1] == referenced);
    CHECK(f["counts"][2] == cached);
    // Every table entry holds a block the page says its request (or a sharer) owns.
    std::vector<std::vector<int32_t>> held(pools, std::vector<int32_t>(static_cast<size_t>(blocks), 0));
    for (const auto& [key, row] : tables) {
      const size_t pool = doc["groups"][static_cast<size_t>(key.second)]["pool"].get<size_t>();
      for (int32_t b : row)
        if (owner[pool][b] != report::kReserved) {
          ++held[pool][b];
          CHECK(owner[pool][b] >= 0);
          CHECK(owner[pool][b] <= key.first);  // the lowest holder's index
        }
    }
    CHECK(held == holders);
  }
}

}  // namespace

TEST_CASE("the recorded events add up to the replay's counters") {
  for (const char* name : {"prefix_reuse_offload_onboard", "prefix_reuse_partial_copy", "preemption_pool_pressure",
                           "window_release", "prefix_reuse_eviction", "model_gemma3_hybrid_reuse",
                           "model_gpt_oss_vswa_reuse", "model_mistral_sliding_hybrid"}) {
    const std::string scenario_name = name;
    CAPTURE(scenario_name);
    Recorded r;
    record(builtin(name), r);
    const json& doc = r.rec.data();
    const sim::ReplayCounters& c = r.report.counters;
    CHECK(r.rec.frames() == c.steps);
    CHECK(count_events(doc, "offload") == c.offloaded_blocks);
    CHECK(count_events(doc, "onboard") == c.onboarded_blocks);
    CHECK(count_events(doc, "evict") == c.evicted_blocks);
    CHECK(count_events(doc, "preempt") == c.preemptions);
    int64_t hit_tokens = 0, copied = 0;
    for (const json& f : doc["frames"])
      for (const json& e : f["ev"]) {
        if ((e[0] == "hit" && e[7] == 0) || e[0] == "partial_copy") hit_tokens += e[5].get<int64_t>();
        if (e[0] == "partial_copy") copied += e[5].get<int64_t>();
      }
    // Each group tells its own hit blocks; a sliding group holds only those of its window.
    if (doc["groups"].size() == 1 && doc["groups"][0]["mode"] != "sliding") CHECK(hit_tokens == c.reuse_hit_tokens);
    CHECK(copied == c.partial_reuse_tokens);
    int64_t prefill = 0, decode = 0;
    for (const json& f : doc["frames"]) {
      for (const json& p : f["prefill"]) prefill += p[2].get<int64_t>();
      decode += static_cast<int64_t>(f["decode"].size());
    }
    CHECK(prefill == c.prefill_tokens);
    CHECK(decode == c.decode_tokens);
    check_owner_changes_match_counts(doc, r.scenario.cache.primary_blocks);
  }
}

TEST_CASE("a window scenario records each request's newest token and its ring slot") {
  Recorded r;
  record(builtin("window_cyclic_sinks_bubble"), r);
  const WindowMapping w = WindowMapping::make(r.scenario.window.window, r.scenario.window.sinks,
                                              r.scenario.cache.page_size, r.scenario.window.one_more_block);
  int64_t rings = 0;
  for (const json& f : r.rec.data()["frames"])
    for (const json& x : f["ring"]) {
      CHECK(x[3].get<int64_t>() == w.cache_token(x[2].get<int64_t>()));
      ++rings;
    }
  CHECK(rings > 0);
  CHECK(r.rec.data()["groups"][0]["bubble"] == w.bubble);
}

TEST_CASE("a 2,048-block pool over 500 steps records a bounded amount") {
  Recorded r;
  record(std::string(KVSIM_SOURCE_DIR) + "/tests/report/large_pool.toml", r);
  CHECK(r.scenario.cache.primary_blocks == 2048);
  CHECK(r.rec.frames() >= 500);
  CHECK(r.report.counters.evicted_blocks > 0);  // the pool filled
  const size_t bytes = r.rec.data().dump().size();
  // A copy of every block's owner per step alone would be 2,048 x 530 numbers (~5 MB as JSON);
  // the changes are a fraction of that.
  CHECK(bytes < 1500000);
  check_owner_changes_match_counts(r.rec.data(), 2048);
}

TEST_CASE("invariant findings are located") {
  auto l = report::parse_locus(
      "differs from one-chunk prefill: attention output of request a, layer 0, position 16, element 3: -1.7578125 vs "
      "-0.203656077");
  REQUIRE(l);
  CHECK(l->request == "a");
  CHECK(l->position == 16);
  CHECK(l->element == 3);
  CHECK(l->step == -1);
  REQUIRE(l->values.size() == 2);
  CHECK(l->values[1] == std::pair<std::string, std::string>{"one-chunk prefill", "-0.203656077"});
  l = report::parse_locus(
      "step 4, layer 1, request b, position 9, head 2, dim 5: out -0.78125, Eigen double 0, |diff| 0.781 > bound 1e-30");
  REQUIRE(l);
  CHECK(l->step == 4);
  CHECK(l->layer == 1);
  CHECK(l->head == 2);
  CHECK(l->dim == 5);
  CHECK(l->values[0].second == "-0.78125");
  CHECK_FALSE(report::parse_locus("relative RMS error against bf16 0.999 > bound 0.125 over 92 outputs"));
  // The quantization invariant names its largest difference, which the report draws.
  const auto q = report::parse_locus(
      "relative RMS error against bf16 0.999 > bound 0.125 over 92 outputs (max |diff| 2.71 at attention output of "
      "request a, layer 0, position 3, element 439: out -5.20307112, bf16 -2.49589324)");
  REQUIRE(q);
  CHECK(q->request == "a");
  CHECK(q->position == 3);
  CHECK(q->element == 439);
  REQUIRE(q->values.size() == 2);
  CHECK(q->values[0].second == "-5.20307112");
  CHECK(q->values[1].second == "-2.49589324");
}

TEST_CASE("a caught fault is drawn as its path with core's numbers") {
  Recorded r;
  record(builtin("fault_past_len_zero"), r);
  const json doc = report::scenario_document(r.scenario, r.report, r.rec);
  REQUIRE(doc["paths"].size() == 1);
  const json& p = doc["paths"][0];
  CHECK(p["invariant"] == "chunking");
  const std::string svg = p["svg"];
  // The K element of request a, position 16 (element 0: head 0, dim 0) through its table.
  const auto locus = report::parse_locus(r.report.invariants[1].detail);
  REQUIRE(locus);
  int64_t frame = -1;
  const auto e = report::explain_locus(r.scenario, r.rec, *locus, frame);
  REQUIRE(e);
  CHECK(frame == p["frame"].get<int64_t>());
  const PoolStrides s = contiguous_strides(sim::pool_geometry(r.scenario));
  const int64_t element = element_offset(s, e->ref.block(), 0, 0, 0, e->entry, 0);
  CHECK(svg.find("data-stage=\"element\" data-value=\"" + std::to_string(element) + "\"") != std::string::npos);
  CHECK(svg.find("data-stage=\"token\" data-value=\"16\"") != std::string::npos);
  for (const char* stage : {"token", "slot", "page", "entry", "block", "element", "byte"})
    CHECK(svg.find(std::string("data-stage=\"") + stage + "\"") != std::string::npos);
  CHECK(svg.find("-1.7578125") != std::string::npos);
}

TEST_CASE("a page is self-contained: nothing is fetched") {
  Recorded r;
  record(builtin("prefix_reuse_same_step"), r);
  const std::string page = report::scenario_page(report::scenario_document(r.scenario, r.report, r.rec));
  for (const char* outside : {"src=\"http", "href=\"http", "@import", "<link", "fetch(", "XMLHttpRequest", "src=\"//"})
    CHECK(page.find(outside) == std::string::npos);
  CHECK(page.find("id=\"replay\"") != std::string::npos);
  // The data cannot close its own <script> element.
  const size_t data = page.find("id=\"replay\">");
  CHECK(page.find("</script>", data) + 9 == page.find("\n<script>", data));
}

namespace {
// One scenario replayed on the CPU against a CPU that flips one pool byte after the first `op`,
// recorded as kvsim diff --report records it.
struct CorruptedDiff {
  report::ReplayRecorder rec;
  report::FirstDifferenceOp first_op;
  std::optional<DiffReport> difference;
};
void replay_corrupted(const sim::Scenario& s, const std::string& op, int64_t pool_byte, CorruptedDiff& out) {
  auto candidate = std::make_unique<testing::CorruptingBackend>();
  candidate->corrupt_op = op;
  candidate->pool_byte = pool_byte;
  candidate->corruptions = 1;
  DifferentialBackend diff(make_backend("cpu"), std::move(candidate));
  sim::ReplayOptions o;
  o.comparison_invariants = false;
  o.observer = &out.rec;
  o.before_op = [&](const sim::OpContext& c) {
    out.first_op.before_op(c, diff);
    diff.set_context("step " + std::to_string(c.step), c.sequence_ids);
  };
  sim::replay(s, diff, o);
  out.difference = diff.first_difference();
}

// Tries a byte of element (layer 0, kv, head, entry, dim) in blocks 0..5 of scenario `name` until
// `drawn(scenario, run)` accepts the difference (checking it); true if one did.
template <class Drawn>
bool some_block_drawn(const std::string& name, const std::string& op, int32_t kv, int32_t head, int32_t entry,
                      int32_t dim, Drawn drawn) {
  const sim::Scenario s = sim::load_scenario_file(builtin(name));
  const PoolGeometry g = sim::pool_geometry(s);
  const PoolStrides strides = contiguous_strides(g);
  for (int64_t block = 0; block < 6; ++block) {
    CAPTURE(block);
    CorruptedDiff run;
    replay_corrupted(s, op, element_byte_offset(element_offset(strides, block, 0, kv, head, entry, dim), g.dtype), run);
    if (run.difference && drawn(s, run)) return true;
  }
  return false;
}
}  // namespace

TEST_CASE("a difference between backends is drawn as its path, both values under it") {
  const sim::Scenario s = sim::load_scenario_file(builtin("prefix_reuse_partial_copy"));
  CorruptedDiff run;
  replay_corrupted(s, "qkv_preprocess_write", 2 * 1024 * 3 + 70, run);  // somewhere in block 3: written by the first prefill
  REQUIRE(run.difference);
  const DiffReport& d = *run.difference;
  REQUIRE(d.pool_at);
  CHECK(run.first_op.op().op == "qkv_preprocess_write");
  const report::DrawnPath p = report::difference_path(s, run.rec, d, run.first_op.op().step, run.first_op.op().layer);
  CHECK(p.frame == 0);
  // The path ends at the differing element: its block and, through core's element_offset, its byte.
  CHECK(p.svg.find("data-stage=\"block\" data-value=\"" + std::to_string(d.pool_at->block) + "\"") != std::string::npos);
  const PoolStrides strides = contiguous_strides(sim::pool_geometry(s));
  const int64_t element = element_offset(strides, d.pool_at->block, d.pool_at->layer, d.pool_at->kv, d.pool_at->head,
                                         d.pool_at->entry, d.pool_at->dim);
  CHECK(element_byte_offset(element, s.cache.dtype) / 2 == d.byte_offset / 2);  // bf16: the element's two bytes
  CHECK(p.svg.find("data-stage=\"element\" data-value=\"" + std::to_string(element) + "\"") != std::string::npos);
  CHECK(p.svg.find(d.reference_hex) != std::string::npos);
  CHECK(p.svg.find(d.candidate_hex) != std::string::npos);
}

namespace {
// `diff_candidate`: KVSIM_DIFF_CANDIDATE for kvsim diff (cpu: cpu against cpu, no GPU needed).
int run_kvsim(const std::string& args, const std::string& diff_candidate = "") {
  const std::string env = diff_candidate.empty() ? "" : "KVSIM_DIFF_CANDIDATE=" + diff_candidate + " ";
  const int status = std::system((env + std::string(KVSIM_BINARY) + " " + args + " >/dev/null 2>&1").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}
}  // namespace

TEST_CASE("a difference at a window ring's cache slot is drawn as the path of the token that slot holds") {
  // A byte of a ring block flipped after the first qkv_preprocess_write: the differential backend
  // names the element by its cache slot (the op's table is the ring's); the drawing follows the
  // newest token core's WindowMapping maps onto that slot, and ends at the differing element.
  CHECK(some_block_drawn("window_cyclic_sinks_bubble", "qkv_preprocess_write", 0, 1, 3, 5,
                         [](const sim::Scenario& s, const CorruptedDiff& run) {
    const DiffReport& d = *run.difference;
    if (d.token_meaning.rfind("cache slot", 0) != 0 || d.sequence_id.empty()) return false;
    REQUIRE(d.pool_at);
    const PoolStrides strides = contiguous_strides(sim::pool_geometry(s));
    const report::DrawnPath p = report::difference_path(s, run.rec, d, run.first_op.op().step, run.first_op.op().layer);
    REQUIRE(p.svg.find("class=\"stage stage-token\"") != std::string::npos);
    CHECK(p.svg.find("data-stage=\"slot\" data-value=\"" + std::to_string(d.token) + "\"") != std::string::npos);
    CHECK(p.svg.find("data-stage=\"block\" data-value=\"" + std::to_string(d.pool_at->block) + "\"") != std::string::npos);
    const int64_t element = element_offset(strides, d.pool_at->block, d.pool_at->layer, d.pool_at->kv, d.pool_at->head,
                                           d.pool_at->entry, d.pool_at->dim);
    CHECK(p.svg.find("data-stage=\"element\" data-value=\"" + std::to_string(element) + "\"") != std::string::npos);
    // The token drawn is one the ring maps onto the differing slot.
    const std::string token_stage = "data-stage=\"token\" data-value=\"";
    const int64_t token = std::stoll(p.svg.substr(p.svg.find(token_stage) + token_stage.size()));
    CHECK(run.rec.window(0).cache_token(token) == d.token);
    CHECK(p.svg.find(d.reference_hex) != std::string::npos);
    return true;
  }));
}

TEST_CASE("a difference located only by vLLM's slot mapping is drawn through the request whose table holds the block") {
  // reshape_and_cache names an input row, not a request: the page finds the request whose
  // recorded table at that step holds the differing block and draws the token in that slot.
  CHECK(some_block_drawn("write_path_reshape_and_cache_split_x", "reshape_and_cache", 0, 0, 1, 2,
                         [](const sim::Scenario& s, const CorruptedDiff& run) {
    const DiffReport& d = *run.difference;
    if (!d.pool_at) return false;
    CHECK(d.token_meaning == "input token (slot_mapping row)");
    const report::DrawnPath p = report::difference_path(s, run.rec, d, run.first_op.op().step, run.first_op.op().layer);
    if (p.svg.find("class=\"stage stage-token\"") == std::string::npos) return false;  // a block no table holds
    CHECK(p.svg.find("data-stage=\"block\" data-value=\"" + std::to_string(d.pool_at->block) + "\"") != std::string::npos);
    const PoolStrides strides = contiguous_strides(sim::pool_geometry(s));
    const int64_t element = element_offset(strides, d.pool_at->block, d.pool_at->layer, d.pool_at->kv, d.pool_at->head,
                                           d.pool_at->entry, d.pool_at->dim);
    if (d.pool_at->kv == 0)
      CHECK(p.svg.find("data-stage=\"element\" data-value=\"" + std::to_string(element) + "\"") != std::string::npos);
    CHECK(p.svg.find(d.candidate_hex) != std::string::npos);
    return true;
  }));
}

TEST_CASE("kvsim run --report writes a page per scenario and an index") {
  const auto dir = std::filesystem::temp_directory_path() / "kvsim_report_cli_test";
  std::filesystem::remove_all(dir);
  CHECK(run_kvsim("run " + builtin("prefix_reuse_partial_copy") + " " + builtin("fault_window_mismatch") +
                  " --report " + dir.string()) == 0);
  CHECK(std::filesystem::exists(dir / "index.html"));
  CHECK(std::filesystem::exists(dir / "prefix_reuse_partial_copy.html"));
  CHECK(std::filesystem::exists(dir / "fault_window_mismatch.html"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("kvsim run --report into a folder that cannot be made is bad input, before anything runs") {
  const auto file = std::filesystem::temp_directory_path() / "kvsim_report_not_a_folder";
  std::ofstream(file) << "x";
  CHECK(run_kvsim("run " + builtin("prefix_reuse_partial_copy") + " --report " + (file / "sub").string()) == 2);
  CHECK(run_kvsim("run " + builtin("prefix_reuse_partial_copy") + " --report ''") == 2);
  std::filesystem::remove(file);
}

TEST_CASE("kvsim explain --svg draws the explained token's path; an unwritable file is bad input") {
  const auto svg = std::filesystem::temp_directory_path() / "kvsim_report_explain.svg";
  std::filesystem::remove(svg);
  CHECK(run_kvsim("explain --page-size 16 --window 64 --sinks 4 --block-table 0,1,2,3,4,5 --token 90 --svg " +
                  svg.string()) == 0);
  std::ifstream in(svg);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text.find("data-stage=\"slot\" data-value=\"42\"") != std::string::npos);  // 4 + 12 + (90 - 4) mod 60
  CHECK(text.find("data-stage=\"block\" data-value=\"2\"") != std::string::npos);
  std::filesystem::remove(svg);
  CHECK(run_kvsim("explain --page-size 16 --block-table 0 --token 3 --svg /nonexistent-folder/x.svg") == 2);
}

TEST_CASE("kvsim explain --engine PRESET --svg draws the path through the engine's strides and its tensor's offset") {
  // vLLM's split-x cache (vllm-paged): K element of layer 1, KV head 1, dim 9 of token 6 in
  // block 3 (table 5, 3), with the strides core's engine_layout gives; and its offset inside
  // key_cache[layer 1], which is the element offset less the tensor's first element.
  const auto svg = std::filesystem::temp_directory_path() / "kvsim_report_explain_engine.svg";
  std::filesystem::remove(svg);
  const std::string geometry = "--engine vllm-paged --dtype fp16 --kv-heads 2 --head-dim 16 --page-size 4 --layers 2";
  CHECK(run_kvsim("explain " + geometry + " --block-table 5,3 --token 6 --layer 1 --head 1 --dim 9 --svg " + svg.string()) == 0);
  std::ifstream in(svg);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  sim::ExplainRequest q;
  q.geometry.layers = 2;
  q.geometry.kv_heads = 2;
  q.geometry.head_dim = 16;
  q.geometry.tokens_per_block = 4;
  q.geometry.dtype = CacheDtype::fp16;
  q.geometry.primary_blocks = 64;  // kvsim explain's default pool
  q.engine = *parse_engine("vllm-paged");
  q.block_table = {5, 3};
  q.token = 6;
  q.layer = 1;
  q.head = 1;
  q.dim = 9;
  const sim::Explanation e = sim::explain(q);
  const sim::TensorOffsets& k = e.tensors.front();
  CHECK(k.tensor == "key_cache[layer 1]");
  CHECK(text.find("data-stage=\"block\" data-value=\"3\"") != std::string::npos);
  CHECK(text.find("data-stage=\"element\" data-value=\"" + std::to_string(k.element) + "\"") != std::string::npos);
  CHECK(text.find("in the engine's tensor key_cache[layer 1]:</tspan> element " + std::to_string(k.tensor_element)) !=
        std::string::npos);
  CHECK(k.tensor_element == k.element - k.tensor_base);
  std::filesystem::remove(svg);
}

TEST_CASE("kvsim diff --report writes the pages of the scenarios it compared") {
  const auto dir = std::filesystem::temp_directory_path() / "kvsim_report_diff_test";
  std::filesystem::remove_all(dir);
  CHECK(run_kvsim("diff " + builtin("prefix_reuse_partial_copy") + " --report " + dir.string(), "cpu") == 0);
  CHECK(std::filesystem::exists(dir / "index.html"));
  CHECK(std::filesystem::exists(dir / "prefix_reuse_partial_copy.html"));
  std::filesystem::remove_all(dir);
}
