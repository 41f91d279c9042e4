// KV-event streams (workload/lib/kv_events.cpp, kv_event_check.cpp): one
// stream written here in every encoding the engines use (vLLM msgpack with
// structs as arrays and as maps, ZMQ frame triples, JSON Lines; SGLang's
// array shape; TensorRT-LLM's JSON) reads back as the same events; each
// invariant is broken once and named with the first event that breaks it;
// malformed input is rejected as bad_event_stream with the byte offset or
// line and the field; and the replay through kvsim's block manager finds
// where its LRU evicts something the engine kept.
#include <doctest/doctest.h>

#include <msgpack.hpp>
#include <nlohmann/json.hpp>

#include <sstream>
#include <string>
#include <vector>

#include "kvsim/validation/errors.hpp"
#include "kvsim/workload/kv_events.hpp"

using namespace kvsim::workload;
using json = nlohmann::json;

namespace {

// ---- writing streams (msgpack-c's packer; the reader is not used here)

void pack(msgpack::packer<std::stringstream>& p, const json& v) {
  if (v.is_null()) p.pack_nil();
  else if (v.is_boolean()) p.pack(v.get<bool>());
  else if (v.is_number_unsigned()) p.pack(v.get<uint64_t>());
  else if (v.is_number_integer()) p.pack(v.get<int64_t>());
  else if (v.is_number_float()) p.pack(v.get<double>());
  else if (v.is_string()) p.pack(v.get<std::string>());
  else if (v.is_binary()) {
    p.pack_bin(static_cast<uint32_t>(v.get_binary().size()));
    p.pack_bin_body(reinterpret_cast<const char*>(v.get_binary().data()), static_cast<uint32_t>(v.get_binary().size()));
  } else if (v.is_array()) {
    p.pack_array(static_cast<uint32_t>(v.size()));
    for (const json& x : v) pack(p, x);
  } else {
    p.pack_map(static_cast<uint32_t>(v.size()));
    for (auto it = v.begin(); it != v.end(); ++it) {
      p.pack(it.key());
      pack(p, it.value());
    }
  }
}

std::string msgpack_bytes(const json& v) {
  std::stringstream ss;
  msgpack::packer<std::stringstream> p(ss);
  pack(p, v);
  return ss.str();
}

const std::vector<std::string> kStored = {"block_hashes", "parent_block_hash", "token_ids", "block_size",
                                          "lora_id",      "medium",            "lora_name", "extra_keys",
                                          "group_idx",    "kv_cache_spec_kind", "kv_cache_spec_sliding_window"};
const std::vector<std::string> kRemoved = {"block_hashes", "medium", "group_idx"};

// msgspec array_like: the tag, then the fields in order, trailing absent ones omitted.
json as_array(const json& event, size_t min_fields) {
  const std::string tag = event["type"];
  const auto& names = tag == "BlockStored" ? kStored : tag == "BlockRemoved" ? kRemoved : std::vector<std::string>{};
  json a = json::array({tag});
  size_t last = min_fields;
  for (size_t i = 0; i < names.size(); ++i)
    if (event.contains(names[i])) last = std::max(last, i + 1);
  for (size_t i = 0; i < last && i < names.size(); ++i) a.push_back(event.contains(names[i]) ? event[names[i]] : json());
  return a;
}

json stored(json hashes, json parent, int block_size, int first_token) {
  json tokens = json::array();
  for (size_t i = 0; i < hashes.size() * static_cast<size_t>(block_size); ++i) tokens.push_back(first_token + static_cast<int>(i));
  return {{"type", "BlockStored"}, {"block_hashes", hashes}, {"parent_block_hash", parent}, {"token_ids", tokens},
          {"block_size", block_size}, {"lora_id", nullptr}, {"medium", "GPU"}, {"lora_name", nullptr}};
}
json removed(json hashes) { return {{"type", "BlockRemoved"}, {"block_hashes", hashes}, {"medium", "GPU"}}; }
json cleared() { return {{"type", "AllBlocksCleared"}}; }

// A clean stream: three batches (a chain of three blocks, a branch, a removal of the branch's tail).
std::vector<json> clean_batches() {
  return {json::array({stored({101, 102}, nullptr, 4, 0)}),
          json::array({stored({103}, 102, 4, 100), stored({201}, 101, 4, 200)}),
          json::array({removed({201})})};
}

json map_batch(const json& events, int i) { return {{"ts", 1000.5 + i}, {"events", events}, {"data_parallel_rank", 0}}; }
json array_batch(const json& events, int i, size_t min_fields = 7) {
  json evs = json::array();
  for (const json& e : events) evs.push_back(as_array(e, e["type"] == "BlockStored" ? min_fields : 2));
  return json::array({1000.5 + i, evs, 0});
}

std::string frames(const std::vector<std::string>& payloads, uint64_t first_seq, const std::vector<uint64_t>& skip = {}) {
  std::string out;
  uint64_t seq = first_seq;
  for (const std::string& p : payloads) {
    while (std::find(skip.begin(), skip.end(), seq) != skip.end()) ++seq;
    std::vector<uint8_t> sb(8);
    for (int b = 0; b < 8; ++b) sb[b] = static_cast<uint8_t>(seq >> (56 - 8 * b));
    out += msgpack_bytes(json::array({"kv", json::binary(sb), json::binary(std::vector<uint8_t>(p.begin(), p.end()))}));
    ++seq;
  }
  return out;
}

std::string rejection(const std::string& bytes) {
  try {
    parse_event_stream(bytes, "e.bin");
  } catch (const kvsim::ValidationError& e) {
    CHECK(e.code() == kvsim::ErrorCode::bad_event_stream);
    return e.what();
  }
  FAIL("accepted");
  return "";
}

const EventCheck& check_of(const EventCheckReport& r, EventInvariant i) { return r.checks[static_cast<size_t>(i)]; }

std::string summary(const EventStream& s) {
  std::string out;
  for (const KvEvent& e : s.events) {
    out += e.kind == EventKind::stored ? "S" : e.kind == EventKind::removed ? "R" : "C";
    for (const auto& b : e.blocks) out += " " + b.hash + "/" + std::to_string(b.tokens.size());
    for (const auto& h : e.removed) out += " " + h;
    if (e.parent) out += " <" + *e.parent;
    out += ";";
  }
  return out;
}

}  // namespace

TEST_CASE("one vLLM stream in every encoding reads back as the same events and passes every check") {
  const auto batches = clean_batches();
  std::string packed_array, packed_map, jsonl_map, jsonl_array;
  std::vector<std::string> payloads;
  for (size_t i = 0; i < batches.size(); ++i) {
    packed_array += msgpack_bytes(array_batch(batches[i], static_cast<int>(i)));
    packed_map += msgpack_bytes(map_batch(batches[i], static_cast<int>(i)));
    payloads.push_back(msgpack_bytes(map_batch(batches[i], static_cast<int>(i))));
    jsonl_map += map_batch(batches[i], static_cast<int>(i)).dump() + "\n";
    jsonl_array += array_batch(batches[i], static_cast<int>(i)).dump() + "\n";
  }
  const std::string expected = "S 101/4 102/4;S 103/4 <102;S 201/4 <101;R 201;";
  struct Case {
    std::string bytes, encoding;
  };
  for (const Case& c : {Case{packed_array, "msgpack-array"}, Case{packed_map, "msgpack-map"},
                        Case{frames(payloads, 7), "msgpack-zmq-frames+map"}, Case{jsonl_map, "jsonl-map"},
                        Case{jsonl_array, "jsonl-array"}}) {
    CAPTURE(c.encoding);
    const EventStream s = parse_event_stream(c.bytes, "e.bin");
    CHECK(s.encoding == c.encoding);
    CHECK(s.engine == "vllm");
    CHECK(s.batches == 3);
    CHECK(summary(s) == expected);
    const EventCheckReport r = check_event_stream(s);
    CHECK(r.ok());
    CHECK(r.stored_blocks == 4);
    CHECK(r.removed_blocks == 1);
    CHECK(check_of(r, EventInvariant::sequence_contiguous).applicable == (c.encoding == "msgpack-zmq-frames+map"));
  }
  // Bytes block hashes (vLLM's ExternalBlockHash may be bytes) and the newer fields.
  json e = stored(json::array({json::binary({0xab, 0x01})}), nullptr, 2, 5);
  e["group_idx"] = 1;
  e["kv_cache_spec_kind"] = "full_attention";
  const EventStream b = parse_event_stream(msgpack_bytes(array_batch(json::array({e}), 0)), "e.bin");
  REQUIRE(b.events.size() == 1);
  CHECK(b.events[0].blocks[0].hash == "0xab01");
  CHECK(b.events[0].group == 1);
}

TEST_CASE("SGLang's array shape: five-field BlockStored, one-field BlockRemoved") {
  std::string bytes;
  const auto batches = clean_batches();
  for (size_t i = 0; i < batches.size(); ++i) {
    json evs = json::array();
    for (const json& ev : batches[i]) {
      json a = as_array(ev, 0);
      a.erase(a.begin() + (ev["type"] == "BlockStored" ? 6 : 2), a.end());  // tag + 5 fields, tag + 1 field
      evs.push_back(a);
    }
    bytes += msgpack_bytes(json::array({1.0 + i, evs}));
  }
  const EventStream s = parse_event_stream(bytes, "sglang.bin");
  CHECK(s.engine == "sglang");
  CHECK(summary(s) == "S 101/4 102/4;S 103/4 <102;S 201/4 <101;R 201;");
  CHECK(check_event_stream(s).ok());
}

TEST_CASE("TensorRT-LLM JSON events: created, stored, updated, removed") {
  auto block = [](int64_t hash, int first, int n, int level) {
    json toks = json::array();
    for (int i = 0; i < n; ++i) toks.push_back({{"type", "unique_token"}, {"token_id", first + i}, {"token_extra_id", 0}});
    return json{{"type", "stored_block"}, {"block_hash", hash}, {"tokens", toks}, {"cache_level", level}, {"priority", 35}};
  };
  json events = json::array({
      {{"event_id", 0}, {"data", {{"type", "created"}, {"num_blocks_per_cache_level", {64, 128}}}}, {"window_size", 32}},
      {{"event_id", 1}, {"data", {{"type", "stored"}, {"parent_hash", nullptr}, {"blocks", {block(11, 0, 4, 0), block(12, 4, 4, 0)}}}}, {"window_size", 32}},
      {{"event_id", 2}, {"data", {{"type", "updated"}, {"block_hash", 12}, {"cache_level", {{"type", "event_diff"}, {"new_value", 1}, {"old_value", 0}}}, {"priority", nullptr}}}, {"window_size", 32}},
      {{"event_id", 3}, {"data", {{"type", "removed"}, {"block_hashes", {12}}}}, {"window_size", 32}, {"attention_dp_rank", 0}},
  });
  const EventStream s = parse_event_stream(events.dump(), "trt.json");
  CHECK(s.engine == "trtllm");
  CHECK(s.encoding == "trtllm-json");
  EventCheckReport r = check_event_stream(s);
  CHECK(r.ok());
  CHECK(check_of(r, EventInvariant::cache_levels_exist).applicable);
  CHECK(check_of(r, EventInvariant::sequence_contiguous).applicable);
  // One event per line reads the same.
  std::string lines;
  for (const json& e : events) lines += e.dump() + "\n";
  CHECK(check_event_stream(parse_event_stream(lines, "trt.jsonl")).ok());
  // An update to a level `created` did not announce; an update from the wrong level; a lost event id.
  json bad = events;
  bad[2]["data"]["cache_level"]["new_value"] = 2;
  bad[3]["event_id"] = 5;
  r = check_event_stream(parse_event_stream(bad.dump(), "trt.json"));
  CHECK(check_of(r, EventInvariant::cache_levels_exist).violations == 1);
  CHECK(check_of(r, EventInvariant::cache_levels_exist).first ==
        "trt.json: event 2: update of 12 to at cache level 2, but `created` announced 2 level(s)");
  CHECK(check_of(r, EventInvariant::sequence_contiguous).first == "trt.json: event 3: sequence number 5 after 2: 2 batch(es) lost");
  CHECK(r.lost_batches == 2);
  // Two block sizes in one window.
  bad = events;
  bad[1]["data"]["blocks"][1] = block(12, 4, 3, 0);
  r = check_event_stream(parse_event_stream(bad.dump(), "trt.json"));
  CHECK(check_of(r, EventInvariant::one_block_size_per_group).violations == 1);
}

TEST_CASE("each invariant broken once is named with the first event that breaks it") {
  auto check = [](const std::vector<json>& batches) {
    std::string bytes;
    for (size_t i = 0; i < batches.size(); ++i) bytes += msgpack_bytes(map_batch(batches[i], static_cast<int>(i)));
    return check_event_stream(parse_event_stream(bytes, "v.bin"));
  };
  EventCheckReport r = check({json::array({stored({1}, nullptr, 4, 0)}), json::array({removed({2})})});
  const std::string first_batch = msgpack_bytes(map_batch(json::array({stored({1}, nullptr, 4, 0)}), 0));
  CHECK(check_of(r, EventInvariant::removed_is_live).first ==
        "v.bin:byte " + std::to_string(first_batch.size()) + " batch 1 event 0: removed block 2 is not live");
  r = check({json::array({stored({5}, 4, 4, 0)})});
  CHECK(check_of(r, EventInvariant::parent_is_live).first.find("parent 4 of stored block 5 is not live") != std::string::npos);
  r = check({json::array({stored({1}, nullptr, 4, 0)}), json::array({stored({1}, nullptr, 4, 0)})});
  CHECK(check_of(r, EventInvariant::no_duplicate_store).first.find("block 1 stored again while live") != std::string::npos);
  r = check({json::array({stored({1}, nullptr, 4, 0), stored({2}, 1, 8, 0)})});
  CHECK(check_of(r, EventInvariant::one_block_size_per_group).first.find("group 0 stores a block of 8 tokens, earlier 4") !=
        std::string::npos);
  json short_block = stored({1}, nullptr, 4, 0);
  short_block["token_ids"] = {1, 2, 3};
  r = check({json::array({short_block})});
  CHECK(check_of(r, EventInvariant::full_blocks).first.find("block 1 holds 3 tokens, the block size is 4") != std::string::npos);
  short_block["kv_cache_spec_kind"] = "mamba";  // the stream says blocks need not be full
  CHECK(check_of(check({json::array({short_block})}), EventInvariant::full_blocks).violations == 0);
  r = check({json::array({stored({1, 2}, nullptr, 4, 0)}), json::array({cleared()}), json::array({removed({2})}),
             json::array({stored({3}, 1, 4, 0)})});
  CHECK(check_of(r, EventInvariant::cleared_means_empty).violations == 2);
  CHECK(check_of(r, EventInvariant::cleared_means_empty).first.find("removed block 2 was live before AllBlocksCleared") !=
        std::string::npos);
  CHECK(check_of(r, EventInvariant::removed_is_live).violations == 0);
  // Frames with a gap: lost batches.
  std::vector<std::string> payloads;
  for (const json& b : clean_batches()) payloads.push_back(msgpack_bytes(map_batch(b, 0)));
  r = check_event_stream(parse_event_stream(frames(payloads, 0, {1, 2}), "f.bin"));
  CHECK(r.lost_batches == 2);
  CHECK(check_of(r, EventInvariant::sequence_contiguous).first.find("seq 3 batch 1 event 0: sequence number 3 after 0: 2 batch(es) lost") != std::string::npos);
}

TEST_CASE("malformed streams are rejected as bad_event_stream with the offset or line and the field") {
  const std::string good = msgpack_bytes(map_batch(clean_batches()[0], 0));
  const std::string two = good + good;
  CHECK(rejection(two.substr(0, two.size() - 3)).rfind(
            "bad_event_stream: e.bin:byte " + std::to_string(good.size()) + ": msgpack: truncated", 0) == 0);
  json e = stored({1}, nullptr, 4, 0);
  e["colour"] = "red";
  CHECK(rejection(msgpack_bytes(map_batch(json::array({e}), 0))) ==
        "bad_event_stream: e.bin:byte 0 batch 0 event 0: BlockStored.colour: unknown field");
  CHECK(rejection(msgpack_bytes(map_batch(json::array({{{"type", "BlockMoved"}}}), 0))) ==
        "bad_event_stream: e.bin:byte 0 batch 0 event 0: event tag: expected BlockStored, BlockRemoved or AllBlocksCleared, got \"BlockMoved\"");
  e = stored({1}, nullptr, 4, 0);
  e["block_size"] = -4;
  CHECK(rejection(msgpack_bytes(map_batch(json::array({e}), 0))) ==
        "bad_event_stream: e.bin:byte 0 batch 0 event 0: BlockStored.block_size: expected an integer >= 1, got -4");
  CHECK(rejection(map_batch(clean_batches()[0], 0).dump() + "\n{\"ts\": 1, \"events\": [}\n").rfind(
            "bad_event_stream: e.bin:2: json: expected one JSON value per line, got a malformed line", 0) == 0);
  CHECK(rejection(msgpack_bytes(json{{"ts", 1}, {"events", json::array()}, {"rank", 0}})) ==
        "bad_event_stream: e.bin:byte 0: batch.rank: unknown field (expected ts, events, data_parallel_rank)");
  json a = array_batch(clean_batches()[0], 0);
  a[1][0].push_back(1);
  a[1][0].push_back(2);
  a[1][0].push_back(3);
  a[1][0].push_back(4);
  a[1][0].push_back(5);
  CHECK(rejection(msgpack_bytes(a)) == "bad_event_stream: e.bin:byte 0 batch 0 event 0: BlockStored: expected at most 11 fields, got 12");
  CHECK(rejection("") == "bad_event_stream: e.bin:byte 0: expected at least one event batch, got an empty file");
}

TEST_CASE("events replay: kvsim's LRU against the engine's removals, and the hit rate of the stored chains") {
  // Chains A (1 -> 2 -> 3) and B (1 -> 4), each stored as the engine computes it; the engine then
  // removes 4 and stores chain C (5). A kvsim pool of 4 blocks must evict for C: its LRU takes the
  // least recently used, 3 (A's tail), where the engine dropped 4.
  std::vector<json> batches = {json::array({stored({1, 2, 3}, nullptr, 4, 0)}), json::array({stored({4}, 1, 4, 100)}),
                               json::array({removed({4})}), json::array({stored({5}, nullptr, 4, 200)})};
  std::string bytes;
  for (size_t i = 0; i < batches.size(); ++i) bytes += msgpack_bytes(map_batch(batches[i], static_cast<int>(i)));
  const EventStream s = parse_event_stream(bytes, "r.bin");
  EventReplayReport r = replay_event_stream(s, 4);
  CHECK(r.block_size == 4);
  CHECK(r.replayed_stores == 3);
  CHECK(r.chain_tokens == 12 + 8 + 4);
  CHECK(r.hit_tokens == 4);         // chain B found block 1
  CHECK(r.engine_hit_tokens == 4);  // the engine stored only block 4 of chain B
  CHECK(r.engine_removals == 1);
  CHECK(r.kvsim_evictions == 1);
  CHECK(r.kvsim_evicted_engine_kept == 1);
  CHECK(r.engine_removed_kvsim_kept == 1);
  CHECK(r.first_divergence.find("r.bin:byte ") == 0);
  CHECK(r.first_divergence.find("the engine removed 4, kvsim's LRU still holds it") != std::string::npos);
  // A pool large enough for everything: no eviction, one divergence (the engine's removal).
  r = replay_event_stream(s, 64);
  CHECK(r.kvsim_evictions == 0);
  CHECK(r.kvsim_evicted_engine_kept == 0);
}

TEST_CASE("more negative values and a hash chain longer than its tokens are rejected with the offset and the field") {
  json e = stored({1}, nullptr, 4, 0);
  e["token_ids"][2] = -7;
  CHECK(rejection(msgpack_bytes(map_batch(json::array({e}), 0))) ==
        "bad_event_stream: e.bin:byte 0 batch 0 event 0: BlockStored.token_ids[2]: expected an integer >= 0, got -7");
  e = stored({1, 2, 3}, nullptr, 4, 0);
  e["token_ids"] = json::array({1, 2, 3, 4, 5});  // two blocks' worth of tokens for three hashes
  const std::string good = msgpack_bytes(map_batch(clean_batches()[0], 0));
  CHECK(rejection(good + msgpack_bytes(map_batch(json::array({e}), 1))) ==
        "bad_event_stream: e.bin:byte " + std::to_string(good.size()) +
            " batch 1 event 0: BlockStored.block_hashes: expected at most ceil(5 token_ids / block_size 4) = 2 hashes, got "
            "3: a hash chain longer than its tokens");
  e = stored({1}, nullptr, 4, 0);
  e["group_idx"] = -1;
  CHECK(rejection(msgpack_bytes(map_batch(json::array({e}), 0))) ==
        "bad_event_stream: e.bin:byte 0 batch 0 event 0: BlockStored.group_idx: expected an integer >= 0, got -1");
  const std::string trt =
      "{\"event_id\": 0, \"data\": {\"type\": \"stored\", \"parent_hash\": null, \"blocks\": [{\"type\": \"stored_block\", "
      "\"block_hash\": 5, \"tokens\": [{\"type\": \"unique_token\", \"token_id\": -2, \"token_extra_id\": 0}], "
      "\"lora_id\": null, \"cache_level\": 0, \"priority\": 35}]}, \"window_size\": 32, \"attention_dp_rank\": 0}\n";
  const std::string why = rejection(trt);
  CHECK(why.rfind("bad_event_stream: e.bin:1", 0) == 0);
  CHECK(why.find("token_id: expected an integer >= 0, got -2") != std::string::npos);
}

TEST_CASE("events replay: every (rank, group) is replayed in a pool of its own; other media are counted, not replayed") {
  // Rank 0 group 0: chain 1 -> 2, then 3 (a pool of 2 blocks evicts). Rank 1 group 0: chain 1 (the
  // same hash, another cache). Rank 0 group 1: chain 9 of 2-token blocks. Rank 0 group 0 offloads 2
  // to the CPU medium and the engine stores 2 on the GPU again later.
  auto at = [](json e, int group) {
    e["group_idx"] = group;
    return e;
  };
  json cpu = stored({2}, 1, 4, 4);
  cpu["medium"] = "CPU";
  json batch0 = {{"ts", 1}, {"events", json::array({stored({1, 2}, nullptr, 4, 0), at(stored({9}, nullptr, 2, 50), 1), cpu})},
                 {"data_parallel_rank", 0}};
  json batch1 = {{"ts", 2}, {"events", json::array({stored({1}, nullptr, 4, 0)})}, {"data_parallel_rank", 1}};
  json batch2 = {{"ts", 3}, {"events", json::array({removed({2}), stored({3}, nullptr, 4, 80)})}, {"data_parallel_rank", 0}};
  json batch3 = {{"ts", 4}, {"events", json::array({stored({2}, 1, 4, 4)})}, {"data_parallel_rank", 0}};
  std::string bytes;
  for (const json& b : {batch0, batch1, batch2, batch3}) bytes += msgpack_bytes(b);
  const EventStream s = parse_event_stream(bytes, "m.bin");
  const EventReplayReport r = replay_event_stream(s, 2);
  REQUIRE(r.streams.size() == 3);
  const EventReplayStream& a = r.streams[0];
  CHECK(a.rank == 0);
  CHECK(a.group == 0);
  CHECK(a.block_size == 4);
  CHECK(a.replayed_stores == 3);       // 1 -> 2, 3, 1 -> 2 again
  CHECK(a.other_medium_stores == 1);   // the CPU store
  CHECK(a.engine_removals == 1);
  const EventReplayStream& g1 = r.streams[1];
  CHECK(g1.rank == 0);
  CHECK(g1.group == 1);
  CHECK(g1.block_size == 2);
  CHECK(g1.replayed_stores == 1);
  CHECK(g1.chain_tokens == 2);
  const EventReplayStream& b = r.streams[2];
  CHECK(b.rank == 1);
  CHECK(b.group == 0);
  CHECK(b.replayed_stores == 1);
  CHECK(b.hit_tokens == 0);            // rank 1 holds nothing of rank 0's blocks
  CHECK(r.replayed_stores == a.replayed_stores + g1.replayed_stores + b.replayed_stores);
  CHECK(r.chain_tokens == a.chain_tokens + g1.chain_tokens + b.chain_tokens);
  CHECK(r.rank == -1);
  REQUIRE(r.other_media.size() == 1);
  CHECK(r.other_media[0].medium == "CPU");
  CHECK(r.other_media[0].rank == 0);
  CHECK(r.other_media[0].group == 0);
  CHECK(r.other_media[0].stored_blocks == 1);
  CHECK(r.other_media[0].live_at_end == 1);
  CHECK(r.other_media[0].restored_blocks == 1);  // the GPU store of 2 in batch 3
  // The first divergence over all streams is the earliest event: rank 0 group 0's store of 3
  // evicts 2 or 1 in kvsim's pool of 2 while the engine keeps 1.
  CHECK(r.first_divergence.rfind("rank 0 group 0: m.bin:byte ", 0) == 0);
  CHECK(r.first_divergence == "rank 0 group 0: " + a.first_divergence);
}

TEST_CASE("events replay: TensorRT-LLM moves between cache levels take blocks out of and back into the primary tier") {
  const std::string trt =
      "{\"event_id\": 0, \"data\": {\"type\": \"created\", \"num_blocks_per_cache_level\": [4, 8]}, \"window_size\": 32, \"attention_dp_rank\": 0}\n"
      "{\"event_id\": 1, \"data\": {\"type\": \"stored\", \"parent_hash\": null, \"blocks\": [{\"type\": \"stored_block\", "
      "\"block_hash\": 5, \"tokens\": [{\"type\": \"unique_token\", \"token_id\": 1, \"token_extra_id\": 0}, "
      "{\"type\": \"unique_token\", \"token_id\": 2, \"token_extra_id\": 0}], \"lora_id\": null, \"cache_level\": 0, "
      "\"priority\": 35}]}, \"window_size\": 32, \"attention_dp_rank\": 0}\n"
      "{\"event_id\": 2, \"data\": {\"type\": \"updated\", \"block_hash\": 5, \"cache_level\": {\"type\": \"event_diff\", "
      "\"old_value\": 0, \"new_value\": 1}, \"priority\": null}, \"window_size\": 32, \"attention_dp_rank\": 0}\n"
      "{\"event_id\": 3, \"data\": {\"type\": \"updated\", \"block_hash\": 5, \"cache_level\": {\"type\": \"event_diff\", "
      "\"old_value\": 1, \"new_value\": 0}, \"priority\": null}, \"window_size\": 32, \"attention_dp_rank\": 0}\n";
  const EventStream s = parse_event_stream(trt, "t.jsonl");
  const EventReplayReport r = replay_event_stream(s, 4);
  REQUIRE(r.streams.size() == 1);
  CHECK(r.group == 32);
  CHECK(r.replayed_stores == 1);
  CHECK(r.engine_removals == 1);              // 5 left level 0
  CHECK(r.engine_removed_kvsim_kept == 1);    // kvsim still holds it
  REQUIRE(r.other_media.size() == 1);
  CHECK(r.other_media[0].medium == "cache_level 1");
  CHECK(r.other_media[0].stored_blocks == 1);
  CHECK(r.other_media[0].restored_blocks == 1);
  CHECK(r.other_media[0].live_at_end == 0);
}
