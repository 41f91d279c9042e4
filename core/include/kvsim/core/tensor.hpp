// Plain descriptors shared by every op and every backend: a strided tensor
// view and the set of pools of one geometry. Pointers point into the memory
// of the backend that runs the op (host memory for cpu, device memory for
// cuda); the descriptors themselves are trivially copyable, so a kernel takes
// them by value (FlashInfer's paged_kv_t idea: one struct for host and device).
#pragma once

#include <type_traits>

#include "codecs.hpp"
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
  // Elements from `data` to one past the last one the view addresses (strides
  // >= 0, as validation requires; 0 for a view of no elements): what a copy of
  // the view must hold. span_bytes: the same in whole bytes.
  KVSIM_HD constexpr int64_t span_elements() const {
    if (numel() == 0) return 0;
    int64_t last = 0;
    for (int i = 0; i < rank; ++i) last += stride[i] * (shape[i] - 1);
    return last + 1;
  }
  KVSIM_HD constexpr int64_t span_bytes() const { return (span_elements() * bits_per_element(dtype) + 7) / 8; }
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

// The one fp32 NaN every computed float output holds: 0x7FFFFFFF, what the
// GPU's f32 arithmetic produces for any NaN result. x86 instead propagates an
// operand's payload (0x7FC01234) or makes 0xFFC00000, so an output that came
// out of arithmetic is canonicalised here before it is stored; bytes then agree
// across backends. (fp16/bf16 outputs are canonical already: their codecs
// map NaN to 0x7FFF.) Bit copies of fp32 pool bytes never come through here
// and keep their payloads.
inline constexpr uint32_t kCanonicalF32NaN = 0x7FFFFFFFu;
KVSIM_HD constexpr float canonical_nan(float v) { return is_nan(v) ? bits_float(kCanonicalF32NaN) : v; }

// Rounds an fp32 value to a fp32/fp16/bf16 tensor element (RNE, canonical NaN).
KVSIM_HD constexpr void store_float(void* data, CacheDtype t, int64_t offset, float v) {
  switch (t) {
    case CacheDtype::fp32: static_cast<float*>(data)[offset] = canonical_nan(v); break;
    case CacheDtype::fp16: static_cast<uint16_t*>(data)[offset] = codec::f32_to_f16(v); break;
    case CacheDtype::bf16: static_cast<uint16_t*>(data)[offset] = codec::f32_to_bf16(v); break;
    default: break;
  }
}

// v[i] = load_float(data, t, at + i * step) and store_float(data, t, at + i *
// step, v[i]) for i < n, with the dtype switch outside the loop (a narrow
// backend's rows: the same values, element for element).
template <CacheDtype T>
KVSIM_HD constexpr void load_floats_as(const void* data, int64_t at, int64_t step, int32_t n, float* v) {
  for (int32_t i = 0; i < n; ++i) v[i] = load_float(data, T, at + i * step);
}
KVSIM_HD constexpr void load_floats(const void* data, CacheDtype t, int64_t at, int64_t step, int32_t n, float* v) {
  switch (t) {
    case CacheDtype::fp32: return load_floats_as<CacheDtype::fp32>(data, at, step, n, v);
    case CacheDtype::fp16: return load_floats_as<CacheDtype::fp16>(data, at, step, n, v);
    case CacheDtype::bf16: return load_floats_as<CacheDtype::bf16>(data, at, step, n, v);
    default: for (int32_t i = 0; i < n; ++i) v[i] = 0.0f;  // not a float input type (load_float's 0)
  }
}
template <CacheDtype T>
KVSIM_HD constexpr void store_floats_as(void* data, int64_t at, int64_t step, int32_t n, const float* v) {
  for (int32_t i = 0; i < n; ++i) store_float(data, T, at + i * step, v[i]);
}
KVSIM_HD constexpr void store_floats(void* data, CacheDtype t, int64_t at, int64_t step, int32_t n, const float* v) {
  switch (t) {
    case CacheDtype::fp32: return store_floats_as<CacheDtype::fp32>(data, at, step, n, v);
    case CacheDtype::fp16: return store_floats_as<CacheDtype::fp16>(data, at, step, n, v);
    case CacheDtype::bf16: return store_floats_as<CacheDtype::bf16>(data, at, step, n, v);
    default: break;
  }
}

KVSIM_HD constexpr bool is_float_input(CacheDtype t) {
  return t == CacheDtype::fp32 || t == CacheDtype::fp16 || t == CacheDtype::bf16;
}

// allocation_elements value meaning "the pool's own dense size".
inline constexpr int64_t kPoolOwnSize = -1;

// Primary and secondary pools of one geometry, with nvfp4 block-scale pools.
struct KvPools {
  PoolGeometry geometry;
  void* data[2] = {nullptr, nullptr};    // [PoolKind]
  void* scales[2] = {nullptr, nullptr};  // [PoolKind], nvfp4 only
  PoolStrides strides[2];
  PoolStrides scale_strides[2];
  // Elements (nibbles for nvfp4; one byte each for scales) of the allocation
  // that data[k] / scales[k] point into, counted from that pointer. Strides
  // are checked against it, not against the pool's dense size, so a pool may
  // be a strided view into a larger tensor (FlashInfer's [pages, 2, P, H, D]
  // per layer, see make_shared_kv_pools). kPoolOwnSize = the dense size.
  int64_t allocation_elements[2] = {kPoolOwnSize, kPoolOwnSize};
  int64_t scale_allocation_elements[2] = {kPoolOwnSize, kPoolOwnSize};

  KVSIM_HD constexpr const PoolStrides& strides_of(PoolKind k) const { return strides[static_cast<int>(k)]; }
  KVSIM_HD constexpr uint8_t* bytes(PoolKind k) const { return static_cast<uint8_t*>(data[static_cast<int>(k)]); }
  KVSIM_HD constexpr uint8_t* scale_bytes(PoolKind k) const {
    return static_cast<uint8_t*>(scales[static_cast<int>(k)]);
  }
  KVSIM_HD constexpr int64_t data_allocation(PoolKind k) const {
    const int64_t n = allocation_elements[static_cast<int>(k)];
    return n == kPoolOwnSize ? geometry.pool_elements(k) : n;
  }
  KVSIM_HD constexpr int64_t scale_allocation(PoolKind k) const {
    const int64_t n = scale_allocation_elements[static_cast<int>(k)];
    return n == kPoolOwnSize ? (geometry.has_scale_pool() ? geometry.scale_geometry().pool_elements(k) : 0) : n;
  }
};
static_assert(std::is_trivially_copyable_v<KvPools>, "kernels take KvPools by value");

// FlashInfer's paged KV cache: per layer one tensor [pages, 2, P, H, D] (NHD)
// or [pages, 2, H, P, D] (HND); K is t[:, 0] and V is t[:, 1], two strided
// views with a page stride of 2*H*P*D, V starting H*P*D elements in. Here the
// layers' tensors lie back to back in one allocation of
// layers * allocation_pages * 2*H*P*D elements (torch.empty(L, pages, 2, ...)),
// of which the pool uses the first g.primary_blocks pages of each layer
// (FlashInfer sizes the tensor for its max pages; the pool may use fewer).
// nvfp4 scales (one byte per 16 elements) follow the same arrangement with
// D / 16 in `scale_allocation`. The secondary pool is not part of FlashInfer's
// tensor: give it its own dense allocation (or none, with secondary_blocks 0).
struct SharedKvAllocation {
  void* data = nullptr;
  void* scales = nullptr;     // nvfp4 only
  int64_t pages = 0;          // pages per layer in the allocation, >= the pool's blocks
};

inline PoolStrides shared_kv_strides(const PoolGeometry& g, int64_t allocation_pages) {
  PoolStrides s{};
  s.kv = g.inner_elements();
  s.block = 2 * s.kv;
  s.layer = allocation_pages * s.block;
  s.inner[0] = contiguous_inner_strides(g, 0);
  s.inner[1] = contiguous_inner_strides(g, 1);
  return s;
}

inline int64_t scale_pool_bytes(const PoolGeometry& g, PoolKind k) {
  return g.has_scale_pool() ? g.scale_geometry().pool_bytes(k) : 0;
}

}  // namespace kvsim
