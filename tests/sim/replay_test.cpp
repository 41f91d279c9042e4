// Replays of small scenarios built in C++ (sim/include/kvsim/sim/replay.hpp):
// counters, every invariant of contract §6 holding over page sizes 1, 3, 7, 17,
// odd batch sizes, every write path and both window modes; each fault caught
// by its invariant (and the same invariant passing with the fault off);
// determinism across runs and thread counts; the --dump files.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>

#include <nlohmann/json.hpp>
#include <tbb/task_arena.h>

#include <kvsim/core/splitmix64.hpp>

#include "backends/backend.hpp"
#include "kvsim/sim/digest.hpp"
#include "kvsim/sim/estimate.hpp"
#include "kvsim/sim/invariants.hpp"
#include "kvsim/sim/replay.hpp"
#include "kvsim/sim/replay_run.hpp"
#include "kvsim/sim/scenario_file.hpp"
#include "kvsim/sim/scheduler.hpp"

using namespace kvsim;
using namespace kvsim::sim;

namespace {

Backend& cpu() {
  static std::unique_ptr<Backend> be = make_backend("cpu");
  return *be;
}

RequestSpec request(const std::string& id, int32_t generated, int32_t decode, int32_t arrival = 0,
                    std::vector<std::string> prefixes = {}) {
  RequestSpec r;
  r.id = id;
  r.generated = generated;
  r.decode_tokens = decode;
  r.arrival_step = arrival;
  r.prefixes = std::move(prefixes);
  return r;
}

// A named prefix of `length` tokens counting up from `first`.
PrefixSpec counting_prefix(const std::string& name, int32_t length, int32_t first) {
  PrefixSpec p;
  p.name = name;
  p.tokens.resize(static_cast<size_t>(length));
  std::iota(p.tokens.begin(), p.tokens.end(), first);
  return p;
}

// Three requests (odd batch), ragged prompts spanning several pages, chunked prefill.
Scenario small(int32_t page_size) {
  Scenario s;
  s.name = "small_p" + std::to_string(page_size);
  s.model.layers = 2;
  s.model.q_heads = 6;
  s.model.kv_heads = 3;
  s.model.head_dim = 32;
  s.cache.page_size = page_size;
  s.cache.primary_blocks = 200;
  s.scheduler.chunk_size = 7;
  s.scheduler.token_budget = 24;
  s.requests = {request("a", 29, 4), request("b", 11, 6), request("c", 40, 3, 1)};
  return s;
}

InvariantStatus status(const ScenarioReport& r, Invariant inv) {
  for (const InvariantReport& i : r.invariants)
    if (i.invariant == inv) return i.status;
  FAIL("invariant missing from the report");
  return InvariantStatus::fail;
}

std::string details(const ScenarioReport& r) {
  std::string s;
  for (const InvariantReport& i : r.invariants)
    s += std::string(invariant_name(i.invariant)) + "=" + std::string(invariant_status_name(i.status)) + " (" +
         i.detail + ")\n";
  for (const std::string& e : r.expectation_failures) s += e + "\n";
  return s;
}

void all_hold(const ScenarioReport& r, std::initializer_list<Invariant> must_be_checked) {
  INFO(details(r));
  CHECK(r.ok);
  for (const InvariantReport& i : r.invariants) CHECK(i.status != InvariantStatus::fail);
  for (Invariant inv : must_be_checked) CHECK(status(r, inv) == InvariantStatus::pass);
}

}  // namespace

TEST_CASE("replay: counters and every invariant, page sizes 1, 3, 7, 17") {
  for (int32_t P : {1, 3, 7, 17}) {
    INFO("P = " << P);
    const Scenario s = small(P);
    const ScenarioReport r = replay(s, cpu());
    all_hold(r, {Invariant::conservation, Invariant::chunking, Invariant::layout, Invariant::dense, Invariant::batch});
    CHECK(r.counters.prefill_tokens == 29 + 11 + 40);
    CHECK(r.counters.decode_tokens == 4 + 6 + 3);
    CHECK(r.counters.token_layers == (29 + 11 + 40 + 4 + 6 + 3) * 2);
    CHECK(r.counters.reuse_hit_tokens == 0);
    CHECK(r.counters.preemptions == 0);
    // Prefill of 40 tokens in chunks of 7 takes 6 steps, plus 3 decodes, after arriving at step 1.
    CHECK(r.counters.steps >= 1 + 6 + 3);
  }
}

TEST_CASE("replay: every write path and dtype keeps the invariants") {
  struct Case {
    WritePath path;
    CacheDtype dtype;
    BlockLayout layout;
  } cases[] = {{WritePath::append_paged, CacheDtype::bf16, BlockLayout::hnd},
               {WritePath::append_paged, CacheDtype::nvfp4, BlockLayout::nhd},
               {WritePath::reshape_and_cache, CacheDtype::fp8_e4m3, BlockLayout::split_x},
               {WritePath::reshape_and_cache, CacheDtype::fp16, BlockLayout::nhd},
               {WritePath::qkv_preprocess, CacheDtype::int8, BlockLayout::hnd},
               {WritePath::qkv_preprocess, CacheDtype::fp8_e4m3, BlockLayout::nhd},
               {WritePath::qkv_preprocess, CacheDtype::nvfp4, BlockLayout::hnd},
               {WritePath::append_paged, CacheDtype::fp8_e5m2, BlockLayout::split_x}};
  for (const Case& c : cases) {
    INFO(write_path_name(c.path) << " " << dtype_name(c.dtype));
    Scenario s = small(7);
    s.model.input_dtype = c.dtype == CacheDtype::fp16 ? CacheDtype::fp16 : CacheDtype::bf16;
    s.cache.write_path = c.path;
    s.cache.dtype = c.dtype;
    s.cache.layout = c.layout;
    s.cache.k_scale = c.dtype == CacheDtype::int8 ? 0.03f : 0.02f;
    s.cache.v_scale = s.cache.k_scale;
    s.cache.k_global_scale = s.cache.v_global_scale = 0.01f;
    const ScenarioReport r = replay(s, cpu());
    // write: every read-back row equals its recomputed input (V only where RoPE rotates K)
    all_hold(r, {Invariant::dense, Invariant::layout, Invariant::chunking, Invariant::write});
    if (is_quantized(c.dtype)) CHECK(status(r, Invariant::quantization) == InvariantStatus::pass);
  }
}

TEST_CASE("replay: prefix reuse hits, last-token recompute, eviction, offload and onboard") {
  Scenario s = small(4);
  s.cache.primary_blocks = 14;
  s.cache.secondary_blocks = 8;
  s.reuse.enabled = true;
  s.reuse.offload = true;
  s.prefixes = {counting_prefix("system", 12, 300)};
  // "second" arrives after "first" finished: its 3 prefix blocks are cached.
  // "filler" then needs the whole pool, evicting (and offloading) them; "third" onboards them.
  s.requests = {request("first", 5, 2, 0, {"system"}), request("second", 9, 2, 8, {"system"}),
                request("filler", 52, 1, 16), request("third", 3, 2, 30, {"system"})};
  const ScenarioReport r = replay(s, cpu());
  all_hold(r, {Invariant::reuse, Invariant::offload, Invariant::conservation, Invariant::dense});
  CHECK(r.counters.reuse_hit_tokens == 12 + 12);
  CHECK(r.counters.offloaded_blocks >= 3);
  CHECK(r.counters.onboarded_blocks == 3);
  CHECK(r.counters.evicted_blocks >= 3);
  // A prompt that is exactly the cached blocks still recomputes its last token.
  Scenario exact = s;
  exact.requests = {request("first", 0, 1, 0, {"system"}), request("again", 0, 1, 5, {"system"})};
  const ScenarioReport e = replay(exact, cpu());
  all_hold(e, {Invariant::reuse});
  CHECK(e.counters.reuse_hit_tokens == 8);
  CHECK(e.counters.prefill_tokens == 12 + 4);
}

TEST_CASE("replay: partial-block reuse copies the matching head") {
  Scenario s = small(5);
  s.reuse.enabled = true;
  s.reuse.partial = true;
  s.prefixes = {counting_prefix("system", 13, 40)};  // two full blocks and 3 tokens of a third
  s.requests = {request("first", 9, 1, 0, {"system"}), request("second", 6, 1, 10, {"system"})};
  const ScenarioReport r = replay(s, cpu());
  all_hold(r, {Invariant::reuse});
  CHECK(r.counters.reuse_hit_tokens == 13);
  CHECK(r.counters.partial_reuse_tokens == 3);
}

TEST_CASE("replay: a block filled in this step is no partial_copy source until the step has run") {
  // Two requests share a 10-token prefix inside one 16-token block and arrive
  // together: the first one's block is in the tree (full-block hits may use
  // it) but not yet written, so the second must not copy its head.
  Scenario s;
  s.name = "same_step_partial";
  s.model.layers = 1;
  s.model.q_heads = 2;
  s.model.kv_heads = 1;
  s.model.head_dim = 16;
  s.cache.page_size = 16;
  s.cache.primary_blocks = 9;
  s.reuse.enabled = true;
  s.reuse.partial = true;
  s.prefixes = {counting_prefix("p", 10, 7)};
  s.requests = {request("r0", 7, 6, 0, {"p"}), request("r1", 2, 9, 0, {"p"})};
  const ScenarioReport r = replay(s, cpu());
  all_hold(r, {Invariant::reuse, Invariant::batch});
  CHECK(r.counters.partial_reuse_tokens == 0);
}

TEST_CASE("replay: preemption by recompute under pool pressure keeps outputs bit-equal") {
  Scenario s = small(3);
  s.cache.primary_blocks = 24;
  s.scheduler.token_budget = 64;
  s.scheduler.chunk_size = 0;
  s.requests = {request("a", 20, 20), request("b", 21, 19), request("c", 22, 18)};
  const ScenarioReport r = replay(s, cpu());
  all_hold(r, {Invariant::chunking, Invariant::batch, Invariant::conservation});
  CHECK(r.counters.preemptions > 0);
  CHECK(r.counters.decode_tokens == 57);
  CHECK(r.counters.prefill_tokens > 63);  // recomputed tokens count again
}

TEST_CASE("replay: both window modes, sinks with a bubble, window >= lengths") {
  for (WindowMode mode : {WindowMode::cyclic, WindowMode::release}) {
    for (bool one_more : {false, true}) {
      INFO(window_mode_name(mode) << " one_more_block " << one_more);
      Scenario s = small(4);
      s.window.mode = mode;
      s.window.window = 18;
      s.window.sinks = 3;  // bubble 1
      s.window.one_more_block = one_more;
      s.cache.primary_blocks = 30;
      const ScenarioReport r = replay(s, cpu());
      all_hold(r, {Invariant::window, Invariant::dense, Invariant::chunking});
    }
  }
  Scenario wide = small(7);
  wide.window.mode = WindowMode::cyclic;
  wide.window.window = 64;  // >= every length: every output compared with no window
  wide.window.sinks = 2;
  all_hold(replay(wide, cpu()), {Invariant::window});
}

TEST_CASE("replay: MLA latent cache and indexer-K scatter") {
  Scenario s = small(3);
  s.mla.enabled = true;
  s.mla.d_ckv = 64;
  s.mla.d_kpe = 16;
  s.model.head_dim = 80;
  s.cache.write_path = WritePath::append_mla;
  s.indexer_k_scatter = true;
  const ScenarioReport r = replay(s, cpu());
  all_hold(r, {Invariant::chunking, Invariant::layout, Invariant::batch});
  CHECK(status(r, Invariant::dense) == InvariantStatus::not_applicable);  // core has no latent attention op
}

TEST_CASE("replay: ReplayOptions::threads runs the whole replay, its checks included, on that many threads") {
  // Every invariant on (the digests, the dense and write checks run on the replay's own threads).
  const Scenario s = small(3);
  const auto be = make_backend("cpu", BackendOptions{1});
  for (int threads : {1, 3}) {
    ReplayOptions o;
    o.threads = threads;
    int seen = 0;
    o.after_step = [&](int64_t, const ReplayCounters&) { seen = std::max(seen, tbb::this_task_arena::max_concurrency()); };
    const ScenarioReport r = replay(s, *be, o);
    INFO("threads " << threads);
    CHECK(seen == threads);
    CHECK(r.ok);
    CHECK(r.content_hash == replay(s, cpu()).content_hash);  // the same bytes as the caller's arena
  }
}

TEST_CASE("replay: a small scenario's runs made at once report what runs one after another report") {
  // Every built-in scenario (faults, expectations, every comparison invariant), 4 threads: one run
  // after another, then a host backend's runs at once where they fit together. (The same thread
  // count: the dense check's tasks, and so its worst ratio's last digits, follow it.)
  const auto be = make_backend("cpu", BackendOptions{1});
  int at_once = 0;
  for (const std::string& path : builtin_scenario_paths()) {
    const Scenario s = load_scenario_file(path);
    ReplayOptions one, four;
    one.threads = 4;
    one.runs_at_once = false;
    four.threads = 4;
    const ScenarioReport a = replay(s, *be, one), b = replay(s, *be, four);
    INFO(s.name << "\none after another:\n" << details(a) << "at once:\n" << details(b));
    CHECK(a.concurrent_runs == 1);
    const ReplayEstimate e = estimate_replay(s);
    CHECK(b.concurrent_runs == (e.concurrent_runs > 1 ? e.runs : 1));
    at_once += b.concurrent_runs > 1;
    CHECK(details(a) == details(b));
    CHECK(a.ok == b.ok);
    CHECK(a.content_hash == b.content_hash);
    CHECK(a.counters.steps == b.counters.steps);
    CHECK(a.counters.token_layers == b.counters.token_layers);
    // The split still adds up to the wall time: the runs' parts in proportion to their own splits.
    CHECK(b.timings.total() == doctest::Approx(b.total_seconds).epsilon(1e-3));
  }
  CHECK(at_once >= 30);  // most built-in scenarios are small enough
  // KVSIM_RUNS_AT_ONCE=0 (same-binary timings) makes them follow each other; a bad value is named.
  const Scenario s = load_scenario_file(std::string(KVSIM_SOURCE_DIR) + "/scenarios/gqa_decode_batch_ragged.toml");
  ReplayOptions four;
  four.threads = 4;
  REQUIRE(replay(s, *be, four).concurrent_runs > 1);
  ::setenv("KVSIM_RUNS_AT_ONCE", "0", 1);
  CHECK(replay(s, *be, four).concurrent_runs == 1);
  ::setenv("KVSIM_RUNS_AT_ONCE", "yes", 1);
  CHECK_THROWS_WITH_AS(replay(s, *be, four), doctest::Contains("KVSIM_RUNS_AT_ONCE = 'yes': expected 1 or 0 (or unset: 1)"),
                       ValidationError);
  ::setenv("KVSIM_RUNS_AT_ONCE", std::string(1000, '9').c_str(), 1);  // echoed clipped, not whole
  const std::string clipped_value = "'" + std::string(64, '9') + "... (1000 characters)'";
  CHECK_THROWS_WITH_AS(replay(s, *be, four), doctest::Contains(clipped_value.c_str()), ValidationError);
  ::unsetenv("KVSIM_RUNS_AT_ONCE");
  // The reference backend has instances for other threads too; a device backend (and the
  // differential pair) would not: there every run shares the caller's backend, one after another.
  CHECK(make_backend("reference")->another() != nullptr);
}

TEST_CASE("replay: determinism across runs and thread counts; content hash covers the pools") {
  const Scenario s = small(3);
  ReplayOptions fast;
  fast.comparison_invariants = false;
  const auto be1 = make_backend("cpu", BackendOptions{1});
  const auto be3 = make_backend("cpu", BackendOptions{3});
  const ScenarioReport a = replay(s, *be1, fast), b = replay(s, *be3, fast), c = replay(s, cpu(), fast);
  CHECK(a.content_hash == b.content_hash);
  CHECK(a.content_hash == c.content_hash);
  Scenario other = s;
  other.model.seed = 2;
  CHECK(replay(other, cpu(), fast).content_hash != a.content_hash);
}

TEST_CASE("replay: each fault is caught by its invariant, which passes with the fault off") {
  struct Case {
    Fault fault;
    Scenario s;
  };
  std::vector<Case> cases;
  {
    Scenario s = small(3);  // chunks of 7 over prompts of 29 and 40 tokens
    cases.push_back({Fault::past_len_zero, s});
  }
  {
    Scenario s = small(4);
    s.window.mode = WindowMode::cyclic;
    s.window.window = 20;
    s.window.sinks = 3;  // bubble 1: the reader that forgets the sinks reads the wrong slots
    cases.push_back({Fault::window_mismatch, s});
  }
  {
    Scenario s = small(7);
    s.cache.dtype = CacheDtype::fp8_e4m3;
    s.cache.k_scale = 0.04f;
    s.cache.v_scale = 0.01f;  // 4x apart: V dequantized with K's scale is 4x too large
    cases.push_back({Fault::k_scale_for_v, s});
  }
  {
    Scenario s = small(4);
    s.reuse.enabled = true;
    s.prefixes = {counting_prefix("system", 12, 7)};
    s.requests = {request("first", 6, 2, 0, {"system"}), request("second", 5, 2, 6, {"system"})};
    cases.push_back({Fault::reused_block_mismatch, s});
  }
  {
    Scenario s = small(4);  // prompts end inside a page: the V tail is read
    cases.push_back({Fault::v_tail_not_zeroed, s});
  }
  {
    Scenario s = small(3);  // decodes open new pages: the previous step's table lacks them
    cases.push_back({Fault::stale_bad_page, s});
  }
  {
    Scenario s = small(4);  // a Gemma-like pair: layer 0 sliding (12), layer 1 full
    s.layers.enabled = true;
    s.layers.windows = {12, 0};
    cases.push_back({Fault::group_window_for_layer, s});
  }
  {
    Scenario s = small(4);  // VSWA cyclic ring of 12 + 4 slots: prompts of 29 and 40 wrap it
    s.layers.enabled = true;
    s.layers.windows = {12, 0};
    s.layers.allocation = KvAllocation::vswa;
    s.layers.rule = VswaRule::cyclic;
    s.layers.one_more_block = true;
    s.scheduler.chunk_size = 5;
    cases.push_back({Fault::window_table_absolute, s});
  }
  {
    Scenario s = small(3);
    cases.push_back({Fault::short_block_table, s});
  }
  {
    Scenario s = load_scenario_file(std::string(KVSIM_SOURCE_DIR) + "/scenarios/fault_offload_drops_scales.toml");
    s.faults.clear();
    s.expect = Expectations{};
    cases.push_back({Fault::offload_drops_scales, s});
  }
  // The built-in scenarios of the faults that need a particular shape (34 KV
  // heads of 128, MLA with an indexer, an offload then a hit).
  for (const Fault f : {Fault::split_x_heads_unwritten, Fault::indexer_slot_past_cache, Fault::offload_before_copy,
                        Fault::snapshot_off_block_boundary}) {
    Scenario s = load_scenario_file(std::string(KVSIM_SOURCE_DIR) + "/scenarios/fault_" + std::string(fault_name(f)) + ".toml");
    s.faults.clear();
    s.expect = Expectations{};
    cases.push_back({f, s});
  }
  {
    Scenario s = small(4);
    s.cache.write_path = WritePath::reshape_and_cache;
    cases.push_back({Fault::slot_mapping_page_size, s});
  }
  for (Case& c : cases) {
    INFO("fault " << fault_name(c.fault));
    const Invariant inv = invariant_for(c.fault);
    Scenario on = c.s;
    on.faults = {c.fault};
    on.expect.must_catch = {c.fault};
    const ScenarioReport r_on = replay(on, cpu());
    INFO(details(r_on));
    CHECK(status(r_on, inv) == InvariantStatus::caught);
    CHECK(r_on.ok);
    // The same scenario without the fault: the invariant is checked and holds.
    Scenario off = c.s;
    if (c.fault == Fault::v_tail_not_zeroed) off.cache.poison_nan = true;  // no_nan needs the poison
    const ScenarioReport r_off = replay(off, cpu());
    INFO(details(r_off));
    CHECK(status(r_off, inv) == InvariantStatus::pass);
    CHECK(r_off.ok);
    // A fault nobody expected is a failure of the scenario, not a pass.
    Scenario unexpected = on;
    unexpected.expect.must_catch.clear();
    unexpected.expect.must_pass = {inv};
    CHECK_FALSE(replay(unexpected, cpu()).ok);
  }
}

TEST_CASE("replay: recurrent states, snapshots at block boundaries, hits limited to them") {
  Scenario s = load_scenario_file(std::string(KVSIM_SOURCE_DIR) + "/scenarios/model_hybrid_recurrent_reuse.toml");
  const ScenarioReport all = replay(s, cpu());
  INFO(details(all));
  CHECK(all.ok);
  CHECK(all.counters.reuse_hit_tokens == 64);  // the 4 system-prompt blocks, each boundary snapshotted
  all_hold(all, {Invariant::state_hit, Invariant::state_restore, Invariant::reuse, Invariant::chunking});
  // vLLM #45238: "align" keeps only the last boundary before each prompt's end (80 of "first"'s 84
  // tokens, in its own tokens), so "second" finds no snapshot inside the shared prefix: no hit at all.
  s.recurrent.snapshots = SnapshotMode::align;
  s.expect = Expectations{};
  const ScenarioReport align = replay(s, cpu());
  INFO(details(align));
  CHECK(align.ok);
  CHECK(align.counters.reuse_hit_tokens == 0);
  CHECK(status(align, Invariant::state_hit) == InvariantStatus::pass);
  // Two requests with one 96-token prompt: align snapshots boundary 80, the second hits exactly there.
  Scenario same = s;
  same.requests[0].tokens.clear();
  same.requests[0].generated = 32;
  same.requests[1].tokens.clear();
  same.requests[1].generated = 32;
  same.requests[1].seed = same.requests[0].seed;
  const ScenarioReport hit = replay(same, cpu());
  INFO(details(hit));
  CHECK(hit.ok);
  CHECK(hit.counters.reuse_hit_tokens == 80);
  all_hold(hit, {Invariant::state_hit, Invariant::state_restore, Invariant::reuse});
}

TEST_CASE("replay: a scenario that cannot fit is bad input, not a hang") {
  Scenario s = small(4);
  s.cache.primary_blocks = 3;
  s.requests = {request("huge", 40, 0)};
  CHECK_THROWS_AS(replay(s, cpu()), ValidationError);
  Scenario slow = small(4);
  slow.scheduler.max_steps = 3;
  const ScenarioReport r = replay(slow, cpu());
  CHECK_FALSE(r.ok);
  REQUIRE(!r.expectation_failures.empty());
  CHECK(r.expectation_failures.back().find("max_steps") != std::string::npos);
}

TEST_CASE("replay: counter expectations are compared") {
  Scenario s = small(7);
  s.expect.preemptions = 0;
  s.expect.reuse_hit_tokens = 5;  // wrong on purpose
  const ScenarioReport r = replay(s, cpu());
  CHECK_FALSE(r.ok);
  REQUIRE(r.expectation_failures.size() == 1);
  CHECK(r.expectation_failures[0] == "expected reuse_hit_tokens = 5, got 0");
}

TEST_CASE("replay: --dump writes .npy files and a manifest naming step, op, layer, dtype, shape") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "kvsim_dump_test";
  std::filesystem::remove_all(dir);
  Scenario s = small(7);
  s.requests = {request("a", 9, 1)};
  ReplayOptions o;
  o.comparison_invariants = false;
  o.dump_dir = dir.string();
  replay(s, cpu(), o);
  std::ifstream mf(dir / "manifest.json");
  REQUIRE(mf.good());
  const nlohmann::json m = nlohmann::json::parse(mf);
  bool saw_pool = false, saw_out = false;
  for (const auto& f : m["files"]) {
    std::ifstream npy(dir / f["file"].get<std::string>(), std::ios::binary);
    REQUIRE(npy.good());
    char magic[6];
    npy.read(magic, 6);
    CHECK(std::string(magic + 1, 5) == "NUMPY");
    if (f["op"] == "pool") {
      saw_pool = true;
      CHECK(f["dtype"] == "bf16");
    }
    if (f["file"] == "step0_layer1_prefill_attention_out.npy") {
      saw_out = true;
      CHECK(f["op"] == "prefill_attention");
      CHECK(f["layer"] == 1);
      CHECK(f["dtype"] == "fp32");
      CHECK(f["shape"] == nlohmann::json::array({7, 6, 32}));  // the first chunk of 7 of a 9-token prompt
    }
  }
  CHECK(saw_pool);
  CHECK(saw_out);
  std::filesystem::remove_all(dir);
}

TEST_CASE("comparisons: a one-bit difference is found and located; keys only one run holds are skipped") {
  // Records as replay() makes them: digests of every row, attention rows also
  // spilled (so the element is named), each key's last production kept.
  auto spilled = [] {
    RunRecord r;
    r.spill = std::make_shared<SpillFile>();
    r.spill_kinds[0] = r.spill_kinds[1] = r.spill_kinds[2] = true;
    return r;
  };
  RunRecord a = spilled(), b = spilled();
  const float x[3] = {1.0f, 2.0f, 3.0f};
  auto put = [](RunRecord& r, const OutputKey& k, const float* v) {
    record(r, k, v, 12);
    finalize(r);
  };
  put(a, {"r", 0, OutputKind::attention, 5}, x);
  put(b, {"r", 0, OutputKind::attention, 5}, x);
  put(a, {"r", 1, OutputKind::v_cache, 2}, x);  // only in a: not compared
  Comparison c = compare_outputs(a, b);
  CHECK(c.compared == 1);
  CHECK(c.first_difference.empty());
  float y[3] = {1.0f, 2.0f, 3.0f};
  y[1] = std::nextafter(2.0f, 3.0f);  // one ulp
  put(b, {"r", 0, OutputKind::attention, 5}, y);
  c = compare_outputs(a, b);
  CHECK(c.first_difference.find("attention output of request r, layer 0, position 5, element 1") == 0);
  // -0 and +0 differ in bits: bit equality compares bytes, not values.
  float z[3] = {1.0f, 2.0f, -0.0f}, w[3] = {1.0f, 2.0f, 0.0f};
  put(a, {"r", 0, OutputKind::attention, 5}, z);
  put(b, {"r", 0, OutputKind::attention, 5}, w);
  CHECK_FALSE(compare_outputs(a, b).first_difference.empty());
  // Quantization error: relative RMS over the attention outputs both hold.
  const float r1[3] = {1.0f, 0.0f, 0.0f}, q1[3] = {1.5f, 0.0f, 0.0f};
  RunRecord q = spilled(), ref = spilled();
  put(q, {"r", 0, OutputKind::attention, 0}, q1);
  put(ref, {"r", 0, OutputKind::attention, 0}, r1);
  CHECK(quantization_error(q, ref).rel_rms == doctest::Approx(0.5));
  CHECK(quantization_bound(CacheDtype::fp8_e4m3) == 0.125);
}

TEST_CASE("replay: before_op sees every backend op with its step, layer and batch") {
  Scenario s = small(7);
  s.requests = {request("a", 9, 2), request("b", 4, 1)};
  std::vector<OpContext> seen;
  ReplayOptions o;
  o.comparison_invariants = false;
  o.before_op = [&](const OpContext& c) { seen.push_back(c); };
  const ScenarioReport r = replay(s, cpu(), o);
  CHECK(static_cast<int64_t>(seen.size()) == r.counters.ops);
  REQUIRE(seen.size() > 4);
  CHECK(seen[0].op == "qkv_preprocess_write");
  CHECK(seen[0].step == 0);
  CHECK(seen[0].layer == 0);
  CHECK(seen[0].sequence_ids == std::vector<std::string>{"a", "b"});
  CHECK(seen[1].op == "prefill_attention");
  // Every layer is written before it is read, in every step.
  for (size_t i = 1; i < seen.size(); ++i)
    if (seen[i].op == "prefill_attention" || seen[i].op == "decode_attention") {
      bool written = false;
      for (size_t j = i; j-- > 0 && seen[j].step == seen[i].step;)
        written = written || (seen[j].op == "qkv_preprocess_write" && seen[j].layer == seen[i].layer);
      CHECK(written);
    }
}

TEST_CASE("replay: a finite fresh-page fill reaches every pool byte a write leaves, and no output") {
  Scenario s = small(4);
  s.cache.write_path = WritePath::append_paged;  // leaves page tails as they were
  ReplayOptions quick;
  quick.comparison_invariants = false;
  const RunRecord plain = run_scenario(s, cpu(), quick);
  s.cache.fresh_page_fill = 0.0f;
  const RunRecord zero = run_scenario(s, cpu(), quick);
  CHECK(zero.content_hash == plain.content_hash);  // bf16 0.0 is the zero bytes of a fresh pool
  s.cache.fresh_page_fill = 3.0f;
  const RunRecord poisoned = run_scenario(s, cpu(), quick);
  CHECK(poisoned.content_hash != plain.content_hash);  // the untouched slots hold 3.0
  const Comparison c = compare_outputs(poisoned, plain);
  CHECK(c.compared > 0);
  CHECK(c.first_difference.empty());  // masked tail keys weigh 0: a finite poison never shows
}

TEST_CASE("comparisons: digests alone find the differing row, and the record keeps each key's last production") {
  RunRecord a, b;  // no spill: digests only, as the comparison re-runs keep them
  const float x[2] = {1.0f, 2.0f}, y[2] = {1.0f, -2.0f};
  record(a, {"r", 0, OutputKind::k_cache, 3}, x, 8);
  record(b, {"r", 0, OutputKind::k_cache, 3}, y, 8);
  record(b, {"r", 0, OutputKind::k_cache, 3}, x, 8);  // recomputed after a preemption: the last one counts
  record(a, {"r", 0, OutputKind::k_cache, 4}, x, 8);
  record(b, {"r", 0, OutputKind::k_cache, 4}, y, 8);
  finalize(a);
  finalize(b);
  CHECK(b.outputs.size() == 2);
  const Comparison c = compare_outputs(a, b);
  CHECK(c.compared == 2);
  REQUIRE(c.differing_key);
  CHECK(c.differing_key->position == 4);
  CHECK_FALSE(c.located);
  CHECK(c.first_difference == "cached K of request r, layer 0, position 4 (content digests differ)");
  const std::vector<uint8_t> xa(reinterpret_cast<const uint8_t*>(x), reinterpret_cast<const uint8_t*>(x) + 8),
      ya(reinterpret_cast<const uint8_t*>(y), reinterpret_cast<const uint8_t*>(y) + 8);
  CHECK(describe_difference(*c.differing_key, xa, ya) == "cached K of request r, layer 0, position 4, element 1: 2 vs -2");
}

TEST_CASE("comparisons: a record across several row chunks sorts, keeps each key's last production, frees the rest") {
  // 2.5 chunks of rows in a scrambled key order, every 7th key produced twice (the second one counts),
  // so finalize() sorts through the chunked iterator, moves rows across chunk edges and drops rows.
  const size_t n = RecordRows::kRowsPerChunk * 5 / 2, dup_every = 7;
  RunRecord r;
  std::vector<int64_t> positions(n);
  for (size_t i = 0; i < n; ++i) positions[i] = static_cast<int64_t>((i * 40503u) % n);  // 40503 is odd: a permutation of 0..n-1
  size_t produced = 0;
  for (size_t i = 0; i < n; ++i) {
    const float first = static_cast<float>(positions[i]), second = -first;
    if (positions[i] % dup_every == 0) {
      record(r, {"q", 1, OutputKind::attention, positions[i]}, &second, 4);
      ++produced;
    }
    record(r, {"q", 1, OutputKind::attention, positions[i]}, &first, 4);
    ++produced;
  }
  REQUIRE(r.outputs.size() == produced);
  finalize(r);
  REQUIRE(r.outputs.size() == n);
  for (size_t i = 0; i < n; ++i) {
    const float want = static_cast<float>(i);
    CHECK_MESSAGE(r.outputs[i].key.position == static_cast<int64_t>(i), "row " << i);
    CHECK_MESSAGE(r.outputs[i].digest == blake2b_128(&want, 4), "row " << i << ": not the last production");
    if (r.outputs[i].key.position != static_cast<int64_t>(i)) break;
  }
  const RecordedOutput* o = find_output(r, {"q", 1, OutputKind::attention, static_cast<int64_t>(n - 1)});
  REQUIRE(o);
  CHECK(o->key.position == static_cast<int64_t>(n - 1));
  CHECK_FALSE(find_output(r, {"q", 1, OutputKind::attention, static_cast<int64_t>(n)}));
  CHECK(std::is_sorted(r.outputs.begin(), r.outputs.end(),
                       [](const RecordedOutput& a, const RecordedOutput& b) { return a.key < b.key; }));
}

TEST_CASE("BLAKE2b-128 matches Python's hashlib.blake2b(digest_size=16)") {
  // Values from /usr/bin/python3 -c "hashlib.blake2b(m, digest_size=16)", as two little-endian words.
  CHECK(blake2b_128("", 0).word[0] == 0x40bdefd94169e6caull);
  CHECK(blake2b_128("", 0).word[1] == 0x7076a68e75884d4eull);
  CHECK(blake2b_128("abc", 3).word[0] == 0x2b8d2bc691b74acfull);
  CHECK(blake2b_128("abc", 3).word[1] == 0x1678287502c90921ull);
  std::vector<uint8_t> m;
  for (int rep = 0; rep < 2; ++rep)
    for (int i = 0; i < 256; ++i) m.push_back(static_cast<uint8_t>(i));
  m.push_back('x');  // 513 bytes: four full blocks and a one-byte tail
  CHECK(blake2b_128(m.data(), m.size()).word[0] == 0xc5a06561281bc807ull);
  CHECK(blake2b_128(m.data(), m.size()).word[1] == 0x12c4f571453ff6eeull);
}

TEST_CASE("BLAKE2b-128 of many messages at once (AVX-512 and AVX2 lanes) equals blake2b_128 of each") {
  // Lengths around the block edges (0, 128, 256: the last block is full or empty) and counts that
  // leave lanes over (n % 8, n % 4), at every ISA this CPU runs; every message differs from the others.
  uint64_t state = 1;
  for (CpuIsa isa : {CpuIsa::portable, CpuIsa::avx2, CpuIsa::avx512}) {
    if (!cpu_isa_supported(isa)) {
      MESSAGE("this CPU lacks " << cpu_isa_name(isa) << ": its lanes are not tested here");
      continue;
    }
    for (size_t bytes : {0, 1, 7, 64, 127, 128, 129, 255, 256, 257, 512, 513, 1000}) {
      for (size_t n : {1, 3, 4, 5, 8, 9, 17}) {
        std::vector<std::vector<uint8_t>> messages(n, std::vector<uint8_t>(bytes));
        std::vector<const void*> at(n);
        for (size_t i = 0; i < n; ++i) {
          for (uint8_t& b : messages[i]) b = static_cast<uint8_t>(splitmix64_next(state));
          at[i] = messages[i].data();
        }
        std::vector<Digest128> got(n);
        blake2b_128_each(at.data(), n, bytes, got.data(), isa);
        for (size_t i = 0; i < n; ++i) {
          INFO(cpu_isa_name(isa) << ", " << bytes << " bytes, message " << i << " of " << n);
          CHECK(got[i] == blake2b_128(messages[i].data(), bytes));
        }
      }
    }
  }
}

TEST_CASE("replay: the mma attention order keeps every invariant, and its outputs are not the fp32 order's") {
  // scenarios/orders/ asks for the order (kvsim diff runs them on the GPU; with every invariant
  // they take minutes on the CPU, so the replays here are the small scenario's).
  for (const char* name : {"mma_chunked_prefill_reuse", "mma_fp8_e4m3"})
    CHECK(load_scenario_file(std::string(KVSIM_SOURCE_DIR) + "/scenarios/orders/" + name + ".toml").attention.order ==
          AttentionOrder::mma);
  for (int32_t P : {1, 7, 17}) {
    Scenario s = small(P);
    s.attention.order = AttentionOrder::mma;
    if (P == 17) {  // an fp8 cache, its codes decoded exactly to bf16 operands
      s.cache.dtype = CacheDtype::fp8_e4m3;
      s.cache.k_scale = 0.25;
      s.cache.v_scale = 0.3;
    }
    INFO("P = " << P);
    const ScenarioReport r = replay(s, cpu());
    all_hold(r, {Invariant::chunking, Invariant::layout, Invariant::dense, Invariant::batch});
    s.attention.order = AttentionOrder::fp32;
    CHECK(replay(s, cpu()).content_hash != r.content_hash);
  }
}

TEST_CASE("replay: the wall time's split adds up to it, each part charged where its work is") {
  auto parts_of = [](const ReplayTimings& t) {
    return std::vector<double>{t.kernels, t.op_host,  t.inputs,      t.transfers, t.scheduling,
                               t.recording, t.dense, t.checks, t.comparisons, t.other};
  };
  auto adds_up = [&](const ScenarioReport& r) {
    double sum = 0;
    for (double p : parts_of(r.timings)) {
      CHECK(p >= 0);
      sum += p;
    }
    CHECK(sum == doctest::Approx(r.total_seconds).epsilon(1e-3));
    CHECK(r.timings.total() == doctest::Approx(sum));
  };
  // Recurrent layers (their states are inputs, state_restore's recomputation a check), prefix reuse,
  // every comparison run.
  const Scenario recurrent = load_scenario_file(std::string(KVSIM_SOURCE_DIR) + "/scenarios/model_hybrid_recurrent_reuse.toml");
  const ScenarioReport all = replay(recurrent, cpu());
  adds_up(all);
  const ReplayTimings& t = all.timings;
  CHECK(t.kernels > 0);
  CHECK(t.inputs > 0);
  CHECK(t.transfers > 0);
  CHECK(t.scheduling > 0);
  CHECK(t.recording > 0);
  CHECK(t.dense > 0);
  CHECK(t.checks > 0);
  CHECK(t.comparisons > 0);
  CHECK(t.op_host == 0);  // the CPU backend times no kernels apart from its op calls unless asked
  // No invariant selected: no comparison run, no comparison, no dense reference.
  ReplayOptions none;
  none.invariants = std::set<Invariant>{};
  const ScenarioReport bare = replay(recurrent, cpu(), none);
  adds_up(bare);
  CHECK(bare.timings.comparisons == 0);
  CHECK(bare.timings.dense == 0);
  // The offload check's digests are checks; its block copies transfers.
  const ScenarioReport offload =
      replay(load_scenario_file(std::string(KVSIM_SOURCE_DIR) + "/scenarios/prefix_reuse_offload_onboard.toml"), cpu());
  adds_up(offload);
  CHECK(offload.timings.checks > 0);
  // With the backend's kernel timing on, each op call is split into its kernel and the rest.
  cpu().set_kernel_timing(true);
  const ScenarioReport timed = replay(recurrent, cpu(), none);
  cpu().set_kernel_timing(false);
  adds_up(timed);
  CHECK(timed.timings.kernels > 0);
}

TEST_CASE("planned_steps: the scheduler's dry run names every built-in scenario's step count") {
  namespace fs = std::filesystem;
  int exact = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(KVSIM_SOURCE_DIR) / "scenarios")) {
    if (entry.path().extension() != ".toml") continue;
    const Scenario s = load_scenario_file(entry.path().string());
    INFO(s.name);
    int64_t last = -1;
    ReplayOptions o;
    o.after_step = [&](int64_t step, const ReplayCounters&) { last = step; };
    const RunRecord r = run_scenario(s, cpu(), o);
    if (!r.op_rejection.empty()) continue;  // a fault that validation of an op stops mid-run
    const int64_t planned = planned_steps(s);
    if (s.recurrent.layers > 0 && s.reuse.enabled) {  // hits stop at the run's snapshots: an estimate
      CHECK(planned > 0);
      continue;
    }
    CHECK(planned == last + 1);
    ++exact;
  }
  CHECK(exact >= 40);
}
