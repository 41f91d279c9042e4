// Host validation of the plain descriptors (contract §2, §4): the layer an op
// addresses, a pool's memory and strides, the nvfp4 global scale, and
// FlashInfer's shared [pages, 2, ...] allocation (checked while it is built).
#pragma once

#include <cstdio>
#include <string>

#include "checks.hpp"
#include "errors.hpp"
#include "geometry.hpp"
#include "kvsim/core/tensor.hpp"

namespace kvsim {

// An nvfp4 global decode scale g must be finite and > 0 (contract §4); every op
// that takes one checks it here. `name` says which (e.g. "decode_attention:
// k_global_scale").
inline void validate_global_scale(float g, const std::string& name) {
  check_scale(g, ScaleRule::finite_positive, ErrorCode::bad_global_scale, name,
              "an nvfp4 global decode scale is finite and > 0");
}

// The layer an op addresses must exist in the pool. `op` prefixes the message.
inline void validate_layer(const PoolGeometry& g, int32_t layer, const std::string& op) {
  if (layer < 0 || layer >= g.layers)
    fail(ErrorCode::bad_argument, op + "layer = " + std::to_string(layer) + ": rule: layer is in [0, layers = " +
                                      std::to_string(g.layers) + ")");
}

// Everything an op needs of one pool kind before it touches it, so that every
// offset it computes lands inside memory the caller owns: a valid geometry,
// the data (and nvfp4 scale) pointers, a known allocation size, and strides
// that keep every element of the pool inside that allocation without two
// coordinates sharing an element. Every op's validation calls this for each
// pool kind it reads or writes; `op` prefixes the message ("copy_blocks: ").
inline void validate_pool(const KvPools& pools, PoolKind kind, const std::string& op) {
  const PoolGeometry& g = pools.geometry;
  validate_geometry(g);
  const int k = static_cast<int>(kind);
  const std::string name = kind == PoolKind::primary ? "primary" : "secondary";
  if (g.blocks(kind) == 0) return;  // an empty pool is never addressed (block refs are checked against 0 blocks)
  if (pools.data[k] == nullptr) fail(ErrorCode::bad_argument, op + "the " + name + " data pool is not allocated");
  // Element counts times 8 bits must stay a valid 64-bit bit offset (nvfp4 byte = element >> 1).
  const auto check_allocation = [&](int64_t n, const char* what) {
    if ((n < 0 && n != kPoolOwnSize) || n > (int64_t{1} << 59))
      fail(ErrorCode::bad_argument, op + "the " + name + " " + what + " allocation of " + std::to_string(n) +
                                        " elements: rule: kPoolOwnSize (-1) or a count in [0, 2^59]");
  };
  check_allocation(pools.allocation_elements[k], "data");
  validate_strides(g, pools.strides[k], kind, pools.data_allocation(kind));
  if (g.has_scale_pool()) {
    if (pools.scales[k] == nullptr)
      fail(ErrorCode::bad_argument, op + "the " + name + " nvfp4 scale pool is not allocated");
    check_allocation(pools.scale_allocation_elements[k], "scale");
    validate_strides(g.scale_geometry(), pools.scale_strides[k], kind, pools.scale_allocation(kind));
  }
}

inline KvPools make_shared_kv_pools(const PoolGeometry& g, const SharedKvAllocation& primary,
                                    const SharedKvAllocation& secondary = {}) {
  validate_geometry(g);
  if (g.kv_factor != 2 || g.layout == BlockLayout::split_x || g.placement != LayerPlacement::per_layer)
    fail(ErrorCode::bad_geometry, "FlashInfer's shared [pages, 2, ...] allocation needs kv_factor 2, layout nhd or hnd "
                                  "and per_layer placement (" + geometry_summary(g) + ")");
  KvPools pools;
  pools.geometry = g;
  const SharedKvAllocation* alloc[2] = {&primary, &secondary};
  for (int k = 0; k < 2; ++k) {
    const PoolKind kind = static_cast<PoolKind>(k);
    const SharedKvAllocation& a = *alloc[k];
    if (g.blocks(kind) == 0 && a.data == nullptr) continue;
    if (a.pages < g.blocks(kind))
      fail(ErrorCode::bad_argument, std::string(k == 0 ? "primary" : "secondary") + " allocation has " +
                                        std::to_string(a.pages) + " pages per layer for a pool of " +
                                        std::to_string(g.blocks(kind)) + " blocks: rule: pages >= blocks");
    if (a.pages > (int64_t{1} << 59) / (g.layers * 2 * g.inner_elements()))
      fail(ErrorCode::bad_argument, std::to_string(a.pages) + " pages per layer overflow 64-bit offsets");
    pools.data[k] = a.data;
    pools.strides[k] = shared_kv_strides(g, a.pages);
    pools.allocation_elements[k] = g.layers * a.pages * 2 * g.inner_elements();
    if (g.has_scale_pool()) {
      const PoolGeometry sg = g.scale_geometry();
      pools.scales[k] = a.scales;
      pools.scale_strides[k] = shared_kv_strides(sg, a.pages);
      pools.scale_allocation_elements[k] = sg.layers * a.pages * 2 * sg.inner_elements();
    }
    validate_pool(pools, kind, "make_shared_kv_pools: ");
  }
  return pools;
}

}  // namespace kvsim
