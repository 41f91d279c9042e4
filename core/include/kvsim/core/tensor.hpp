// Plain descriptors shared by every op and every backend: a strided tensor
// view and the set of pools of one geometry. Pointers point into the memory
// of the backend that runs the op (host memory for cpu, device memory for
// cuda); the descriptors themselves are trivially copyable, so a kernel takes
// them by value (FlashInfer's paged_kv_t idea: one struct for host and device).
#pragma once

#include <cstdio>
#include <string>

#include "codecs.hpp"
#include "errors.hpp"
#include "geometry.hpp"

namespace kvsim {

inline constexpr int kMaxRank = 4;

struct TensorView {
  void* data = nullptr;
  CacheDtype dtype = CacheDtype::fp32;  // element type (fp32/fp16/bf16 inputs, fp8/int8 bytes, ...)
  int32_t rank = 0;
  int64_t shape[kMaxRank] = {};
  int64_t stride[kMaxRank] = {};  // in elements

  KVSIM_HD constexpr bool empty() const { return data == nullptr; }
  KVSIM_HD constexpr int64_t offset(int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) const {
    return i0 * stride[0] + i1 * stride[1] + i2 * stride[2] + i3 * stride[3];
  }
  KVSIM_HD constexpr int64_t numel() const {
    int64_t n = rank > 0 ? 1 : 0;
    for (int i = 0; i < rank; ++i) n *= shape[i];
    return n;
  }
};

// Row-major view helper.
inline TensorView contiguous_view(void* data, CacheDtype dtype, std::initializer_list<int64_t> shape) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.rank = static_cast<int32_t>(shape.size());
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  int64_t stride = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.stride[d] = stride;
    stride *= t.shape[d];
  }
  return t;
}

// Reads element `offset` of a fp32/fp16/bf16 tensor as its exact fp32 value.
KVSIM_HD constexpr float load_float(const void* data, CacheDtype t, int64_t offset) {
  switch (t) {
    case CacheDtype::fp32: return static_cast<const float*>(data)[offset];
    case CacheDtype::fp16: return codec::f16_to_f32(static_cast<const uint16_t*>(data)[offset]);
    case CacheDtype::bf16: return codec::bf16_to_f32(static_cast<const uint16_t*>(data)[offset]);
    default: return 0.0f;  // not a float input type; rejected by validation
  }
}

// Rounds an fp32 value to a fp32/fp16/bf16 tensor element (RNE, canonical NaN).
KVSIM_HD constexpr void store_float(void* data, CacheDtype t, int64_t offset, float v) {
  switch (t) {
    case CacheDtype::fp32: static_cast<float*>(data)[offset] = v; break;
    case CacheDtype::fp16: static_cast<uint16_t*>(data)[offset] = codec::f32_to_f16(v); break;
    case CacheDtype::bf16: static_cast<uint16_t*>(data)[offset] = codec::f32_to_bf16(v); break;
    default: break;
  }
}

KVSIM_HD constexpr bool is_float_input(CacheDtype t) {
  return t == CacheDtype::fp32 || t == CacheDtype::fp16 || t == CacheDtype::bf16;
}

// Primary and secondary pools of one geometry, with nvfp4 block-scale pools.
struct KvPools {
  PoolGeometry geometry;
  void* data[2] = {nullptr, nullptr};    // [PoolKind]
  void* scales[2] = {nullptr, nullptr};  // [PoolKind], nvfp4 only
  PoolStrides strides[2];
  PoolStrides scale_strides[2];

  KVSIM_HD constexpr const PoolStrides& strides_of(PoolKind k) const { return strides[static_cast<int>(k)]; }
  KVSIM_HD constexpr uint8_t* bytes(PoolKind k) const { return static_cast<uint8_t*>(data[static_cast<int>(k)]); }
  KVSIM_HD constexpr uint8_t* scale_bytes(PoolKind k) const {
    return static_cast<uint8_t*>(scales[static_cast<int>(k)]);
  }
};

// An nvfp4 global decode scale g must be finite and > 0 (SPEC §4); every op
// that takes one checks it here. `name` says which (e.g. "decode_attention:
// k_global_scale").
inline void validate_global_scale(float g, const std::string& name) {
  if (g > 0.0f && g <= 3.4028234663852886e38f) return;
  char value[64];
  std::snprintf(value, sizeof value, "%.9g (0x%08X)", static_cast<double>(g), float_bits(g));
  fail(ErrorCode::bad_global_scale, name + " = " + value + ": rule: an nvfp4 global decode scale is finite and > 0");
}

// The layer an op addresses must exist in the pool. `op` prefixes the message.
inline void validate_layer(const PoolGeometry& g, int32_t layer, const std::string& op) {
  if (layer < 0 || layer >= g.layers)
    fail(ErrorCode::bad_argument, op + "layer = " + std::to_string(layer) + ": rule: layer is in [0, layers = " +
                                      std::to_string(g.layers) + ")");
}

inline int64_t scale_pool_bytes(const PoolGeometry& g, PoolKind k) {
  return g.has_scale_pool() ? g.scale_geometry().pool_bytes(k) : 0;
}

}  // namespace kvsim
