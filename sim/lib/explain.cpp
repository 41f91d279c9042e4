// Every step of the index arithmetic for one token (explain.hpp): the numbers
// come from core; this file only arranges them and shows the formulas.
#include "kvsim/sim/explain.hpp"

#include <stdexcept>

#include <kvsim/validation/page_table.hpp>
#include <kvsim/validation/window.hpp>

namespace kvsim::sim {
namespace {

// The products element_offset() sums, for display: core's layout object
// walked in coordinate order (block, layer, kv, head, token, dim / x, dim % x),
// dim shown as one term where x = head_dim; checked against element_offset.
std::vector<OffsetTerm> offset_terms(const PoolGeometry& g, const PoolStrides& s, PoolKind kind, int64_t block,
                                     int32_t layer, int32_t kv, int32_t head, int32_t token, int32_t dim,
                                     const std::string& dim_name) {
  const PoolLayout l = pool_layout(g, s, kind, kv);
  const int32_t x = s.inner[kv].x;
  const bool one_dim = x == g.head_dim;
  const int64_t coordinate[PoolLayout::kAxes] = {block, layer, kv, head, token, dim / x, dim % x};
  std::vector<OffsetTerm> terms;
  for (int32_t i = 0; i < PoolLayout::kAxes; ++i) {
    const LayoutAxis& a = l.of(static_cast<LayoutAxisId>(i));
    if (a.id == LayoutAxisId::dim_outer && one_dim) continue;
    const std::string name = a.id == LayoutAxisId::dim_outer   ? dim_name + "/x"
                             : a.id == LayoutAxisId::dim_inner ? (one_dim ? dim_name : dim_name + "%x")
                                                               : std::string(a.name);
    terms.push_back({name, coordinate[i], a.stride});
  }
  return terms;
}

void check_terms(const std::vector<OffsetTerm>& terms, int64_t core_offset) {
  int64_t sum = 0;
  for (const OffsetTerm& t : terms) sum += t.index * t.stride;
  if (sum != core_offset)
    throw std::logic_error("explain's displayed stride terms sum to " + std::to_string(sum) +
                           " but element_offset gives " + std::to_string(core_offset));
}

}  // namespace

std::string terms_formula(const std::vector<OffsetTerm>& terms) {
  std::string names, numbers;
  for (size_t i = 0; i < terms.size(); ++i) {
    const std::string& a = terms[i].axis;
    const bool compound = a.find_first_of("/%") != std::string::npos;
    names += (i ? " + " : "") + (compound ? "(" + a + ")" : a) + "*" + std::to_string(terms[i].stride);
    numbers += (i ? " + " : "") + std::to_string(terms[i].index) + "*" + std::to_string(terms[i].stride);
  }
  return names + " = " + numbers;
}

Explanation explain(const ExplainRequest& o) {
  Explanation e;
  e.g = o.geometry;
  validate_geometry(e.g);
  if (o.engine) {
    e.engine = engine_layout(*o.engine, e.g);  // the engine fixes layout and placement
    e.g = e.engine->geometry;
    if (e.g.has_scale_pool()) e.engine_scales = engine_scale_layout(*o.engine, e.g);
  }
  const PoolGeometry& g = e.g;

  // The explained layer's window: its entry of the per-layer list, else the one window.
  int32_t window = o.window;
  if (!o.layer_windows.empty()) {
    if (o.window != 0)
      fail(ErrorCode::bad_argument, "give the window once: --window W or --layer-windows (one per layer), not both");
    if (static_cast<int64_t>(o.layer_windows.size()) != g.layers)
      fail(ErrorCode::bad_argument, "--layer-windows has " + std::to_string(o.layer_windows.size()) +
                                        " entries for " + std::to_string(g.layers) + " layers: rule: one per layer");
    if (o.layer >= 0 && o.layer < g.layers) window = o.layer_windows[static_cast<size_t>(o.layer)];
    e.layer_windows = o.layer_windows;
  }
  if (o.one_more_block && window == 0)
    fail(ErrorCode::bad_window, "--one-more-block needs a window (--window W > 0, or the layer's --layer-windows entry)");
  if (o.null_block) {
    if (*o.null_block < 0 || *o.null_block >= g.primary_blocks)
      fail(ErrorCode::block_out_of_range, "--null-block " + std::to_string(*o.null_block) +
                                              ": rule: a primary block id < primary_blocks = " +
                                              std::to_string(g.primary_blocks));
    if (o.one_more_block)
      fail(ErrorCode::bad_window, "--null-block is vLLM's hybrid manager (slot = position, no ring): "
                                  "--one-more-block is TensorRT-LLM's ring");
    e.null_block = o.null_block;
  }
  // vLLM's hybrid manager indexes its tables by absolute position; TensorRT-LLM's
  // cyclic window maps the position into its ring (getKVTokenIdx).
  e.window = o.null_block ? WindowMapping::make_linear(window, o.sinks, g.tokens_per_block)
                          : WindowMapping::make(window, o.sinks, g.tokens_per_block, o.one_more_block);
  validate_window(e.window);

  auto out_of_range = [](const char* what, int64_t value, int64_t limit, const char* limit_name) {
    fail(ErrorCode::bad_argument, std::string(what) + " = " + std::to_string(value) + ": rule: " + what +
                                      " must be in [0, " + limit_name + " = " + std::to_string(limit) + ")");
  };
  if (o.token < 0) fail(ErrorCode::bad_argument, "token = " + std::to_string(o.token) + ": rule: token >= 0");
  if (o.layer < 0 || o.layer >= g.layers) out_of_range("layer", o.layer, g.layers, "layers");
  if (o.head < 0 || o.head >= g.kv_heads) out_of_range("head", o.head, g.kv_heads, "kv_heads");
  if (o.dim < 0 || o.dim >= g.head_dim) out_of_range("dim", o.dim, g.head_dim, "head_dim");
  e.token = o.token;
  e.layer = o.layer;
  e.head = o.head;
  e.dim = o.dim;

  // Step 1: window mapping (identity without a window).
  e.cache_token = e.window.cache_token(e.token);
  e.divider = g.page_divider();
  const std::string token_path = "token " + std::to_string(e.token) + " (cache token " + std::to_string(e.cache_token);

  // Steps 2-3: page divide and table lookup.
  std::string where;
  if (!o.csr) {
    e.block_table = o.block_table;
    const DenseBlockTable table{e.block_table.data(), 1, static_cast<int32_t>(e.block_table.size())};
    e.linear_token = e.cache_token;
    e.logical_page = e.divider.div(e.cache_token);
    e.entry = e.divider.mod(e.cache_token);
    e.page_slot = e.logical_page;
    if (e.logical_page >= table.max_blocks_per_seq)
      fail(ErrorCode::position_beyond_sequence,
           token_path + ") is on logical page " + std::to_string(e.logical_page) + " but the block table has " +
               std::to_string(table.max_blocks_per_seq) + " entries: rule: logical page < table entries");
    e.ref = table.block_at(0, e.logical_page);
    where = token_path + ", logical page " + std::to_string(e.logical_page) + ", entry " + std::to_string(e.entry) +
            "): block_table[" + std::to_string(e.page_slot) + "]";
  } else {
    e.csr = true;
    e.indptr = o.indptr;
    e.indices = o.indices;
    e.last_page_len = o.last_page_len;
    validate_csr(e.indptr, e.indices, e.last_page_len, g, /*for_write=*/false);
    const CsrPageTable csr = make_csr_view(e.indptr, e.indices, e.last_page_len, g);
    if (o.seq < 0 || o.seq >= csr.batch) out_of_range("seq", o.seq, csr.batch, "batch");
    e.seq = o.seq;
    e.length = csr.length(e.seq);
    if (e.cache_token >= e.length)
      fail(ErrorCode::position_beyond_sequence,
           "sequence " + std::to_string(e.seq) + ", " + token_path + "): rule: position < length = (pages - 1) * P + " +
               "last_page_len = " + std::to_string(e.length));
    e.linear_token = static_cast<int64_t>(e.indptr[e.seq]) * g.tokens_per_block + e.cache_token;
    csr.locate(e.seq, e.cache_token, e.page_slot, e.entry);
    e.logical_page = e.page_slot - e.indptr[e.seq];
    e.ref = csr.block_at(e.page_slot);
    where = "sequence " + std::to_string(e.seq) + ", " + token_path + ", logical page " +
            std::to_string(e.logical_page) + ", entry " + std::to_string(e.entry) + "): indices[" +
            std::to_string(e.page_slot) + "]";
  }
  // The hybrid manager's null entries of this sequence's pages, and the
  // token's own entry: a null block holds no token of this layer.
  if (e.null_block) {
    const int64_t first = e.csr ? e.indptr[e.seq] : 0;
    const int64_t end = e.csr ? e.indptr[e.seq + 1] : static_cast<int64_t>(e.block_table.size());
    for (int64_t i = first; i < end; ++i)
      if ((e.csr ? e.indices[i] : e.block_table[i]) == *e.null_block) e.null_entries.push_back(i);
    if (!e.ref.is_bad() && !e.ref.is_secondary() && e.ref.block() == *e.null_block)
      fail(ErrorCode::bad_window,
           where + " = " + std::to_string(*e.null_block) + ", the null block: " +
               (e.window.enabled()
                    ? "token " + std::to_string(e.token) + " lies before layer " + std::to_string(e.layer) +
                          "'s sliding window of " + std::to_string(e.window.window) +
                          " (vLLM's hybrid manager releases a sliding group's pages wholly before its window)"
                    : "layer " + std::to_string(e.layer) +
                          " has full attention, and a full-attention group never holds the null block (a sliding "
                          "group's table used for a full layer, vLLM PR #51756)"));
  }
  // BAD_PAGE, out-of-range ids and secondary (not onboarded) references all
  // stop here with core's named error.
  validate_block_ref(e.ref, g, where, /*is_write=*/true);
  // The rest of a dense table is checked as validate_csr checks every CSR
  // entry (a read: BAD_PAGE allowed), so one table is accepted or rejected
  // the same in either form, whichever page the token is on.
  if (!e.csr)
    for (size_t i = 0; i < e.block_table.size(); ++i)
      validate_block_ref(BlockRef{e.block_table[i]}, g, "block_table[" + std::to_string(i) + "]", /*is_write=*/false);
  const int64_t block = e.ref.block();
  e.slot = block * g.tokens_per_block + e.entry;
  const SlotLocation back = locate_slot(e.slot, e.divider);
  if (back.block != block || back.entry != e.entry)
    throw std::logic_error("vLLM slot " + std::to_string(e.slot) + " does not locate back to its block and entry");

  // Steps 4-6: element, byte and scale offsets.
  e.strides = e.engine ? e.engine->strides : contiguous_strides(g, e.ref.pool());
  if (g.has_scale_pool())
    e.scale_strides = e.engine_scales ? e.engine_scales->strides : contiguous_strides(g.scale_geometry(), e.ref.pool());
  for (int32_t kv = 0; kv < g.kv_factor; ++kv) {
    TensorOffsets t;
    t.kv = kv;
    t.element = element_offset(e.strides, block, e.layer, kv, e.head, e.entry, e.dim);
    t.terms = offset_terms(g, e.strides, e.ref.pool(), block, e.layer, kv, e.head, e.entry, e.dim, "dim");
    check_terms(t.terms, t.element);
    t.byte = element_byte_offset(t.element, g.dtype);
    if (e.scale_strides) {
      const PoolGeometry sg = g.scale_geometry();
      t.high_nibble = (t.element & 1) != 0;  // codec::nibble_at: element 2i low, 2i+1 high
      t.scale_element = scale_offset(*e.scale_strides, block, e.layer, kv, e.head, e.entry, e.dim);
      t.scale_terms = offset_terms(sg, *e.scale_strides, e.ref.pool(), block, e.layer, kv, e.head, e.entry,
                                   e.dim / codec::kNvfp4BlockElems, "dim/16");
      check_terms(t.scale_terms, t.scale_element);
      t.scale_byte = element_byte_offset(t.scale_element, sg.dtype);
      if (e.engine_scales) t.tensor_scale_element = t.scale_element - e.engine_scales->tensor_base(e.layer, kv);
    }
    if (e.engine) {
      t.tensor = e.engine->tensor_label(e.layer, kv);
      t.tensor_base = e.engine->tensor_base(e.layer, kv);
      t.tensor_element = t.element - t.tensor_base;
      t.tensor_byte = element_byte_offset(t.tensor_element, g.dtype);
    }
    e.tensors.push_back(t);
  }
  return e;
}

// ---------------------------------------------------------------- formulas (shared by text and JSON)

std::string window_formula(const Explanation& e) {
  const WindowMapping& w = e.window;
  if (!w.enabled()) return "no window: cache_token = token = " + std::to_string(e.cache_token);
  if (w.linear)
    return "linear window (vLLM: slot = position, the window chooses the attended keys only): cache_token = token = " +
           std::to_string(e.cache_token);
  if (w.is_sink(e.token))
    return "token " + std::to_string(e.token) + " < sinks " + std::to_string(w.sinks) + ": cache_token = token = " +
           std::to_string(e.cache_token);
  // The ring index shown is read back from core's result, not recomputed.
  const int64_t ring = e.cache_token - w.sinks - w.bubble;
  return "cache_token = S + bubble + (t - S) mod cyclic_len = " + std::to_string(w.sinks) + " + " +
         std::to_string(w.bubble) + " + (" + std::to_string(e.token) + " - " + std::to_string(w.sinks) + ") mod " +
         std::to_string(w.cyclic_len) + " = " + std::to_string(w.sinks) + " + " + std::to_string(w.bubble) + " + " +
         std::to_string(ring) + " = " + std::to_string(e.cache_token);
}

std::string bubble_formula(const WindowMapping& w) {
  const int32_t P = w.tokens_per_block;
  return "bubble = (S mod P == 0) ? 0 : P - S mod P = (" + std::to_string(w.sinks) + " mod " + std::to_string(P) +
         " == 0) ? 0 : " + std::to_string(P) + " - " + std::to_string(w.sinks % P) + " = " + std::to_string(w.bubble);
}

std::string cyclic_formula(const WindowMapping& w) {
  if (w.one_more_block)
    return "cyclic_len = W + P - S = " + std::to_string(w.window) + " + " + std::to_string(w.tokens_per_block) +
           " - " + std::to_string(w.sinks) + " = " + std::to_string(w.cyclic_len);
  return "cyclic_len = W - S = " + std::to_string(w.window) + " - " + std::to_string(w.sinks) + " = " +
         std::to_string(w.cyclic_len);
}

std::string page_formula(const Explanation& e) {
  const std::string x = e.csr ? "linear" : "cache_token";
  const std::string v = std::to_string(e.linear_token);
  const std::string lhs = e.csr ? "page_slot" : "logical_page";
  if (e.divider.pow2)
    return lhs + " = " + x + " >> " + std::to_string(e.divider.shift) + " = " + v + " >> " +
           std::to_string(e.divider.shift) + " = " + std::to_string(e.page_slot) + "; entry = " + x + " & " +
           std::to_string(e.divider.page_size - 1) + " = " + v + " & " + std::to_string(e.divider.page_size - 1) +
           " = " + std::to_string(e.entry);
  return lhs + " = " + x + " / P = " + v + " / " + std::to_string(e.divider.page_size) + " = " +
         std::to_string(e.page_slot) + "; entry = " + x + " % P = " + v + " % " + std::to_string(e.divider.page_size) +
         " = " + std::to_string(e.entry);
}

std::string csr_linear_formula(const Explanation& e) {
  return "linear = indptr[b] * P + cache_token = " + std::to_string(e.indptr[e.seq]) + " * " +
         std::to_string(e.g.tokens_per_block) + " + " + std::to_string(e.cache_token) + " = " +
         std::to_string(e.linear_token);
}

std::string csr_length_formula(const Explanation& e) {
  const int64_t pages = e.indptr[e.seq + 1] - e.indptr[e.seq];
  return "length = (pages - 1) * P + last_page_len[b] = (" + std::to_string(pages) + " - 1) * " +
         std::to_string(e.g.tokens_per_block) + " + " + std::to_string(e.last_page_len[e.seq]) + " = " +
         std::to_string(e.length);
}

std::string slot_formula(const Explanation& e) {
  return "slot = block * P + entry = " + std::to_string(e.ref.block()) + " * " + std::to_string(e.g.tokens_per_block) +
         " + " + std::to_string(e.entry) + " = " + std::to_string(e.slot);
}

std::string byte_formula(int64_t element, int64_t byte, int bits) {
  return "byte = offset * " + std::to_string(bits) + " / 8 = " + std::to_string(element) + " * " +
         std::to_string(bits) + " / 8 = " + std::to_string(byte);
}

std::string table_lookup_text(const Explanation& e) {
  const std::string arr = e.csr ? "indices" : "block_table";
  return arr + "[" + std::to_string(e.page_slot) + "] = " + std::to_string(e.ref.raw) + " -> " +
         (e.ref.is_secondary() ? "secondary" : "primary") + " block " + std::to_string(e.ref.block());
}

std::string pool_tensor_text(const PoolGeometry& g, const PoolStrides& s, PoolKind kind) {
  std::string text = axes_text(outer_axes(g, s, kind));
  if (g.layout == BlockLayout::split_x && g.kv_factor == 2)
    return text + " then K " + axes_text(inner_axes(g, s, 0)) + ", V " + axes_text(inner_axes(g, s, 1));
  return text + axes_text(inner_axes(g, s, 0));
}

// Both read core's layout object (pool_layout): its first three axes are the
// outer ones, the rest up to its rank the block-inner ones.
std::vector<Axis> outer_axes(const PoolGeometry& g, const PoolStrides& s, PoolKind kind) {
  const PoolLayout l = pool_layout(g, s, kind, 0);
  std::vector<Axis> axes;
  for (int32_t i = 0; i < 3; ++i) axes.push_back(Axis{l.axis[i].name, l.axis[i].extent, l.axis[i].stride});
  return axes;
}

std::vector<Axis> inner_axes(const PoolGeometry& g, const PoolStrides& s, int32_t kv) {
  const PoolLayout l = pool_layout(g, s, PoolKind::primary, kv);
  std::vector<Axis> axes;
  for (int32_t i = 3; i < l.rank; ++i) axes.push_back(Axis{l.axis[i].name, l.axis[i].extent, l.axis[i].stride});
  return axes;
}

std::string axes_text(const std::vector<Axis>& axes) {
  std::string text;
  for (const Axis& a : axes) text += "[" + a.name + " " + std::to_string(a.extent) + "]";
  return text;
}

const char* kv_label(int32_t kv, int32_t kv_factor) {
  if (kv_factor == 1) return "latent";
  return kv == 0 ? "K" : "V";
}

std::string join_numbers(const std::vector<int32_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}
// ---------------------------------------------------------------- the steps as text lines

std::string engine_tensors_text(const EngineLayout& l) {
  std::string text = "engine " + std::string(engine_name(l.engine)) + " tensors:";
  for (size_t i = 0; i < l.tensors.size(); ++i) {
    const EngineTensor& t = l.tensors[i];
    text += std::string(i ? "," : "") + " " + t.name + " " + t.shape_text() + (t.per_layer ? " per layer" : "");
  }
  return text;
}

std::vector<std::string> explain_header(const Explanation& e) {
  const PoolGeometry& g = e.g;
  return {"kvsim explain: token " + std::to_string(e.token) + ", layer " + std::to_string(e.layer) + ", head " +
              std::to_string(e.head) + ", dim " + std::to_string(e.dim),
          "geometry: " + geometry_summary(g) + ", " + std::to_string(g.primary_blocks) + " primary blocks, " +
              std::to_string(g.secondary_blocks) + " secondary",
          e.engine ? engine_tensors_text(*e.engine) : "pool tensor: " + pool_tensor_text(g, e.strides, e.ref.pool())};
}

std::vector<ExplainStep> explain_steps(const Explanation& e) {
  const PoolGeometry& g = e.g;
  const std::string P = std::to_string(g.tokens_per_block);
  const std::string bits = std::to_string(bits_per_element(g.dtype));
  std::vector<ExplainStep> steps;

  ExplainStep window{"window", "window mapping", {}};
  if (!e.layer_windows.empty())
    window.lines.push_back("layer " + std::to_string(e.layer) + " of [" + join_numbers(e.layer_windows) + "]: " +
                           (e.window.enabled() ? "sliding window W = " + std::to_string(e.window.window)
                                               : std::string("full attention (W = 0)")));
  if (e.null_block)
    window.lines.push_back("vLLM hybrid manager: the table is indexed by absolute position (no ring), null block " +
                           std::to_string(*e.null_block));
  if (e.window.enabled()) {
    window.lines.push_back("W = " + std::to_string(e.window.window) + ", S = " + std::to_string(e.window.sinks) +
                           ", P = " + P + (e.window.one_more_block ? ", one more block" : ""));
    if (!e.window.linear) {  // a linear window has no ring: no bubble, no cyclic length
      window.lines.push_back(bubble_formula(e.window));
      window.lines.push_back(cyclic_formula(e.window));
    }
  }
  window.lines.push_back(window_formula(e));
  steps.push_back(window);

  ExplainStep page{"page", "page divide (P = " + P + ", " +
                               (e.divider.pow2 ? "power of two: shift/mask path, shift " +
                                                     std::to_string(e.divider.shift) + ", mask " +
                                                     std::to_string(e.divider.page_size - 1)
                                               : std::string("not a power of two: integer divide")) +
                               ")",
                   {}};
  if (e.csr) {
    page.lines.push_back("CSR sequence " + std::to_string(e.seq) + ": indptr [" + join_numbers(e.indptr) +
                         "], indices [" + join_numbers(e.indices) + "], last_page_len [" +
                         join_numbers(e.last_page_len) + "]");
    page.lines.push_back(csr_length_formula(e));
    page.lines.push_back(csr_linear_formula(e));
    page.lines.push_back(page_formula(e));
    page.lines.push_back("logical_page = page_slot - indptr[b] = " + std::to_string(e.page_slot) + " - " +
                         std::to_string(e.indptr[e.seq]) + " = " + std::to_string(e.logical_page));
  } else {
    page.lines.push_back(page_formula(e));
  }
  steps.push_back(page);

  ExplainStep table{"table",
                    std::string("block table") + (e.csr ? "" : " [" + join_numbers(e.block_table) + "]"),
                    {table_lookup_text(e), "vLLM " + slot_formula(e)}};
  if (e.null_block) {
    std::string entries;
    for (const int64_t i : e.null_entries)
      entries += (entries.empty() ? "" : ", ") + std::string(e.csr ? "indices[" : "block_table[") + std::to_string(i) + "]";
    const bool before_token = !e.null_entries.empty() && e.null_entries.front() < e.page_slot;
    if (e.null_entries.empty())
      table.lines.push_back("null entries: none (no page of this sequence released)");
    else if (e.window.enabled())
      table.lines.push_back("null entries (block " + std::to_string(*e.null_block) + ", released: outside layer " +
                            std::to_string(e.layer) + "'s window): " + entries);
    else
      table.lines.push_back("null entries (block " + std::to_string(*e.null_block) + "): " + entries +
                            (before_token ? ": layer " + std::to_string(e.layer) +
                                                " has full attention and needs every page before its token: this "
                                                "table lost them (a sliding group's table read for a full layer, "
                                                "vLLM PR #51756)"
                                          : " (after the token's page: padding)"));
  }
  steps.push_back(table);

  ExplainStep element{"element",
                      std::string(e.engine ? "element offsets (engine_layout strides + element_offset, unit "
                                           : "element offsets (contiguous_strides + element_offset, unit ") +
                          (g.dtype == CacheDtype::nvfp4 ? "nibble" : "element") + ")",
                      {}};
  if (g.layout == BlockLayout::split_x)
    element.lines.push_back("split-x: x = 16 bytes / " + std::to_string(bits_per_element(g.dtype) / 8) +
                            " bytes = " + std::to_string(g.split_x()) + "; K splits dim " + std::to_string(e.dim) +
                            " into dim/x = " + std::to_string(e.dim / g.split_x()) +
                            ", dim%x = " + std::to_string(e.dim % g.split_x()) + "; V is [head][dim][token]");
  for (const TensorOffsets& t : e.tensors)
    element.lines.push_back(std::string(kv_label(t.kv, g.kv_factor)) + " = " + terms_formula(t.terms) + " = " +
                            std::to_string(t.element));
  for (const TensorOffsets& t : e.tensors)
    if (e.engine)
      element.lines.push_back(std::string(kv_label(t.kv, g.kv_factor)) + " in " + t.tensor + " = " +
                              std::to_string(t.element) + " - " + std::to_string(t.tensor_base) + " = " +
                              std::to_string(t.tensor_element));
  if (g.kv_factor == 1) element.lines.push_back("(kv_factor 1: one latent tensor, no V)");
  steps.push_back(element);

  ExplainStep byte{"byte", "byte offsets (" + std::string(dtype_name(g.dtype)) + ", " + bits + " bits)", {}};
  for (const TensorOffsets& t : e.tensors) {
    std::string line = std::string(kv_label(t.kv, g.kv_factor)) + " " +
                       byte_formula(t.element, t.byte, bits_per_element(g.dtype));
    if (e.scale_strides)
      line += std::string(", ") + (t.high_nibble ? "high" : "low") + " nibble (element 2i low, 2i+1 high)";
    byte.lines.push_back(line);
  }
  for (const TensorOffsets& t : e.tensors)
    if (e.engine)
      byte.lines.push_back(std::string(kv_label(t.kv, g.kv_factor)) + " in " + t.tensor + " " +
                           byte_formula(t.tensor_element, t.tensor_byte, bits_per_element(g.dtype)));
  steps.push_back(byte);

  if (e.scale_strides) {
    const PoolGeometry sg = g.scale_geometry();
    ExplainStep scale{"scale",
                      "nvfp4 scale pool (one " + std::string(dtype_name(sg.dtype)) + " byte per " +
                          std::to_string(codec::kNvfp4BlockElems) + " elements; dim " + std::to_string(e.dim) +
                          " is in scale group " + std::to_string(e.dim / codec::kNvfp4BlockElems) + ")",
                      {"scale pool tensor: " + pool_tensor_text(sg, *e.scale_strides, e.ref.pool())}};
    for (const TensorOffsets& t : e.tensors)
      scale.lines.push_back(std::string(kv_label(t.kv, g.kv_factor)) + " scale = " + terms_formula(t.scale_terms) +
                            " = " + std::to_string(t.scale_element) + " -> byte " + std::to_string(t.scale_byte) +
                            (e.engine_scales ? ", byte " + std::to_string(t.tensor_scale_element) + " in its " +
                                                   e.engine_scales->tensor_label(e.layer, t.kv) + " scale tensor"
                                             : ""));
    steps.push_back(scale);
  }
  return steps;
}

std::string explain_text(const Explanation& e) {
  std::string text;
  for (const std::string& line : explain_header(e)) text += line + "\n";
  text += "\n";
  const std::vector<ExplainStep> steps = explain_steps(e);
  for (size_t i = 0; i < steps.size(); ++i) {
    text += std::to_string(i + 1) + ". " + steps[i].title + "\n";
    for (const std::string& line : steps[i].lines) text += "   " + line + "\n";
  }
  return text;
}

}  // namespace kvsim::sim
