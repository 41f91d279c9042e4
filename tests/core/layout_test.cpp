// The layout object (pool_layout, core/geometry.hpp) against THE offset
// function and against first principles:
//   * element_offset is the dot product of the coordinate (block, layer, kv,
//     head, token, dim / x, dim % x) with the layout's strides, for every
//     layout, placement, pool kind, K/V and dtype, over odd sizes, contiguous
//     and random strides (a property sweep over every coordinate);
//   * each layout lists every coordinate once, shows the tensor's axes in the
//     tensor's order, and folds only an axis of one index.
#include <doctest/doctest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "kvsim/validation.hpp"

#include "../support/rng.hpp"

using namespace kvsim;
using kvsim::testing::Rng;

namespace {

int64_t coordinate(LayoutAxisId id, int64_t block, int32_t layer, int32_t kv, int32_t head, int32_t token, int32_t dim,
                   int32_t x) {
  switch (id) {
    case LayoutAxisId::block: return block;
    case LayoutAxisId::layer: return layer;
    case LayoutAxisId::kv: return kv;
    case LayoutAxisId::head: return head;
    case LayoutAxisId::token: return token;
    case LayoutAxisId::dim_outer: return dim / x;
    case LayoutAxisId::dim_inner: return dim % x;
  }
  return -1;
}

// Every coordinate of one (kind, kv) pool: element_offset == coordinate . strides.
void check_dot_product(const PoolGeometry& g, const PoolStrides& s, PoolKind kind) {
  for (int32_t kv = 0; kv < g.kv_factor; ++kv) {
    const PoolLayout l = pool_layout(g, s, kind, kv);
    const int32_t x = s.inner[kv].x;
    int64_t mismatches = 0;
    for (int64_t b = 0; b < g.blocks(kind); ++b)
      for (int32_t layer = 0; layer < g.layers; ++layer)
        for (int32_t h = 0; h < g.kv_heads; ++h)
          for (int32_t t = 0; t < g.tokens_per_block; ++t)
            for (int32_t d = 0; d < g.head_dim; ++d) {
              int64_t dot = 0;
              for (const LayoutAxis& a : l.axis) dot += coordinate(a.id, b, layer, kv, h, t, d, x) * a.stride;
              mismatches += dot != element_offset(s, b, layer, kv, h, t, d);
            }
    CHECK_MESSAGE(mismatches == 0, geometry_summary(g), " kv ", kv);
  }
}

std::vector<PoolGeometry> odd_geometries() {
  std::vector<PoolGeometry> out;
  for (BlockLayout layout : {BlockLayout::nhd, BlockLayout::hnd, BlockLayout::split_x})
    for (LayerPlacement placement : {LayerPlacement::in_block, LayerPlacement::per_layer})
      for (CacheDtype dtype : {CacheDtype::fp32, CacheDtype::bf16, CacheDtype::fp8_e4m3, CacheDtype::nvfp4})
        for (int32_t kv_factor : {1, 2}) {
          if (layout == BlockLayout::split_x && dtype == CacheDtype::nvfp4) continue;
          PoolGeometry g;
          g.layers = 3;
          g.kv_factor = kv_factor;
          g.kv_heads = 3;
          g.tokens_per_block = 5;
          g.layout = layout;
          g.placement = placement;
          g.dtype = dtype;
          // odd multiples of what the layout needs: x for split-x, 16 for nvfp4, else odd
          g.head_dim = layout == BlockLayout::split_x ? 3 * g.split_x() : dtype == CacheDtype::nvfp4 ? 48 : 7;
          g.primary_blocks = 3;
          g.secondary_blocks = 5;
          validate_geometry(g);
          out.push_back(g);
        }
  return out;
}

// Strides with gaps: the contiguous layout's inner strides scaled, and outer
// strides padded past the sub-block (the dot product holds for any strides;
// these keep the coordinates apart too).
PoolStrides padded_strides(const PoolGeometry& g, Rng& r) {
  PoolStrides s = contiguous_strides(g);
  for (InnerStrides& in : s.inner) {
    const int64_t pad = 1 + r.below(3);
    in.head *= pad;
    in.dim_outer *= pad;
    if (g.layout != BlockLayout::split_x) in.token *= pad;
  }
  const int64_t span = 4 * g.inner_elements() + 7;
  s.kv = span;
  if (g.placement == LayerPlacement::in_block) {
    s.layer = span * g.kv_factor + 3;
    s.block = s.layer * g.layers + 5;
  } else {
    s.block = span * g.kv_factor + 3;
    s.layer = s.block * (g.primary_blocks + g.secondary_blocks) + 5;
  }
  return s;
}

}  // namespace

TEST_CASE("element_offset is the dot product of the coordinate with the layout's strides") {
  Rng r(2026);
  int pools = 0;
  for (const PoolGeometry& g : odd_geometries())
    for (PoolKind kind : {PoolKind::primary, PoolKind::secondary}) {
      check_dot_product(g, contiguous_strides(g, kind), kind);
      check_dot_product(g, padded_strides(g, r), kind);
      if (g.has_scale_pool()) check_dot_product(g.scale_geometry(), contiguous_strides(g.scale_geometry(), kind), kind);
      pools += 2;
    }
  CHECK(pools == (3 * 2 * 4 * 2 - 2 * 2) * 2 * 2);  // layouts x placements x dtypes x F (no nvfp4 split-x), kinds, strides
}

TEST_CASE("a layout lists every coordinate once, the tensor's axes in its order, and folds only one-index axes") {
  const auto names = [](const PoolLayout& l) {
    std::string s;
    for (int32_t i = 0; i < l.rank; ++i) s += std::string("[") + l.axis[i].name + "]";
    return s;
  };
  for (const PoolGeometry& g : odd_geometries()) {
    const PoolStrides s = contiguous_strides(g);
    for (int32_t kv = 0; kv < g.kv_factor; ++kv) {
      const PoolLayout l = pool_layout(g, s, PoolKind::primary, kv);
      std::set<LayoutAxisId> ids;
      for (const LayoutAxis& a : l.axis) ids.insert(a.id);
      CHECK(ids.size() == PoolLayout::kAxes);
      int64_t shown = 1;
      for (int32_t i = 0; i < l.rank; ++i) shown *= l.axis[i].extent;
      CHECK(shown == g.blocks(PoolKind::primary) * g.block_elements());
      for (int32_t i = l.rank; i < PoolLayout::kAxes; ++i) CHECK(l.axis[i].extent == 1);
      const std::string outer = g.placement == LayerPlacement::in_block ? "[block][layer][kv]" : "[layer][block][kv]";
      const std::string inner = g.layout == BlockLayout::nhd   ? "[token][head][dim]"
                                : g.layout == BlockLayout::hnd ? "[head][token][dim]"
                                : kv == 0                      ? "[head][dim/x][token][x]"
                                                               : "[head][dim][token]";
      CHECK(names(l) == outer + inner);
    }
  }
}
