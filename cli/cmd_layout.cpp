// `kvsim layout`: shape, strides and sizes of the pool tensors of a geometry.
// Every number is read from core (PoolGeometry, contiguous_strides,
// scale_geometry); this file only arranges them.
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#include "commands.hpp"
#include "geometry_options.hpp"

namespace kvsim::cli {
namespace {

struct LayoutOptions {
  GeometryOptions geometry;
  bool json = false;
};

const char* pool_name(PoolKind k) { return k == PoolKind::primary ? "primary" : "secondary"; }

// One pool tensor (primary or secondary) of geometry g: its per-kind strides
// differ for per_layer placement, whose layer stride spans the pool's blocks.
Json pool_json(const PoolGeometry& g, PoolKind kind) {
  const PoolStrides s = contiguous_strides(g, kind);
  Json j;
  j["blocks"] = g.blocks(kind);
  j["elements"] = g.pool_elements(kind);
  j["bytes"] = g.pool_bytes(kind);
  j["outer_axes"] = axes_json(outer_axes(g, s, kind));
  Json inner;
  inner["k"] = axes_json(inner_axes(g, s, 0));
  inner["v"] = g.kv_factor == 2 ? axes_json(inner_axes(g, s, 1)) : Json(nullptr);
  j["inner_axes"] = inner;
  j["strides"] = strides_json(s, g.kv_factor);
  return j;
}

Json pools_json(const PoolGeometry& g) {
  Json j;
  j["primary"] = pool_json(g, PoolKind::primary);
  j["secondary"] = pool_json(g, PoolKind::secondary);
  return j;
}

Json layout_json(const PoolGeometry& g) {
  Json j;
  j["kvsim_version"] = kVersion;
  j["geometry"] = geometry_json(g);
  j["element_bits"] = bits_per_element(g.dtype);
  j["split_x"] = g.layout == BlockLayout::split_x ? Json(g.split_x()) : Json(nullptr);
  j["inner_elements"] = g.inner_elements();
  j["block_elements"] = g.block_elements();
  j["bytes_per_block"] = g.block_bytes();
  j["pools"] = pools_json(g);
  if (g.has_scale_pool()) {
    const PoolGeometry sg = g.scale_geometry();
    Json scale;
    scale["elements_per_scale"] = codec::kNvfp4BlockElems;
    scale["scale_dtype"] = std::string(dtype_name(sg.dtype));
    scale["geometry"] = geometry_json(sg);
    scale["bytes_per_block"] = sg.block_bytes();
    scale["pools"] = pools_json(sg);
    j["scale_pool"] = scale;
  } else {
    j["scale_pool"] = nullptr;
  }
  return j;
}

void print_pool_text(std::ostream& out, const PoolGeometry& g, PoolKind kind, const char* title) {
  const PoolStrides s = contiguous_strides(g, kind);
  out << pool_name(kind) << " " << title << ": " << g.blocks(kind) << " blocks, " << g.pool_elements(kind)
      << " elements, " << g.pool_bytes(kind) << " bytes\n";
  if (g.blocks(kind) == 0) return;
  const auto outer = outer_axes(g, s, kind);
  auto print_strides = [&out](const std::vector<Axis>& axes) {
    for (const Axis& a : axes) out << "  " << a.name << " " << a.stride;
  };
  if (g.layout != BlockLayout::split_x || g.kv_factor == 1) {
    // K and V share one inner layout: the pool is one rectangular tensor.
    const auto inner = inner_axes(g, s, 0);
    out << "  tensor  " << axes_text(outer) << axes_text(inner) << "\n";
    out << "  strides";
    print_strides(outer);
    print_strides(inner);
    out << "   (elements)\n";
    return;
  }
  out << "  tensor  " << axes_text(outer) << "[block-inner]\n";
  out << "  strides";
  print_strides(outer);
  out << "   (elements)\n";
  for (int32_t kv = 0; kv < g.kv_factor; ++kv) {
    const auto inner = inner_axes(g, s, kv);
    out << "  " << kv_label(kv, g.kv_factor) << " inner " << axes_text(inner) << "  strides";
    print_strides(inner);
    out << "\n";
  }
}

// With an engine the pools are the engine's tensors (print_engine_text), not
// kvsim's contiguous pools.
void print_layout_text(std::ostream& out, const PoolGeometry& g, bool pools = true) {
  out << "kvsim layout: " << geometry_summary(g) << "\n";
  out << "element size     " << bits_per_element(g.dtype) << " bits (" << dtype_name(g.dtype) << ")"
      << (g.dtype == CacheDtype::nvfp4 ? ", offsets count nibbles: element 2i low, 2i+1 high nibble of byte i" : "")
      << "\n";
  if (g.layout == BlockLayout::split_x)
    out << "split-x x        " << g.split_x() << " elements = 16 bytes\n";
  out << "sub-block        " << g.inner_elements() << " elements (one layer, one of K/V: H*P*D)\n";
  out << "block            " << g.block_elements() << " elements, " << g.block_bytes() << " bytes (all layers, K and V)\n";
  if (!pools) return;
  print_pool_text(out, g, PoolKind::primary, "pool");
  print_pool_text(out, g, PoolKind::secondary, "pool");
  if (g.has_scale_pool()) {
    const PoolGeometry sg = g.scale_geometry();
    out << "nvfp4 scale pool: one " << dtype_name(sg.dtype) << " byte per " << codec::kNvfp4BlockElems
        << " elements (head_dim " << g.head_dim << " -> " << sg.head_dim << " scales), " << sg.block_bytes()
        << " bytes per block\n";
    print_pool_text(out, sg, PoolKind::primary, "scale pool");
    print_pool_text(out, sg, PoolKind::secondary, "scale pool");
  }
}

// The engine's own tensors with their row-major strides, and where kvsim
// lays them in one allocation (the pool above, with the engine's strides).
void print_engine_text(std::ostream& out, const EngineLayout& l, const char* what) {
  const bool per_layer = l.tensors[0].per_layer;
  out << "engine " << engine_name(l.engine) << " " << what << " (one allocation of " << l.allocation_elements
      << " elements" << (per_layer ? ": layer after layer" : "") << (l.tensors.size() == 2 ? ", K tensor before V tensor" : "")
      << ")\n";
  for (const EngineTensor& t : l.tensors) {
    out << "  " << t.name << (t.per_layer ? " per layer " : " ") << t.shape_text() << "  strides";
    for (const EngineTensorAxis& a : t.axes) out << "  " << a.name << " " << a.stride;
    out << "\n";
  }
  const PoolStrides& s = l.strides;
  out << "  kvsim strides  block " << s.block << "  layer " << s.layer << "  kv " << s.kv << "\n";
}

}  // namespace

void register_layout(CLI::App& app) {
  auto opts = std::make_shared<LayoutOptions>();
  CLI::App* cmd = app.add_subcommand("layout", "Shape, strides, bytes per block and per pool of a geometry");
  add_geometry_options(*cmd, opts->geometry);
  cmd->add_flag("--json", opts->json, "Print one JSON object (schema in docs/index-arithmetic.md)");
  cmd->callback([opts]() {
    PoolGeometry g = make_geometry(opts->geometry);
    std::optional<EngineLayout> engine;
    if (const std::optional<Engine> e = engine_option(opts->geometry)) {
      engine = engine_layout(*e, g);
      g = engine->geometry;  // the engine's layout and placement
    }
    std::ostringstream out;  // printed whole, so a failure prints nothing on stdout
    if (opts->json) {
      Json j = layout_json(g);
      if (engine) {
        j["engine"] = engine_json(*engine);
        if (g.has_scale_pool()) j["engine_scales"] = engine_json(engine_scale_layout(engine->engine, g));
      }
      out << j.dump(2) << '\n';
    } else {
      print_layout_text(out, g, !engine);
      if (engine) {
        print_engine_text(out, *engine, "tensors");
        if (g.has_scale_pool()) print_engine_text(out, engine_scale_layout(engine->engine, g), "nvfp4 scale tensors");
      }
    }
    std::cout << out.str();
    std::cout.flush();
  });
}

}  // namespace kvsim::cli
