// KV-event streams: reading (see kv_events.hpp for the formats and their sources).
#include "kvsim/workload/kv_events.hpp"

#include <fstream>
#include <sstream>

#include <msgpack.hpp>
#include <nlohmann/json.hpp>

#include <kvsim/validation/errors.hpp>

#include "json_lines.hpp"

namespace kvsim::workload {

namespace {

using json = nlohmann::json;

[[noreturn]] void reject(const std::string& where, const std::string& what) {
  fail(ErrorCode::bad_event_stream, where + ": " + what);
}

std::string shown(const json& v) {
  std::string s = v.is_binary() ? "<" + std::to_string(v.get_binary().size()) + " bytes>" : v.dump();
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

// msgpack-c object -> JSON value (bin as a JSON binary), so one decoder reads both.
json from_msgpack(const msgpack::object& o, const std::string& where) {
  switch (o.type) {
    case msgpack::type::NIL: return nullptr;
    case msgpack::type::BOOLEAN: return o.via.boolean;
    case msgpack::type::POSITIVE_INTEGER: return o.via.u64;
    case msgpack::type::NEGATIVE_INTEGER: return o.via.i64;
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: return o.via.f64;
    case msgpack::type::STR: return std::string(o.via.str.ptr, o.via.str.size);
    case msgpack::type::BIN:
      return json::binary(std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(o.via.bin.ptr),
                                               reinterpret_cast<const uint8_t*>(o.via.bin.ptr) + o.via.bin.size));
    case msgpack::type::ARRAY: {
      json a = json::array();
      for (uint32_t i = 0; i < o.via.array.size; ++i) a.push_back(from_msgpack(o.via.array.ptr[i], where));
      return a;
    }
    case msgpack::type::MAP: {
      json m = json::object();
      for (uint32_t i = 0; i < o.via.map.size; ++i) {
        const msgpack::object& k = o.via.map.ptr[i].key;
        if (k.type != msgpack::type::STR) reject(where, "msgpack map key: expected a string (a struct field name)");
        m[std::string(k.via.str.ptr, k.via.str.size)] = from_msgpack(o.via.map.ptr[i].val, where);
      }
      return m;
    }
    default: reject(where, "msgpack: expected no extension types, got one");
  }
}

std::string hash_text(const json& h, const std::string& where, const std::string& field) {
  if (h.is_number_unsigned()) return std::to_string(h.get<uint64_t>());
  if (h.is_number_integer()) return std::to_string(h.get<int64_t>());
  if (h.is_binary()) {
    static const char* hex = "0123456789abcdef";
    std::string s = "0x";
    for (uint8_t b : h.get_binary()) s += {hex[b >> 4], hex[b & 15]};
    return s;
  }
  if (h.is_string()) return h.get<std::string>();
  reject(where, field + ": expected a block hash (an integer or bytes), got " + shown(h));
}

int64_t int_value(const json& v, const std::string& where, const std::string& field, int64_t min) {
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) ||
      v.get<int64_t>() < min)
    reject(where, field + ": expected an integer >= " + std::to_string(min) + ", got " + shown(v));
  return v.get<int64_t>();
}

const json& array_value(const json& v, const std::string& where, const std::string& field) {
  if (!v.is_array()) reject(where, field + ": expected an array, got " + shown(v));
  return v;
}

// The struct fields of vLLM's events in declaration order (array_like
// encodes them positionally after the tag; SGLang's copy is a prefix).
const std::vector<std::string> kStoredFields = {"block_hashes", "parent_block_hash", "token_ids", "block_size",
                                                "lora_id",      "medium",            "lora_name", "extra_keys",
                                                "group_idx",    "kv_cache_spec_kind", "kv_cache_spec_sliding_window"};
const std::vector<std::string> kRemovedFields = {"block_hashes", "medium", "group_idx"};

struct Decoder {
  EventStream& s;
  bool saw_array = false, saw_map = false, sglang_shape = false, vllm_shape = false;

  // One vLLM/SGLang event: ["Tag", fields...] or {"type": "Tag", field: value...}.
  void event(const json& e, const std::string& where, int64_t batch, std::optional<uint64_t> seq, int64_t rank) {
    std::string tag;
    json f = json::object();
    const std::vector<std::string>* names = nullptr;
    auto schema = [&](const std::string& t) -> const std::vector<std::string>* {
      static const std::vector<std::string> none;
      if (t == "BlockStored") return &kStoredFields;
      if (t == "BlockRemoved") return &kRemovedFields;
      if (t == "AllBlocksCleared") return &none;
      reject(where, "event tag: expected BlockStored, BlockRemoved or AllBlocksCleared, got \"" + t + "\"");
    };
    if (e.is_array()) {
      saw_array = true;
      if (e.empty() || !e[0].is_string()) reject(where, "event: expected the event's tag first, got " + shown(e));
      tag = e[0].get<std::string>();
      names = schema(tag);
      if (e.size() - 1 > names->size())
        reject(where, tag + ": expected at most " + std::to_string(names->size()) + " fields, got " +
                          std::to_string(e.size() - 1));
      for (size_t i = 1; i < e.size(); ++i) f[(*names)[i - 1]] = e[i];
      if (tag == "BlockStored") (e.size() - 1 == 5 ? sglang_shape : vllm_shape) = true;
      if (tag == "BlockRemoved") (e.size() - 1 == 1 ? sglang_shape : vllm_shape) = true;
    } else if (e.is_object()) {
      saw_map = true;
      auto t = e.find("type");
      if (t == e.end() || !t->is_string()) reject(where, "event: expected a \"type\" tag, got " + shown(e));
      tag = t->get<std::string>();
      names = schema(tag);
      for (auto it = e.begin(); it != e.end(); ++it) {
        if (it.key() == "type") continue;
        if (std::find(names->begin(), names->end(), it.key()) == names->end())
          reject(where, tag + "." + it.key() + ": unknown field");
        f[it.key()] = it.value();
      }
      vllm_shape = true;
    } else {
      reject(where, "event: expected an array or a map, got " + shown(e));
    }
    KvEvent ev;
    ev.where = where;
    ev.batch = batch;
    ev.seq = seq;
    ev.rank = rank;
    auto opt = [&](const char* k) -> const json* {
      auto it = f.find(k);
      return it == f.end() || it->is_null() ? nullptr : &*it;
    };
    auto need = [&](const char* k) -> const json& {
      const json* v = opt(k);
      if (!v) reject(where, tag + "." + k + ": expected a value, got none");
      return *v;
    };
    if (const json* g = opt("group_idx")) ev.group = int_value(*g, where, tag + ".group_idx", 0);
    if (const json* m = opt("medium")) {
      if (!m->is_string()) reject(where, tag + ".medium: expected a string, got " + shown(*m));
      ev.medium = m->get<std::string>();
    }
    if (tag == "AllBlocksCleared") {
      ev.kind = EventKind::cleared;
    } else if (tag == "BlockRemoved") {
      ev.kind = EventKind::removed;
      const json& hs = array_value(need("block_hashes"), where, tag + ".block_hashes");
      for (size_t i = 0; i < hs.size(); ++i)
        ev.removed.push_back(hash_text(hs[i], where, tag + ".block_hashes[" + std::to_string(i) + "]"));
    } else {
      ev.kind = EventKind::stored;
      const json& hs = array_value(need("block_hashes"), where, tag + ".block_hashes");
      const json& toks = array_value(need("token_ids"), where, tag + ".token_ids");
      ev.block_size = int_value(need("block_size"), where, tag + ".block_size", 1);
      if (const json* p = opt("parent_block_hash")) ev.parent = hash_text(*p, where, tag + ".parent_block_hash");
      if (const json* k = opt("kv_cache_spec_kind")) {
        if (!k->is_string()) reject(where, tag + ".kv_cache_spec_kind: expected a string, got " + shown(*k));
        // Only full-attention groups publish whole blocks of block_size tokens.
        ev.token_count_free = k->get<std::string>() != "full_attention";
      }
      std::vector<int64_t> all;
      for (size_t i = 0; i < toks.size(); ++i)
        all.push_back(int_value(toks[i], where, tag + ".token_ids[" + std::to_string(i) + "]", 0));
      const size_t bs = static_cast<size_t>(ev.block_size);
      if (!ev.token_count_free && hs.size() > (all.size() + bs - 1) / bs)
        reject(where, tag + ".block_hashes: expected at most ceil(" + std::to_string(all.size()) + " token_ids / block_size " +
                          std::to_string(bs) + ") = " + std::to_string((all.size() + bs - 1) / bs) + " hashes, got " +
                          std::to_string(hs.size()) + ": a hash chain longer than its tokens");
      for (size_t i = 0; i < hs.size(); ++i) {
        StoredBlock b;
        b.hash = hash_text(hs[i], where, tag + ".block_hashes[" + std::to_string(i) + "]");
        const size_t begin = std::min(all.size(), i * static_cast<size_t>(ev.block_size));
        const size_t end = i + 1 == hs.size() ? all.size() : std::min(all.size(), (i + 1) * static_cast<size_t>(ev.block_size));
        b.tokens.assign(all.begin() + static_cast<std::ptrdiff_t>(begin), all.begin() + static_cast<std::ptrdiff_t>(end));
        ev.blocks.push_back(std::move(b));
      }
    }
    s.events.push_back(std::move(ev));
  }

  // A KVEventBatch: [ts, events, rank?] or {ts, events, data_parallel_rank | attn_dp_rank}.
  void batch(const json& b, const std::string& where, std::optional<uint64_t> seq) {
    const int64_t index = s.batches++;
    const json* events = nullptr;
    int64_t rank = 0;
    if (b.is_array()) {
      if (b.size() < 2 || b.size() > 3 || !b[0].is_number() || !b[1].is_array())
        reject(where, "batch: expected [ts, events] or [ts, events, data_parallel_rank], got " + shown(b));
      events = &b[1];
      if (b.size() == 3 && !b[2].is_null()) rank = int_value(b[2], where, "batch.data_parallel_rank", 0);
      saw_array = true;
    } else if (b.is_object()) {
      for (auto it = b.begin(); it != b.end(); ++it) {
        const std::string& k = it.key();
        if (k == "ts") {
          if (!it->is_number()) reject(where, "batch.ts: expected a number, got " + shown(*it));
        } else if (k == "events") {
          events = &array_value(*it, where, "batch.events");
        } else if (k == "data_parallel_rank" || k == "attn_dp_rank") {
          if (k == "attn_dp_rank") sglang_shape = true;
          if (!it->is_null()) rank = int_value(*it, where, "batch." + k, 0);
        } else {
          reject(where, "batch." + k + ": unknown field (expected ts, events, data_parallel_rank)");
        }
      }
      if (!events) reject(where, "batch.events: expected an array, got none");
      saw_map = true;
    } else {
      reject(where, "batch: expected an array or a map, got " + shown(b));
    }
    for (size_t i = 0; i < events->size(); ++i)
      event((*events)[i], where + " batch " + std::to_string(index) + " event " + std::to_string(i), index, seq, rank);
  }

  // One TensorRT-LLM event (KVCacheEventSerializer.to_json_str).
  void trt_event(const json& e, const std::string& where) {
    static const std::vector<std::string> top = {"event_id", "data", "window_size", "attention_dp_rank"};
    for (auto it = e.begin(); it != e.end(); ++it)
      if (std::find(top.begin(), top.end(), it.key()) == top.end()) reject(where, it.key() + ": unknown field");
    KvEvent ev;
    ev.where = where;
    ev.batch = s.batches++;
    if (!e.contains("event_id")) reject(where, "event_id: expected an integer >= 0, got none");
    ev.seq = static_cast<uint64_t>(int_value(e["event_id"], where, "event_id", 0));
    if (e.contains("window_size")) ev.group = int_value(e["window_size"], where, "window_size", 0);
    if (e.contains("attention_dp_rank") && !e["attention_dp_rank"].is_null())
      ev.rank = int_value(e["attention_dp_rank"], where, "attention_dp_rank", 0);
    if (!e.contains("data") || !e["data"].is_object()) reject(where, "data: expected an object, got none");
    const json& d = e["data"];
    const std::string type = d.contains("type") && d["type"].is_string() ? d["type"].get<std::string>() : "";
    auto only = [&](const json& obj, const std::vector<std::string>& keys, const std::string& ctx) {
      for (auto it = obj.begin(); it != obj.end(); ++it)
        if (it.key() != "type" && std::find(keys.begin(), keys.end(), it.key()) == keys.end())
          reject(where, ctx + "." + it.key() + ": unknown field");
    };
    auto need = [&](const json& obj, const std::string& k, const std::string& ctx) -> const json& {
      if (!obj.contains(k)) reject(where, ctx + "." + k + ": expected a value, got none");
      return obj[k];
    };
    if (type == "created") {
      only(d, {"num_blocks_per_cache_level"}, "data");
      ev.kind = EventKind::created;
      const json& n = array_value(need(d, "num_blocks_per_cache_level", "data"), where, "data.num_blocks_per_cache_level");
      for (size_t i = 0; i < n.size(); ++i)
        ev.blocks_per_level.push_back(int_value(n[i], where, "data.num_blocks_per_cache_level[" + std::to_string(i) + "]", 0));
    } else if (type == "stored") {
      only(d, {"parent_hash", "blocks"}, "data");
      ev.kind = EventKind::stored;
      if (d.contains("parent_hash") && !d["parent_hash"].is_null()) ev.parent = hash_text(d["parent_hash"], where, "data.parent_hash");
      const json& bs = array_value(need(d, "blocks", "data"), where, "data.blocks");
      for (size_t i = 0; i < bs.size(); ++i) {
        const std::string ctx = "data.blocks[" + std::to_string(i) + "]";
        if (!bs[i].is_object()) reject(where, ctx + ": expected an object, got " + shown(bs[i]));
        only(bs[i], {"block_hash", "tokens", "cache_level", "priority", "lora_id", "mm_keys"}, ctx);
        StoredBlock b;
        b.hash = hash_text(need(bs[i], "block_hash", ctx), where, ctx + ".block_hash");
        const json& toks = array_value(need(bs[i], "tokens", ctx), where, ctx + ".tokens");
        for (size_t t = 0; t < toks.size(); ++t) {
          const std::string tctx = ctx + ".tokens[" + std::to_string(t) + "]";
          if (!toks[t].is_object()) reject(where, tctx + ": expected {token_id, token_extra_id}, got " + shown(toks[t]));
          only(toks[t], {"token_id", "token_extra_id"}, tctx);
          b.tokens.push_back(int_value(need(toks[t], "token_id", tctx), where, tctx + ".token_id", 0));
        }
        ev.cache_levels.push_back(bs[i].contains("cache_level") ? int_value(bs[i]["cache_level"], where, ctx + ".cache_level", 0) : 0);
        ev.blocks.push_back(std::move(b));
      }
    } else if (type == "removed") {
      only(d, {"block_hashes"}, "data");
      ev.kind = EventKind::removed;
      const json& hs = array_value(need(d, "block_hashes", "data"), where, "data.block_hashes");
      for (size_t i = 0; i < hs.size(); ++i) ev.removed.push_back(hash_text(hs[i], where, "data.block_hashes[" + std::to_string(i) + "]"));
    } else if (type == "updated") {
      only(d, {"block_hash", "cache_level", "priority"}, "data");
      ev.kind = EventKind::updated;
      ev.updated_hash = hash_text(need(d, "block_hash", "data"), where, "data.block_hash");
      if (d.contains("cache_level") && !d["cache_level"].is_null()) {
        const json& c = d["cache_level"];
        if (!c.is_object()) reject(where, "data.cache_level: expected {old_value, new_value}, got " + shown(c));
        only(c, {"old_value", "new_value"}, "data.cache_level");
        ev.level_change = {int_value(need(c, "old_value", "data.cache_level"), where, "data.cache_level.old_value", 0),
                           int_value(need(c, "new_value", "data.cache_level"), where, "data.cache_level.new_value", 0)};
      }
    } else {
      reject(where, "data.type: expected created, stored, removed or updated, got " + shown(d.contains("type") ? d["type"] : json()));
    }
    s.events.push_back(std::move(ev));
  }
};

bool is_trt_event(const json& v) { return v.is_object() && v.contains("event_id"); }

}  // namespace

EventStream parse_event_stream(std::string_view bytes, const std::string& source) {
  EventStream s;
  s.source = source;
  Decoder d{s};
  const size_t first = bytes.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) reject(source + ":byte 0", "expected at least one event batch, got an empty file");
  const char c0 = bytes[first];
  if (c0 == '{' || c0 == '[') {
    // JSON: one array of TensorRT-LLM events, or JSON Lines (batches or TensorRT-LLM events).
    json whole = json::parse(bytes.begin(), bytes.end(), nullptr, false);
    if (!whole.is_discarded() && whole.is_array() && !whole.empty() && is_trt_event(whole[0])) {
      for (size_t i = 0; i < whole.size(); ++i) {
        if (!whole[i].is_object()) reject(source + ": event " + std::to_string(i), "expected a TensorRT-LLM event object, got " + shown(whole[i]));
        d.trt_event(whole[i], source + ": event " + std::to_string(i));
      }
      s.engine = "trtllm";
      s.encoding = "trtllm-json";
      return s;
    }
    bool trt = false;
    for_each_json_line(bytes, source, ErrorCode::bad_event_stream, [&](const json& v, const std::string& where, int64_t) {
      if (is_trt_event(v)) {
        trt = true;
        d.trt_event(v, where);
      } else {
        d.batch(v, where, std::nullopt);
      }
    });
    s.engine = trt ? "trtllm" : d.sglang_shape && !d.vllm_shape ? "sglang" : "vllm";
    s.encoding = trt ? "trtllm-jsonl" : d.saw_map ? "jsonl-map" : "jsonl-array";
    return s;
  }
  // msgpack: a sequence of objects, each a batch or a [topic, seq, payload] frame triple.
  size_t off = 0;
  bool frames = false;
  while (off < bytes.size()) {
    const size_t at = off;
    const std::string where = source + ":byte " + std::to_string(at);
    msgpack::object_handle oh;
    try {
      oh = msgpack::unpack(bytes.data(), bytes.size(), off);
    } catch (const msgpack::insufficient_bytes&) {
      reject(where, "msgpack: truncated (the object starting here ends past the end of the file, " +
                        std::to_string(bytes.size() - at) + " bytes left)");
    } catch (const std::exception& e) {
      reject(where, std::string("msgpack: malformed (") + e.what() + ")");
    }
    const json v = from_msgpack(oh.get(), where);
    const bool triple = v.is_array() && v.size() == 3 && (v[0].is_string() || v[0].is_binary()) && v[1].is_binary() &&
                        v[2].is_binary();
    if (!triple) {
      d.batch(v, where, std::nullopt);
      continue;
    }
    frames = true;
    const auto& seq_bytes = v[1].get_binary();
    if (seq_bytes.size() != 8) reject(where, "frame sequence number: expected 8 bytes (big-endian), got " + std::to_string(seq_bytes.size()));
    uint64_t seq = 0;
    for (uint8_t b : seq_bytes) seq = (seq << 8) | b;
    const auto& payload = v[2].get_binary();
    size_t poff = 0;
    msgpack::object_handle ph;
    try {
      ph = msgpack::unpack(reinterpret_cast<const char*>(payload.data()), payload.size(), poff);
    } catch (const msgpack::insufficient_bytes&) {
      reject(where, "frame payload (seq " + std::to_string(seq) + "): msgpack truncated");
    } catch (const std::exception& e) {
      reject(where, "frame payload (seq " + std::to_string(seq) + "): msgpack malformed (" + e.what() + ")");
    }
    if (poff != payload.size()) reject(where, "frame payload (seq " + std::to_string(seq) + "): bytes left after the batch");
    d.batch(from_msgpack(ph.get(), where), where + " seq " + std::to_string(seq), seq);
  }
  s.engine = d.sglang_shape && !d.vllm_shape ? "sglang" : "vllm";
  s.encoding = std::string(frames ? "msgpack-zmq-frames+" : "msgpack-") + (d.saw_map ? "map" : "array");
  return s;
}

EventStream load_event_stream(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorCode::bad_event_stream, path + ":byte 0: file: expected a readable event file, got none");
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse_event_stream(ss.str(), path);
}

}  // namespace kvsim::workload
