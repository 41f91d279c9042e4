// Element-level reads and writes of a cache pool, by element offset from
// element_offset(). Quantized stores take the already-encoded code; the
// conversion conventions live with each op (see ops/*.hpp).
#pragma once

#include "tensor.hpp"

namespace kvsim {

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
