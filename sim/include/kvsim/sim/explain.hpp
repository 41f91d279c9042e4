// The index arithmetic of one (token, layer, head, dim) of one sequence, as
// data: every step `kvsim explain` prints (window mapping, page divide, table
// lookup, element, byte and nvfp4 scale offsets), with each number taken from
// a core function (WindowMapping::cache_token, PageDivider /
// CsrPageTable::locate, DenseBlockTable::block_at, validate_block_ref,
// contiguous_strides, element_offset, element_byte_offset, scale_offset).
// The per-axis products kept next to an offset are for the reader; their sum
// is checked against core's result, so no printout can drift from the real
// arithmetic. Used by `kvsim explain` (text and --json), the Python module's
// kvsim.explain() and kvsim.testing, and anything that draws the steps.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <kvsim/core.hpp>
#include <kvsim/validation/engine_presets.hpp>
#include <kvsim/validation/errors.hpp>

namespace kvsim::sim {

// What to explain. The page table is either a dense block table of one
// sequence (TensorRT-LLM / vLLM) or, with csr = true, a CSR triple and the
// sequence `seq` (FlashInfer). Block references are raw BlockRef values
// (-1 = BAD_PAGE, top bit = secondary pool).
struct ExplainRequest {
  PoolGeometry geometry;
  bool csr = false;
  std::vector<int32_t> block_table;
  std::vector<int32_t> indptr, indices, last_page_len;
  int32_t seq = 0;
  int64_t token = 0;
  int32_t layer = 0, head = 0, dim = 0;
  int32_t window = 0, sinks = 0;  // window 0 = none
  bool one_more_block = false;
  // Per-layer attention (Gemma 3, gpt-oss, Mistral): one window per layer, 0 =
  // full attention; the explained layer's entry is its window (instead of
  // `window`). Empty: `window` for every layer.
  std::vector<int32_t> layer_windows;
  // vLLM's hybrid KV cache manager: the table is indexed by absolute position
  // (no ring) and entries equal to this block are the null block (a sliding
  // group's pages wholly before its window, released). Unset: no null block.
  std::optional<int32_t> null_block;
  // The engine's own tensors (validation/engine_presets.hpp): layout, placement and
  // strides from the engine; offsets are also given inside the engine tensor.
  std::optional<Engine> engine;
};

// One product index * stride of an offset sum.
struct OffsetTerm {
  std::string axis;
  int64_t index = 0;
  int64_t stride = 0;
};

// Offsets of K (kv 0), V (kv 1) or the MLA latent (kv 0 of kv_factor 1).
struct TensorOffsets {
  int32_t kv = 0;
  std::vector<OffsetTerm> terms;  // sum = element
  int64_t element = 0;            // element_offset (nibbles for nvfp4)
  int64_t byte = 0;               // element_byte_offset
  // nvfp4 only
  bool high_nibble = false;
  std::vector<OffsetTerm> scale_terms;
  int64_t scale_element = 0;
  int64_t scale_byte = 0;
  // with an engine preset: the engine tensor holding the element and the
  // offsets inside it (element - tensor_base)
  std::string tensor;  // "key_cache[layer 1]"
  int64_t tensor_base = 0;
  int64_t tensor_element = 0;
  int64_t tensor_byte = 0;
  int64_t tensor_scale_element = 0;  // nvfp4: inside the engine's scale tensor
};

struct Explanation {
  PoolGeometry g;
  WindowMapping window;
  int64_t token = 0;
  int32_t layer = 0, head = 0, dim = 0;
  std::vector<int32_t> layer_windows;  // ExplainRequest::layer_windows
  std::optional<int32_t> null_block;   // ExplainRequest::null_block
  std::vector<int64_t> null_entries;   // table positions (the sequence's pages) that hold the null block
  int64_t cache_token = 0;  // after the window mapping
  PageDivider divider;
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
  std::optional<PoolStrides> scale_strides;  // nvfp4
  std::vector<TensorOffsets> tensors;        // K (and V when kv_factor == 2)
  std::optional<EngineLayout> engine;        // with ExplainRequest::engine
  std::optional<EngineLayout> engine_scales; // with an engine and nvfp4
};

// Validates the request (core's named ValidationErrors: bad_window,
// bad_argument, position_beyond_sequence, write_through_bad_page,
// block_out_of_range, secondary_not_onboarded, CSR rules) and computes
// every step.
Explanation explain(const ExplainRequest& request);

// One numbered step as `kvsim explain` prints it: "N. title", then each line
// indented by three spaces. `key` names the step for tools: "window", "page",
// "table", "element", "byte", "scale".
struct ExplainStep {
  std::string key;
  std::string title;
  std::vector<std::string> lines;
};
std::vector<ExplainStep> explain_steps(const Explanation& e);
// The three header lines (coordinates, geometry, pool tensor) before the steps.
std::vector<std::string> explain_header(const Explanation& e);
// The whole text report of `kvsim explain` (header, blank line, steps).
std::string explain_text(const Explanation& e);

// The formulas with their numbers put in (shared by the text and --json).
std::string window_formula(const Explanation& e);
std::string bubble_formula(const WindowMapping& w);
std::string cyclic_formula(const WindowMapping& w);
std::string page_formula(const Explanation& e);
std::string csr_linear_formula(const Explanation& e);
std::string csr_length_formula(const Explanation& e);
std::string slot_formula(const Explanation& e);
std::string byte_formula(int64_t element, int64_t byte, int bits);
std::string table_lookup_text(const Explanation& e);
// "block*4096 + layer*... = 4*4096 + ..."
std::string terms_formula(const std::vector<OffsetTerm>& terms);

// ---------------------------------------------------------------- pool tensor axes
// One axis of a pool tensor as printed by layout/explain: core's layout object
// (pool_layout, core/geometry.hpp) axis by axis, in its order, never restated.
struct Axis {
  std::string name;
  int64_t extent = 0;
  int64_t stride = 0;
};
// [block][layer][kv] (in_block) or [layer][block][kv] (per_layer).
std::vector<Axis> outer_axes(const PoolGeometry& g, const PoolStrides& s, PoolKind kind);
// The block-inner axes of K (kv 0) or V (kv 1): NHD [token][head][dim],
// HND [head][token][dim], split-x K [head][dim/x][token][x], split-x V [head][dim][token].
std::vector<Axis> inner_axes(const PoolGeometry& g, const PoolStrides& s, int32_t kv);
// "[block 64][layer 1][kv 2]"
std::string axes_text(const std::vector<Axis>& axes);
// The pool tensor's axes, with K's and V's inner axes apart for split-x.
std::string pool_tensor_text(const PoolGeometry& g, const PoolStrides& s, PoolKind kind);
// "engine vllm-paged tensors: key_cache [blocks 64]... per layer, value_cache ..."
std::string engine_tensors_text(const EngineLayout& l);
// "K" and "V", or "latent" for the single tensor of kv_factor 1 (MLA).
const char* kv_label(int32_t kv, int32_t kv_factor);
// "4,9,2"
std::string join_numbers(const std::vector<int32_t>& v);

}  // namespace kvsim::sim
