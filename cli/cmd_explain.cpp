// `kvsim explain`: every step of the index arithmetic for one (token, layer,
// head, dim) of one sequence, with the formula and the numbers put in. The
// steps are computed by the library (sim/explain.hpp: sim::explain,
// sim::explain_text); this file parses the flags and writes the JSON form.
//
// Page tables: either a dense block table of one sequence (--block-table,
// TensorRT-LLM / vLLM) or a CSR triple (--indptr --indices --last-page-len
// --seq, FlashInfer). A token on a BAD_PAGE (-1) entry, beyond the table or
// the sequence length, or on a secondary-pool block (it must be onboarded
// first; explain does not show secondary-pool offsets) is an error: exit 2.
// --svg FILE also draws the path (token -> window slot -> logical page ->
// table entry -> physical block -> element offset -> byte) as an SVG file
// (report/, docs/report.md), written before anything is printed.
#include <cstdint>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "commands.hpp"
#include "kvsim/report/report.hpp"
#include "geometry_options.hpp"
#include "numbers.hpp"
#include "kvsim/sim/explain.hpp"

namespace kvsim::cli {
namespace {

using sim::ExplainRequest;
using sim::Explanation;
using sim::OffsetTerm;
using sim::TensorOffsets;
using sim::bubble_formula;
using sim::byte_formula;
using sim::cyclic_formula;
using sim::terms_formula;

struct ExplainOptions {
  GeometryOptions geometry;
  // Absent or given (possibly empty, which the number parser rejects).
  std::optional<std::string> block_table;
  std::optional<std::string> indptr;
  std::optional<std::string> indices;
  std::optional<std::string> last_page_len;
  // The coordinates and the window, bound to their flags; the geometry and
  // the tables are filled in from the flags above by explain_request().
  ExplainRequest at;
  bool json = false;
  std::optional<std::string> svg_file;
  std::optional<int32_t> null_block;  // --null-block
};

// ---------------------------------------------------------------- parsing

// "a,b,c" -> int32 values through the command line's number parser
// (numbers.hpp). Block references (`refs`) also accept raw 32-bit patterns in
// hex such as 0x80000003 and the shorthand sN for BlockRef::secondary(N).
std::vector<int32_t> parse_table(const std::string& text, const std::string& flag, bool refs) {
  std::vector<int32_t> values;
  if (!refs) {
    for (int64_t v : parse_int_list(flag, text, INT32_MIN, INT32_MAX)) values.push_back(static_cast<int32_t>(v));
    return values;
  }
  const std::vector<std::string_view> items = split_list(flag, text);
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string label = flag + " entry " + std::to_string(i);
    const std::string_view item = items[i];
    if (!item.empty() && (item[0] == 's' || item[0] == 'S')) {
      values.push_back(BlockRef::secondary(static_cast<int32_t>(parse_int(label, item.substr(1), 0, INT32_MAX))).raw);
    } else {
      // -1 (BAD_PAGE), a block id, or a raw 32-bit reference (0x80000003).
      const int64_t v = parse_int(label, item, INT32_MIN, 0xFFFFFFFFLL, IntSyntax::decimal_or_hex);
      values.push_back(static_cast<int32_t>(static_cast<uint32_t>(v)));
    }
  }
  return values;
}


// The library's request: the flags' geometry and the parsed tables.
ExplainRequest explain_request(const ExplainOptions& o) {
  ExplainRequest r = o.at;
  r.null_block = o.null_block;
  r.geometry = make_geometry(o.geometry);
  r.engine = engine_option(o.geometry);
  if (o.block_table) {
    r.block_table = parse_table(*o.block_table, "--block-table", true);
  } else {
    r.csr = true;
    r.indptr = parse_table(*o.indptr, "--indptr", false);
    r.indices = parse_table(*o.indices, "--indices", true);
    r.last_page_len = parse_table(*o.last_page_len, "--last-page-len", false);
  }
  return r;
}

// ---------------------------------------------------------------- JSON

Json terms_json(const std::vector<OffsetTerm>& terms) {
  Json list = Json::array();
  for (const OffsetTerm& t : terms) list.push_back(Json{{"axis", t.axis}, {"index", t.index}, {"stride", t.stride}});
  return list;
}

Json explanation_json(const Explanation& e) {
  const PoolGeometry& g = e.g;
  const TensorOffsets& k = e.tensors[0];
  const TensorOffsets* v = e.tensors.size() > 1 ? &e.tensors[1] : nullptr;
  const bool nvfp4 = e.scale_strides.has_value();
  auto opt = [](bool present, auto value) { return present ? Json(value) : Json(nullptr); };

  Json j;
  j["kvsim_version"] = kVersion;
  j["geometry"] = geometry_json(g);
  j["token"] = e.token;
  j["layer"] = e.layer;
  j["head"] = e.head;
  j["dim"] = e.dim;
  if (e.window.enabled()) {
    j["window"] = Json{{"window", e.window.window},
                       {"sinks", e.window.sinks},
                       {"one_more_block", e.window.one_more_block},
                       {"linear", e.window.linear},
                       {"bubble", e.window.bubble},
                       {"cyclic_len", e.window.linear ? Json(nullptr) : Json(e.window.cyclic_len)},
                       {"is_sink", e.window.is_sink(e.token)}};
  } else {
    j["window"] = nullptr;
  }
  j["layer_windows"] = e.layer_windows.empty() ? Json(nullptr) : Json(e.layer_windows);
  j["null_block"] = e.null_block ? Json(*e.null_block) : Json(nullptr);
  j["null_entries"] = e.null_block ? Json(e.null_entries) : Json(nullptr);
  j["cache_token"] = e.cache_token;
  j["page_divider"] = Json{{"page_size", e.divider.page_size},
                           {"pow2", e.divider.pow2},
                           {"shift", e.divider.pow2 ? Json(e.divider.shift) : Json(nullptr)},
                           {"mask", e.divider.pow2 ? Json(e.divider.page_size - 1) : Json(nullptr)}};
  Json table;
  if (e.csr) {
    table["kind"] = "csr";
    table["indptr"] = e.indptr;
    table["indices"] = e.indices;
    table["last_page_len"] = e.last_page_len;
    table["seq"] = e.seq;
    table["num_pages"] = e.indptr[e.seq + 1] - e.indptr[e.seq];
    table["length"] = e.length;
  } else {
    table["kind"] = "dense";
    table["block_table"] = e.block_table;
  }
  j["table"] = table;
  j["linear_token"] = e.linear_token;
  j["page_slot"] = e.page_slot;
  j["logical_page"] = e.logical_page;
  j["entry"] = e.entry;
  j["block_ref"] = e.ref.raw;
  j["block"] = e.ref.block();
  j["pool"] = e.ref.is_secondary() ? "secondary" : "primary";
  j["slot"] = e.slot;
  j["element_bits"] = bits_per_element(g.dtype);
  j["strides"] = strides_json(e.strides, g.kv_factor);
  j["k_offset"] = k.element;
  j["v_offset"] = opt(v != nullptr, v ? v->element : 0);
  j["k_byte_offset"] = k.byte;
  j["v_byte_offset"] = opt(v != nullptr, v ? v->byte : 0);
  j["k_terms"] = terms_json(k.terms);
  j["v_terms"] = v ? terms_json(v->terms) : Json(nullptr);
  j["k_nibble"] = opt(nvfp4, k.high_nibble ? "high" : "low");
  j["v_nibble"] = opt(nvfp4 && v, v && v->high_nibble ? "high" : "low");
  j["scale_strides"] = nvfp4 ? strides_json(*e.scale_strides, g.kv_factor) : Json(nullptr);
  j["k_scale_offset"] = opt(nvfp4, k.scale_element);
  j["v_scale_offset"] = opt(nvfp4 && v, v ? v->scale_element : 0);
  j["k_scale_byte_offset"] = opt(nvfp4, k.scale_byte);
  j["v_scale_byte_offset"] = opt(nvfp4 && v, v ? v->scale_byte : 0);
  if (e.engine) {  // offsets inside the engine's own tensors (absent without --engine)
    j["engine"] = engine_json(*e.engine);
    for (const TensorOffsets& t : e.tensors) {
      const std::string p = t.kv == 0 ? "k" : "v";
      j[p + "_tensor"] = t.tensor;
      j[p + "_tensor_offset"] = t.tensor_element;
      j[p + "_tensor_byte_offset"] = t.tensor_byte;
      if (nvfp4) j[p + "_tensor_scale_offset"] = t.tensor_scale_element;
    }
  }

  Json f;
  if (e.window.enabled() && !e.window.linear) {
    f["bubble"] = bubble_formula(e.window);
    f["cyclic_len"] = cyclic_formula(e.window);
  }
  f["cache_token"] = window_formula(e);
  if (e.csr) {
    f["length"] = csr_length_formula(e);
    f["linear_token"] = csr_linear_formula(e);
  }
  f["page"] = page_formula(e);
  f["block"] = table_lookup_text(e);
  f["slot"] = slot_formula(e);
  for (const TensorOffsets& t : e.tensors) {
    const std::string p = t.kv == 0 ? "k" : "v";
    f[p + "_offset"] = terms_formula(t.terms) + " = " + std::to_string(t.element);
    f[p + "_byte_offset"] = byte_formula(t.element, t.byte, bits_per_element(g.dtype));
    if (nvfp4) f[p + "_scale_offset"] = terms_formula(t.scale_terms) + " = " + std::to_string(t.scale_element);
  }
  j["formulas"] = f;
  return j;
}

}  // namespace

void register_explain(CLI::App& app) {
  auto opts = std::make_shared<ExplainOptions>();
  CLI::App* cmd = app.add_subcommand("explain", "Every step of the index arithmetic for one token of one sequence");
  add_geometry_options(*cmd, opts->geometry);

  const std::string table_group = "Page table (one of)";
  // Lists are kept as text and parsed by numbers.hpp in explain(); "--flag="
  // reaches it as "" (an error naming the flag) instead of eating the next flag.
  // An empty list is named as it is read, before CLI11 checks the required
  // flags: `explain --block-table` names --block-table, not a missing --token.
  const auto list_option = [&](const std::string& name, std::optional<std::string>& target, const std::string& help) {
    return cmd
        ->add_option_function<std::string>(
            name,
            [&target, name](const std::string& text) {
              if (text.empty()) split_list(name, text);  // throws bad_argument naming the flag
              target = text;
            },
            help)
        ->expected(0, 1)
        ->group(table_group);
  };
  auto* dense = list_option("--block-table", opts->block_table,
                            "Dense block table of the sequence: b0,b1,... (-1 = BAD_PAGE, sN = secondary block N, "
                            "0xHEX = a raw 32-bit reference)");
  auto* indptr = list_option("--indptr", opts->indptr, "CSR indptr: 0,p1,...,pn");
  auto* indices = list_option("--indices", opts->indices, "CSR indices (block references, as --block-table)");
  auto* last = list_option("--last-page-len", opts->last_page_len, "CSR last_page_len per sequence");
  auto* seq = add_int_option(*cmd, "--seq", opts->at.seq, "CSR sequence b", 0, INT32_MAX)->group(table_group);
  indptr->needs(indices)->needs(last);
  indices->needs(indptr);
  last->needs(indptr);
  seq->needs(indptr);
  dense->excludes(indptr)->excludes(indices)->excludes(last)->excludes(seq);

  const std::string coord_group = "Coordinates";
  add_int_option(*cmd, "--token", opts->at.token, "Token position t in the sequence", INT64_MIN, INT64_MAX)
      ->required()
      ->group(coord_group);
  add_int_option(*cmd, "--layer", opts->at.layer, "Layer", INT32_MIN, INT32_MAX)->group(coord_group);
  add_int_option(*cmd, "--head", opts->at.head, "KV head", INT32_MIN, INT32_MAX)->group(coord_group);
  add_int_option(*cmd, "--dim", opts->at.dim, "Element of head_dim", INT32_MIN, INT32_MAX)->group(coord_group);

  const std::string window_group = "Sliding window (TensorRT-LLM getKVTokenIdx)";
  add_int_option(*cmd, "--window", opts->at.window, "Attention window W (0 = none)", INT32_MIN, INT32_MAX)
      ->group(window_group);
  add_int_option(*cmd, "--sinks", opts->at.sinks, "Sink tokens S", INT32_MIN, INT32_MAX)->group(window_group);
  cmd->add_flag("--one-more-block", opts->at.one_more_block, "cyclic_len = W + P - S instead of W - S")
      ->group(window_group);
  add_int_list_option(*cmd, "--layer-windows", opts->at.layer_windows,
                      "Per-layer attention: one window per layer, 0 = full (Gemma 3: 1024,1024,1024,1024,1024,0); "
                      "--layer's entry is its window",
                      0, INT32_MAX)
      ->group(window_group);
  cmd->add_option_function<std::string>(
         "--null-block",
         [opts](const std::string& text) {
           opts->null_block = static_cast<int32_t>(parse_int("--null-block", text, INT32_MIN, INT32_MAX));
         },
         "vLLM hybrid KV cache manager: the table is indexed by position (no ring) and entries equal to this block "
         "are the null block (a sliding group's released pages); vLLM's null block is 0")
      ->expected(0, 1)
      ->group(window_group);

  cmd->add_flag("--json", opts->json, "Print one JSON object (schema in docs/index-arithmetic.md)");
  cmd->add_option("--svg", opts->svg_file,
                  "Also draw the path token -> slot -> page -> entry -> block -> element -> byte into FILE (SVG)");
  cmd->callback([opts]() {
    if (!opts->block_table && !opts->indptr)
      throw CLI::ValidationError("page table", "give --block-table or --indptr/--indices/--last-page-len");
    const Explanation e = explain(explain_request(*opts));
    if (opts->svg_file) {
      const std::string title = "token " + std::to_string(e.token) + ", layer " + std::to_string(e.layer) +
                                ", KV head " + std::to_string(e.head) + ", dim " + std::to_string(e.dim) + " (" +
                                geometry_summary(e.g) + ")";
      report::write_text_file(*opts->svg_file, report::standalone_svg(report::path_svg(e, 0, title, {})), "--svg");
    }
    std::ostringstream out;  // printed whole, so a failure prints nothing on stdout
    if (opts->json)
      out << explanation_json(e).dump(2) << '\n';
    else
      out << explain_text(e);
    std::cout << out.str();
  });
}

}  // namespace kvsim::cli
