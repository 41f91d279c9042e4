// The report's data (report.hpp): where an invariant's finding sits, the path
// drawing of one element, and the document a scenario page is built from.
#include <filesystem>
#include <fstream>
#include <regex>

#include "kvsim/report/report.hpp"

namespace kvsim::report {

using nlohmann::json;

namespace {

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::optional<int64_t> find_number(const std::string& text, const std::string& word) {
  std::smatch m;
  if (std::regex_search(text, m, std::regex("\\b" + word + " (\\d+)"))) return std::stoll(m[1]);
  return std::nullopt;
}

// The KV cache group holding model layer `layer`, and the layer's index in that group's pool.
std::pair<int32_t, int32_t> group_of_layer(const std::vector<sim::KvGroup>& groups, int32_t layer) {
  for (size_t g = 0; g < groups.size(); ++g)
    for (size_t i = 0; i < groups[g].layers.size(); ++i)
      if (groups[g].layers[i] == layer) return {static_cast<int32_t>(g), static_cast<int32_t>(i)};
  return {0, layer};
}

}  // namespace

std::optional<Locus> parse_locus(const std::string& detail) {
  std::smatch m;
  Locus l;
  if (!std::regex_search(detail, m, std::regex("request ([^,:]+)[,:]"))) return std::nullopt;
  l.request = m[1];
  const auto position = find_number(detail, "position");
  if (!position) return std::nullopt;
  l.position = *position;
  l.layer = static_cast<int32_t>(find_number(detail, "layer").value_or(0));
  l.step = find_number(detail, "step").value_or(-1);
  l.element = find_number(detail, "element").value_or(-1);
  l.head = static_cast<int32_t>(find_number(detail, "head").value_or(-1));
  l.dim = static_cast<int32_t>(find_number(detail, "dim").value_or(-1));
  if (std::regex_search(detail, m, std::regex(": out ([^,]+), Eigen double ([^,]+),")))
    l.values = {{"the op's output", m[1]}, {"Eigen double reference", m[2]}};
  else if (std::regex_search(detail, m, std::regex(": out ([^,]+), bf16 ([^)]+)\\)")))
    l.values = {{"this run (quantized cache)", m[1]}, {"the same run with a bf16 cache", m[2]}};
  else if (std::regex_search(detail, m, std::regex("differs from (.+?): .*: ([^ ]+) vs ([^ ]+)$")))
    l.values = {{"this run", m[2]}, {std::string(m[1]), m[3]}};
  else if (std::regex_search(detail, m, std::regex("is NaN")))
    l.values = {{"the op's output", "NaN"}};
  return l;
}

std::string path_svg(const sim::Explanation& e, int32_t kv, const std::string& title,
                     const std::vector<std::pair<std::string, std::string>>& values) {
  const sim::TensorOffsets* t = nullptr;
  for (const sim::TensorOffsets& x : e.tensors)
    if (x.kv == kv) t = &x;
  if (!t) t = &e.tensors.front();
  const std::string kv_name = sim::kv_label(t->kv, e.g.kv_factor);
  struct Stage {
    std::string cls, label, value, formula;
  };
  const std::vector<Stage> stages = {
      {"token", "token", std::to_string(e.token),
       "layer " + std::to_string(e.layer) + ", KV head " + std::to_string(e.head) + ", dim " + std::to_string(e.dim)},
      {"slot", "window slot", std::to_string(e.cache_token), sim::window_formula(e)},
      {"page", "logical page", std::to_string(e.logical_page) + " entry " + std::to_string(e.entry), sim::page_formula(e)},
      {"entry", "table entry", "[" + std::to_string(e.page_slot) + "] = " + std::to_string(e.ref.raw),
       sim::table_lookup_text(e)},
      {"block", "physical block", std::string(e.ref.is_secondary() ? "secondary " : "") + std::to_string(e.ref.block()),
       "slot = block * P + entry = " + std::to_string(e.slot)},
      {"element", kv_name + " element offset", std::to_string(t->element), sim::terms_formula(t->terms)},
      {"byte", "byte", std::to_string(t->byte), sim::byte_formula(t->element, t->byte, bits_per_element(e.g.dtype))},
  };
  // With an engine preset (validation/engine_presets.hpp) the element also has an offset inside the
  // engine's own tensor: written under the path, beside the values.
  std::vector<std::pair<std::string, std::string>> lines = values;
  if (!t->tensor.empty())
    lines.insert(lines.begin(), {"in the engine's tensor " + t->tensor,
                                 "element " + std::to_string(t->tensor_element) + " (= " + std::to_string(t->element) +
                                     " - tensor base " + std::to_string(t->tensor_base) + "), byte " +
                                     std::to_string(t->tensor_byte)});
  const int row = 52, top = 34, box_w = 190;
  const int height = top + static_cast<int>(stages.size()) * row + 24 * static_cast<int>(lines.size()) + 10;
  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"path\" width=\"980\" height=\"" +
                  std::to_string(height) + "\" viewBox=\"0 0 980 " + std::to_string(height) +
                  "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s += "<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" "
       "orient=\"auto\"><path d=\"M0,0 L10,5 L0,10 z\" fill=\"#555\"/></marker></defs>\n";
  s += "<text x=\"8\" y=\"20\" font-size=\"14\" font-weight=\"bold\">" + xml_escape(title) + "</text>\n";
  for (size_t i = 0; i < stages.size(); ++i) {
    const Stage& st = stages[i];
    const int y = top + static_cast<int>(i) * row;
    s += "<g class=\"stage stage-" + st.cls + "\" data-stage=\"" + st.cls + "\" data-value=\"" + xml_escape(st.value) +
         "\">";
    s += "<rect x=\"8\" y=\"" + std::to_string(y) + "\" width=\"" + std::to_string(box_w) +
         "\" height=\"36\" rx=\"6\" fill=\"#eef3fb\" stroke=\"#3a6ea5\"/>";
    s += "<text x=\"16\" y=\"" + std::to_string(y + 14) + "\" fill=\"#555\">" + xml_escape(st.label) + "</text>";
    s += "<text x=\"16\" y=\"" + std::to_string(y + 30) + "\" font-size=\"14\" font-weight=\"bold\">" +
         xml_escape(st.value) + "</text>";
    s += "<text x=\"" + std::to_string(box_w + 22) + "\" y=\"" + std::to_string(y + 22) +
         "\" font-family=\"monospace\" font-size=\"11\">" + xml_escape(st.formula) + "</text></g>\n";
    if (i + 1 < stages.size())
      s += "<line x1=\"60\" y1=\"" + std::to_string(y + 36) + "\" x2=\"60\" y2=\"" + std::to_string(y + row) +
           "\" stroke=\"#555\" marker-end=\"url(#arrow)\"/>\n";
  }
  int y = top + static_cast<int>(stages.size()) * row + 8;
  for (const auto& [label, value] : lines) {
    s += "<text class=\"value\" x=\"8\" y=\"" + std::to_string(y) + "\"><tspan font-weight=\"bold\">" +
         xml_escape(label) + ":</tspan> " + xml_escape(value) + "</text>\n";
    y += 24;
  }
  return s + "</svg>";
}

std::string standalone_svg(const std::string& svg) { return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n" + svg + "\n"; }

std::optional<sim::Explanation> explain_locus(const sim::Scenario& s, const ReplayRecorder& rec, const Locus& l,
                                              int64_t& frame) {
  const int32_t r = rec.request_index(l.request);
  if (r < 0) return std::nullopt;
  frame = l.frame >= 0 ? l.frame : rec.frame_of(r, l.position);
  if (frame < 0) return std::nullopt;
  const int32_t D = s.model.head_dim;
  int32_t q_head = l.head, dim = l.dim;
  if (l.head_is_kv) q_head = l.head * (s.model.kv_heads > 0 ? std::max(s.model.q_heads / s.model.kv_heads, 1) : 1);
  if (l.element >= 0) {
    q_head = static_cast<int32_t>(l.element / D);
    dim = static_cast<int32_t>(l.element % D);
  }
  // The layer's KV cache group: its table, its pool (and the layer's index in that pool), its window.
  const std::vector<sim::KvGroup> groups = sim::kv_groups(s);
  const auto [group, layer_in_pool] = group_of_layer(groups, l.layer);
  const sim::KvGroup& kg = groups.at(static_cast<size_t>(group));
  sim::ExplainRequest q;
  q.geometry = sim::kv_pool_geometry(s, groups, kg.pool);
  q.block_table = rec.table_at(frame, r, group);
  q.token = l.position;
  q.layer = layer_in_pool;
  const int32_t group_size =
      s.model.q_heads >= s.model.kv_heads && s.model.kv_heads > 0 ? s.model.q_heads / s.model.kv_heads : 1;
  q.head = std::max(q_head, 0) / std::max(group_size, 1);
  if (q.head >= q.geometry.kv_heads) q.head = 0;
  q.dim = std::max(dim, 0);
  // A ring (cyclic, release) maps the token through WindowMapping::make; vLLM's sliding
  // window keeps slot = position (make_linear), which is the identity explain shows without one.
  if (kg.mode == sim::WindowMode::cyclic || kg.mode == sim::WindowMode::release) {
    q.window = kg.window;
    q.sinks = kg.sinks;
    q.one_more_block = kg.one_more_block;
  }
  try {
    return sim::explain(q);
  } catch (const ValidationError&) {
    return std::nullopt;  // e.g. the page went back to the free list (release mode) before the report could look
  }
}

DrawnPath difference_path(const sim::Scenario& s, const ReplayRecorder& rec, const DiffReport& d, int64_t step,
                          int32_t layer) {
  DrawnPath p;
  p.title = "first difference: " + d.op + " (" + d.context + "), " + d.buffer + " byte " + std::to_string(d.byte_offset);
  const std::vector<std::pair<std::string, std::string>> values = {
      {"reference", d.reference_value + " (" + d.reference_hex + ")"},
      {"candidate", d.candidate_value + " (" + d.candidate_hex + ")"}};
  const json& frames = rec.data().at("frames");
  for (size_t k = 0; k < frames.size(); ++k)
    if (frames[k].at("step") == step) p.frame = static_cast<int64_t>(k);
  Locus l;
  l.request = d.sequence_id;
  l.layer = layer;
  l.position = d.token;
  l.step = step;
  int32_t kv = 0;
  if (d.pool_at) {
    l.head = d.pool_at->head;
    l.head_is_kv = true;
    l.dim = d.pool_at->dim;
    kv = d.pool_at->kv;
  } else if (d.tensor_index.size() == 3) {  // [token row, query head, dim] of an output
    l.head = static_cast<int32_t>(d.tensor_index[1]);
    l.dim = static_cast<int32_t>(d.tensor_index[2]);
  }
  int64_t frame = -1;
  std::optional<sim::Explanation> e;
  if (!l.request.empty() && l.position >= 0 && l.dim >= 0 && (d.token_meaning == "token position" || d.token_meaning == "query position"))
    e = explain_locus(s, rec, l, frame);
  // The pool element's cache slot in a request's table (a window ring's slot, or slot = position):
  // the token it holds after the op's step is the newest position the group's mapping puts there
  // (core's WindowMapping::cache_token, the mapping the ops use). The drawing must end at that slot.
  // .first, not a structured binding: clang 14 (Debian 12) cannot capture bindings in draw_slot.
  const int32_t group = group_of_layer(sim::kv_groups(s), layer).first;
  auto draw_slot = [&](int32_t r, int64_t slot) {
    const WindowMapping& w = rec.window(group);
    int64_t token = rec.length_at(p.frame, r) - 1;
    while (token >= 0 && w.cache_token(token) != slot) --token;
    if (token < 0) return;
    Locus at = l;
    at.request = rec.data().at("requests")[static_cast<size_t>(r)].at("id");
    at.position = token;
    at.frame = p.frame;
    e = explain_locus(s, rec, at, frame);
    if (e && e->cache_token != slot) e.reset();
  };
  if (!e && !l.request.empty() && l.position >= 0 && l.dim >= 0 && d.token_meaning.rfind("cache slot", 0) == 0 &&
      p.frame >= 0 && rec.request_index(l.request) >= 0)
    draw_slot(rec.request_index(l.request), d.token);
  // Located by the op's slot mapping only (vLLM reshape_and_cache: an input row, no request): the
  // request whose recorded table at that step holds the block, at page j, holds slot j * P + entry.
  if (!e && d.pool_at && l.dim >= 0 && p.frame >= 0) {
    const int64_t P = s.cache.page_size;
    const int32_t n = static_cast<int32_t>(rec.data().at("requests").size());
    for (int32_t r = 0; r < n && !e; ++r) {
      const std::vector<int32_t> table = rec.table_at(p.frame, r, group);
      for (size_t j = 0; j < table.size() && !e; ++j)
        if (table[j] == d.pool_at->block) draw_slot(r, static_cast<int64_t>(j) * P + d.pool_at->entry);
    }
  }
  if (e) {
    p.svg = path_svg(*e, kv, p.title, values);
    return p;
  }
  // No path to follow: the report's own lines.
  std::string text = d.text();
  std::vector<std::string> lines;
  for (size_t at = 0; at <= text.size();) {
    const size_t nl = std::min(text.find('\n', at), text.size());
    lines.push_back(text.substr(at, nl - at));
    at = nl + 1;
  }
  p.svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"difference\" width=\"980\" height=\"" +
          std::to_string(30 + 16 * lines.size()) + "\" font-family=\"monospace\" font-size=\"12\">";
  for (size_t i = 0; i < lines.size(); ++i)
    p.svg += "<text x=\"8\" y=\"" + std::to_string(20 + 16 * i) + "\">" + xml_escape(lines[i]) + "</text>";
  p.svg += "</svg>";
  return p;
}

json scenario_document(const sim::Scenario& s, const sim::ScenarioReport& r, const ReplayRecorder& rec,
                       const std::vector<DrawnPath>& extra_paths) {
  json doc = rec.data();
  const PoolGeometry g = sim::pool_geometry(s);
  doc["scenario"] = {{"name", s.name},
                     {"description", s.description},
                     {"layers", g.layers},
                     {"kv_heads", g.kv_heads},
                     {"head_dim", g.head_dim},
                     {"page_size", g.tokens_per_block},
                     {"dtype", std::string(dtype_name(g.dtype))},
                     {"layout", std::string(layout_name(g.layout))},
                     {"placement", std::string(placement_name(g.placement))},
                     {"primary_blocks", g.primary_blocks},
                     {"secondary_blocks", g.secondary_blocks},
                     {"reuse", s.reuse.enabled},
                     {"faults", [&] {
                        json f = json::array();
                        for (sim::Fault x : s.faults) f.push_back(std::string(sim::fault_name(x)));
                        return f;
                      }()}};
  const int64_t last = rec.frames() - 1;
  json invariants = json::array(), paths = json::array();
  for (const sim::InvariantReport& i : r.invariants) {
    if (i.status == sim::InvariantStatus::not_applicable) continue;
    int64_t frame = -1;
    if (const auto locus = parse_locus(i.detail)) {
      if (auto e = explain_locus(s, rec, *locus, frame)) {
        const std::string title = std::string(sim::invariant_name(i.invariant)) + " " +
                                  std::string(sim::invariant_status_name(i.status)) + ": request " + locus->request +
                                  ", position " + std::to_string(locus->position) + ", layer " +
                                  std::to_string(locus->layer);
        paths.push_back({{"title", title}, {"frame", frame}, {"invariant", std::string(sim::invariant_name(i.invariant))},
                         {"svg", path_svg(*e, 0, title, locus->values)}});
      } else if (locus->step >= 0) {
        const json& frames = rec.data().at("frames");
        for (size_t k = 0; k < frames.size(); ++k)
          if (frames[k].at("step") == locus->step) frame = static_cast<int64_t>(k);
      }
    }
    // The in-run checks fail at a step; the comparisons are judged after the last one.
    invariants.push_back({{"name", std::string(sim::invariant_name(i.invariant))},
                          {"checks", std::string(sim::invariant_info(i.invariant).checks)},
                          {"status", std::string(sim::invariant_status_name(i.status))},
                          {"detail", i.detail},
                          {"frame", frame >= 0 ? frame : last}});
  }
  for (const DrawnPath& p : extra_paths)
    paths.push_back({{"title", p.title}, {"frame", p.frame}, {"invariant", ""}, {"svg", p.svg}});
  doc["invariants"] = invariants;
  doc["paths"] = paths;
  json counters = json::object();
  for (const sim::CounterField& c : sim::kReportedCounters) counters[std::string(c.name)] = r.counters.*c.value;
  doc["outcome"] = {{"ok", r.ok}, {"expectation_failures", r.expectation_failures}, {"counters", counters}};
  return doc;
}

void write_text_file(const std::string& path, const std::string& content, const std::string& flag) {
  std::ofstream out(path, std::ios::binary);
  out << content;
  out.close();
  if (!out) fail(ErrorCode::bad_argument, flag + " " + path + ": cannot write the file");
}

void write_report_file(const std::string& dir, const std::string& name, const std::string& content,
                       const std::string& flag) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail(ErrorCode::bad_argument, flag + " " + dir + ": cannot create the folder: " + ec.message());
  write_text_file((std::filesystem::path(dir) / name).string(), content, flag);
}

}  // namespace kvsim::report
