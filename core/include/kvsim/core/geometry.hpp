// Pool geometry, block layouts, layer placement, strides and THE offset
// function (contract §2). Every element offset in kvsim -- both backends, the
// `explain` subcommand and the docs -- comes from element_offset() below.
//
// A pool is one tensor per pool kind (primary, secondary):
//   in_block  (TensorRT-LLM):        [block][layer][kv][block-inner]
//   per_layer (FlashInfer / vLLM):   [layer][block][kv][block-inner]
// block-inner, for one (layer, kv):
//   NHD:            [token][head][dim]
//   HND:            [head][token][dim]
//   split-x K:      [head][dim/x][token][x]      (vLLM, x = 16 bytes / element)
//   split-x V:      [head][dim][token]
// Offsets are in elements (nibbles for nvfp4) and 64-bit throughout:
// FlashInfer #3130 read the wrong page through 32-bit stride arithmetic.
#pragma once

#include <optional>
#include <string_view>

#include "dtype.hpp"

namespace kvsim {

enum class BlockLayout : uint8_t { nhd, hnd, split_x };
enum class LayerPlacement : uint8_t { in_block, per_layer };
enum class PoolKind : uint8_t { primary, secondary };

constexpr std::string_view layout_name(BlockLayout l) {
  switch (l) {
    case BlockLayout::nhd: return "nhd";
    case BlockLayout::hnd: return "hnd";
    case BlockLayout::split_x: return "split-x";
  }
  return "?";
}
constexpr std::optional<BlockLayout> parse_layout(std::string_view s) {
  if (s == "nhd" || s == "NHD") return BlockLayout::nhd;
  if (s == "hnd" || s == "HND") return BlockLayout::hnd;
  if (s == "split-x" || s == "split_x") return BlockLayout::split_x;
  return std::nullopt;
}
constexpr std::string_view placement_name(LayerPlacement p) {
  return p == LayerPlacement::in_block ? "in_block" : "per_layer";
}
constexpr std::optional<LayerPlacement> parse_placement(std::string_view s) {
  if (s == "in_block" || s == "in-block") return LayerPlacement::in_block;
  if (s == "per_layer" || s == "per-layer") return LayerPlacement::per_layer;
  return std::nullopt;
}

inline constexpr int32_t kMaxTokensPerBlock = 1024;

// Divides a token index by the page size. Powers of two take the shift/mask
// path real kernels use; the result is identical either way (tested).
struct PageDivider {
  int32_t page_size = 1;
  int32_t shift = 0;
  bool pow2 = true;

  KVSIM_HD static constexpr PageDivider make(int32_t p) {
    PageDivider d;
    d.page_size = p;
    d.pow2 = p > 0 && (p & (p - 1)) == 0;
    d.shift = 0;
    if (d.pow2)
      while ((1 << d.shift) < p) ++d.shift;
    return d;
  }
  // x >= 0: quotient (page) and remainder (entry).
  KVSIM_HD constexpr int64_t div(int64_t x) const { return pow2 ? (x >> shift) : x / page_size; }
  KVSIM_HD constexpr int32_t mod(int64_t x) const {
    return static_cast<int32_t>(pow2 ? (x & (page_size - 1)) : x % page_size);
  }
};

struct PoolGeometry {
  int32_t layers = 1;
  int32_t kv_factor = 2;  // 2 = separate K and V; 1 = one latent tensor (MLA)
  int32_t kv_heads = 1;
  int32_t tokens_per_block = 16;
  int32_t head_dim = 128;
  CacheDtype dtype = CacheDtype::bf16;
  BlockLayout layout = BlockLayout::nhd;
  LayerPlacement placement = LayerPlacement::in_block;
  int64_t primary_blocks = 1;
  int64_t secondary_blocks = 0;

  KVSIM_HD constexpr int64_t blocks(PoolKind k) const {
    return k == PoolKind::primary ? primary_blocks : secondary_blocks;
  }
  // vLLM's x: elements per 16 bytes (fp32 4, 16-bit 8, 8-bit 16).
  KVSIM_HD constexpr int32_t split_x() const { return 128 / bits_per_element(dtype); }
  // Elements of one (block, layer, kv) sub-block.
  KVSIM_HD constexpr int64_t inner_elements() const {
    return static_cast<int64_t>(kv_heads) * tokens_per_block * head_dim;
  }
  // Elements of one block across all layers and K/V.
  KVSIM_HD constexpr int64_t block_elements() const {
    return static_cast<int64_t>(layers) * kv_factor * inner_elements();
  }
  KVSIM_HD constexpr int64_t pool_elements(PoolKind k) const { return blocks(k) * block_elements(); }
  KVSIM_HD constexpr int64_t bytes_for(int64_t elements) const {
    return (elements * bits_per_element(dtype) + 7) / 8;
  }
  KVSIM_HD constexpr int64_t block_bytes() const { return bytes_for(block_elements()); }
  KVSIM_HD constexpr int64_t pool_bytes(PoolKind k) const { return bytes_for(pool_elements(k)); }
  KVSIM_HD constexpr PageDivider page_divider() const { return PageDivider::make(tokens_per_block); }

  // The nvfp4 block-scale pool: the data pool's shape with head_dim / 16, one
  // byte per entry (linear K and V scales, as FlashInfer's append writes them).
  KVSIM_HD constexpr bool has_scale_pool() const { return dtype == CacheDtype::nvfp4; }
  KVSIM_HD constexpr PoolGeometry scale_geometry() const {
    PoolGeometry g = *this;
    g.head_dim = head_dim / codec::kNvfp4BlockElems;
    g.dtype = CacheDtype::fp8_e4m3;  // one byte per entry
    g.layout = layout == BlockLayout::split_x ? BlockLayout::nhd : layout;
    return g;
  }
};

// Strides (in elements) of the inner [head][token][dim] coordinates of one
// (layer, kv) sub-block. dim is split as (dim / x, dim % x) so vLLM's split-x
// K layout is one more stride, not a special case: non-split layouts use x = D.
struct InnerStrides {
  int64_t head = 0;
  int64_t token = 0;
  int64_t dim_outer = 0;  // stride of dim / x
  int64_t dim_inner = 1;  // stride of dim % x
  int32_t x = 1;
};

struct PoolStrides {
  int64_t block = 0;
  int64_t layer = 0;
  int64_t kv = 0;
  InnerStrides inner[2];  // [kv]: split-x K and V differ
};

KVSIM_HD constexpr InnerStrides contiguous_inner_strides(const PoolGeometry& g, int32_t kv) {
  const int64_t H = g.kv_heads, P = g.tokens_per_block, D = g.head_dim;
  InnerStrides s{};
  switch (g.layout) {
    case BlockLayout::nhd:
      s = InnerStrides{D, H * D, D, 1, g.head_dim};
      break;
    case BlockLayout::hnd:
      s = InnerStrides{P * D, D, D, 1, g.head_dim};
      break;
    case BlockLayout::split_x: {
      const int64_t x = g.split_x();
      if (kv == 0)
        s = InnerStrides{D * P, x, P * x, 1, static_cast<int32_t>(x)};  // K [head][dim/x][token][x]
      else
        s = InnerStrides{D * P, 1, 0, P, g.head_dim};  // V [head][dim][token]
      break;
    }
  }
  return s;
}

KVSIM_HD constexpr bool same_inner_strides(const InnerStrides& a, const InnerStrides& b) {
  return a.head == b.head && a.token == b.token && a.dim_outer == b.dim_outer && a.dim_inner == b.dim_inner && a.x == b.x;
}
KVSIM_HD constexpr bool same_strides(const PoolStrides& a, const PoolStrides& b) {
  return a.block == b.block && a.layer == b.layer && a.kv == b.kv && same_inner_strides(a.inner[0], b.inner[0]) &&
         same_inner_strides(a.inner[1], b.inner[1]);
}

// Dense strides of the pool tensor for one pool kind. per_layer needs the
// pool's block count for its layer stride, so primary and secondary differ.
KVSIM_HD constexpr PoolStrides contiguous_strides(const PoolGeometry& g, PoolKind kind = PoolKind::primary) {
  PoolStrides s{};
  const int64_t inner = g.inner_elements();
  s.kv = inner;
  if (g.placement == LayerPlacement::in_block) {
    s.layer = g.kv_factor * inner;
    s.block = g.layers * s.layer;
  } else {
    s.block = g.kv_factor * inner;
    s.layer = g.blocks(kind) * s.block;
  }
  s.inner[0] = contiguous_inner_strides(g, 0);
  s.inner[1] = contiguous_inner_strides(g, 1);
  return s;
}

// ---------------------------------------------------------------- the layout object
// A pool tensor of one (pool kind, kv), as CuTe writes a layout: its axes,
// each (name, extent, stride in elements), in the tensor's order (outermost
// first):
//   in_block [block][layer][kv] / per_layer [layer][block][kv], then
//   NHD [token][head][dim], HND [head][token][dim],
//   split-x K [head][dim/x][token][x], split-x V [head][dim][token].
// The dim coordinate is always two axes, (dim / x, dim % x), so split-x K is
// one more axis and not a special case; where the tensor shows dim as one
// axis (x = head_dim), the dim/x axis of one index is folded: it follows the
// tensor's `rank` axes, so `kvsim layout` and `kvsim explain` (which print
// axis[0, rank)) do not show it while stride validation (which walks all
// kAxes) still checks its stride. The nvfp4 scale pool is the same list over
// scale_geometry() and the scale strides. element_offset below is the dot
// product of (block, layer, kv, head, token, dim / x, dim % x) with these
// strides (tested for every layout over odd sizes): the one mapping.
enum class LayoutAxisId : uint8_t { block, layer, kv, head, token, dim_outer, dim_inner };

struct LayoutAxis {
  LayoutAxisId id = LayoutAxisId::block;
  const char* name = "";
  int64_t extent = 0;
  int64_t stride = 0;
};

struct PoolLayout {
  static constexpr int32_t kAxes = 7;
  int32_t rank = 0;  // the axes the tensor shows; axis[rank, kAxes) are folded (one index by the layout)
  LayoutAxis axis[kAxes];

  KVSIM_HD constexpr const LayoutAxis& of(LayoutAxisId id) const {
    for (int32_t i = 0; i < kAxes - 1; ++i)
      if (axis[i].id == id) return axis[i];
    return axis[kAxes - 1];
  }
};

// x < 1 gives dim/x no index (validate_strides rejects such strides).
KVSIM_HD constexpr PoolLayout pool_layout(const PoolGeometry& g, const PoolStrides& s, PoolKind kind, int32_t kv) {
  using A = LayoutAxisId;
  const InnerStrides& in = s.inner[kv];
  const LayoutAxis block{A::block, "block", g.blocks(kind), s.block};
  const LayoutAxis layer{A::layer, "layer", g.layers, s.layer};
  const LayoutAxis kvs{A::kv, "kv", g.kv_factor, s.kv};
  const LayoutAxis head{A::head, "head", g.kv_heads, in.head};
  const LayoutAxis token{A::token, "token", g.tokens_per_block, in.token};
  const int64_t outer_extent = in.x > 0 ? g.head_dim / in.x : 0;
  const LayoutAxis dim_outer{A::dim_outer, "dim/x", outer_extent, in.dim_outer};
  // Outside split-x K, x == head_dim: dim / x is always 0 and dim % x is dim.
  const LayoutAxis dim{A::dim_inner, "dim", in.x, in.dim_inner};
  const LayoutAxis x{A::dim_inner, "x", in.x, in.dim_inner};
  PoolLayout l{};
  const bool in_block = g.placement == LayerPlacement::in_block;
  l.axis[0] = in_block ? block : layer;
  l.axis[1] = in_block ? layer : block;
  l.axis[2] = kvs;
  l.rank = 6;
  switch (g.layout) {
    case BlockLayout::nhd: l.axis[3] = token, l.axis[4] = head, l.axis[5] = dim; break;
    case BlockLayout::hnd: l.axis[3] = head, l.axis[4] = token, l.axis[5] = dim; break;
    case BlockLayout::split_x:
      if (kv == 0) {
        l.axis[3] = head, l.axis[4] = dim_outer, l.axis[5] = token, l.axis[6] = x;
        l.rank = 7;
        return l;
      }
      l.axis[3] = head, l.axis[4] = dim, l.axis[5] = token;
      break;
  }
  l.axis[6] = dim_outer;  // folded
  return l;
}

// THE offset function: element offset of (block, layer, kv, head, token, dim)
// in a pool tensor with strides s. For nvfp4 the unit is a nibble: byte =
// offset >> 1, element 2i in the low nibble.
// Index of the lowest set bit (x > 0).
KVSIM_HD constexpr int32_t lowest_bit(int32_t x) {
#if defined(__CUDA_ARCH__)
  return __ffs(x) - 1;
#else
  return __builtin_ctz(static_cast<unsigned>(x));
#endif
}

// (dim / x, dim % x) for dim >= 0: shift and mask when x is a power of two
// (every split-x x and most head dims), the same numbers without a division.
KVSIM_HD constexpr void split_dim(int32_t dim, int32_t x, int32_t& outer, int32_t& inner) {
  if ((x & (x - 1)) == 0) {
    outer = dim >> lowest_bit(x);
    inner = dim & (x - 1);
  } else {
    outer = dim / x;
    inner = dim % x;
  }
}

KVSIM_HD constexpr int64_t element_offset(const PoolStrides& s, int64_t block, int32_t layer, int32_t kv,
                                          int32_t head, int32_t token, int32_t dim) {
  const InnerStrides& in = s.inner[kv];
  int32_t outer = 0, inner = 0;
  split_dim(dim, in.x, outer, inner);
  return block * s.block + static_cast<int64_t>(layer) * s.layer + static_cast<int64_t>(kv) * s.kv +
         static_cast<int64_t>(head) * in.head + static_cast<int64_t>(token) * in.token +
         static_cast<int64_t>(outer) * in.dim_outer + static_cast<int64_t>(inner) * in.dim_inner;
}

// Byte holding an element (the element's first byte for multi-byte types).
KVSIM_HD constexpr int64_t element_byte_offset(int64_t element_offset, CacheDtype t) {
  return element_offset * bits_per_element(t) / 8;
}

// Offset of the nvfp4 scale byte covering dim (dim / 16) in the scale pool.
KVSIM_HD constexpr int64_t scale_offset(const PoolStrides& scale_strides, int64_t block, int32_t layer, int32_t kv,
                                        int32_t head, int32_t token, int32_t dim) {
  return element_offset(scale_strides, block, layer, kv, head, token, dim / codec::kNvfp4BlockElems);
}

}  // namespace kvsim
