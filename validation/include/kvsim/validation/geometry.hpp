// Host validation of a pool geometry and of caller strides (contract §2):
// every geometry the contract does not support, and every stride set that
// would leave the allocation or map two coordinates to one element, is a
// named error.
#pragma once

#include <cstdio>
#include <string>

#include "errors.hpp"
#include "kvsim/core/geometry.hpp"

namespace kvsim {

// ---------------------------------------------------------------- validation

inline std::string geometry_summary(const PoolGeometry& g) {
  return "L=" + std::to_string(g.layers) + " F=" + std::to_string(g.kv_factor) + " H=" + std::to_string(g.kv_heads) +
         " P=" + std::to_string(g.tokens_per_block) + " D=" + std::to_string(g.head_dim) + " " +
         std::string(dtype_name(g.dtype)) + " " + std::string(layout_name(g.layout)) + " " +
         std::string(placement_name(g.placement));
}

// Most blocks a pool may have: BlockRef is 31 bits of block id plus the pool
// bit, and -1 is BAD_PAGE.
inline constexpr int64_t kMaxBlocks = 0x7FFFFFFE;

// Rejects every geometry the contract does not support, naming field and value.
inline void validate_geometry(const PoolGeometry& g) {
  auto bad = [&](ErrorCode c, const std::string& what) { fail(c, what + " (geometry " + geometry_summary(g) + ")"); };
  if (g.layers < 1) bad(ErrorCode::bad_geometry, "layers = " + std::to_string(g.layers) + " must be >= 1");
  if (g.kv_factor != 1 && g.kv_factor != 2)
    bad(ErrorCode::bad_geometry, "kv_factor = " + std::to_string(g.kv_factor) + " must be 1 (MLA latent) or 2 (K and V)");
  if (g.kv_heads < 1) bad(ErrorCode::bad_geometry, "kv_heads = " + std::to_string(g.kv_heads) + " must be >= 1");
  if (g.tokens_per_block < 1 || g.tokens_per_block > kMaxTokensPerBlock)
    bad(ErrorCode::unsupported_page_size,
        "tokens_per_block = " + std::to_string(g.tokens_per_block) + " must be in 1..1024");
  if (g.head_dim < 1) bad(ErrorCode::unsupported_head_dim, "head_dim = " + std::to_string(g.head_dim) + " must be >= 1");
  if (g.primary_blocks < 1)
    bad(ErrorCode::bad_geometry, "primary_blocks = " + std::to_string(g.primary_blocks) + " must be >= 1");
  if (g.secondary_blocks < 0)
    bad(ErrorCode::bad_geometry, "secondary_blocks = " + std::to_string(g.secondary_blocks) + " must be >= 0");
  if (g.dtype == CacheDtype::nvfp4 && g.head_dim % codec::kNvfp4BlockElems != 0)
    bad(ErrorCode::unsupported_head_dim,
        "head_dim = " + std::to_string(g.head_dim) + " must be a multiple of 16 for nvfp4 (one scale per 16 elements)");
  if (g.layout == BlockLayout::split_x) {
    if (g.dtype == CacheDtype::nvfp4)
      bad(ErrorCode::bad_geometry, "split-x layout does not support nvfp4 (x = 16 bytes / element is not whole)");
    else if (g.head_dim % g.split_x() != 0)
      bad(ErrorCode::unsupported_head_dim, "head_dim = " + std::to_string(g.head_dim) +
                                               " must be a multiple of x = " + std::to_string(g.split_x()) +
                                               " for split-x with " + std::string(dtype_name(g.dtype)));
  }
  if (g.primary_blocks > kMaxBlocks || g.secondary_blocks > kMaxBlocks)
    bad(ErrorCode::bad_geometry, "block counts must be < 2^31 - 1 (a BlockRef holds 31 bits of block id)");
  // The larger pool's size in bits (elements * bits per element) must fit in int64.
  const long double total = static_cast<long double>(g.layers) * g.kv_factor * g.kv_heads * g.tokens_per_block *
                            g.head_dim * static_cast<long double>(g.primary_blocks > g.secondary_blocks ? g.primary_blocks
                                                                                                        : g.secondary_blocks);
  if (total * bits_per_element(g.dtype) > 9.0e18L) {
    // A count, never "1638400000000.000000": exact below 2^64 (each partial
    // product is an integer the 64-bit mantissa holds), else 4 digits.
    char count[32];
    if (total < 18446744073709551616.0L)
      std::snprintf(count, sizeof count, "%llu", static_cast<unsigned long long>(total));
    else
      std::snprintf(count, sizeof count, "%.4Le", total);
    bad(ErrorCode::bad_geometry, "pool of " + std::string(count) + " elements (" +
                                     std::to_string(bits_per_element(g.dtype)) +
                                     " bits each) overflows 64-bit bit offsets");
  }
}

// Caller strides must keep every element inside `pool_elements` and map
// distinct coordinates to distinct elements. Checked with the sufficient
// condition of PyTorch-style overlap checks: sorted by stride, each stride
// exceeds the span of all smaller ones.
inline void validate_strides(const PoolGeometry& g, const PoolStrides& s, PoolKind kind, int64_t pool_elements) {
  const int64_t blocks = g.blocks(kind);
  if (blocks == 0) return;  // an empty pool has no element that could overlap or leave it
  for (int kv = 0; kv < g.kv_factor; ++kv) {
    const InnerStrides& in = s.inner[kv];
    if (in.x < 1 || g.head_dim % in.x != 0)
      fail(ErrorCode::bad_strides, "kv " + std::to_string(kv) + ": x = " + std::to_string(in.x) +
                                       " must divide head_dim = " + std::to_string(g.head_dim));
    using Dim = LayoutAxis;
    // Every axis of the layout, folded ones too, in element_offset's coordinate
    // order (so the first offending axis named does not depend on the layout).
    const PoolLayout layout = pool_layout(g, s, kind, kv);
    Dim dims[PoolLayout::kAxes];
    for (int32_t i = 0; i < PoolLayout::kAxes; ++i) dims[i] = layout.of(static_cast<LayoutAxisId>(i));
    // Checked sums: caller strides may be anything, and a wrapped max_offset
    // would pass the bound below.
    int64_t max_offset = 0;
    for (const Dim& d : dims) {
      if (d.stride < 0) fail(ErrorCode::bad_strides, std::string("stride of ") + d.name + " is negative");
      if (d.extent > 1 && d.stride > (INT64_MAX - max_offset) / (d.extent - 1))
        fail(ErrorCode::bad_strides, std::string("stride of ") + d.name + " = " + std::to_string(d.stride) +
                                         " overflows 64-bit offsets");
      if (d.extent > 0) max_offset += d.stride * (d.extent - 1);
    }
    if (blocks > 0 && max_offset >= pool_elements)
      fail(ErrorCode::bad_strides, "kv " + std::to_string(kv) + ": largest offset " + std::to_string(max_offset) +
                                       " lies beyond the pool of " + std::to_string(pool_elements) + " elements");
    // Overlap check over dims with extent > 1.
    Dim live[PoolLayout::kAxes];
    int n = 0;
    for (const Dim& d : dims)
      if (d.extent > 1) live[n++] = d;
    for (int i = 1; i < n; ++i)
      for (int j = i; j > 0 && live[j].stride < live[j - 1].stride; --j) {
        Dim t = live[j];
        live[j] = live[j - 1];
        live[j - 1] = t;
      }
    int64_t span = 0;
    for (int i = 0; i < n; ++i) {
      if (live[i].stride <= span)
        fail(ErrorCode::bad_strides, std::string("stride of ") + live[i].name + " = " + std::to_string(live[i].stride) +
                                         " overlaps the span " + std::to_string(span) + " of smaller dimensions");
      span += live[i].stride * (live[i].extent - 1);
    }
  }
  if (g.kv_factor == 2 && s.inner[0].x != s.inner[1].x && g.layout != BlockLayout::split_x)
    fail(ErrorCode::bad_strides, "K and V inner x differ outside split-x");
}

}  // namespace kvsim
