// `kvsim explain`: every step of the index arithmetic for one (token, layer,
// head, dim) of one sequence, with the formula and the numbers put in.
//
// Every value comes from a core function: WindowMapping::cache_token,
// PageDivider / CsrPageTable::locate, DenseBlockTable::block_at, BlockRef,
// validate_block_ref, contiguous_strides, element_offset,
// element_byte_offset, scale_offset. The per-axis products shown next to an
// offset are for the reader only; their sum is checked against core's result
// so the printout can never drift from the real arithmetic.
//
// Page tables: either a dense block table of one sequence (--block-table,
// TensorRT-LLM / vLLM) or a CSR triple (--indptr --indices --last-page-len
// --seq, FlashInfer). A token on a BAD_PAGE (-1) entry, beyond the table or
// the sequence length, or on a secondary-pool block (it must be onboarded
// first; explain does not show secondary-pool offsets) is an error: exit 2.
#include <cstdint>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "commands.hpp"
#include "geometry_options.hpp"
#include "numbers.hpp"

namespace kvsim::cli {
namespace {

struct ExplainOptions {
  GeometryOptions geometry;
  // Absent or given (possibly empty, which the number parser rejects).
  std::optional<std::string> block_table;
  std::optional<std::string> indptr;
  std::optional<std::string> indices;
  std::optional<std::string> last_page_len;
  int32_t seq = 0;
  int64_t token = 0;
  int32_t layer = 0;
  int32_t head = 0;
  int32_t dim = 0;
  int32_t window = 0;
  int32_t sinks = 0;
  bool one_more_block = false;
  bool json = false;
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

std::string join(const std::vector<int32_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

// ---------------------------------------------------------------- the explanation

struct Term {
  std::string axis;
  int64_t index;
  int64_t stride;
};

// The products element_offset() sums, for display; checked against it.
std::vector<Term> offset_terms(const PoolStrides& s, int64_t block, int32_t layer, int32_t kv, int32_t head,
                               int32_t token, int32_t dim, int32_t head_dim, const std::string& dim_name) {
  const InnerStrides& in = s.inner[kv];
  std::vector<Term> terms{{"block", block, s.block},
                          {"layer", layer, s.layer},
                          {"kv", kv, s.kv},
                          {"head", head, in.head},
                          {"token", token, in.token}};
  if (in.x == head_dim) {
    terms.push_back({dim_name, dim, in.dim_inner});
  } else {
    terms.push_back({dim_name + "/x", dim / in.x, in.dim_outer});
    terms.push_back({dim_name + "%x", dim % in.x, in.dim_inner});
  }
  return terms;
}

void check_terms(const std::vector<Term>& terms, int64_t core_offset) {
  int64_t sum = 0;
  for (const Term& t : terms) sum += t.index * t.stride;
  if (sum != core_offset)
    throw std::logic_error("explain's displayed stride terms sum to " + std::to_string(sum) +
                           " but element_offset gives " + std::to_string(core_offset));
}

std::string terms_formula(const std::vector<Term>& terms) {
  std::string names, numbers;
  for (size_t i = 0; i < terms.size(); ++i) {
    const std::string& a = terms[i].axis;
    const bool compound = a.find_first_of("/%") != std::string::npos;
    names += (i ? " + " : "") + (compound ? "(" + a + ")" : a) + "*" + std::to_string(terms[i].stride);
    numbers += (i ? " + " : "") + std::to_string(terms[i].index) + "*" + std::to_string(terms[i].stride);
  }
  return names + " = " + numbers;
}

struct TensorOffsets {
  int32_t kv = 0;
  std::vector<Term> terms;
  int64_t element = 0;
  int64_t byte = 0;
  // nvfp4 only
  bool high_nibble = false;
  std::vector<Term> scale_terms;
  int64_t scale_element = 0;
  int64_t scale_byte = 0;
};

struct Explanation {
  PoolGeometry g;
  WindowMapping window;
  int64_t token = 0;
  int32_t layer = 0, head = 0, dim = 0;
  int64_t cache_token = 0;
  PageDivider divider;
  // table
  bool csr = false;
  std::vector<int32_t> block_table, indptr, indices, last_page_len;
  int32_t seq = 0;
  int64_t length = 0;        // CSR: length(seq)
  int64_t linear_token = 0;  // CSR: indptr[seq] * P + cache_token; dense: cache_token
  int64_t page_slot = 0;     // index into indices (CSR) or the block table (dense)
  int64_t logical_page = 0;  // page within the sequence
  int32_t entry = 0;
  BlockRef ref;
  int64_t slot = 0;  // vLLM slot of (block, entry)
  PoolStrides strides;
  std::optional<PoolStrides> scale_strides;
  std::vector<TensorOffsets> tensors;  // K (and V when kv_factor == 2)
};

Explanation explain(const ExplainOptions& o) {
  Explanation e;
  e.g = make_geometry(o.geometry);
  const PoolGeometry& g = e.g;

  if (o.one_more_block && o.window == 0)
    fail(ErrorCode::bad_window, "--one-more-block needs a window (--window W > 0)");
  e.window = WindowMapping::make(o.window, o.sinks, g.tokens_per_block, o.one_more_block);
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
  if (o.block_table) {
    e.block_table = parse_table(*o.block_table, "--block-table", true);
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
    e.indptr = parse_table(*o.indptr, "--indptr", false);
    e.indices = parse_table(*o.indices, "--indices", true);
    e.last_page_len = parse_table(*o.last_page_len, "--last-page-len", false);
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
  e.strides = contiguous_strides(g, e.ref.pool());
  if (g.has_scale_pool()) e.scale_strides = contiguous_strides(g.scale_geometry(), e.ref.pool());
  for (int32_t kv = 0; kv < g.kv_factor; ++kv) {
    TensorOffsets t;
    t.kv = kv;
    t.element = element_offset(e.strides, block, e.layer, kv, e.head, e.entry, e.dim);
    t.terms = offset_terms(e.strides, block, e.layer, kv, e.head, e.entry, e.dim, g.head_dim, "dim");
    check_terms(t.terms, t.element);
    t.byte = element_byte_offset(t.element, g.dtype);
    if (e.scale_strides) {
      const PoolGeometry sg = g.scale_geometry();
      t.high_nibble = (t.element & 1) != 0;  // codec::nibble_at: element 2i low, 2i+1 high
      t.scale_element = scale_offset(*e.scale_strides, block, e.layer, kv, e.head, e.entry, e.dim);
      t.scale_terms = offset_terms(*e.scale_strides, block, e.layer, kv, e.head, e.entry,
                                   e.dim / codec::kNvfp4BlockElems, sg.head_dim, "dim/16");
      check_terms(t.scale_terms, t.scale_element);
      t.scale_byte = element_byte_offset(t.scale_element, sg.dtype);
    }
    e.tensors.push_back(t);
  }
  return e;
}

// ---------------------------------------------------------------- formulas (shared by text and JSON)

std::string window_formula(const Explanation& e) {
  const WindowMapping& w = e.window;
  if (!w.enabled()) return "no window: cache_token = token = " + std::to_string(e.cache_token);
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

// ---------------------------------------------------------------- JSON

Json terms_json(const std::vector<Term>& terms) {
  Json list = Json::array();
  for (const Term& t : terms) list.push_back(Json{{"axis", t.axis}, {"index", t.index}, {"stride", t.stride}});
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
                       {"bubble", e.window.bubble},
                       {"cyclic_len", e.window.cyclic_len},
                       {"is_sink", e.window.is_sink(e.token)}};
  } else {
    j["window"] = nullptr;
  }
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

  Json f;
  if (e.window.enabled()) {
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

// ---------------------------------------------------------------- text

void print_text(std::ostream& out, const Explanation& e) {
  const PoolGeometry& g = e.g;
  out << "kvsim explain: token " << e.token << ", layer " << e.layer << ", head " << e.head << ", dim " << e.dim
      << "\n";
  out << "geometry: " << geometry_summary(g) << ", " << g.primary_blocks << " primary blocks, " << g.secondary_blocks
      << " secondary\n";
  out << "pool tensor: " << pool_tensor_text(g, e.strides, e.ref.pool()) << "\n\n";

  out << "1. window mapping\n";
  if (e.window.enabled()) {
    out << "   W = " << e.window.window << ", S = " << e.window.sinks << ", P = " << g.tokens_per_block
        << (e.window.one_more_block ? ", one more block" : "") << "\n";
    out << "   " << bubble_formula(e.window) << "\n";
    out << "   " << cyclic_formula(e.window) << "\n";
  }
  out << "   " << window_formula(e) << "\n";

  out << "2. page divide (P = " << g.tokens_per_block << ", "
      << (e.divider.pow2 ? "power of two: shift/mask path, shift " + std::to_string(e.divider.shift) + ", mask " +
                               std::to_string(e.divider.page_size - 1)
                         : std::string("not a power of two: integer divide"))
      << ")\n";
  if (e.csr) {
    out << "   CSR sequence " << e.seq << ": indptr [" << join(e.indptr) << "], indices [" << join(e.indices)
        << "], last_page_len [" << join(e.last_page_len) << "]\n";
    out << "   " << csr_length_formula(e) << "\n";
    out << "   " << csr_linear_formula(e) << "\n";
    out << "   " << page_formula(e) << "\n";
    out << "   logical_page = page_slot - indptr[b] = " << e.page_slot << " - " << e.indptr[e.seq] << " = "
        << e.logical_page << "\n";
  } else {
    out << "   " << page_formula(e) << "\n";
  }

  out << "3. block table" << (e.csr ? "" : " [" + join(e.block_table) + "]") << "\n";
  out << "   " << table_lookup_text(e) << "\n";
  out << "   vLLM " << slot_formula(e) << "\n";

  out << "4. element offsets (contiguous_strides + element_offset, unit "
      << (g.dtype == CacheDtype::nvfp4 ? "nibble" : "element") << ")\n";
  if (g.layout == BlockLayout::split_x)
    out << "   split-x: x = 16 bytes / " << bits_per_element(g.dtype) / 8 << " bytes = " << g.split_x() << "; K splits dim "
        << e.dim << " into dim/x = " << e.dim / g.split_x() << ", dim%x = " << e.dim % g.split_x()
        << "; V is [head][dim][token]\n";
  for (const TensorOffsets& t : e.tensors) {
    out << "   " << kv_label(t.kv, g.kv_factor) << " = " << terms_formula(t.terms) << " = " << t.element << "\n";
  }
  if (g.kv_factor == 1) out << "   (kv_factor 1: one latent tensor, no V)\n";

  out << "5. byte offsets (" << dtype_name(g.dtype) << ", " << bits_per_element(g.dtype) << " bits)\n";
  for (const TensorOffsets& t : e.tensors) {
    out << "   " << kv_label(t.kv, g.kv_factor) << " " << byte_formula(t.element, t.byte, bits_per_element(g.dtype));
    if (e.scale_strides)
      out << ", " << (t.high_nibble ? "high" : "low") << " nibble (element 2i low, 2i+1 high)";
    out << "\n";
  }

  if (e.scale_strides) {
    const PoolGeometry sg = g.scale_geometry();
    out << "6. nvfp4 scale pool (one " << dtype_name(sg.dtype) << " byte per " << codec::kNvfp4BlockElems
        << " elements; dim " << e.dim << " is in scale group " << e.dim / codec::kNvfp4BlockElems << ")\n";
    out << "   scale pool tensor: " << pool_tensor_text(sg, *e.scale_strides, e.ref.pool()) << "\n";
    for (const TensorOffsets& t : e.tensors)
      out << "   " << kv_label(t.kv, g.kv_factor) << " scale = " << terms_formula(t.scale_terms) << " = "
          << t.scale_element << " -> byte " << t.scale_byte << "\n";
  }
}

}  // namespace

void register_explain(CLI::App& app) {
  auto opts = std::make_shared<ExplainOptions>();
  CLI::App* cmd = app.add_subcommand("explain", "Every step of the index arithmetic for one token of one sequence");
  add_geometry_options(*cmd, opts->geometry);

  const std::string table_group = "Page table (one of)";
  // Lists are kept as text and parsed by numbers.hpp in explain(); "--flag="
  // reaches it as "" (an error naming the flag) instead of eating the next flag.
  const auto list_option = [&](const std::string& name, std::optional<std::string>& target, const std::string& help) {
    return cmd
        ->add_option_function<std::string>(name, [&target](const std::string& text) { target = text; }, help)
        ->expected(0, 1)
        ->group(table_group);
  };
  auto* dense = list_option("--block-table", opts->block_table,
                            "Dense block table of the sequence: b0,b1,... (-1 = BAD_PAGE, sN = secondary block N, "
                            "0xHEX = a raw 32-bit reference)");
  auto* indptr = list_option("--indptr", opts->indptr, "CSR indptr: 0,p1,...,pn");
  auto* indices = list_option("--indices", opts->indices, "CSR indices (block references, as --block-table)");
  auto* last = list_option("--last-page-len", opts->last_page_len, "CSR last_page_len per sequence");
  auto* seq = add_int_option(*cmd, "--seq", opts->seq, "CSR sequence b", 0, INT32_MAX)->group(table_group);
  indptr->needs(indices)->needs(last);
  indices->needs(indptr);
  last->needs(indptr);
  seq->needs(indptr);
  dense->excludes(indptr)->excludes(indices)->excludes(last)->excludes(seq);

  const std::string coord_group = "Coordinates";
  add_int_option(*cmd, "--token", opts->token, "Token position t in the sequence", INT64_MIN, INT64_MAX)
      ->required()
      ->group(coord_group);
  add_int_option(*cmd, "--layer", opts->layer, "Layer", INT32_MIN, INT32_MAX)->group(coord_group);
  add_int_option(*cmd, "--head", opts->head, "KV head", INT32_MIN, INT32_MAX)->group(coord_group);
  add_int_option(*cmd, "--dim", opts->dim, "Element of head_dim", INT32_MIN, INT32_MAX)->group(coord_group);

  const std::string window_group = "Sliding window (TensorRT-LLM getKVTokenIdx)";
  add_int_option(*cmd, "--window", opts->window, "Attention window W (0 = none)", INT32_MIN, INT32_MAX)
      ->group(window_group);
  add_int_option(*cmd, "--sinks", opts->sinks, "Sink tokens S", INT32_MIN, INT32_MAX)->group(window_group);
  cmd->add_flag("--one-more-block", opts->one_more_block, "cyclic_len = W + P - S instead of W - S")
      ->group(window_group);

  cmd->add_flag("--json", opts->json, "Print one JSON object (schema in docs/index-arithmetic.md)");
  cmd->callback([opts]() {
    if (!opts->block_table && !opts->indptr)
      throw CLI::ValidationError("page table", "give --block-table or --indptr/--indices/--last-page-len");
    const Explanation e = explain(*opts);
    std::ostringstream out;  // printed whole, so a failure prints nothing on stdout
    if (opts->json)
      out << explanation_json(e).dump(2) << '\n';
    else
      print_text(out, e);
    std::cout << out.str();
  });
}

}  // namespace kvsim::cli
