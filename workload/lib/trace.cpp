// Trace files: see trace.hpp for the formats and docs/traces.md for the rules.
#include "kvsim/workload/trace.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <map>

#include <nlohmann/json.hpp>

#include <kvsim/validation/errors.hpp>

#include "json_lines.hpp"

namespace kvsim::workload {

namespace {

struct FormatFields {
  const char* time;    // arrival field
  double time_to_ms;   // its unit in ms
  const char* input;
  const char* output;
  std::vector<std::string> ignored;  // known fields kvsim does not use
};

FormatFields fields_of(TraceFormat f) {
  switch (f) {
    case TraceFormat::mooncake: return {"timestamp", 1.0, "input_length", "output_length", {}};
    // qwen-bailian-usagetraces-anon's README: "timestamp": seconds since the trace began.
    case TraceFormat::bailian:
      return {"timestamp", 1000.0, "input_length", "output_length", {"chat_id", "parent_chat_id", "turn", "type"}};
    case TraceFormat::semianalysis: return {"t", 1000.0, "in", "out", {}};
  }
  return {"timestamp", 1.0, "input_length", "output_length", {}};
}

[[noreturn]] void reject(const std::string& where, const std::string& field, const std::string& what) {
  fail(ErrorCode::bad_trace, where + ": " + field + ": " + what);
}

std::string shown(const nlohmann::json& v) {
  std::string s = v.dump();
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

int64_t integer_field(const nlohmann::json& obj, const std::string& where, const char* name, int64_t min) {
  auto it = obj.find(name);
  if (it == obj.end()) reject(where, name, "expected an integer >= " + std::to_string(min) + ", got nothing (field missing)");
  const nlohmann::json& v = *it;
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) ||
      v.get<int64_t>() < min)
    reject(where, name, "expected an integer >= " + std::to_string(min) + ", got " + shown(v));
  return v.get<int64_t>();
}

// A SemiAnalysis agent session (semianalysisai/cc-traces-weka-*, read as
// AIPerf's weka loader reads it): its requests, `t` in seconds from the
// session's start, every session starting at time 0; hash ids are local to
// the session (hash_id_scope "local"), so they are keyed by its line;
// `type` "n" / "s" requests are replayed, a "subagent" entry's own
// `requests` are replayed in place (their `t` on the session's clock, as the
// SemiAnalysis-published traces store them) and its other fields not read.
template <class AddRequest>
void semianalysis_session(const nlohmann::json& obj, const std::string& where, int64_t line_no, int64_t block_tokens,
                          bool block_size_given, AddRequest& add_request) {
  static const std::vector<std::string> session_fields = {"id", "models", "block_size", "hash_id_scope",
                                                          "tool_tokens", "system_tokens", "requests"};
  static const std::vector<std::string> request_fields = {"t", "type", "model", "in", "out", "hash_ids",
                                                          "api_time", "think_time", "input_types", "stop"};
  for (auto it = obj.begin(); it != obj.end(); ++it)
    if (std::find(session_fields.begin(), session_fields.end(), it.key()) == session_fields.end())
      reject(where, it.key(),
             "unknown field of a semianalysis session (expected id, models, block_size, hash_id_scope, tool_tokens, "
             "system_tokens, requests)");
  if (auto bs = obj.find("block_size"); bs != obj.end()) {
    if (!bs->is_number_integer() || bs->get<int64_t>() < 1)
      reject(where, "block_size", "expected an integer >= 1, got " + shown(*bs));
    if (!block_size_given && bs->get<int64_t>() != block_tokens)
      reject(where, "block_size",
             "expected " + std::to_string(block_tokens) + " (the semianalysis release's; --trace-block-size N for another), got " +
                 shown(*bs));
  }
  if (auto sc = obj.find("hash_id_scope"); sc != obj.end() && *sc != "local")
    reject(where, "hash_id_scope", "expected \"local\" (the releases' scope: ids compare within a session), got " + shown(*sc));
  const nlohmann::json& requests = obj["requests"];
  if (!requests.is_array()) reject(where, "requests", "expected an array of requests, got " + shown(requests));
  const int64_t scope = line_no;  // hash ids compare within the session only
  auto one = [&](const nlohmann::json& r, const std::string& at) {
    if (!r.is_object()) reject(at, "requests", "expected a request object, got " + shown(r));
    if (auto ty = r.find("type"); ty != r.end() && (!ty->is_string() || (*ty != "n" && *ty != "s")))
      reject(at, "type", "expected \"n\", \"s\" or \"subagent\", got " + shown(*ty));
    add_request(r, at, line_no, request_fields, scope, 0.0);
  };
  for (size_t i = 0; i < requests.size(); ++i) {
    const std::string at = where + ": requests[" + std::to_string(i) + "]";
    const nlohmann::json& r = requests[i];
    if (r.is_object() && r.value("type", std::string()) == "subagent") {
      auto inner = r.find("requests");
      if (inner == r.end() || !inner->is_array())
        reject(at, "requests", "expected the subagent's array of requests, got " +
                                   (inner == r.end() ? std::string("nothing (field missing)") : shown(*inner)));
      for (size_t k = 0; k < inner->size(); ++k) one((*inner)[k], at + ".requests[" + std::to_string(k) + "]");
      continue;
    }
    one(r, at);
  }
}

}  // namespace

std::string_view trace_format_name(TraceFormat f) {
  switch (f) {
    case TraceFormat::mooncake: return "mooncake";
    case TraceFormat::bailian: return "bailian";
    case TraceFormat::semianalysis: return "semianalysis";
  }
  return "?";
}

std::optional<TraceFormat> parse_trace_format(std::string_view s) {
  for (TraceFormat f : {TraceFormat::mooncake, TraceFormat::bailian, TraceFormat::semianalysis})
    if (s == trace_format_name(f)) return f;
  return std::nullopt;
}

int32_t default_trace_block_tokens(TraceFormat f) {
  switch (f) {
    case TraceFormat::mooncake: return 512;
    case TraceFormat::bailian: return 16;
    case TraceFormat::semianalysis: return 64;
  }
  return 512;
}

int64_t Trace::prompt_tokens() const {
  int64_t n = 0;
  for (const TraceRequest& r : requests) n += r.input_length;
  return n;
}

Trace parse_trace(std::string_view text, const std::string& source, TraceFormat format, int32_t block_tokens) {
  Trace t;
  t.source = source;
  t.format = format;
  if (block_tokens < 0 || block_tokens > (1 << 20))
    fail(ErrorCode::bad_argument, "--trace-block-size = " + std::to_string(block_tokens) +
                                      ": expected 1..1048576 tokens per hash id (0 = the format's own)");
  t.block_tokens = block_tokens > 0 ? block_tokens : default_trace_block_tokens(format);
  const FormatFields ff = fields_of(format);
  const int64_t B = t.block_tokens;
  std::map<std::pair<int64_t, uint64_t>, int32_t> dense;  // (scope, hash id) -> dense block id
  int64_t next_id = 0;
  // Token ids are block id * B + offset and must stay below 2^31 (prompt_tokens).
  const int64_t max_ids = std::numeric_limits<int32_t>::max() / B;
  auto new_id = [&](const std::string& where) {
    if (next_id >= max_ids)
      reject(where, "hash_ids", "expected at most " + std::to_string(max_ids) + " distinct blocks of " + std::to_string(B) +
                                     " tokens (token ids are 31-bit), got more");
    return static_cast<int32_t>(next_id++);
  };
  // One request object: `known` lists the fields it may hold; `scope` keys
  // its hash ids (0 = the file's one namespace; a SemiAnalysis session's
  // line for its local ids).
  auto add_request = [&](const nlohmann::json& obj, const std::string& where, int64_t line_no,
                         const std::vector<std::string>& known, int64_t scope, double t0_ms) {
    for (auto it = obj.begin(); it != obj.end(); ++it)
      if (std::find(known.begin(), known.end(), it.key()) == known.end()) {
        std::string list;
        for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
        reject(where, it.key(),
               std::string("unknown field for the ") + std::string(trace_format_name(format)) + " format (expected " + list + ")");
      }
    TraceRequest r;
    r.line = line_no;
    auto ts = obj.find(ff.time);
    if (ts == obj.end() || !ts->is_number() || !std::isfinite(ts->get<double>()) || ts->get<double>() < 0)
      reject(where, ff.time,
             "expected a finite number >= 0, got " + (ts == obj.end() ? std::string("nothing (field missing)") : shown(*ts)));
    r.arrival_ms = t0_ms + ts->get<double>() * ff.time_to_ms;
    r.input_length = integer_field(obj, where, ff.input, 1);
    r.output_length = integer_field(obj, where, ff.output, 0);
    if (r.input_length > std::numeric_limits<int32_t>::max())
      reject(where, ff.input, "expected at most 2^31 - 1 tokens, got " + std::to_string(r.input_length));
    auto hs = obj.find("hash_ids");
    if (hs == obj.end() || !hs->is_array())
      reject(where, "hash_ids",
             "expected an array of integers >= 0, got " + (hs == obj.end() ? std::string("nothing (field missing)") : shown(*hs)));
    const int64_t prompt_blocks = (r.input_length + B - 1) / B;
    if (static_cast<int64_t>(hs->size()) > prompt_blocks)
      reject(where, "hash_ids",
             "expected at most ceil(" + std::string(ff.input) + " / " + std::to_string(B) + ") = " +
                 std::to_string(prompt_blocks) + " ids (one per " + std::to_string(B) + "-token block of the prompt), got " +
                 std::to_string(hs->size()) + ": a hash chain longer than the prompt");
    for (size_t i = 0; i < hs->size(); ++i) {
      const nlohmann::json& h = (*hs)[i];
      if (!h.is_number_integer() || (!h.is_number_unsigned() && h.get<int64_t>() < 0))
        reject(where, "hash_ids[" + std::to_string(i) + "]", "expected an integer >= 0, got " + shown(h));
      r.hash_ids.push_back(h.get<uint64_t>());
    }
    for (uint64_t h : r.hash_ids) {
      auto [it, fresh] = dense.try_emplace({scope, h}, 0);
      if (fresh) it->second = new_id(where);
      r.blocks.push_back(it->second);
    }
    while (static_cast<int64_t>(r.blocks.size()) < prompt_blocks) r.blocks.push_back(new_id(where));
    t.requests.push_back(std::move(r));
  };
  const std::vector<std::string> flat_fields = [&] {
    std::vector<std::string> f = {ff.time, ff.input, ff.output, "hash_ids"};
    f.insert(f.end(), ff.ignored.begin(), ff.ignored.end());
    return f;
  }();
  for_each_json_line(text, source, ErrorCode::bad_trace, [&](const nlohmann::json& obj, const std::string& where,
                                                             int64_t line_no) {
    if (!obj.is_object()) reject(where, "json", "expected a JSON object, got " + shown(obj));
    if (format == TraceFormat::semianalysis && obj.contains("requests"))
      semianalysis_session(obj, where, line_no, B, block_tokens > 0, add_request);
    else
      add_request(obj, where, line_no, flat_fields, 0, 0.0);
  });
  std::stable_sort(t.requests.begin(), t.requests.end(),
                   [](const TraceRequest& a, const TraceRequest& b) { return a.arrival_ms < b.arrival_ms; });
  t.distinct_blocks = next_id;
  return t;
}

Trace load_trace(const std::string& path, TraceFormat format, int32_t block_tokens) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorCode::bad_trace, path + ":0: file: expected a readable trace file, got none");
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse_trace(ss.str(), path, format, block_tokens);
}

void prompt_tokens_into(const TraceRequest& r, int32_t block_tokens, int64_t length, std::vector<int32_t>& out) {
  out.resize(static_cast<size_t>(length));
  const int64_t B = block_tokens;
  for (int64_t p = 0; p < length; ++p) {
    const int64_t j = p / B;
    out[static_cast<size_t>(p)] = static_cast<int32_t>(static_cast<int64_t>(r.blocks[static_cast<size_t>(j)]) * B + p % B);
  }
}

std::vector<int32_t> prompt_tokens(const TraceRequest& r, int32_t block_tokens, int64_t length) {
  std::vector<int32_t> out;
  prompt_tokens_into(r, block_tokens, length, out);
  return out;
}

namespace {
// "A:B", either side optional, as a half-open range of numbers.
std::pair<double, double> parse_range(std::string_view spec, const char* flag) {
  const size_t colon = spec.find(':');
  auto bad = [&] {
    fail(ErrorCode::bad_argument, std::string(flag) + " = '" + std::string(spec) +
                                      "': expected A:B (numbers >= 0, A < B, either may be left out), got something else");
  };
  if (colon == std::string_view::npos) bad();
  auto number = [&](std::string_view s, double dflt) {
    if (s.empty()) return dflt;
    std::string str(s);
    char* end = nullptr;
    const double v = std::strtod(str.c_str(), &end);
    if (end != str.c_str() + str.size() || !std::isfinite(v) || v < 0) bad();
    return v;
  };
  const double a = number(spec.substr(0, colon), 0.0);
  const double b = number(spec.substr(colon + 1), std::numeric_limits<double>::infinity());
  if (!(a < b)) bad();
  return {a, b};
}
}  // namespace

TraceWindow select_window(const Trace& t, std::string_view requests_spec, std::string_view time_spec) {
  TraceWindow w{0, static_cast<int64_t>(t.requests.size())};
  if (!requests_spec.empty()) {
    const auto [a, b] = parse_range(requests_spec, "--requests");
    if (a != std::floor(a) || (std::isfinite(b) && b != std::floor(b)))
      fail(ErrorCode::bad_argument, "--requests = '" + std::string(requests_spec) + "': expected request indices (integers)");
    w.begin = std::min<int64_t>(static_cast<int64_t>(a), w.end);
    if (std::isfinite(b)) w.end = std::min<int64_t>(static_cast<int64_t>(b), w.end);
  }
  if (!time_spec.empty()) {
    const auto [a, b] = parse_range(time_spec, "--time");
    while (w.begin < w.end && t.requests[static_cast<size_t>(w.begin)].arrival_ms < a) ++w.begin;
    int64_t e = w.begin;
    while (e < w.end && t.requests[static_cast<size_t>(e)].arrival_ms < b) ++e;
    w.end = e;
  }
  if (w.begin >= w.end)
    fail(ErrorCode::bad_argument, "the window (--requests '" + std::string(requests_spec) + "', --time '" +
                                      std::string(time_spec) + "') holds no request of " + t.source + " (" +
                                      std::to_string(t.requests.size()) + " requests)");
  return w;
}

}  // namespace kvsim::workload
