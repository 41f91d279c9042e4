// Element-level reads and writes of a cache pool, by element offset from
// element_offset(). Quantized stores take the already-encoded code; the
// conversion conventions live with each op (see ops/*.hpp).
#pragma once

#include <cstring>

#include "tensor.hpp"

namespace kvsim {

// Whether dims [dim0, dim0 + count) of a row are `count` consecutive elements
// of the pool: unit dim stride and one x-group (split-x K keeps x elements
// together; split-x V strides dims by the page size, so it never is).
KVSIM_HD constexpr bool dims_contiguous(const InnerStrides& in, int32_t dim0, int32_t count) {
  if (count <= 1) return true;
  if (in.dim_inner != 1) return false;
  int32_t first_outer = 0, first_inner = 0, last_outer = 0, last_inner = 0;
  split_dim(dim0, in.x, first_outer, first_inner);
  split_dim(dim0 + count - 1, in.x, last_outer, last_inner);
  return first_outer == last_outer;
}

// Whether entries [entry, entry + count) of one (block, head, dim) are `count`
// consecutive pool elements: a unit token stride (split-x V's [dim][token];
// NHD and HND step tokens by heads or dims) and all inside one page of
// `page` entries.
KVSIM_HD constexpr bool entries_contiguous(const InnerStrides& in, int32_t entry, int32_t count, int32_t page) {
  return count <= 1 || (in.token == 1 && entry >= 0 && entry + count <= page);
}

// Dims of one chunk of a pool row, the unit a wide backend gives one thread:
// 16 bytes of the pool (one nvfp4 block of 16 elements for nvfp4). A row is
// ceil(D / chunk) chunks; the last may be short.
KVSIM_HD constexpr int32_t row_chunk_elements(CacheDtype pool_dtype) {
  return pool_dtype == CacheDtype::nvfp4 ? codec::kNvfp4BlockElems : 16 * 8 / bits_per_element(pool_dtype);
}
KVSIM_HD constexpr int32_t row_chunks(int32_t head_dim, CacheDtype pool_dtype) {
  const int32_t c = row_chunk_elements(pool_dtype);
  return (head_dim + c - 1) / c;
}

// f.template operator()<T>() with the pool dtype t as a compile-time T for
// every dtype whose elements are whole bytes (a row loop without a dtype
// switch per element); false, calling nothing, for nvfp4.
template <class F>
KVSIM_HD inline bool with_byte_element_dtype(CacheDtype t, F&& f) {
  switch (t) {
    case CacheDtype::fp32: f.template operator()<CacheDtype::fp32>(); return true;
    case CacheDtype::fp16: f.template operator()<CacheDtype::fp16>(); return true;
    case CacheDtype::bf16: f.template operator()<CacheDtype::bf16>(); return true;
    case CacheDtype::fp8_e4m3: f.template operator()<CacheDtype::fp8_e4m3>(); return true;
    case CacheDtype::fp8_e5m2: f.template operator()<CacheDtype::fp8_e5m2>(); return true;
    case CacheDtype::int8: f.template operator()<CacheDtype::int8>(); return true;
    default: return false;
  }
}

// The most 16-byte words copy_words16 holds at once (a wide backend's copy
// item moves up to this many chunks of a row).
inline constexpr int kCopyWords = 4;

#if defined(__CUDA_ARCH__)
// Word k (16 bytes, both ends aligned) from src[k] to dst[k], k < n <=
// kCopyWords, every load issued before the first store: a store waits for
// its load, so load-store pairs in turn keep one word in flight per thread
// where this keeps n. The words are disjoint, so the bytes are a plain copy's.
__device__ inline void copy_words16(uint8_t* const* dst, const uint8_t* const* src, int n) {
  uint4 w[kCopyWords];
#pragma unroll
  for (int k = 0; k < kCopyWords; ++k)
    if (k < n) w[k] = *reinterpret_cast<const uint4*>(src[k]);
#pragma unroll
  for (int k = 0; k < kCopyWords; ++k)
    if (k < n) *reinterpret_cast<uint4*>(dst[k]) = w[k];
}

// kWords 16-byte words from p (16-byte aligned) into w, every load issued
// before any of them is used.
template <int kWords>
__device__ inline void load_words16(const uint8_t* p, uint4* w) {
#pragma unroll
  for (int k = 0; k < kWords; ++k) w[k] = reinterpret_cast<const uint4*>(p)[k];
}

// kBytes (8 or a multiple of 16) bytes of src to dst (aligned to the word)
// as 8- or 16-byte stores.
template <int kBytes, class Byte>
__device__ inline void store_bytes_by_words(uint8_t* dst, const Byte* src) {
  static_assert(kBytes == 8 || kBytes % 16 == 0, "whole words");
  if constexpr (kBytes == 8) {
    uint2 w;
    memcpy(&w, src, 8);
    *reinterpret_cast<uint2*>(dst) = w;
  } else {
    uint4 w[kBytes / 16];
    memcpy(w, src, kBytes);
#pragma unroll
    for (int k = 0; k < kBytes / 16; ++k) reinterpret_cast<uint4*>(dst)[k] = w[k];
  }
}
#endif

// Moves n bytes between two disjoint runs: a byte copy, so it is exact by
// construction; the device takes 16-, 8- or 4-byte words when both ends are
// aligned (one coalesced vector access per thread instead of n).
KVSIM_HD inline void copy_bytes_run(uint8_t* dst, const uint8_t* src, int64_t n) {
#if defined(__CUDA_ARCH__)
  const uintptr_t align = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src);
  int64_t i = 0;
  if ((align & 15) == 0) {
    for (; i + 16 <= n; i += 16) *reinterpret_cast<uint4*>(dst + i) = *reinterpret_cast<const uint4*>(src + i);
  } else if ((align & 7) == 0) {
    for (; i + 8 <= n; i += 8) *reinterpret_cast<uint2*>(dst + i) = *reinterpret_cast<const uint2*>(src + i);
  } else if ((align & 3) == 0) {
    for (; i + 4 <= n; i += 4) *reinterpret_cast<uint32_t*>(dst + i) = *reinterpret_cast<const uint32_t*>(src + i);
  }
  for (; i < n; ++i) dst[i] = src[i];
#else
  if (n > 0) std::memmove(dst, src, static_cast<size_t>(n));
#endif
}

KVSIM_HD constexpr int bytes_per_element(CacheDtype t) { return bits_per_element(t) / 8; }

// Copy one element's bytes (dtype with >= 8 bits) from src[src_elem] to pool[pool_elem].
KVSIM_HD inline void copy_element(uint8_t* pool, int64_t pool_elem, const void* src, int64_t src_elem, int bytes) {
  const uint8_t* s = static_cast<const uint8_t*>(src) + src_elem * bytes;
  uint8_t* d = pool + pool_elem * bytes;
  for (int i = 0; i < bytes; ++i) d[i] = s[i];
}

KVSIM_HD inline void store_byte(uint8_t* pool, int64_t pool_elem, uint8_t code) { pool[pool_elem] = code; }

// nvfp4: element e lives in byte e >> 1, low nibble for even e.
KVSIM_HD inline void store_nibble(uint8_t* pool, int64_t pool_elem, uint8_t code) {
  uint8_t& b = pool[pool_elem >> 1];
  b = (pool_elem & 1) ? static_cast<uint8_t>((b & 0x0Fu) | (code << 4)) : static_cast<uint8_t>((b & 0xF0u) | (code & 0xFu));
}
KVSIM_HD inline uint8_t load_nibble(const uint8_t* pool, int64_t pool_elem) {
  const uint8_t b = pool[pool_elem >> 1];
  return (pool_elem & 1) ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 0xFu);
}

// The exact fp32 value of a stored element's code, before any per-tensor
// scale: fp32/fp16/bf16 as is, fp8 and int8 decoded. (nvfp4 needs its block
// scale: use codec::nvfp4_decode.)
KVSIM_HD inline float load_cache_code_value(const uint8_t* pool, CacheDtype t, int64_t elem) {
  switch (t) {
    case CacheDtype::fp32: return load_float(pool, t, elem);
    case CacheDtype::fp16:
    case CacheDtype::bf16: return load_float(pool, t, elem);
    case CacheDtype::fp8_e4m3: return codec::e4m3_to_f32(pool[elem]);
    case CacheDtype::fp8_e5m2: return codec::e5m2_to_f32(pool[elem]);
    case CacheDtype::int8: return codec::int8_to_f32(static_cast<int8_t>(pool[elem]));
    case CacheDtype::nvfp4: return codec::e2m1_to_f32(load_nibble(pool, elem));
  }
  return 0.0f;
}

}  // namespace kvsim
