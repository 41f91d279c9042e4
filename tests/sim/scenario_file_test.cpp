// Scenario files: every built-in scenario parses and passes the checks; every
// key reaches its Scenario field; malformed files and impossible settings
// are rejected with bad_scenario, FILE:LINE:COLUMN, the key and what was
// expected -- before anything runs.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <fstream>
#include <set>
#include <string>

#include "backends/backend.hpp"
#include "kvsim/sim/replay.hpp"
#include "kvsim/sim/scenario_file.hpp"

using namespace kvsim;
using namespace kvsim::sim;

namespace {

// The whole message of the rejection of `text` (parsed as "t.toml").
std::string rejection(const std::string& text) {
  try {
    parse_scenario(text, "t.toml");
  } catch (const ValidationError& e) {
    CHECK(e.code() == ErrorCode::bad_scenario);
    return e.what();
  }
  FAIL("accepted: " << text);
  return {};
}

// `text` is rejected and the message starts with "bad_scenario: t.toml:" + `where_and_key`
// and contains `detail`.
void check_rejected(const std::string& text, const std::string& where_and_key, const std::string& detail) {
  const std::string message = rejection(text);
  INFO("message: " << message);
  CHECK(message.rfind("bad_scenario: t.toml:" + where_and_key, 0) == 0);
  CHECK(message.find(detail) != std::string::npos);
}

const std::string kOneRequest = "[[request]]\ngenerated = 5\n";

}  // namespace

TEST_CASE("every built-in scenario parses, passes the checks and says what it teaches and models") {
  const std::vector<std::string> paths = builtin_scenario_paths();
  REQUIRE(paths.size() >= 30);
  CHECK(std::is_sorted(paths.begin(), paths.end()));
  std::set<Fault> caught;
  for (const std::string& path : paths) {
    INFO(path);
    const Scenario s = load_scenario_file(path);
    CHECK(s.name == std::filesystem::path(path).stem().string());
    CHECK(s.path == path);
    CHECK_FALSE(s.requests.empty());
    CHECK(s.description.find("Teaches:") != std::string::npos);
    CHECK(s.description.find("Models:") != std::string::npos);
    // Each switched-on fault is expected to be caught, and each expected catch is switched on.
    for (Fault f : s.faults)
      CHECK(std::find(s.expect.must_catch.begin(), s.expect.must_catch.end(), f) != s.expect.must_catch.end());
    for (Fault f : s.expect.must_catch) caught.insert(f);
  }
  // One fault scenario for each silent failure of contract §6.
  for (Fault f : {Fault::past_len_zero, Fault::window_mismatch, Fault::k_scale_for_v, Fault::reused_block_mismatch,
                  Fault::v_tail_not_zeroed, Fault::stale_bad_page}) {
    INFO(fault_name(f));
    CHECK(caught.count(f) == 1);
  }
}

TEST_CASE("the built-in set covers the behaviours issue 6 lists") {
  std::vector<Scenario> all;
  for (const std::string& path : builtin_scenario_paths()) all.push_back(load_scenario_file(path));
  auto any = [&](auto predicate) { return std::any_of(all.begin(), all.end(), predicate); };
  std::set<int32_t> chunk_sizes;
  for (const Scenario& s : all)
    if (s.scheduler.chunk_size > 0 && s.faults.empty()) chunk_sizes.insert(s.scheduler.chunk_size);
  CHECK(chunk_sizes.size() >= 3);
  CHECK(any([](const Scenario& s) { return s.cache.page_size % 2 == 1 && s.cache.page_size > 1 && s.scheduler.chunk_size > 0; }));
  CHECK(any([](const Scenario& s) { return s.reuse.partial; }));
  // Two requests sharing a prefix in the same step.
  CHECK(any([](const Scenario& s) {
    if (!s.reuse.enabled) return false;
    for (size_t i = 0; i < s.requests.size(); ++i)
      for (size_t j = i + 1; j < s.requests.size(); ++j)
        if (s.requests[i].arrival_step == s.requests[j].arrival_step && !s.requests[i].prefixes.empty() &&
            s.requests[i].prefixes == s.requests[j].prefixes)
          return true;
    return false;
  }));
  CHECK(any([](const Scenario& s) { return s.reuse.offload && s.cache.secondary_blocks > 0; }));
  CHECK(any([](const Scenario& s) { return s.window.mode == WindowMode::release; }));
  CHECK(any([](const Scenario& s) { return s.window.mode == WindowMode::cyclic && s.window.sinks % s.cache.page_size != 0; }));
  CHECK(any([](const Scenario& s) { return s.window.one_more_block; }));
  for (CacheDtype d : {CacheDtype::fp8_e4m3, CacheDtype::int8, CacheDtype::nvfp4})
    CHECK(any([d](const Scenario& s) { return s.cache.dtype == d && s.faults.empty(); }));
  CHECK(any([](const Scenario& s) { return s.mla.enabled; }));
  CHECK(any([](const Scenario& s) { return s.indexer_k_scatter; }));
  CHECK(any([](const Scenario& s) { return s.cache.shared_kv_allocation; }));
  CHECK(any([](const Scenario& s) { return s.cache.poison_nan && s.cache.zero_v_tail; }));
  CHECK(any([](const Scenario& s) { return s.cache.layout == BlockLayout::split_x && s.cache.write_path == WritePath::reshape_and_cache; }));
  for (WritePath w : {WritePath::qkv_preprocess, WritePath::append_paged, WritePath::reshape_and_cache, WritePath::append_mla})
    CHECK(any([w](const Scenario& s) { return s.cache.write_path == w; }));
  CHECK(any([](const Scenario& s) { return s.model.q_heads > s.model.kv_heads && s.requests.size() >= 5; }));
}

TEST_CASE("an omitted key takes the default of scenario.hpp") {
  const Scenario s = parse_scenario(kOneRequest, "defaults.toml");
  const Scenario d;
  CHECK(s.name == "defaults");
  CHECK(s.model.layers == d.model.layers);
  CHECK(s.model.q_heads == d.model.q_heads);
  CHECK(s.model.kv_heads == d.model.kv_heads);
  CHECK(s.model.head_dim == d.model.head_dim);
  CHECK(s.model.input_dtype == d.model.input_dtype);
  CHECK(s.model.rope == d.model.rope);
  CHECK(s.cache.dtype == d.cache.dtype);
  CHECK(s.cache.layout == d.cache.layout);
  CHECK(s.cache.placement == d.cache.placement);
  CHECK(s.cache.page_size == d.cache.page_size);
  CHECK(s.cache.primary_blocks == d.cache.primary_blocks);
  CHECK(s.cache.write_path == d.cache.write_path);
  CHECK(s.cache.zero_v_tail == d.cache.zero_v_tail);
  CHECK(s.window.mode == WindowMode::none);
  CHECK_FALSE(s.reuse.enabled);
  CHECK(s.scheduler.token_budget == d.scheduler.token_budget);
  CHECK(s.scheduler.max_steps == d.scheduler.max_steps);
  CHECK_FALSE(s.indexer_k_scatter);
  CHECK(s.faults.empty());
  CHECK_FALSE(s.expect.reuse_hit_tokens.has_value());
  REQUIRE(s.requests.size() == 1);
  CHECK(s.requests[0].id == "r0");  // unnamed requests are numbered by position
  CHECK(s.requests[0].generated == 5);
  CHECK(s.requests[0].where.line == 1);
}

TEST_CASE("every key reaches its Scenario field") {
  const std::string text = R"(# What this teaches.
# Which engine it models.
[model]
layers = 3
q_heads = 6
kv_heads = 3
head_dim = 128
seed = 99
value_scale = 0.5
outlier_rate = 0.01
outlier_scale = 32
input_dtype = "fp16"
rope = "gptj"
rotary_dim = 64
rope_theta = 500000.0

[cache]
dtype = "fp8_e5m2"
layout = "split-x"
placement = "per_layer"
page_size = 7
primary_blocks = 100
secondary_blocks = 9
write_path = "reshape_and_cache"
k_scale = 0.5
v_scale = 0.25
zero_v_tail = false
fresh_page_fill = 0.5

[window]
mode = "release"
window = 33

[scheduler]
token_budget = 77
chunk_size = 11
max_batch = 5
max_steps = 500

[indexer]
k_scatter = true

[[prefix]]
name = "sys"
tokens = [5, 6, 7]

[[prefix]]
name = "gen"
length = 20
seed = 3

[[request]]
id = "x"
arrival_step = 4
prefixes = ["sys", "gen"]
tokens = [1, 2, 3]
decode_tokens = 9

[[request]]
id = "y"
generated = 12
seed = 8

[faults]
stale_bad_page = true

[expect]
reuse_hit_tokens = 0
evicted_blocks = 4
offloaded_blocks = 0
onboarded_blocks = 0
preemptions = 3
must_pass = ["conservation"]
must_catch = ["stale_bad_page"]
)";
  const Scenario s = parse_scenario(text, "dir/every_key.toml");
  CHECK(s.name == "every_key");
  CHECK(s.description == "What this teaches.\nWhich engine it models.");
  CHECK(s.model.layers == 3);
  CHECK(s.model.q_heads == 6);
  CHECK(s.model.kv_heads == 3);
  CHECK(s.model.head_dim == 128);
  CHECK(s.model.seed == 99);
  CHECK(s.model.value_scale == 0.5f);
  CHECK(s.model.outlier_rate == 0.01f);
  CHECK(s.model.outlier_scale == 32.0f);  // an integer is accepted where a number is expected
  CHECK(s.model.input_dtype == CacheDtype::fp16);
  CHECK(s.model.rope == RopeStyle::gptj);
  CHECK(s.model.rotary_dim == 64);
  CHECK(s.model.rope_theta == 500000.0);
  CHECK(s.cache.dtype == CacheDtype::fp8_e5m2);
  CHECK(s.cache.layout == BlockLayout::split_x);
  CHECK(s.cache.placement == LayerPlacement::per_layer);
  CHECK(s.cache.page_size == 7);
  CHECK(s.cache.primary_blocks == 100);
  CHECK(s.cache.secondary_blocks == 9);
  CHECK(s.cache.write_path == WritePath::reshape_and_cache);
  CHECK(s.cache.k_scale == 0.5f);
  CHECK(s.cache.v_scale == 0.25f);
  CHECK_FALSE(s.cache.zero_v_tail);
  CHECK(s.cache.fresh_page_fill == 0.5f);
  // poison_nan goes with the write path that zeroes the V tail (qkv_preprocess).
  CHECK(parse_scenario("[cache]\npoison_nan = true\n" + kOneRequest, "p.toml").cache.poison_nan);
  CHECK(s.window.mode == WindowMode::release);
  CHECK(s.window.window == 33);
  CHECK(s.scheduler.token_budget == 77);
  CHECK(s.scheduler.chunk_size == 11);
  CHECK(s.scheduler.max_batch == 5);
  CHECK(s.scheduler.max_steps == 500);
  CHECK(s.indexer_k_scatter);
  REQUIRE(s.prefixes.size() == 2);
  CHECK(s.prefixes[0].tokens == std::vector<int32_t>{5, 6, 7});
  CHECK(s.prefixes[1].tokens == generated_tokens(3, 20));
  CHECK(s.prefixes[1].where.line == 47);
  REQUIRE(s.requests.size() == 2);
  CHECK(s.requests[0].id == "x");
  CHECK(s.requests[0].arrival_step == 4);
  CHECK(s.requests[0].prefixes == std::vector<std::string>{"sys", "gen"});
  CHECK(s.requests[0].tokens == std::vector<int32_t>{1, 2, 3});
  CHECK(s.requests[0].decode_tokens == 9);
  CHECK(s.requests[1].generated == 12);
  CHECK(s.requests[1].seed == 8);
  CHECK(s.faults == std::vector<Fault>{Fault::stale_bad_page});
  CHECK(s.expect.reuse_hit_tokens == 0);
  CHECK(s.expect.evicted_blocks == 4);
  CHECK(s.expect.offloaded_blocks == 0);
  CHECK(s.expect.onboarded_blocks == 0);
  CHECK(s.expect.preemptions == 3);
  CHECK(s.expect.must_pass == std::vector<Invariant>{Invariant::conservation});
  CHECK(s.expect.must_catch == std::vector<Fault>{Fault::stale_bad_page});
  // [reuse] needs no window (checked elsewhere), so its keys are read here.
  const Scenario r = parse_scenario(
      "[reuse]\nenabled = true\npartial = true\noffload = true\n[cache]\nsecondary_blocks = 4\n" + kOneRequest, "r.toml");
  CHECK(r.reuse.enabled);
  CHECK(r.reuse.partial);
  CHECK(r.reuse.offload);
  // Locations for later checks and for kvsim's messages.
  CHECK(s.key_locations.at("cache.page_size").line == 21);
  CHECK(s.key_locations.at("cache.page_size").column == 13);
}

TEST_CASE("MLA: head_dim follows d_ckv + d_kpe and the write path is append_mla") {
  const Scenario s = parse_scenario("[mla]\nenabled = true\nd_ckv = 128\nd_kpe = 32\n" + kOneRequest, "m.toml");
  CHECK(s.model.head_dim == 160);
  CHECK(s.cache.write_path == WritePath::append_mla);
  CHECK(pool_geometry(s).kv_factor == 1);
  CHECK(pool_geometry(s).kv_heads == 1);
  check_rejected("[mla]\nenabled = true\n[model]\nhead_dim = 64\n" + kOneRequest, "4:12: model.head_dim",
                 "expected d_ckv + d_kpe = 576");
  check_rejected("[cache]\nwrite_path = \"append_mla\"\n" + kOneRequest, "2:14: cache.write_path",
                 "set mla.enabled = true");
  // nvfp4 keeps kpe as fp8 bytes: two nibbles each.
  const Scenario fp4 =
      parse_scenario("[mla]\nenabled = true\nd_ckv = 128\nd_kpe = 32\n[cache]\ndtype = \"nvfp4\"\n" + kOneRequest, "m.toml");
  CHECK(fp4.model.head_dim == 192);
  check_rejected("[mla]\nenabled = true\n[model]\nhead_dim = 576\n[cache]\ndtype = \"nvfp4\"\n" + kOneRequest,
                 "4:12: model.head_dim", "expected d_ckv + 2 * d_kpe = 640");
}

TEST_CASE("generated tokens are deterministic and inside the vocabulary") {
  const auto a = generated_tokens(42, 1000);
  CHECK(a == generated_tokens(42, 1000));
  CHECK(a != generated_tokens(43, 1000));
  CHECK(std::all_of(a.begin(), a.end(), [](int32_t t) { return t >= 0 && t < kGeneratedVocabulary; }));
  CHECK(std::set<int32_t>(a.begin(), a.end()).size() > 900);  // not a constant or a short cycle
  // An unseeded generated prefix is seeded from its name: two such prefixes differ.
  const Scenario s = parse_scenario(
      "[[prefix]]\nname = \"a\"\nlength = 8\n[[prefix]]\nname = \"b\"\nlength = 8\n" + kOneRequest, "t.toml");
  CHECK(s.prefixes[0].tokens != s.prefixes[1].tokens);
}

TEST_CASE("malformed TOML is rejected at its line and column") {
  check_rejected("[cache\npage_size = 16\n", "1:7: toml", "expected valid TOML");
  check_rejected("[cache]\npage_size = = 16\n", "2:13: toml", "expected valid TOML");
  check_rejected("[cache]\npage_size = 16\npage_size = 17\n", "3:13: toml", "cannot redefine existing integer 'page_size'");
}

TEST_CASE("unknown keys are rejected with the nearest valid key") {
  check_rejected("[cache]\npage_sise = 16\n" + kOneRequest, "2:1: cache.page_sise", "did you mean page_size?");
  check_rejected("[scheduler]\nchunk = 16\n" + kOneRequest, "2:1: scheduler.chunk", "did you mean chunk_size?");
  check_rejected("[cache]\nflux_capacitor = 1\n" + kOneRequest, "2:1: cache.flux_capacitor",
                 "expected one of dtype, layout, placement");
  check_rejected("modle = 1\n" + kOneRequest, "1:1: modle", "did you mean model?");
  check_rejected(kOneRequest + "prompt = [1, 2]\n", "3:1: request[0].prompt", "unknown key");
  check_rejected("[faults]\npast_len_zeros = true\n" + kOneRequest, "2:1: faults.past_len_zeros",
                 "did you mean past_len_zero?");
}

TEST_CASE("wrong types are rejected with what was expected and what was found") {
  check_rejected("[cache]\npage_size = \"16\"\n" + kOneRequest, "2:13: cache.page_size",
                 "expected an integer, got a string (\"16\")");
  check_rejected("[cache]\nzero_v_tail = 1\n" + kOneRequest, "2:15: cache.zero_v_tail",
                 "expected a boolean (true or false), got an integer (1)");
  check_rejected("[cache]\nk_scale = \"big\"\n" + kOneRequest, "2:11: cache.k_scale", "expected a number");
  check_rejected("cache = 3\n" + kOneRequest, "1:9: cache", "expected a table ([cache]), got an integer (3)");
  check_rejected("[request]\ngenerated = 5\n", "1:1: request", "expected an array of tables ([[request]])");
  check_rejected("[[request]]\ntokens = [1, \"two\"]\n", "2:14: request[0].tokens[1]", "expected a token id");
  check_rejected("[[request]]\ntokens = [1, -2]\n", "2:14: request[0].tokens[1]",
                 "expected a token id in 0..2147483647, got an integer (-2)");
  check_rejected("[[request]]\nprefixes = \"sys\"\n", "2:12: request[0].prefixes", "expected an array of strings");
  check_rejected("[expect]\nmust_catch = [\"everything\"]\n" + kOneRequest, "2:15: expect.must_catch[0]",
                 "expected one of past_len_zero, window_mismatch");
}

TEST_CASE("out-of-range values are rejected") {
  check_rejected("[model]\nlayers = 99999999999\n" + kOneRequest, "2:10: model.layers",
                 "expected an integer in -2147483648..2147483647, got an integer (99999999999)");
  check_rejected("[cache]\npage_size = 0\n" + kOneRequest, "2:13: cache.page_size", "expected 1..1024");
  check_rejected("[cache]\nsecondary_blocks = 4000000000000\n" + kOneRequest, "2:20: cache.secondary_blocks",
                 "expected 0..2147483646 (block ids are 31 bits), got 4000000000000");
  check_rejected("[cache]\nprimary_blocks = 2147483647\n" + kOneRequest, "2:18: cache.primary_blocks",
                 "expected 1..2147483646");
  check_rejected("[cache]\npage_size = 1025\n" + kOneRequest, "2:13: cache.page_size", "expected 1..1024");
  check_rejected("[model]\nq_heads = 6\nkv_heads = 4\n" + kOneRequest, "2:11: model.q_heads",
                 "expected a positive multiple of kv_heads = 4");
  check_rejected("[model]\noutlier_rate = 1.5\n" + kOneRequest, "2:16: model.outlier_rate", "expected a share in 0..1");
  check_rejected("[cache]\nk_scale = 0\ndtype = \"int8\"\n" + kOneRequest, "2:11: cache.k_scale",
                 "expected a finite number > 0");
  check_rejected("[cache]\ndtype = \"nvfp4\"\nv_global_scale = -1.0\n" + kOneRequest, "3:18: cache.v_global_scale",
                 "bad_global_scale");
  check_rejected("[mla]\nenabled = true\nd_ckv = 2147483647\n" + kOneRequest, "3:9: mla.d_ckv", "expected 1..4096");
  check_rejected("[model]\nq_heads = 100000\n" + kOneRequest, "2:11: model.q_heads", "expected at most 8192");
  check_rejected("[cache]\nk_global_scale = nan\n" + kOneRequest, "2:18: cache.k_global_scale",
                 "expected a finite number > 0, got nan");
  check_rejected("[model]\nvalue_scale = inf\n" + kOneRequest, "2:15: model.value_scale",
                 "expected a finite number > 0, got inf");
  check_rejected("[scheduler]\ntoken_budget = 0\n" + kOneRequest, "2:16: scheduler.token_budget", "expected >= 1");
  check_rejected("[[request]]\ngenerated = 5\ndecode_tokens = -1\n", "3:17: request[0].decode_tokens",
                 "expected >= 0");
  check_rejected("[[request]]\ndecode_tokens = 3\n", "1:1: request[0]", "expected a prompt of at least one token");
  check_rejected("[[request]]\ngenerated = 5\narrival_step = 10\n[scheduler]\nmax_steps = 10\n",
                 "3:16: request[0].arrival_step", "expected 0..scheduler.max_steps - 1 = 9");
}

TEST_CASE("names from a closed vocabulary: dtype, layout, placement, write path, window mode, rope") {
  check_rejected("[cache]\ndtype = \"fp9\"\n" + kOneRequest, "2:9: cache.dtype",
                 "expected one of fp32, fp16, bf16, fp8_e4m3, fp8_e5m2, int8, nvfp4, got a string (\"fp9\")");
  check_rejected("[cache]\nlayout = \"NCHW\"\n" + kOneRequest, "2:10: cache.layout", "expected one of nhd, hnd, split-x");
  check_rejected("[cache]\nplacement = \"interleaved\"\n" + kOneRequest, "2:13: cache.placement",
                 "expected one of in_block, per_layer");
  check_rejected("[cache]\nwrite_path = \"memcpy\"\n" + kOneRequest, "2:14: cache.write_path",
                 "expected one of qkv_preprocess, append_paged, reshape_and_cache, append_mla");
  check_rejected("[window]\nmode = \"rolling\"\n" + kOneRequest, "2:8: window.mode",
                 "expected one of none, cyclic, release");
  check_rejected("[model]\nrope = \"llama\"\n" + kOneRequest, "2:8: model.rope", "expected one of none, neox, gptj");
  // The input is what engines feed: a float dtype (parsed as a dtype name, then checked).
  check_rejected("[model]\ninput_dtype = \"int8\"\n" + kOneRequest, "2:15: model.input_dtype",
                 "expected one of fp32, fp16, bf16");
  // Core's own spellings are accepted.
  CHECK(parse_scenario("[cache]\nlayout = \"split_x\"\nplacement = \"per-layer\"\n" + kOneRequest, "t.toml").cache.layout ==
        BlockLayout::split_x);
}

TEST_CASE("[attention] order: fp32 (default) or mma; mma only where core offers it") {
  CHECK(parse_scenario(kOneRequest, "t.toml").attention.order == AttentionOrder::fp32);
  CHECK(parse_scenario("[attention]\norder = \"mma\"\n" + kOneRequest, "t.toml").attention.order == AttentionOrder::mma);
  check_rejected("[attention]\norder = \"tf32\"\n" + kOneRequest, "2:9: attention.order", "expected one of fp32, mma");
  check_rejected("[attention]\nmode = \"mma\"\n" + kOneRequest, "2:1: attention.mode", "order");
  check_rejected("[model]\ninput_dtype = \"fp32\"\n[cache]\ndtype = \"fp32\"\n[attention]\norder = \"mma\"\n" + kOneRequest,
                 "6:9: attention.order",
                 "unsupported_attention_order: attention: attention order mma is not offered for a fp32 cache");
  check_rejected("[cache]\ndtype = \"nvfp4\"\n[attention]\norder = \"mma\"\n" + kOneRequest, "4:9: attention.order",
                 "not offered for a nvfp4 cache");
}

TEST_CASE("prompts: missing prefixes, duplicates, tokens and generated together") {
  check_rejected("[[request]]\nprefixes = [\"nope\"]\n", "2:12: request[0].prefixes",
                 "expected the name of a [[prefix]] (none defined), got \"nope\"");
  check_rejected("[[prefix]]\nname = \"sys\"\nlength = 4\n[[request]]\nprefixes = [\"sys\", \"syss\"]\n",
                 "5:12: request[0].prefixes", "expected the name of a [[prefix]] (sys), got \"syss\"");
  check_rejected("[[prefix]]\nname = \"a\"\nlength = 4\n[[prefix]]\nname = \"a\"\nlength = 5\n" + kOneRequest,
                 "5:8: prefix[1].name", "expected a unique name, got \"a\" twice");
  check_rejected("[[prefix]]\nname = \"a\"\n" + kOneRequest, "1:1: prefix[0].tokens", "got neither");
  check_rejected("[[prefix]]\nname = \"a\"\nlength = 3\ntokens = [1]\n" + kOneRequest, "1:1: prefix[0].tokens",
                 "got both");
  check_rejected("[[prefix]]\nlength = 3\n" + kOneRequest, "1:1: prefix[0].name", "every [[prefix]] is named");
  check_rejected("[[request]]\nid = \"a\"\ngenerated = 1\n[[request]]\nid = \"a\"\ngenerated = 1\n",
                 "5:6: request[1].id", "expected a unique id, got \"a\" twice");
  check_rejected("[[request]]\ntokens = [1]\ngenerated = 4\n", "3:13: request[0].generated", "got both");
  check_rejected("[cache]\npage_size = 16\n", "1:1: request", "expected at least one [[request]]");
}

TEST_CASE("windows: sinks >= window, a window without a mode, release-mode limits, cyclic chunk overflow") {
  check_rejected("[window]\nmode = \"cyclic\"\nwindow = 8\nsinks = 8\n" + kOneRequest, "4:9: window.sinks",
                 "rejected by core: bad_window: sinks = 8 must be < window = 8");
  check_rejected("[window]\nwindow = 8\n" + kOneRequest, "2:10: window.window", "expected 0 with mode = none");
  check_rejected("[window]\nmode = \"release\"\n" + kOneRequest, "1:1: window.window",
                 "expected >= 1 tokens with mode = release");
  check_rejected("[window]\nmode = \"release\"\nwindow = 32\nsinks = 4\n" + kOneRequest, "4:9: window.sinks",
                 "expected 0 with mode = release");
  check_rejected("[window]\nmode = \"cyclic\"\nwindow = 32\n[reuse]\nenabled = true\n" + kOneRequest,
                 "5:11: reuse.enabled", "TensorRT-LLM disables block reuse");
  check_rejected("[window]\nmode = \"release\"\nwindow = 32\n[reuse]\nenabled = true\n" + kOneRequest,
                 "5:11: reuse.enabled", "expected false with a release window");
  // A 100-token prompt prefilled in one chunk wraps a 32-slot ring over keys its own queries read.
  const std::string wraps = "[window]\nmode = \"cyclic\"\nwindow = 32\n[[request]]\ngenerated = 100\n";
  check_rejected(wraps, "4:1: request[0]", "expected prefill chunks of at most 1 token once the prompt wraps");
  check_rejected("[window]\nmode = \"cyclic\"\nwindow = 32\none_more_block = true\n[[request]]\ngenerated = 100\n",
                 "5:1: request[0]", "expected prefill chunks of at most 17 tokens");
  CHECK_NOTHROW(parse_scenario(wraps + "[scheduler]\nchunk_size = 1\n", "t.toml"));
  CHECK_NOTHROW(parse_scenario(
      "[window]\nmode = \"cyclic\"\nwindow = 32\none_more_block = true\n[scheduler]\nchunk_size = 17\n[[request]]\n"
      "generated = 100\n",
      "t.toml"));
}

TEST_CASE("impossible settings: a pool too small, offload without a secondary pool, shared allocation") {
  check_rejected("[cache]\nprimary_blocks = 2\n[[request]]\ngenerated = 100\n", "3:1: request[0]",
                 "100 tokens need 7 blocks of 16 tokens, got cache.primary_blocks = 2");
  // A cyclic window bounds the blocks a request needs: 1000 tokens fit in 3 blocks of a 40-token window.
  CHECK_NOTHROW(parse_scenario(
      "[cache]\nprimary_blocks = 3\n[window]\nmode = \"cyclic\"\nwindow = 40\n[[request]]\ngenerated = 10\n"
      "decode_tokens = 990\n",
      "t.toml"));
  check_rejected("[cache]\nprimary_blocks = 2\n[window]\nmode = \"release\"\nwindow = 32\n[[request]]\ngenerated = 40\n",
                 "6:1: request[0]", "40 tokens need 3 blocks of 16 tokens (one of them the release window's null block)");
  check_rejected("[reuse]\nenabled = true\noffload = true\n" + kOneRequest, "3:11: reuse.offload",
                 "expected cache.secondary_blocks >= 1");
  check_rejected("[reuse]\npartial = true\n" + kOneRequest, "2:11: reuse.partial", "expected reuse.enabled = true");
  check_rejected("[cache]\nshared_kv_allocation = true\n" + kOneRequest, "2:24: cache.shared_kv_allocation",
                 "expected placement = per_layer and layout = nhd");
  check_rejected("[cache]\ndtype = \"nvfp4\"\nlayout = \"split-x\"\n" + kOneRequest, "1:1: cache",
                 "rejected by core: bad_geometry: split-x layout does not support nvfp4");
  check_rejected("[cache]\ndtype = \"fp16\"\n" + kOneRequest, "2:9: cache.dtype",
                 "expected model.input_dtype = bf16");
  check_rejected("[cache]\ndtype = \"nvfp4\"\nwrite_path = \"reshape_and_cache\"\n" + kOneRequest,
                 "3:14: cache.write_path", "reshape_and_cache does not write nvfp4");
}

TEST_CASE("faults need the setting they break, and expectations must be consistent") {
  check_rejected("[faults]\npast_len_zero = true\n" + kOneRequest, "2:17: faults.past_len_zero",
                 "expected scheduler.chunk_size > 0");
  check_rejected("[faults]\nwindow_mismatch = true\n" + kOneRequest, "2:19: faults.window_mismatch",
                 "expected window.mode = cyclic");
  check_rejected("[faults]\nk_scale_for_v = true\n" + kOneRequest, "2:17: faults.k_scale_for_v",
                 "expected a quantized cache.dtype");
  check_rejected("[cache]\ndtype = \"int8\"\n[faults]\nk_scale_for_v = true\n" + kOneRequest,
                 "4:17: faults.k_scale_for_v", "expected different K and V scales");
  check_rejected("[faults]\nreused_block_mismatch = true\n" + kOneRequest, "2:25: faults.reused_block_mismatch",
                 "expected reuse.enabled = true");
  check_rejected("[faults]\nv_tail_not_zeroed = true\n" + kOneRequest, "2:21: faults.v_tail_not_zeroed",
                 "expected cache.poison_nan = true");
  check_rejected("[expect]\nmust_catch = [\"stale_bad_page\"]\n" + kOneRequest, "2:14: expect.must_catch",
                 "set faults.stale_bad_page = true");
  check_rejected("[faults]\nstale_bad_page = true\n[expect]\nmust_pass = [\"dense\"]\n" + kOneRequest,
                 "4:13: expect.must_pass", "dense, which fault stale_bad_page breaks");
  check_rejected("[expect]\nreuse_hit_tokens = 16\n" + kOneRequest, "2:20: expect.reuse_hit_tokens",
                 "expected 0 or reuse.enabled = true");
  check_rejected("[expect]\npreemptions = -1\n" + kOneRequest, "2:15: expect.preemptions", "expected a count >= 0");
}

TEST_CASE("fp8 queries: query_dtype is e4m3 or e5m2, q_scale belongs to it, not with mla_attention") {
  const Scenario s = parse_scenario("[model]\nquery_dtype = \"fp8_e5m2\"\nq_scale = 0.25\n" + kOneRequest, "t.toml");
  REQUIRE(s.model.query_dtype.has_value());
  CHECK(*s.model.query_dtype == CacheDtype::fp8_e5m2);
  CHECK(s.model.q_scale == 0.25f);
  CHECK_FALSE(parse_scenario(kOneRequest, "t.toml").model.query_dtype.has_value());
  check_rejected("[model]\nquery_dtype = \"bf16\"\n" + kOneRequest, "2:15: model.query_dtype",
                 "expected fp8_e4m3 or fp8_e5m2");
  check_rejected("[model]\nquery_dtype = \"fp9\"\n" + kOneRequest, "2:15: model.query_dtype",
                 "one of fp8_e4m3, fp8_e5m2");
  // A NUL inside the echoed string comes back escaped: the message goes on past it.
  check_rejected("[model]\nquery_dtype = \"fp8_e4m3\\u0000x\"\n" + kOneRequest, "2:15: model.query_dtype",
                 "(\"fp8_e4m3\\u0000x\")");
  check_rejected("[model]\nq_scale = 0.5\n" + kOneRequest, "2:11: model.q_scale", "expected 1 without model.query_dtype");
  check_rejected("[model]\nquery_dtype = \"fp8_e4m3\"\nq_scale = 0.0\n" + kOneRequest, "3:11: model.q_scale",
                 "expected a finite number > 0");
  check_rejected("[model]\nquery_dtype = \"fp8_e4m3\"\nlayers = 1\nhead_dim = 80\n[mla]\nenabled = true\nd_ckv = 64\n"
                 "d_kpe = 16\nattention = true\n[cache]\nwrite_path = \"append_mla\"\n" + kOneRequest,
                 "2:15: model.query_dtype", "not mla_attention");
  check_rejected("[model]\nquery_dtype = \"fp8_e4m3\"\n[faults]\nq_scale_dropped = true\n" + kOneRequest,
                 "4:19: faults.q_scale_dropped", "model.q_scale != 1");
}

TEST_CASE("check_scenario: the same rules for a scenario built in C++, placed by its name") {
  Scenario s;
  s.name = "built_in_cpp";
  s.requests.push_back(RequestSpec{.id = "a", .generated = 10});
  CHECK_NOTHROW(check_scenario(s));
  s.cache.page_size = 0;
  try {
    check_scenario(s);
    FAIL("accepted page_size = 0");
  } catch (const ValidationError& e) {
    CHECK(e.code() == ErrorCode::bad_scenario);
    CHECK(std::string(e.what()) == "bad_scenario: built_in_cpp:0:0: cache.page_size: expected 1..1024 tokens per "
                                   "block, got 0");
  }
}

TEST_CASE("load_scenario_file: a missing file, and the file's own name in every message") {
  try {
    load_scenario_file("/nonexistent/dir/x.toml");
    FAIL("loaded a missing file");
  } catch (const ValidationError& e) {
    CHECK(e.code() == ErrorCode::bad_scenario);
    CHECK(std::string(e.what()).find("/nonexistent/dir/x.toml:0:0: file: expected a readable scenario file") !=
          std::string::npos);
  }
  const auto path = std::filesystem::temp_directory_path() / "kvsim_scenario_file_test_typo.toml";
  std::ofstream(path) << "# header\n[cache]\npage_sise = 16\n";
  try {
    load_scenario_file(path.string());
    FAIL("accepted a typo");
  } catch (const ValidationError& e) {
    CHECK(std::string(e.what()) == "bad_scenario: " + path.string() +
                                       ":3:1: cache.page_sise: unknown key; did you mean page_size?");
  }
  std::filesystem::remove(path);
}

TEST_CASE("[layers]: per-layer windows by list or pattern, both allocation models, and what they rule out") {
  const Scenario gemma = parse_scenario(
      "[model]\nlayers = 12\n[layers]\nwindows = [32, 32, 32, 32, 32, 0]\n" + kOneRequest, "t.toml");
  CHECK(gemma.layers.enabled);
  CHECK(gemma.layers.allocation == KvAllocation::hybrid);
  CHECK(layer_window(gemma, 6) == 32);
  CHECK(layer_window(gemma, 11) == 0);
  // vLLM: each kind in groups of the smallest kind's count (2 full layers): 5 sliding groups + 1 full.
  const std::vector<KvGroup> hybrid = kv_groups(gemma);
  REQUIRE(hybrid.size() == 6);
  CHECK(hybrid[0].mode == WindowMode::sliding);
  CHECK(hybrid[0].layers == std::vector<int32_t>{0, 1});
  CHECK(hybrid[5].mode == WindowMode::none);
  CHECK(hybrid[5].layers == std::vector<int32_t>{5, 11});
  CHECK(kv_pool_count(hybrid) == 1);
  CHECK(kv_pool_geometry(gemma, hybrid, 0).layers == 2);
  // TensorRT-LLM VSWA: a pool per window size, full attention last.
  const Scenario oss = parse_scenario(
      "[model]\nlayers = 4\n[layers]\nwindows = [16, 0]\nallocation = \"vswa\"\nrule = \"cyclic\"\nsinks = 2\n" + kOneRequest,
      "t.toml");
  const std::vector<KvGroup> vswa = kv_groups(oss);
  REQUIRE(vswa.size() == 2);
  CHECK(vswa[0].mode == WindowMode::cyclic);
  CHECK(vswa[0].sinks == 2);
  CHECK(vswa[0].layers == std::vector<int32_t>{0, 2});
  CHECK(vswa[1].pool == 1);
  CHECK(vswa[1].layers == std::vector<int32_t>{1, 3});
  CHECK(kv_pool_count(vswa) == 2);

  check_rejected("[model]\nlayers = 4\n[layers]\nwindows = [16, 0, 0]\n" + kOneRequest, "4:11: layers.windows",
                 "a pattern that divides model.layers = 4");
  check_rejected("[layers]\nwindows = []\n" + kOneRequest, "2:11: layers.windows", "expected an array of per-layer windows");
  check_rejected("[layers]\nwindows = [-4]\n" + kOneRequest, "2:12: layers.windows[0]", "expected a window");
  check_rejected("[layers]\nwindows = [16, 0]\nsinks = 2\n" + kOneRequest, "3:9: layers.sinks",
                 "vLLM's sliding window has no sink tokens");
  check_rejected("[layers]\nwindows = [16, 0]\nrule = \"cyclic\"\n" + kOneRequest, "3:8: layers.rule",
                 "expected no rule with allocation = hybrid");
  check_rejected("[layers]\nwindows = [16, 0]\nallocation = \"vswa\"\nrule = \"cyclic\"\n[reuse]\nenabled = true\n" +
                     kOneRequest,
                 "6:11: reuse.enabled", "TensorRT-LLM disables block reuse for cyclic pools");
  check_rejected("[layers]\nwindows = [16, 0]\n[window]\nmode = \"cyclic\"\nwindow = 8\n" + kOneRequest, "4:8: window.mode",
                 "expected none with [layers]");
  check_rejected("[model]\nlayers = 5\n[layers]\nwindows = [16, 16, 16, 0, 0]\n" + kOneRequest, "4:11: layers.windows",
                 "a multiple of the smallest");
  check_rejected("[layers]\nwindows = [4, 0]\nallocation = \"vswa\"\nsinks = 4\n" + kOneRequest, "2:11: layers.windows",
                 "rejected by core");
  check_rejected("[layers]\nwindows = [16, 0]\nallocation = \"bogus\"\n" + kOneRequest, "3:14: layers.allocation",
                 "expected one of vswa, hybrid");
  check_rejected("[window]\nmode = \"sliding\"\nwindow = 8\n" + kOneRequest, "2:8: window.mode",
                 "expected one of none, cyclic, release");
  // Each pool must hold a request alone: the full group every token, a sliding group its window, + the null block.
  check_rejected("[cache]\npage_size = 4\nprimary_blocks = 5\n[layers]\nwindows = [8, 0]\n[[request]]\ngenerated = 12\n",
                 "6:1: request[0]", "6 blocks of 4 tokens (one of them the null block)");
}

TEST_CASE("scenario file: model.preset fills the model's shape, and the file's own keys override it") {
  Scenario s = parse_scenario("[model]\npreset = \"llama-3.1-8b\"\n\n[[request]]\ngenerated = 3\n", "preset.toml");
  CHECK(s.model.layers == 32);
  CHECK(s.model.q_heads == 32);
  CHECK(s.model.kv_heads == 8);
  CHECK(s.model.head_dim == 128);
  CHECK(s.model.rope_theta == 500000.0);
  CHECK(s.model.rope == RopeStyle::neox);
  s = parse_scenario("[model]\npreset = \"llama-3.1-70b\"\nlayers = 4\n\n[[request]]\ngenerated = 3\n", "p.toml");
  CHECK(s.model.layers == 4);  // the file wins
  CHECK(s.model.q_heads == 64);
  s = parse_scenario("[model]\npreset = \"qwen3-32b\"\n\n[[request]]\ngenerated = 3\n", "p.toml");
  CHECK(s.model.layers == 64);
  CHECK(s.model.rope_theta == 1000000.0);
  s = parse_scenario("[model]\npreset = \"mistral-7b\"\n\n[[request]]\ngenerated = 3\n", "p.toml");
  CHECK(s.window.mode == WindowMode::release);
  CHECK(s.window.window == 4096);
  s = parse_scenario("[model]\npreset = \"deepseek-v3\"\n\n[[request]]\ngenerated = 3\n", "p.toml");
  CHECK(s.mla.enabled);
  CHECK(s.mla.d_ckv == 512);
  CHECK(s.mla.d_kpe == 64);
  CHECK(s.model.layers == 61);
  CHECK(s.model.head_dim == 576);  // the latent row [ckv | kpe] of a bf16 cache
  try {
    parse_scenario("[model]\npreset = \"llama-9\"\n\n[[request]]\ngenerated = 3\n", "bad.toml");
    FAIL("an unknown preset must be rejected");
  } catch (const ValidationError& e) {
    CHECK(std::string(e.what()).find("bad.toml:2:10: model.preset: expected one of llama-3.1-8b, llama-3.1-70b, "
                                     "qwen3-32b, mistral-7b, deepseek-v3") != std::string::npos);
  }
}

// Issue 13 item 8: each of these validated, then `kvsim run` refused it (exit
// 2) or reported an expectation about an invariant it never checked as "n/a"
// and failed (exit 1). Validation now rejects each by the rule the replay
// would have hit, and the edge that is allowed replays.
TEST_CASE("validate <=> run: what the replay would refuse or never check is rejected by validation") {
  // head_dim: qkv_preprocess_write takes at most 512, attention at most 1024 (core's limits).
  check_rejected("[model]\nhead_dim = 520\nq_heads = 2\n" + kOneRequest, "2:12: model.head_dim",
                 "expected at most 512 with cache.write_path = qkv_preprocess");
  check_rejected("[model]\nhead_dim = 1032\nq_heads = 2\n[cache]\nwrite_path = \"append_paged\"\n" + kOneRequest,
                 "2:12: model.head_dim", "expected at most 1024 (decode and prefill attention");
  const std::unique_ptr<Backend> cpu = make_backend("cpu", BackendOptions{.threads = 2});
  for (const char* edge : {"head_dim = 512\n[cache]\nwrite_path = \"qkv_preprocess\"\n",
                           "head_dim = 1024\n[cache]\nwrite_path = \"append_paged\"\n",
                           "head_dim = 1024\n[cache]\nwrite_path = \"reshape_and_cache\"\n"}) {
    INFO(edge);
    const Scenario s = parse_scenario(std::string("[model]\nlayers = 1\nq_heads = 2\n") + edge +
                                          "[[request]]\ngenerated = 3\ndecode_tokens = 1\n",
                                      "edge.toml");
    const ScenarioReport r = replay(s, *cpu);
    CHECK(r.ok);
  }
  // MLA has no dense reference and no quantization comparison: their faults could only fail.
  const std::string mla = "[mla]\nenabled = true\nd_ckv = 64\nd_kpe = 16\nattention = true\n[cache]\n";
  check_rejected(mla + "[faults]\nstale_bad_page = true\n[expect]\nmust_catch = [\"stale_bad_page\"]\n" + kOneRequest,
                 "8:18: faults.stale_bad_page", "dense is checked only with no MLA");
  check_rejected(mla + "dtype = \"fp8_e4m3\"\nk_scale = 0.5\nv_scale = 0.25\n[faults]\nk_scale_for_v = true\n" +
                     "[expect]\nmust_catch = [\"k_scale_for_v\"]\n" + kOneRequest,
                 "11:17: faults.k_scale_for_v", "quantization is checked only with a quantized cache.dtype");
  // append_mla quantizes an nvfp4 ckv in groups of 16, whatever head_dim sums to.
  check_rejected("[mla]\nenabled = true\nd_ckv = 8\nd_kpe = 4\n[cache]\ndtype = \"nvfp4\"\n" + kOneRequest,
                 "3:9: mla.d_ckv", "expected a multiple of 16 with an nvfp4 cache");
  // must_pass of an invariant the scenario never checks.
  check_rejected(mla + "[expect]\nmust_pass = [\"dense\"]\n" + kOneRequest, "8:13: expect.must_pass",
                 "got dense: dense is checked only with no MLA");
  check_rejected(mla + "dtype = \"fp8_e4m3\"\n[expect]\nmust_pass = [\"quantization\"]\n" + kOneRequest,
                 "9:13: expect.must_pass", "got quantization: quantization is checked only with a quantized");
  check_rejected("[expect]\nmust_pass = [\"window\"]\n" + kOneRequest, "2:13: expect.must_pass",
                 "got window: window is checked only with a window");
  check_rejected("[expect]\nmust_pass = [\"reuse\"]\n" + kOneRequest, "2:13: expect.must_pass",
                 "got reuse: reuse is checked only with reuse.enabled = true");
  check_rejected("[reuse]\nenabled = true\n[expect]\nmust_pass = [\"offload\"]\n" + kOneRequest,
                 "4:13: expect.must_pass", "got offload: offload is checked only with reuse.offload = true");
  check_rejected("[expect]\nmust_pass = [\"batch\"]\n" + kOneRequest, "2:13: expect.must_pass",
                 "got batch: batch is checked only with at least two requests");
  check_rejected("[expect]\nmust_pass = [\"no_nan\"]\n" + kOneRequest, "2:13: expect.must_pass",
                 "got no_nan: no_nan is checked only with cache.poison_nan = true");
  check_rejected("[expect]\nmust_pass = [\"state_restore\"]\n" + kOneRequest, "2:13: expect.must_pass",
                 "got state_restore: state_restore is checked only with [recurrent] layers");
  // With a fault on, only the invariants it targets are compared: another comparison is never judged.
  check_rejected("[cache]\ndtype = \"int8\"\nk_scale = 0.5\nv_scale = 0.25\n[faults]\nk_scale_for_v = true\n"
                 "[expect]\nmust_pass = [\"chunking\"]\n" + kOneRequest,
                 "8:13: expect.must_pass", "got chunking: chunking is not judged while faults that target other "
                 "invariants are on (k_scale_for_v");
  // Any fault may make an op reject its input and end the run: what needs the run to get somewhere is not promised.
  check_rejected("[cache]\ndtype = \"int8\"\nk_scale = 0.5\nv_scale = 0.25\n[faults]\nk_scale_for_v = true\n"
                 "[expect]\nmust_pass = [\"dense\"]\n" + kOneRequest,
                 "8:13: expect.must_pass", "got dense: dense is not promised while a fault is on (k_scale_for_v)");
  // int8 has no NaN: its 0xFF bytes are -1, so a poisoned int8 pool shows no unzeroed tail.
  check_rejected("[cache]\ndtype = \"int8\"\npoison_nan = true\n[faults]\nv_tail_not_zeroed = true\n" + kOneRequest,
                 "5:21: faults.v_tail_not_zeroed", "int8's 0xFF is -1");
  // NaN-poisoned pools without the V tail zeroed could only fail no_nan.
  check_rejected("[cache]\npoison_nan = true\nwrite_path = \"append_paged\"\n" + kOneRequest, "2:14: cache.poison_nan",
                 "expected write_path = qkv_preprocess with zero_v_tail = true");
  check_rejected("[cache]\npoison_nan = true\nzero_v_tail = false\n" + kOneRequest, "2:14: cache.poison_nan",
                 "switch on faults.v_tail_not_zeroed");
  // What stays allowed: a must_pass the replay checks, next to a fault of another invariant.
  const Scenario ok = parse_scenario("[cache]\ndtype = \"int8\"\nk_scale = 0.5\nv_scale = 0.25\n[faults]\n"
                                     "k_scale_for_v = true\n[expect]\nmust_catch = [\"k_scale_for_v\"]\n"
                                     "must_pass = [\"conservation\"]\n[[request]]\ngenerated = 20\n"
                                     "decode_tokens = 2\n",
                                     "ok.toml");
  const ScenarioReport r = replay(ok, *cpu);
  CHECK(r.ok);
}
