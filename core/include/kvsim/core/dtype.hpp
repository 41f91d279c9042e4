// Cache element types (contract §2) and their storage sizes.
#pragma once

#include <optional>
#include <string_view>

#include "config.hpp"

namespace kvsim {

enum class CacheDtype : uint8_t { fp32, fp16, bf16, fp8_e4m3, fp8_e5m2, int8, nvfp4 };

inline constexpr CacheDtype kAllCacheDtypes[] = {CacheDtype::fp32,     CacheDtype::fp16,     CacheDtype::bf16,
                                                 CacheDtype::fp8_e4m3, CacheDtype::fp8_e5m2, CacheDtype::int8,
                                                 CacheDtype::nvfp4};

KVSIM_HD constexpr int bits_per_element(CacheDtype t) {
  switch (t) {
    case CacheDtype::fp32: return 32;
    case CacheDtype::fp16:
    case CacheDtype::bf16: return 16;
    case CacheDtype::fp8_e4m3:
    case CacheDtype::fp8_e5m2:
    case CacheDtype::int8: return 8;
    case CacheDtype::nvfp4: return 4;
  }
  return 0;
}

namespace codec {
// Elements per nvfp4 block: one e4m3 scale byte covers this many e2m1 codes
// (contract §4), so the scale pool has head_dim / kNvfp4BlockElems entries per row.
inline constexpr int kNvfp4BlockElems = 16;
}  // namespace codec

// The two 8-bit float formats (contract §2).
KVSIM_HD constexpr bool is_fp8(CacheDtype t) { return t == CacheDtype::fp8_e4m3 || t == CacheDtype::fp8_e5m2; }

// One-byte codes whose values are code x a per-tensor scale (k_scale /
// v_scale, scale_orig_quant): fp8 and int8. nvfp4 carries block scales instead.
KVSIM_HD constexpr bool has_tensor_scale(CacheDtype t) { return is_fp8(t) || t == CacheDtype::int8; }

KVSIM_HD constexpr bool is_quantized(CacheDtype t) {
  return has_tensor_scale(t) || t == CacheDtype::nvfp4;
}

constexpr std::string_view dtype_name(CacheDtype t) {
  switch (t) {
    case CacheDtype::fp32: return "fp32";
    case CacheDtype::fp16: return "fp16";
    case CacheDtype::bf16: return "bf16";
    case CacheDtype::fp8_e4m3: return "fp8_e4m3";
    case CacheDtype::fp8_e5m2: return "fp8_e5m2";
    case CacheDtype::int8: return "int8";
    case CacheDtype::nvfp4: return "nvfp4";
  }
  return "?";
}

constexpr std::optional<CacheDtype> parse_dtype(std::string_view s) {
  for (CacheDtype t : kAllCacheDtypes)
    if (dtype_name(t) == s) return t;
  return std::nullopt;
}

}  // namespace kvsim
