// Scenario files: TOML -> Scenario, then the semantic checks. Two passes on
// purpose: the parser knows where every key is but nothing about the rules;
// check_scenario() knows the rules and finds locations in
// Scenario::key_locations, so scenarios built in C++ get the same checks.
#include "kvsim/sim/scenario_file.hpp"

#include <kvsim/validation/ops/attention.hpp>
#include <kvsim/core/ops/qkv_preprocess.hpp>
#include <kvsim/core/splitmix64.hpp>

#include "kvsim/sim/model_presets.hpp"

#include <algorithm>
#include <cstdio>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <sstream>

#include <toml++/toml.h>

#include "kvsim/validation/tensor.hpp"

namespace kvsim::sim {

namespace {

namespace fs = std::filesystem;

// ------------------------------------------------------------------ messages

std::string location_string(const std::string& file, int line, int column) {
  return file + ":" + std::to_string(line) + ":" + std::to_string(column);
}

SourceLocation location_of(const std::string& file, const toml::source_region& r) {
  return SourceLocation{file, static_cast<int>(r.begin.line), static_cast<int>(r.begin.column)};
}

[[noreturn]] void reject_at(const SourceLocation& at, const std::string& key, const std::string& message) {
  fail(ErrorCode::bad_scenario, location_string(at.file, at.line, at.column) + ": " + clipped(key) + ": " + message);
}

std::string in_quotes(std::string_view s) { return "\"" + clipped(s) + "\""; }

// "an integer (70000)", "a string (\"fp9\")": what the file actually holds.
std::string describe(const toml::node& n) {
  std::ostringstream out;
  if (auto v = n.as_string()) return "a string (" + in_quotes(v->get()) + ")";
  if (auto v = n.as_integer()) return "an integer (" + std::to_string(v->get()) + ")";
  if (auto v = n.as_floating_point()) {
    out << "a float (" << v->get() << ")";
    return out.str();
  }
  if (auto v = n.as_boolean()) return std::string("a boolean (") + (v->get() ? "true" : "false") + ")";
  if (n.is_array()) return "an array";
  if (n.is_table()) return "a table";
  return "a date or time";
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string join(const std::vector<std::string_view>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i ? ", " : "") + std::string(names[i]);
  return out;
}

// "did you mean page_size?" for a key within a few edits of a valid one;
// otherwise the whole list of valid keys.
std::string unknown_key_message(std::string_view key, const std::vector<std::string_view>& valid) {
  std::string_view best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (std::string_view v : valid) {
    // Edits are at least the difference in length: a far longer key is no typo.
    if (key.size() > v.size() + std::max<size_t>(2, key.size() / 3)) continue;
    // A key cut short ("chunk" for chunk_size) is as good as a one-letter typo.
    const bool truncated = !key.empty() && (v.starts_with(key) || key.starts_with(v));
    const size_t d = truncated ? 1 : edit_distance(key, v);
    if (d < best_distance) best_distance = d, best = v;
  }
  const size_t tolerance = std::max<size_t>(2, key.size() / 3);
  if (!best.empty() && best_distance <= tolerance)
    return "unknown key; did you mean " + std::string(best) + "?";
  return "unknown key; expected one of " + join(valid);
}

// ------------------------------------------------------------------ parsing

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// One TOML table with a fixed set of keys. Construction rejects unknown keys;
// each read checks the type and records where the key was set.
class Section {
 public:
  Section(Scenario& s, const toml::table& table, std::string prefix, std::vector<std::string_view> keys)
      : s_(s), table_(table), prefix_(std::move(prefix)), keys_(std::move(keys)) {
    for (const auto& [key, node] : table_) {
      (void)node;
      if (std::find(keys_.begin(), keys_.end(), key.str()) == keys_.end())
        reject_at(location_of(s_.path, key.source()), prefix_ + std::string(key.str()),
                  unknown_key_message(key.str(), keys_));
    }
  }

  bool has(std::string_view key) const { return table_.contains(key); }
  SourceLocation where() const { return location_of(s_.path, table_.source()); }

  void read(std::string_view key, bool& out) {
    if (const toml::node* n = find(key)) {
      if (!n->is_boolean()) wrong_type(key, *n, "a boolean (true or false)");
      out = n->as_boolean()->get();
    }
  }
  void read(std::string_view key, int32_t& out) {
    if (const toml::node* n = find(key)) out = static_cast<int32_t>(integer(key, *n, -kMaxInt32 - 1, kMaxInt32));
  }
  void read(std::string_view key, int64_t& out) {
    if (const toml::node* n = find(key)) out = integer(key, *n, std::numeric_limits<int64_t>::min(),
                                                       std::numeric_limits<int64_t>::max());
  }
  void read(std::string_view key, std::optional<int64_t>& out) {
    if (const toml::node* n = find(key)) out = integer(key, *n, std::numeric_limits<int64_t>::min(),
                                                       std::numeric_limits<int64_t>::max());
  }
  void read(std::string_view key, uint64_t& out) {
    if (const toml::node* n = find(key))
      out = static_cast<uint64_t>(integer(key, *n, 0, std::numeric_limits<int64_t>::max()));
  }
  void read(std::string_view key, double& out) {
    if (const toml::node* n = find(key)) {
      if (n->is_integer()) out = static_cast<double>(n->as_integer()->get());
      else if (n->is_floating_point()) out = n->as_floating_point()->get();
      else wrong_type(key, *n, "a number");
    }
  }
  void read(std::string_view key, float& out) {
    double d = out;
    read(key, d);
    if (has(key)) {
      if (std::isfinite(d) && std::fabs(d) > std::numeric_limits<float>::max())
        wrong_type(key, *table_.get(key), "a number in float range");
      // A value too small for a float would become 0 and be reported as "got 0".
      if (d != 0.0 && static_cast<float>(d) == 0.0f)
        wrong_type(key, *table_.get(key),
                   "a number in float range (at least 1.4e-45 in magnitude; smaller rounds to 0 as a float)");
      out = static_cast<float>(d);
    }
  }
  void read(std::string_view key, std::string& out) {
    if (const toml::node* n = find(key)) {
      if (!n->is_string()) wrong_type(key, *n, "a string");
      out = n->as_string()->get();
    }
  }
  // A name from a closed vocabulary: `parse` maps it, `names` lists the valid ones.
  template <class E>
  void read_name(std::string_view key, E& out, const std::function<std::optional<E>(std::string_view)>& parse,
                 const std::vector<std::string_view>& names) {
    if (const toml::node* n = find(key)) {
      const std::string expected = "one of " + join(names);
      if (!n->is_string()) wrong_type(key, *n, expected);
      const std::optional<E> e = parse(n->as_string()->get());
      if (!e) wrong_type(key, *n, expected);
      out = *e;
    }
  }
  void read(std::string_view key, std::vector<int32_t>& out, const std::string& what = "a token id") {
    const toml::node* n = find(key);
    if (!n) return;
    const toml::array* a = n->as_array();
    if (!a) wrong_type(key, *n, "an array of " + what + "s (integers in 0..2147483647)");
    out.clear();
    for (size_t i = 0; i < a->size(); ++i) {
      const toml::node& e = *a->get(i);
      const std::string element_key = std::string(key) + "[" + std::to_string(i) + "]";
      out.push_back(static_cast<int32_t>(integer(element_key, e, 0, kMaxInt32, what)));
    }
  }
  void read(std::string_view key, std::vector<std::string>& out) {
    const toml::node* n = find(key);
    if (!n) return;
    const toml::array* a = n->as_array();
    if (!a) wrong_type(key, *n, "an array of strings");
    out.clear();
    for (size_t i = 0; i < a->size(); ++i) {
      const toml::node& e = *a->get(i);
      if (!e.is_string()) wrong_type(std::string(key) + "[" + std::to_string(i) + "]", e, "a string");
      out.push_back(e.as_string()->get());
    }
  }
  // An array of names from a closed vocabulary (faults, invariants).
  template <class E>
  void read_names(std::string_view key, std::vector<E>& out, const std::function<std::optional<E>(std::string_view)>& parse,
                  const std::vector<std::string_view>& names) {
    const toml::node* n = find(key);
    if (!n) return;
    const toml::array* a = n->as_array();
    const std::string expected = "one of " + join(names);
    if (!a) wrong_type(key, *n, "an array of names, each " + expected);
    out.clear();
    for (size_t i = 0; i < a->size(); ++i) {
      const toml::node& e = *a->get(i);
      const std::string element_key = std::string(key) + "[" + std::to_string(i) + "]";
      if (!e.is_string()) wrong_type(element_key, e, expected);
      const std::optional<E> v = parse(e.as_string()->get());
      if (!v) wrong_type(element_key, e, expected);
      out.push_back(*v);
    }
  }

 private:
  const toml::node* find(std::string_view key) {
    const toml::node* n = table_.get(key);
    if (n) s_.key_locations[prefix_ + std::string(key)] = location_of(s_.path, n->source());
    return n;
  }
  [[noreturn]] void wrong_type(std::string_view key, const toml::node& n, const std::string& expected) {
    reject_at(location_of(s_.path, n.source()), prefix_ + std::string(key), "expected " + expected + ", got " + describe(n));
  }
  int64_t integer(std::string_view key, const toml::node& n, int64_t lo, int64_t hi,
                  const std::string& what = "an integer") {
    if (!n.is_integer()) wrong_type(key, n, what);
    const int64_t v = n.as_integer()->get();
    if (v < lo || v > hi) wrong_type(key, n, what + " in " + std::to_string(lo) + ".." + std::to_string(hi));
    return v;
  }

  Scenario& s_;
  const toml::table& table_;
  std::string prefix_;
  std::vector<std::string_view> keys_;
};

std::vector<std::string_view> dtype_names() {
  std::vector<std::string_view> names;
  for (CacheDtype t : kAllCacheDtypes) names.push_back(dtype_name(t));
  return names;
}

std::optional<RopeStyle> parse_rope_style(std::string_view s) {
  if (s == "none") return RopeStyle::none;
  if (s == "neox") return RopeStyle::neox;
  if (s == "gptj") return RopeStyle::gptj;
  return std::nullopt;
}

}  // namespace

std::vector<int32_t> generated_tokens(uint64_t seed, int64_t count) {
  std::vector<int32_t> tokens;
  tokens.reserve(static_cast<size_t>(count));
  uint64_t state = seed;
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t z = splitmix64_next(state);
    tokens.push_back(static_cast<int32_t>(z % kGeneratedVocabulary));
  }
  return tokens;
}

namespace {

// The leading comment block, "# " stripped: what the scenario teaches.
std::string header_comment(std::string_view text) {
  std::string out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line[0] != '#') break;
    line.remove_prefix(1);
    if (!line.empty() && line[0] == ' ') line.remove_prefix(1);
    out += std::string(line) + "\n";
    pos = end + 1;
  }
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

const toml::table& section_table(const Scenario& s, const toml::node& n, std::string_view name) {
  if (!n.is_table())
    reject_at(location_of(s.path, n.source()), std::string(name),
              "expected a table ([" + std::string(name) + "]), got " + describe(n));
  return *n.as_table();
}

const toml::array& table_array(const Scenario& s, const toml::node& n, std::string_view name) {
  const toml::array* a = n.as_array();
  if (!a || !a->is_array_of_tables())
    reject_at(location_of(s.path, n.source()), std::string(name),
              "expected an array of tables ([[" + std::string(name) + "]]), got " + describe(n));
  return *a;
}

// One key of a section and how it is read: each key is written once, and the
// section's list of valid keys (for unknown-key messages) is these, in order.
struct Field {
  std::string_view key;
  std::function<void(Section&, std::string_view key)> read;  // null: read elsewhere
};

template <class T>
Field field(std::string_view key, T& out) {
  return {key, [&out](Section& sec, std::string_view k) { sec.read(k, out); }};
}

template <class E>
Field name_field(std::string_view key, E& out, std::function<std::optional<E>(std::string_view)> parse,
                 std::vector<std::string_view> names) {
  return {key, [&out, parse = std::move(parse), names = std::move(names)](Section& sec, std::string_view k) {
            sec.read_name<E>(k, out, parse, names);
          }};
}

void read_section(Scenario& s, const toml::table& t, std::string prefix, const std::vector<Field>& fields) {
  std::vector<std::string_view> keys;
  for (const Field& f : fields) keys.push_back(f.key);
  Section sec(s, t, std::move(prefix), std::move(keys));
  for (const Field& f : fields)
    if (f.read) f.read(sec, f.key);
}

void parse_model(Scenario& s, const toml::table& t) {
  ModelSpec& m = s.model;
  read_section(s, t, "model.",
               {field("layers", m.layers), field("q_heads", m.q_heads), field("kv_heads", m.kv_heads),
                field("head_dim", m.head_dim), field("seed", m.seed), field("value_scale", m.value_scale),
                field("outlier_rate", m.outlier_rate), field("outlier_scale", m.outlier_scale),
                field("nan_rate", m.nan_rate), field("inf_rate", m.inf_rate),
                name_field<CacheDtype>("input_dtype", m.input_dtype, parse_dtype, {"fp32", "fp16", "bf16"}),
                name_field<RopeStyle>("rope", m.rope, parse_rope_style, {"none", "neox", "gptj"}),
                field("rotary_dim", m.rotary_dim), field("rope_theta", m.rope_theta),
                {"preset", nullptr},  // applied before any section (parse_scenario_text)
                {"query_dtype",
                 [&m](Section& sec, std::string_view k) {
                   if (!sec.has(k)) return;
                   CacheDtype q = m.input_dtype;
                   sec.read_name<CacheDtype>(k, q, parse_dtype, {"fp8_e4m3", "fp8_e5m2"});
                   m.query_dtype = q;
                 }},
                field("q_scale", m.q_scale)});
}

void parse_mla(Scenario& s, const toml::table& t) {
  read_section(s, t, "mla.", {field("enabled", s.mla.enabled), field("d_ckv", s.mla.d_ckv),
                              field("d_kpe", s.mla.d_kpe), field("attention", s.mla.attention)});
}

void parse_cache(Scenario& s, const toml::table& t) {
  CacheSpec& c = s.cache;
  std::vector<std::string_view> engines;
  for (Engine e : kEngines) engines.push_back(engine_name(e));
  read_section(
      s, t, "cache.",
      {name_field<CacheDtype>("dtype", c.dtype, parse_dtype, dtype_names()),
       name_field<BlockLayout>("layout", c.layout, parse_layout, {"nhd", "hnd", "split-x"}),
       name_field<LayerPlacement>("placement", c.placement, parse_placement, {"in_block", "per_layer"}),
       {"engine",
        [&c, &engines](Section& sec, std::string_view k) {
          if (!sec.has(k)) return;
          Engine engine{};
          sec.read_name<Engine>(k, engine, parse_engine, engines);
          c.engine = engine;
          c.placement = engine_placement(engine);
          if (c.layout != BlockLayout::split_x) c.layout = engine_block_layout(engine, c.layout);  // split-x + flashinfer: check_cache says why
        }},
       field("page_size", c.page_size), field("primary_blocks", c.primary_blocks),
       field("secondary_blocks", c.secondary_blocks), field("shared_kv_allocation", c.shared_kv_allocation),
       name_field<WritePath>("write_path", c.write_path, parse_write_path,
                             {"qkv_preprocess", "append_paged", "reshape_and_cache", "append_mla"}),
       field("k_scale", c.k_scale), field("v_scale", c.v_scale), field("k_global_scale", c.k_global_scale),
       field("v_global_scale", c.v_global_scale), field("zero_v_tail", c.zero_v_tail),
       field("poison_nan", c.poison_nan),
       {"fresh_page_fill",
        [&c](Section& sec, std::string_view k) {
          if (!sec.has(k)) return;
          float fill = 0.0f;
          sec.read(k, fill);
          c.fresh_page_fill = fill;
        }},
       name_field<BlockOrder>("block_order", c.block_order, parse_block_order, {"lowest", "highest", "shuffled"})});
}

void parse_window(Scenario& s, const toml::table& t) {
  read_section(s, t, "window.",
               {name_field<WindowMode>(
                    "mode", s.window.mode,
                    [](std::string_view n) { return n == "sliding" ? std::nullopt : parse_window_mode(n); },
                    {"none", "cyclic", "release"}),
                field("window", s.window.window), field("sinks", s.window.sinks),
                field("one_more_block", s.window.one_more_block)});
}

void parse_attention(Scenario& s, const toml::table& t) {
  const auto parse_order = [](std::string_view n) -> std::optional<AttentionOrder> {
    if (n == "fp32") return AttentionOrder::fp32;
    if (n == "mma") return AttentionOrder::mma;
    return std::nullopt;
  };
  read_section(s, t, "attention.", {name_field<AttentionOrder>("order", s.attention.order, parse_order, {"fp32", "mma"})});
}

void parse_layers(Scenario& s, const toml::table& t) {
  LayersSpec& l = s.layers;
  l.enabled = true;
  read_section(s, t, "layers.",
               {{"windows", [&l](Section& sec, std::string_view k) {
                   sec.read(k, l.windows, "a window (tokens; 0 = full attention)");
                 }},
                field("sinks", l.sinks),
                name_field<KvAllocation>("allocation", l.allocation, parse_allocation, {"vswa", "hybrid"}),
                name_field<VswaRule>("rule", l.rule, parse_vswa_rule, {"cyclic", "release"}),
                field("one_more_block", l.one_more_block)});
}

void parse_reuse(Scenario& s, const toml::table& t) {
  read_section(s, t, "reuse.", {field("enabled", s.reuse.enabled), field("partial", s.reuse.partial),
                                field("offload", s.reuse.offload)});
}

void parse_scheduler(Scenario& s, const toml::table& t) {
  SchedulerSpec& sch = s.scheduler;
  read_section(s, t, "scheduler.", {field("token_budget", sch.token_budget), field("chunk_size", sch.chunk_size),
                                    field("max_batch", sch.max_batch), field("max_steps", sch.max_steps)});
}

void parse_recurrent(Scenario& s, const toml::table& t) {
  read_section(s, t, "recurrent.",
               {field("layers", s.recurrent.layers), field("state_size", s.recurrent.state_size),
                name_field<SnapshotMode>("snapshots", s.recurrent.snapshots, parse_snapshot_mode, {"all", "align"})});
}

void parse_indexer(Scenario& s, const toml::table& t) {
  read_section(s, t, "indexer.", {field("k_scatter", s.indexer_k_scatter)});
}

// FNV-1a of the name: the same seed on every platform (std::hash is not).
uint64_t name_seed(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return h | 1;
}

void parse_prefix(Scenario& s, const toml::table& t, size_t index) {
  const std::string prefix = "prefix[" + std::to_string(index) + "].";
  Section sec(s, t, prefix, {"name", "tokens", "length", "seed"});
  PrefixSpec p;
  p.where = sec.where();
  if (!sec.has("name")) reject_at(p.where, prefix + "name", "expected a string (every [[prefix]] is named), got nothing");
  sec.read("name", p.name);
  const bool explicit_tokens = sec.has("tokens");
  if (explicit_tokens == sec.has("length"))
    reject_at(p.where, prefix + "tokens",
              "expected either tokens (explicit ids) or length (generated ids), got " +
                  std::string(explicit_tokens ? "both" : "neither"));
  if (explicit_tokens) {
    sec.read("tokens", p.tokens);
    if (sec.has("seed"))
      reject_at(s.key_locations[prefix + "tokens"], prefix + "seed",
                "expected no seed with explicit tokens (seed only seeds length = N generated tokens)");
  } else {
    int32_t length = 0;
    uint64_t seed = 0;
    sec.read("length", length);
    sec.read("seed", seed);
    if (length < 1 || length > (1 << 20))
      reject_at(s.key_locations[prefix + "length"], prefix + "length",
                "expected an integer in 1..1048576, got " + std::to_string(length));
    // seed 0 = derived from the name, so two unseeded prefixes differ.
    if (seed == 0) seed = name_seed(p.name);
    p.tokens = generated_tokens(seed, length);
  }
  s.prefixes.push_back(std::move(p));
}

void parse_request(Scenario& s, const toml::table& t, size_t index) {
  RequestSpec r;
  r.where = location_of(s.path, t.source());
  r.id = "r" + std::to_string(index);
  read_section(s, t, "request[" + std::to_string(index) + "].",
               {field("id", r.id), field("arrival_step", r.arrival_step), field("prefixes", r.prefixes),
                field("tokens", r.tokens), field("generated", r.generated), field("seed", r.seed),
                field("decode_tokens", r.decode_tokens)});
  s.requests.push_back(std::move(r));
}

void parse_faults(Scenario& s, const toml::table& t) {
  Section sec(s, t, "faults.", fault_names());
  for (std::string_view name : fault_names()) {
    bool on = false;
    sec.read(name, on);
    if (on) s.faults.push_back(*parse_fault(name));
  }
}

void parse_expect(Scenario& s, const toml::table& t) {
  Expectations& e = s.expect;
  read_section(s, t, "expect.",
               {field("reuse_hit_tokens", e.reuse_hit_tokens), field("evicted_blocks", e.evicted_blocks),
                field("offloaded_blocks", e.offloaded_blocks), field("onboarded_blocks", e.onboarded_blocks),
                field("preemptions", e.preemptions),
                {"must_pass", [&e](Section& sec, std::string_view k) {
                   sec.read_names<Invariant>(k, e.must_pass, parse_invariant, invariant_names());
                 }},
                {"must_catch", [&e](Section& sec, std::string_view k) {
                   sec.read_names<Fault>(k, e.must_catch, parse_fault, fault_names());
                 }}});
}

const std::vector<std::string_view> kTopLevelKeys = {"model",     "mla",     "cache",     "window", "layers",
                                                     "attention", "reuse",   "scheduler", "indexer", "recurrent",
                                                     "prefix",    "request", "faults",    "expect"};

// ------------------------------------------------------------------ checks

// Places semantic-check messages: at the key when the file set it, else at
// its section, else at the file's start (the default was taken).
class Checker {
 public:
  explicit Checker(const Scenario& s) : s_(s) {}

  [[noreturn]] void reject(const std::string& key, const std::string& message) const {
    reject_at(where(key), key, message);
  }
  void require(bool ok, const std::string& key, const std::string& message) const {
    if (!ok) reject(key, message);
  }
  SourceLocation where(const std::string& key) const {
    for (std::string k = key;;) {
      auto it = s_.key_locations.find(k);
      if (it != s_.key_locations.end()) return it->second;
      const size_t dot = k.rfind('.');
      if (dot == std::string::npos) break;
      k.resize(dot);
    }
    if (s_.path.empty()) return SourceLocation{s_.name.empty() ? "<scenario>" : s_.name, 0, 0};
    return SourceLocation{s_.path, 1, 1};
  }
  // Core's own rejection (validate_geometry, validate_window, ...) reworded
  // as a scenario error at `key`.
  void core_check(const std::string& key, const std::function<void()>& check) const {
    try {
      check();
    } catch (const ValidationError& e) {
      reject(key, std::string("rejected by core: ") + e.what());
    }
  }

 private:
  const Scenario& s_;
};

std::string str(double x) {
  std::ostringstream out;
  out << x;
  return out.str();
}

bool finite_positive(double x) { return std::isfinite(x) && x > 0; }

void check_model(const Scenario& s, const Checker& c) {
  const ModelSpec& m = s.model;
  c.require(m.layers >= 1 && m.layers <= 1024, "model.layers", "expected 1..1024, got " + std::to_string(m.layers));
  c.require(m.kv_heads >= 1 && m.kv_heads <= 1024, "model.kv_heads",
            "expected 1..1024, got " + std::to_string(m.kv_heads));
  c.require(m.q_heads <= 8192, "model.q_heads", "expected at most 8192, got " + std::to_string(m.q_heads));
  c.require(m.q_heads >= 1 && m.q_heads % m.kv_heads == 0, "model.q_heads",
            "expected a positive multiple of kv_heads = " + std::to_string(m.kv_heads) + " (GQA group), got " +
                std::to_string(m.q_heads));
  c.require(m.head_dim >= 1 && m.head_dim <= 4096, "model.head_dim",
            "expected 1..4096, got " + std::to_string(m.head_dim));
  c.require(finite_positive(m.value_scale), "model.value_scale", "expected a finite number > 0, got " + str(m.value_scale));
  c.require(m.outlier_rate >= 0.0f && m.outlier_rate <= 1.0f, "model.outlier_rate",
            "expected a share in 0..1, got " + str(m.outlier_rate));
  c.require(finite_positive(m.outlier_scale), "model.outlier_scale",
            "expected a finite number > 0, got " + str(m.outlier_scale));
  c.require(m.nan_rate >= 0.0f && m.nan_rate <= 1.0f, "model.nan_rate", "expected a share in 0..1, got " + str(m.nan_rate));
  c.require(m.inf_rate >= 0.0f && m.inf_rate <= 1.0f - m.nan_rate, "model.inf_rate",
            "expected a share in 0..1 - nan_rate, got " + str(m.inf_rate));
  c.require(is_float_input(m.input_dtype), "model.input_dtype",
            "expected one of fp32, fp16, bf16 (engines feed K/V in a float dtype), got " +
                std::string(dtype_name(m.input_dtype)));
  c.require(finite_positive(m.q_scale), "model.q_scale", "expected a finite number > 0, got " + str(m.q_scale));
  if (m.query_dtype) {
    c.require(is_fp8(*m.query_dtype), "model.query_dtype",
              "expected fp8_e4m3 or fp8_e5m2 (fp8 queries with a per-tensor q_scale; leave the key out for queries "
              "in input_dtype), got " + std::string(dtype_name(*m.query_dtype)));
    c.require(!s.mla.attention, "model.query_dtype",
              "fp8 queries are modelled for decode and prefill attention, not mla_attention (set mla.attention = "
              "false or leave query_dtype out)");
  } else {
    c.require(m.q_scale == 1.0f, "model.q_scale",
              "expected 1 without model.query_dtype (q_scale is the scale of fp8 queries), got " + str(m.q_scale));
  }
  if (m.rope != RopeStyle::none) {
    const int32_t rotary = m.rotary_dim == 0 ? m.head_dim : m.rotary_dim;
    c.require(rotary > 0 && rotary % 2 == 0 && rotary <= m.head_dim, "model.rotary_dim",
              "expected an even number in 2..head_dim = " + std::to_string(m.head_dim) + " (0 = head_dim), got " +
                  std::to_string(rotary));
    c.require(std::isfinite(m.rope_theta) && m.rope_theta > 1.0, "model.rope_theta",
              "expected a finite number > 1, got " + str(m.rope_theta));
  }
}

}  // namespace

int64_t mla_row_width(const Scenario& s) {
  // nvfp4 rows hold ckv as nibbles and kpe as fp8 bytes, two nibbles each (core's append_mla).
  const int64_t kpe_units = s.cache.dtype == CacheDtype::nvfp4 ? 2 : 1;
  return int64_t{s.mla.d_ckv} + kpe_units * s.mla.d_kpe;
}

namespace {

void check_mla(const Scenario& s, const Checker& c) {
  const MlaSpec& mla = s.mla;
  if (mla.attention)
    c.require(mla.enabled, "mla.attention", "expected mla.enabled = true (mla_attention reads a latent pool)");
  if (!mla.enabled) {
    c.require(s.cache.write_path != WritePath::append_mla, "cache.write_path",
              "expected qkv_preprocess, append_paged or reshape_and_cache: append_mla writes an MLA latent pool "
              "(set mla.enabled = true)");
    return;
  }
  c.require(mla.d_ckv >= 1 && mla.d_ckv <= 4096, "mla.d_ckv", "expected 1..4096, got " + std::to_string(mla.d_ckv));
  c.require(mla.d_kpe >= 0 && mla.d_kpe <= 4096, "mla.d_kpe", "expected 0..4096, got " + std::to_string(mla.d_kpe));
  const bool nvfp4 = s.cache.dtype == CacheDtype::nvfp4;
  c.require(s.model.head_dim == mla_row_width(s), "model.head_dim",
            std::string("expected ") + (nvfp4 ? "d_ckv + 2 * d_kpe" : "d_ckv + d_kpe") + " = " +
                std::to_string(mla_row_width(s)) + " with MLA (one latent row [ckv | kpe] per token" +
                (nvfp4 ? ", kpe as fp8 bytes of two nibbles" : "") + "), got " + std::to_string(s.model.head_dim));
  c.require(s.cache.write_path == WritePath::append_mla, "cache.write_path",
            "expected append_mla with MLA (the latent pool has no separate K and V), got " +
                std::string(write_path_name(s.cache.write_path)));
  c.require(!s.cache.shared_kv_allocation, "cache.shared_kv_allocation",
            "expected false with MLA (a latent pool has no K/V pair to share an allocation)");
  if (nvfp4)
    c.require(mla.d_ckv % codec::kNvfp4BlockElems == 0, "mla.d_ckv",
              "expected a multiple of 16 with an nvfp4 cache (append_mla quantizes ckv in groups of 16), got " +
                  std::to_string(mla.d_ckv));
}

// The head_dim the ops a replay runs accept (core's limits, so validation and
// the ops cannot disagree): decode and prefill attention read at most
// canon::kMaxHeadDim, qkv_preprocess_write writes at most kQkvMaxHeadDim.
void check_head_dim_for_ops(const Scenario& s, const Checker& c) {
  if (s.mla.enabled) return;  // mla_attention's own limit follows from d_ckv and d_kpe (check_mla)
  const int32_t D = s.model.head_dim;
  c.require(D <= canon::kMaxHeadDim, "model.head_dim",
            "expected at most " + std::to_string(canon::kMaxHeadDim) +
                " (decode and prefill attention keep a row of head_dim accumulators), got " + std::to_string(D));
  if (s.cache.write_path == WritePath::qkv_preprocess)
    c.require(D <= kQkvMaxHeadDim, "model.head_dim",
              "expected at most " + std::to_string(kQkvMaxHeadDim) +
                  " with cache.write_path = qkv_preprocess (its fused RoPE keeps a row on the stack; append_paged "
                  "and reshape_and_cache take up to " + std::to_string(canon::kMaxHeadDim) + "), got " +
                  std::to_string(D));
}

void check_cache(const Scenario& s, const Checker& c) {
  const CacheSpec& k = s.cache;
  c.require(k.page_size >= 1 && k.page_size <= kMaxTokensPerBlock, "cache.page_size",
            "expected 1..1024 tokens per block, got " + std::to_string(k.page_size));
  c.require(k.primary_blocks >= 1 && k.primary_blocks <= kMaxBlocks, "cache.primary_blocks",
            "expected 1.." + std::to_string(kMaxBlocks) + " (block ids are 31 bits), got " +
                std::to_string(k.primary_blocks));
  c.require(k.secondary_blocks >= 0 && k.secondary_blocks <= kMaxBlocks, "cache.secondary_blocks",
            "expected 0.." + std::to_string(kMaxBlocks) + " (block ids are 31 bits), got " +
                std::to_string(k.secondary_blocks));
  // No size cap here: the pools may be as large as the backend's memory,
  // which kvsim run checks before allocating (estimate.hpp, check_fits).
  const PoolGeometry g = pool_geometry(s);
  c.core_check("cache", [&] { validate_geometry(g); });
  if (is_float_input(k.dtype))
    c.require(k.dtype == s.model.input_dtype, "cache.dtype",
              "expected model.input_dtype = " + std::string(dtype_name(s.model.input_dtype)) +
                  " (a fp32/fp16/bf16 cache takes the input dtype unconverted), got " + std::string(dtype_name(k.dtype)));
  for (const auto& [key, value] : {std::pair{"cache.k_scale", k.k_scale}, std::pair{"cache.v_scale", k.v_scale}})
    c.require(finite_positive(value), key, "expected a finite number > 0, got " + str(value));
  for (const auto& [key, value] : {std::pair{"cache.k_global_scale", k.k_global_scale},
                                   std::pair{"cache.v_global_scale", k.v_global_scale}})
    if (k.dtype != CacheDtype::nvfp4)  // nvfp4 gets core's own check and message below
      c.require(finite_positive(value), key, "expected a finite number > 0, got " + str(value));
  if (k.dtype == CacheDtype::nvfp4) {
    c.core_check("cache.k_global_scale", [&] { validate_global_scale(k.k_global_scale, "k_global_scale"); });
    c.core_check("cache.v_global_scale", [&] { validate_global_scale(k.v_global_scale, "v_global_scale"); });
    c.require(k.write_path != WritePath::reshape_and_cache, "cache.write_path",
              "expected qkv_preprocess or append_paged for an nvfp4 cache (vLLM's reshape_and_cache does not write "
              "nvfp4), got reshape_and_cache");
  }
  if (k.fresh_page_fill) {
    c.require(std::isfinite(*k.fresh_page_fill), "cache.fresh_page_fill",
              "expected a finite number (the poison must read as a value; NaN is poison_nan), got " +
                  str(*k.fresh_page_fill));
    c.require(!k.poison_nan, "cache.fresh_page_fill", "expected poison_nan = false (one fill per pool)");
    c.require(k.dtype != CacheDtype::nvfp4, "cache.fresh_page_fill",
              "expected a cache dtype with one code per element (an nvfp4 element's value depends on its block scale)");
    c.require(!k.shared_kv_allocation, "cache.fresh_page_fill", "expected shared_kv_allocation = false");
  }
  // With NaN in every pool, no_nan holds only where the writer zeroes the V
  // tail whole-page readers multiply by 0 (docs/invariants.md): anything else
  // could only fail no_nan, so it is the fault, asked for by name.
  const bool v_tail_fault =
      std::find(s.faults.begin(), s.faults.end(), Fault::v_tail_not_zeroed) != s.faults.end();
  if (k.poison_nan && !v_tail_fault && !s.mla.enabled) {
    c.require(k.write_path == WritePath::qkv_preprocess && k.zero_v_tail, "cache.poison_nan",
              "expected write_path = qkv_preprocess with zero_v_tail = true (only it zeroes the V tail of the last "
              "block; append_paged, reshape_and_cache or an unzeroed tail show the pools' NaN and fail no_nan: switch "
              "on faults.v_tail_not_zeroed to see that caught)");
    c.require(s.model.nan_rate == 0.0f && s.model.inf_rate == 0.0f, "cache.poison_nan",
              "expected model.nan_rate = inf_rate = 0 (NaN and Inf inputs reach the attention outputs whatever the "
              "pools hold, so no_nan could only fail)");
  }
  if (k.engine) {
    c.require(!k.shared_kv_allocation, "cache.shared_kv_allocation",
              "expected false with cache.engine (the engine's preset says where K and V live)");
    c.require(s.cache.write_path != WritePath::append_mla && !s.mla.enabled, "cache.engine",
              "expected no MLA with an engine preset (the presets hold separate K and V)");
    c.require(!s.layers.enabled, "cache.engine", "expected no per-layer windows ([layers]) with an engine preset "
                                                 "(one pool of the engine's tensors)");
    c.core_check("cache.engine", [&] {
      engine_layout(*k.engine, pool_geometry(s), PoolKind::primary);
      engine_layout(*k.engine, pool_geometry(s), PoolKind::secondary);
    });
  }
  if (k.shared_kv_allocation)
    c.require(k.placement == LayerPlacement::per_layer && k.layout == BlockLayout::nhd, "cache.shared_kv_allocation",
              "expected placement = per_layer and layout = nhd (FlashInfer's one [pages, 2, P, H, D] allocation per "
              "layer), got " + std::string(placement_name(k.placement)) + " and " + std::string(layout_name(k.layout)));
}

void check_window(const Scenario& s, const Checker& c) {
  const WindowSpec& w = s.window;
  if (w.mode == WindowMode::none) {
    c.require(w.window == 0, "window.window",
              "expected 0 with mode = none (set mode = cyclic or release for a window), got " + std::to_string(w.window));
    c.require(w.sinks == 0, "window.sinks", "expected 0 with mode = none, got " + std::to_string(w.sinks));
    c.require(!w.one_more_block, "window.one_more_block", "expected false with mode = none");
    return;
  }
  c.require(w.window >= 1, "window.window",
            "expected >= 1 tokens with mode = " + std::string(window_mode_name(w.mode)) + ", got " +
                std::to_string(w.window));
  c.core_check("window.sinks", [&] {
    validate_window(WindowMapping::make(w.window, w.sinks, s.cache.page_size, w.one_more_block));
  });
  if (w.mode == WindowMode::release) {
    c.require(w.sinks == 0, "window.sinks",
              "expected 0 with mode = release (vLLM frees every block that leaves the window; sinks are "
              "TensorRT-LLM's cyclic mode), got " + std::to_string(w.sinks));
    c.require(!w.one_more_block, "window.one_more_block",
              "expected false with mode = release (one more block is TensorRT-LLM's cyclic ring)");
  }
  if (w.mode == WindowMode::cyclic)
    c.require(!s.reuse.enabled, "reuse.enabled",
              "expected false with a cyclic window (TensorRT-LLM disables block reuse there: ring blocks are "
              "overwritten, so a cached block would not hold its tokens)");
  else
    c.require(!s.reuse.enabled, "reuse.enabled",
              "expected false with a release window (vLLM's prefix caching over released blocks is not modelled "
              "by kvsim's block manager)");
}

// [layers]: per-layer windows, their allocation model and what it rules out.
void check_layers(const Scenario& s, const Checker& c) {
  const LayersSpec& l = s.layers;
  if (!l.enabled) return;
  c.require(!l.windows.empty(), "layers.windows",
            "expected an array of per-layer windows (0 = full attention), e.g. [32, 32, 32, 32, 32, 0]");
  c.require(s.model.layers % static_cast<int32_t>(l.windows.size()) == 0, "layers.windows",
            "expected one window per layer or a pattern that divides model.layers = " + std::to_string(s.model.layers) +
                ", got " + std::to_string(l.windows.size()) + " windows");
  c.require(s.window.mode == WindowMode::none, "window.mode",
            "expected none with [layers] (the layers' windows are given there), got " +
                std::string(window_mode_name(s.window.mode)));
  c.require(!s.mla.enabled, "layers", "expected no [layers] with MLA (kvsim's MLA models DeepSeek-V3, whose layers all attend fully: no per-layer windows)");
  c.require(!s.cache.shared_kv_allocation, "cache.shared_kv_allocation",
            "expected false with [layers] (each KV cache group's pool is allocated on its own)");
  const bool vswa = l.allocation == KvAllocation::vswa;
  const bool cyclic = vswa && l.rule == VswaRule::cyclic;
  if (!vswa) {
    c.require(l.sinks == 0, "layers.sinks",
              "expected 0 with allocation = hybrid (vLLM's sliding window has no sink tokens), got " +
                  std::to_string(l.sinks));
    c.require(!s.key_locations.count("layers.rule"), "layers.rule",
              "expected no rule with allocation = hybrid (the rule chooses TensorRT-LLM VSWA's cyclic or release pools)");
  }
  c.require(!l.one_more_block || cyclic, "layers.one_more_block",
            "expected false unless allocation = vswa and rule = cyclic (one more block extends TensorRT-LLM's ring)");
  if (cyclic)
    c.require(!s.reuse.enabled, "reuse.enabled",
              "expected false with VSWA rule = cyclic (TensorRT-LLM disables block reuse for cyclic pools: ring blocks "
              "are overwritten)");
  for (size_t i = 0; i < l.windows.size(); ++i) {
    const int32_t w = l.windows[i];
    if (w == 0) continue;
    c.core_check("layers.windows", [&] {
      validate_window(cyclic ? WindowMapping::make(w, l.sinks, s.cache.page_size, l.one_more_block)
                             : WindowMapping::make_linear(w, l.sinks, s.cache.page_size));
    });
  }
  if (!vswa) {
    // vLLM cuts each kind's layers into groups of the smallest kind's count.
    std::map<int32_t, int32_t> counts;
    for (int32_t layer = 0; layer < s.model.layers; ++layer) ++counts[layer_window(s, layer)];
    int32_t smallest = s.model.layers;
    for (const auto& [w, n] : counts) smallest = std::min(smallest, n);
    for (const auto& [w, n] : counts)
      c.require(n % smallest == 0, "layers.windows",
                "expected every kind's layer count to be a multiple of the smallest (" + std::to_string(smallest) +
                    ": vLLM's KV cache groups are of equal size), got " + std::to_string(n) + " layers of window " +
                    std::to_string(w));
  }
}

void check_reuse_and_scheduler(const Scenario& s, const Checker& c) {
  const ReuseSpec& r = s.reuse;
  if (r.partial) c.require(r.enabled, "reuse.partial", "expected reuse.enabled = true for partial-block reuse");
  if (r.offload) {
    c.require(r.enabled, "reuse.offload", "expected reuse.enabled = true (only cached blocks are offloaded)");
    c.require(s.cache.secondary_blocks >= 1, "reuse.offload",
              "expected cache.secondary_blocks >= 1 to offload into, got " + std::to_string(s.cache.secondary_blocks));
  }
  const RecurrentSpec& rc = s.recurrent;
  c.require(rc.layers >= 0 && rc.layers <= 1024, "recurrent.layers",
            "expected 0..1024 recurrent layers, got " + std::to_string(rc.layers));
  c.require(rc.state_size >= 1 && rc.state_size <= 65536, "recurrent.state_size",
            "expected 1..65536 fp32 elements, got " + std::to_string(rc.state_size));
  if (rc.layers > 0) {
    // A state exists only at block boundaries: a partial-block hit would have none to start from.
    c.require(!r.partial, "reuse.partial", "expected no partial-block reuse with [recurrent] (states are snapshotted "
                                           "at block boundaries only)");
    c.require(!s.layers.enabled && s.window.mode == WindowMode::none, "recurrent.layers",
              "expected no [layers] and no [window] with [recurrent] (their hit rule is not combined with the "
              "recurrent states' yet)");
  }
  const SchedulerSpec& q = s.scheduler;
  c.require(q.token_budget >= 1, "scheduler.token_budget", "expected >= 1, got " + std::to_string(q.token_budget));
  c.require(q.chunk_size >= 0, "scheduler.chunk_size",
            "expected >= 0 (0 = whole prompt), got " + std::to_string(q.chunk_size));
  c.require(q.max_batch >= 1, "scheduler.max_batch", "expected >= 1, got " + std::to_string(q.max_batch));
  c.require(q.max_steps >= 1, "scheduler.max_steps", "expected >= 1, got " + std::to_string(q.max_steps));
}

// Blocks a request needs at once, at least: its whole cache length, or for a
// release window the blocks the window spans. A lower bound, so a scenario
// that passes may still preempt; one that fails can never run.
int64_t blocks_needed(const Scenario& s, int64_t total_tokens) {
  const int64_t P = s.cache.page_size;
  int64_t slots = total_tokens;
  if (s.window.mode == WindowMode::cyclic)
    slots = WindowMapping::make(s.window.window, s.window.sinks, s.cache.page_size, s.window.one_more_block)
                .cache_length(total_tokens);
  else if (s.window.mode == WindowMode::release)
    slots = std::min<int64_t>(total_tokens, s.window.window);
  return (slots + P - 1) / P;
}

// Prefill writes a chunk into the ring, then its queries read the ring. Token
// t' overwrites t' - cyclic_len, which a query t of the same chunk still
// attends to when t' - t > extra (extra = cyclic_len - (W - S): P with one more
// block, else 0) -- once the prompt has wrapped. Such a chunk can only give
// wrong outputs, so the scenario is impossible as written.
void check_cyclic_prefill(const Scenario& s, const Checker& c, const std::string& key, int64_t prompt,
                          const WindowMapping& m) {
  const int64_t extra = m.cyclic_len - (static_cast<int64_t>(m.window) - m.sinks);
  const int64_t wraps_from = m.sinks + m.cyclic_len;  // first token that overwrites another
  int64_t max_chunk = s.scheduler.chunk_size > 0 ? std::min<int64_t>(s.scheduler.chunk_size, prompt) : prompt;
  max_chunk = std::min<int64_t>(max_chunk, s.scheduler.token_budget);
  if (prompt - 1 >= wraps_from && max_chunk >= extra + 2)
    c.reject(key, "expected prefill chunks of at most " + std::to_string(extra + 1) +
                      (extra == 0 ? " token" : " tokens") + " once the prompt wraps the cyclic ring (prompt of " + std::to_string(prompt) +
                      " tokens wraps at token " + std::to_string(wraps_from) + "; a chunk of " +
                      std::to_string(max_chunk) +
                      " would overwrite keys its own earlier queries attend to): set scheduler.chunk_size <= " +
                      std::to_string(extra + 1) +
                      (m.one_more_block ? "" : s.layers.enabled ? " or layers.one_more_block = true" : " or window.one_more_block = true") +
                      ", or shorten the prompt");
}

// [layers]: each pool must hold the request alone: the blocks of every group
// drawing on it (full: every token; cyclic: the ring; sliding: the window),
// plus the null block where a sliding group needs one.
void check_group_capacity(const Scenario& s, const Checker& c, const std::string& key, int64_t prompt, int64_t total) {
  const std::vector<KvGroup> groups = kv_groups(s);
  const int64_t P = s.cache.page_size;
  std::vector<int64_t> needed(static_cast<size_t>(kv_pool_count(groups)), 0);
  std::vector<bool> null_block(needed.size(), false);
  for (const KvGroup& g : groups) {
    int64_t slots = total;
    if (g.mode == WindowMode::cyclic) {
      const WindowMapping m = WindowMapping::make(g.window, g.sinks, s.cache.page_size, g.one_more_block);
      check_cyclic_prefill(s, c, key, prompt, m);
      slots = m.cache_length(total);
    } else if (g.mode == WindowMode::sliding) {
      slots = std::min<int64_t>(total, g.window);
      null_block[g.pool] = true;
    }
    needed[g.pool] += (slots + P - 1) / P;
  }
  for (size_t p = 0; p < needed.size(); ++p) {
    const int64_t n = needed[p] + (null_block[p] ? 1 : 0);
    c.require(n <= s.cache.primary_blocks, key,
              "expected to fit " + std::string(needed.size() > 1 ? "pool " + std::to_string(p) : "the primary pool") +
                  ": " + std::to_string(total) + " tokens need " + std::to_string(n) + " blocks of " +
                  std::to_string(P) + " tokens" + (null_block[p] ? " (one of them the null block)" : "") +
                  ", got cache.primary_blocks = " + std::to_string(s.cache.primary_blocks));
  }
}

void check_prompts(const Scenario& s, const Checker& c) {
  std::map<std::string, const PrefixSpec*> prefixes;
  for (size_t i = 0; i < s.prefixes.size(); ++i) {
    const PrefixSpec& p = s.prefixes[i];
    const std::string key = "prefix[" + std::to_string(i) + "]";
    c.require(!p.name.empty(), key + ".name", "expected a non-empty name");
    c.require(prefixes.emplace(p.name, &p).second, key + ".name",
              "expected a unique name, got " + in_quotes(p.name) + " twice");
    c.require(!p.tokens.empty(), key + ".tokens", "expected at least one token");
    for (int32_t t : p.tokens) c.require(t >= 0, key + ".tokens", "expected token ids >= 0, got " + std::to_string(t));
  }
  c.require(!s.requests.empty(), "request", "expected at least one [[request]], got none");
  std::set<std::string> ids;
  for (size_t i = 0; i < s.requests.size(); ++i) {
    const RequestSpec& r = s.requests[i];
    const std::string key = "request[" + std::to_string(i) + "]";
    c.require(!r.id.empty(), key + ".id", "expected a non-empty id");
    c.require(ids.insert(r.id).second, key + ".id", "expected a unique id, got " + in_quotes(r.id) + " twice");
    c.require(r.arrival_step >= 0 && r.arrival_step < s.scheduler.max_steps, key + ".arrival_step",
              "expected 0..scheduler.max_steps - 1 = " + std::to_string(s.scheduler.max_steps - 1) + ", got " +
                  std::to_string(r.arrival_step));
    int64_t prompt = 0;
    for (size_t j = 0; j < r.prefixes.size(); ++j) {
      auto it = prefixes.find(r.prefixes[j]);
      if (it == prefixes.end()) {
        std::vector<std::string_view> names;
        for (const auto& [name, p] : prefixes) names.push_back(name);
        c.reject(key + ".prefixes", "expected the name of a [[prefix]] (" +
                                        (names.empty() ? std::string("none defined") : join(names)) + "), got " +
                                        in_quotes(r.prefixes[j]));
      }
      prompt += static_cast<int64_t>(it->second->tokens.size());
    }
    c.require(r.tokens.empty() || r.generated == 0, key + ".generated",
              "expected either tokens (explicit ids) or generated (a count), got both");
    c.require(r.generated >= 0, key + ".generated", "expected >= 0, got " + std::to_string(r.generated));
    for (int32_t t : r.tokens) c.require(t >= 0, key + ".tokens", "expected token ids >= 0, got " + std::to_string(t));
    prompt += static_cast<int64_t>(r.tokens.size()) + r.generated;
    c.require(prompt >= 1, key, "expected a prompt of at least one token (prefixes, tokens or generated), got none");
    c.require(r.decode_tokens >= 0, key + ".decode_tokens", "expected >= 0, got " + std::to_string(r.decode_tokens));
    if (s.window.mode == WindowMode::cyclic)
      check_cyclic_prefill(s, c, key, prompt,
                           WindowMapping::make(s.window.window, s.window.sinks, s.cache.page_size, s.window.one_more_block));
    const int64_t total = prompt + r.decode_tokens;
    c.require(total <= (1 << 20), key, "expected at most 1048576 tokens in all, got " + std::to_string(total));
    if (s.layers.enabled) {
      check_group_capacity(s, c, key, prompt, total);
      continue;
    }
    // Release mode reserves one block as the null block released entries point at (vLLM).
    const bool null_block = s.window.mode == WindowMode::release;
    const int64_t needed = blocks_needed(s, total) + (null_block ? 1 : 0);
    c.require(needed <= s.cache.primary_blocks, key,
              "expected to fit the primary pool: " + std::to_string(total) + " tokens need " + std::to_string(needed) +
                  " blocks of " + std::to_string(s.cache.page_size) + " tokens" +
                  (null_block ? " (one of them the release window's null block)" : "") +
                  ", got cache.primary_blocks = " + std::to_string(s.cache.primary_blocks));
  }
}

// A fault can only show where its failure can happen; switching one on where
// it cannot would make "caught" meaningless.
void check_faults(const Scenario& s, const Checker& c) {
  auto on = [&](Fault f) { return std::find(s.faults.begin(), s.faults.end(), f) != s.faults.end(); };
  auto key = [](Fault f) { return "faults." + std::string(fault_name(f)); };
  if (on(Fault::past_len_zero))
    c.require(s.scheduler.chunk_size > 0, key(Fault::past_len_zero),
              "expected scheduler.chunk_size > 0 (past_seq_len matters only from the second chunk on)");
  if (on(Fault::window_mismatch))
    c.require(s.window.mode == WindowMode::cyclic || (s.layers.enabled && s.layers.allocation == KvAllocation::vswa &&
                                                      s.layers.rule == VswaRule::cyclic),
              key(Fault::window_mismatch),
              "expected window.mode = cyclic, or [layers] allocation = vswa with rule = cyclic (the reader and writer "
              "disagree on the cyclic mapping)");
  if (on(Fault::k_scale_for_v)) {
    c.require(is_quantized(s.cache.dtype), key(Fault::k_scale_for_v),
              "expected a quantized cache.dtype (fp8_e4m3, fp8_e5m2, int8, nvfp4), got " +
                  std::string(dtype_name(s.cache.dtype)));
    const bool differ = s.cache.dtype == CacheDtype::nvfp4 ? s.cache.k_global_scale != s.cache.v_global_scale
                                                           : s.cache.k_scale != s.cache.v_scale;
    c.require(differ, key(Fault::k_scale_for_v),
              "expected different K and V scales (with equal scales the swap changes nothing)");
  }
  if (on(Fault::reused_block_mismatch))
    c.require(s.reuse.enabled, key(Fault::reused_block_mismatch), "expected reuse.enabled = true");
  if (on(Fault::q_scale_dropped))
    c.require(s.model.query_dtype.has_value() && s.model.q_scale != 1.0f, key(Fault::q_scale_dropped),
              "expected model.query_dtype (fp8 queries) and model.q_scale != 1 (with a scale of 1 dropping it "
              "changes nothing)");
  if (on(Fault::v_tail_not_zeroed)) {
    c.require(s.cache.write_path == WritePath::qkv_preprocess, key(Fault::v_tail_not_zeroed),
              "expected cache.write_path = qkv_preprocess (it zeroes the V tail), got " +
                  std::string(write_path_name(s.cache.write_path)));
    c.require(s.cache.poison_nan, key(Fault::v_tail_not_zeroed),
              "expected cache.poison_nan = true (a tail that is not zeroed only shows when the pool holds NaN)");
    c.require(s.cache.dtype != CacheDtype::int8, key(Fault::v_tail_not_zeroed),
              "expected a cache dtype whose 0xFF bytes are NaN (a float, fp8 or nvfp4 cache; int8's 0xFF is -1)");
  }
  if (on(Fault::group_window_for_layer)) {
    bool sliding = false, full = false;
    for (int32_t l = 0; l < s.model.layers; ++l) (layer_window(s, l) > 0 ? sliding : full) = true;
    c.require(s.layers.enabled && sliding && full, key(Fault::group_window_for_layer),
              "expected [layers] with both sliding and full layers (the full layers take the sliding window)");
  }
  if (on(Fault::window_table_absolute))
    c.require(s.window.mode == WindowMode::cyclic || (s.layers.enabled && s.layers.allocation == KvAllocation::vswa &&
                                                      s.layers.rule == VswaRule::cyclic),
              key(Fault::window_table_absolute),
              "expected a cyclic window (the ring-sized table is indexed by absolute position)");
  if (on(Fault::short_block_table))
    c.require(!s.mla.enabled, key(Fault::short_block_table), "expected no MLA (an attention op reads the table)");
  if (on(Fault::offload_drops_scales))
    c.require(s.cache.dtype == CacheDtype::nvfp4 && s.reuse.offload, key(Fault::offload_drops_scales),
              "expected cache.dtype = nvfp4 and reuse.offload = true (only nvfp4 blocks carry packed scales)");
  if (on(Fault::split_x_heads_unwritten)) {
    const bool wide = s.cache.layout == BlockLayout::split_x &&
                      static_cast<int64_t>(s.model.kv_heads) >= split_x_written_heads(s.cache.dtype, s.model.head_dim) + 1;
    c.require(s.cache.write_path == WritePath::reshape_and_cache && wide, key(Fault::split_x_heads_unwritten),
              "expected cache.write_path = reshape_and_cache, cache.layout = split-x and model.kv_heads > 512 / (D / x) = " +
                  std::to_string(split_x_written_heads(s.cache.dtype, s.model.head_dim)) +
                  " (only heads past that are left unwritten)");
  }
  if (on(Fault::slot_mapping_page_size))
    c.require(s.cache.write_path == WritePath::reshape_and_cache && !s.layers.enabled && s.window.mode == WindowMode::none,
              key(Fault::slot_mapping_page_size),
              "expected cache.write_path = reshape_and_cache (the op that takes a slot mapping), no window and no [layers]");
  if (on(Fault::indexer_slot_past_cache))
    c.require(s.indexer_k_scatter && s.cache.block_order == BlockOrder::highest, key(Fault::indexer_slot_past_cache),
              "expected indexer.k_scatter = true and cache.block_order = highest (the indexer cache is sized for half "
              "the KV pool; tokens in the upper half land past it)");
  if (on(Fault::snapshot_off_block_boundary))
    c.require(s.recurrent.layers > 0 && s.reuse.enabled && s.scheduler.chunk_size > 0 &&
                  s.scheduler.chunk_size % s.cache.page_size != 0,
              key(Fault::snapshot_off_block_boundary),
              "expected [recurrent] layers, reuse.enabled and a scheduler.chunk_size that is not a multiple of "
              "cache.page_size (a chunk that ends on a boundary snapshots the right state)");
  if (on(Fault::offload_before_copy))
    c.require(s.reuse.offload, key(Fault::offload_before_copy), "expected reuse.offload = true");
  // A fault whose invariant this scenario never checks could only fail.
  for (const Fault f : s.faults)
    if (const std::optional<std::string> why = never_checked(s, invariant_for(f)))
      c.reject(key(f),
                "expected a scenario that checks the invariant that catches it, but " + *why);
  for (size_t i = 0; i < s.expect.must_catch.size(); ++i) {
    const Fault f = s.expect.must_catch[i];
    c.require(on(f), "expect.must_catch",
              "expected faults that are switched on, got " + std::string(fault_name(f)) + " (set faults." +
                  std::string(fault_name(f)) + " = true)");
  }
  for (const Fault f : s.faults)
    for (const Invariant i : s.expect.must_pass)
      c.require(i != invariant_for(f), "expect.must_pass",
                "expected invariants that can pass, got " + std::string(invariant_name(i)) + ", which fault " +
                    std::string(fault_name(f)) + " breaks (list the fault in expect.must_catch)");
}

void check_expectations(const Scenario& s, const Checker& c) {
  const Expectations& e = s.expect;
  const std::pair<const char*, const std::optional<int64_t>*> counts[] = {
      {"expect.reuse_hit_tokens", &e.reuse_hit_tokens}, {"expect.evicted_blocks", &e.evicted_blocks},
      {"expect.offloaded_blocks", &e.offloaded_blocks}, {"expect.onboarded_blocks", &e.onboarded_blocks},
      {"expect.preemptions", &e.preemptions}};
  for (const auto& [key, value] : counts)
    if (*value) c.require(**value >= 0, key, "expected a count >= 0, got " + std::to_string(**value));
  // must_pass of an invariant the replay never checks would report n/a and fail.
  for (const Invariant i : e.must_pass)
    if (const std::optional<std::string> why = never_checked(s, i))
      c.reject("expect.must_pass", "expected invariants this scenario checks, got " + std::string(invariant_name(i)) + ": " + *why);
  if (e.reuse_hit_tokens.value_or(0) > 0)
    c.require(s.reuse.enabled, "expect.reuse_hit_tokens", "expected 0 or reuse.enabled = true (no reuse, no hits)");
  if (e.offloaded_blocks.value_or(0) > 0 || e.onboarded_blocks.value_or(0) > 0)
    c.require(s.reuse.offload, e.offloaded_blocks.value_or(0) > 0 ? "expect.offloaded_blocks" : "expect.onboarded_blocks",
              "expected 0 or reuse.offload = true");
}

}  // namespace

void check_attention(const Scenario& s, const Checker& c) {
  if (s.attention.order == AttentionOrder::fp32) return;
  c.require(!s.mla.enabled, "attention.order",
            "expected fp32 with MLA (mla_attention has one order; mma applies to decode/prefill attention)");
  c.core_check("attention.order",
               [&] { kvsim::detail::validate_attention_order(pool_geometry(s), s.attention.order, "attention"); });
}

void check_scenario(const Scenario& s) {
  const Checker c(s);
  check_mla(s, c);  // first: an MLA width explains a wrong head_dim better than head_dim's range
  check_model(s, c);
  check_head_dim_for_ops(s, c);
  check_cache(s, c);
  check_attention(s, c);
  check_window(s, c);
  check_layers(s, c);
  check_reuse_and_scheduler(s, c);
  check_prompts(s, c);
  check_faults(s, c);
  check_expectations(s, c);
}

Scenario parse_scenario(std::string_view toml_text, const std::string& source_name) {
  Scenario s;
  s.path = source_name;
  s.name = fs::path(source_name).stem().string();
  s.description = header_comment(toml_text);
  toml::table root;
  try {
    root = toml::parse(toml_text, source_name);
  } catch (const toml::parse_error& e) {
    reject_at(location_of(source_name, e.source()), "toml", "expected valid TOML: " + std::string(e.description()));
  }
  for (const auto& [key, node] : root)
    if (std::find(kTopLevelKeys.begin(), kTopLevelKeys.end(), key.str()) == kTopLevelKeys.end())
      reject_at(location_of(source_name, key.source()), std::string(key.str()),
                unknown_key_message(key.str(), kTopLevelKeys));

  // model.preset first: every key of the file, [mla]'s included, overrides it.
  if (const toml::table* model = root.get("model") ? root.get("model")->as_table() : nullptr)
    if (const toml::node* n = model->get("preset")) {
      std::vector<std::string_view> names;
      for (const ModelPreset& p : model_presets()) names.push_back(p.name);
      const std::optional<ModelPreset> preset = n->is_string() ? find_model_preset(n->as_string()->get()) : std::nullopt;
      if (!preset) reject_at(location_of(source_name, n->source()), "model.preset", "expected one of " + join(names) + ", got " + describe(*n));
      s.key_locations["model.preset"] = location_of(source_name, n->source());
      apply_model_preset(*preset, s);
    }
  // [mla] before [model] so the MLA defaults can be overridden there.
  if (const toml::node* n = root.get("mla")) parse_mla(s, section_table(s, *n, "mla"));
  if (s.mla.enabled) {
    s.model.kv_heads = 1;
    s.model.q_heads = 1;
    s.model.rope = RopeStyle::none;
    s.cache.write_path = WritePath::append_mla;
  }
  using Parser = void (*)(Scenario&, const toml::table&);
  const std::pair<std::string_view, Parser> sections[] = {
      {"model", parse_model},   {"cache", parse_cache},         {"window", parse_window}, {"layers", parse_layers},
      {"attention", parse_attention}, {"reuse", parse_reuse},
      {"scheduler", parse_scheduler}, {"indexer", parse_indexer}, {"recurrent", parse_recurrent}, {"faults", parse_faults}, {"expect", parse_expect}};
  for (const auto& [name, parse] : sections)
    if (const toml::node* n = root.get(name)) {
      s.key_locations[std::string(name)] = location_of(source_name, n->source());
      parse(s, section_table(s, *n, name));
    }
  if (const toml::node* n = root.get("prefix")) {
    const toml::array& a = table_array(s, *n, "prefix");
    for (size_t i = 0; i < a.size(); ++i) parse_prefix(s, *a.get(i)->as_table(), i);
  }
  if (const toml::node* n = root.get("request")) {
    const toml::array& a = table_array(s, *n, "request");
    s.key_locations["request"] = location_of(source_name, n->source());
    for (size_t i = 0; i < a.size(); ++i) {
      s.key_locations["request[" + std::to_string(i) + "]"] = location_of(source_name, a.get(i)->source());
      parse_request(s, *a.get(i)->as_table(), i);
    }
  }
  for (size_t i = 0; i < s.prefixes.size(); ++i)
    s.key_locations["prefix[" + std::to_string(i) + "]"] = s.prefixes[i].where;
  // An omitted head_dim follows the latent row, which depends on the cache dtype.
  if (s.mla.enabled && !s.key_locations.count("model.head_dim"))
    s.model.head_dim = static_cast<int32_t>(std::min<int64_t>(kMaxInt32, mla_row_width(s)));
  check_scenario(s);
  return s;
}

Scenario load_scenario_file(const std::string& path) {
  // What the file system says, named: a symlink loop or a denied directory is
  // not "no such file".
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec && st.type() != fs::file_type::not_found)
    fail(ErrorCode::bad_scenario, path + ":0:0: file: expected a readable scenario file, got " + ec.message());
  if (!fs::is_regular_file(st))
    fail(ErrorCode::bad_scenario, path + ":0:0: file: expected a readable scenario file, got " +
                                      (fs::exists(st) ? "something that is not a regular file" : "no such file"));
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in)
    fail(ErrorCode::bad_scenario, path + ":0:0: file: expected a readable scenario file, got " +
                                      (errno ? std::string(std::strerror(errno)) : std::string("a file that cannot be opened")));
  std::ostringstream text;
  text << in.rdbuf();
  if (!in && !in.eof())
    fail(ErrorCode::bad_scenario, path + ":0:0: file: expected a readable scenario file, got a read error" +
                                      (errno ? ": " + std::string(std::strerror(errno)) : std::string()));
  return parse_scenario(text.str(), path);
}

std::string builtin_scenario_dir() {
  std::error_code ec;
#ifdef KVSIM_SOURCE_DIR
  const fs::path source = fs::path(KVSIM_SOURCE_DIR) / "scenarios";
  if (fs::is_directory(source, ec)) return source.string();
#endif
  // Installed: <prefix>/bin/kvsim next to <prefix>/share/kvsim/scenarios.
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path installed = exe.parent_path().parent_path() / "share" / "kvsim" / "scenarios";
    if (fs::is_directory(installed, ec)) return installed.string();
  }
  return {};
}

std::vector<std::string> builtin_scenario_paths() {
  std::vector<std::string> paths;
  const std::string dir = builtin_scenario_dir();
  if (dir.empty()) return paths;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.is_regular_file() && entry.path().extension() == ".toml") paths.push_back(entry.path().string());
  std::sort(paths.begin(), paths.end());
  return paths;
}

}  // namespace kvsim::sim
