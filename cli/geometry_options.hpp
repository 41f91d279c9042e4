// Geometry flags shared by `kvsim layout` and `kvsim explain`, and the JSON
// forms of core's geometry structs that both print. The CLI only parses
// names and numbers here; every range rule is core's validate_geometry.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "kvsim/validation.hpp"
#include "kvsim/sim/explain.hpp"

namespace kvsim::cli {

// Output JSON keeps insertion order so the printed object reads in the same
// order as the text report; the schema is documented in docs/index-arithmetic.md.
using Json = nlohmann::ordered_json;

struct GeometryOptions {
  std::string layout = "nhd";
  std::string placement = "in_block";
  std::string dtype = "bf16";
  int32_t layers = 1;
  int32_t kv_factor = 2;
  int32_t kv_heads = 8;
  int32_t head_dim = 128;
  int32_t page_size = 16;
  int64_t blocks = 64;
  int64_t secondary_blocks = 0;
  std::string engine;  // empty: none (validation/engine_presets.hpp)
};

// Adds --layout --placement --layers --kv-factor --kv-heads --head-dim
// --page-size --dtype --blocks --secondary-blocks --engine to `cmd`, bound to `opts`.
void add_geometry_options(CLI::App& cmd, GeometryOptions& opts);

// The PoolGeometry the flags describe, checked by core's validate_geometry
// (throws kvsim::ValidationError, e.g. bad_geometry, unsupported_page_size).
PoolGeometry make_geometry(const GeometryOptions& opts);
// --engine, when given.
std::optional<Engine> engine_option(const GeometryOptions& opts);

Json geometry_json(const PoolGeometry& g);
Json inner_strides_json(const InnerStrides& s);
// PoolStrides with "inner": {"k": ..., "v": ...}; "v" is null when kv_factor == 1.
Json strides_json(const PoolStrides& s, int32_t kv_factor);

// Pool tensor axes (sim/explain.hpp), shared with the explain library.
using sim::Axis;
using sim::axes_text;
using sim::inner_axes;
using sim::kv_label;
using sim::outer_axes;
Json axes_json(const std::vector<Axis>& axes);
// An engine preset: its name, each tensor (name, per layer, K/V, axes with the
// engine's strides) and kvsim's strides into the one allocation of them all.
Json engine_json(const EngineLayout& l);

}  // namespace kvsim::cli
