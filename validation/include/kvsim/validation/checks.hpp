// The vocabulary every op's validation is built from: how values are written
// in messages, the one scale rule, the one nvfp4 one-writer-per-byte rule and
// the one dense block-table check. Each op's validate_<op> (ops/*.hpp) says
// which of them apply; none restates one.
#pragma once

#include <cstdio>
#include <initializer_list>
#include <span>
#include <string>

#include "errors.hpp"
#include "kvsim/core/bits.hpp"
#include "kvsim/core/page_table.hpp"
#include "kvsim/core/tensor.hpp"

namespace kvsim {

// ---------------------------------------------------------------- values in messages
// A float with its bits, so a NaN payload or a -0 is visible: "inf (0x7F800000)".
inline std::string float_text(float x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g (0x%08X)", static_cast<double>(x), float_bits(x));
  return buf;
}

inline std::string dims_text(std::initializer_list<int64_t> dims) {
  std::string s = "[";
  int i = 0;
  for (int64_t d : dims) s += (i++ ? ", " : "") + std::to_string(d);
  return s + "]";
}

inline std::string shape_text(const TensorView& t) {
  std::string s = "[";
  for (int i = 0; i < t.rank; ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + "]";
}

inline std::string pool_kind_text(PoolKind kind) { return kind == PoolKind::primary ? "primary" : "secondary"; }

// ---------------------------------------------------------------- scales
// Every scale an op takes is finite (softmax, dequantization and per-tensor
// scales) and, where it divides or decodes a code, also > 0 (nvfp4 global
// decode scales, fp8/int8 quantization scales: contract §4).
enum class ScaleRule : uint8_t { finite, finite_positive };

constexpr bool scale_holds(float x, ScaleRule rule) {
  const bool finite = (float_bits(x) & 0x7F800000u) != 0x7F800000u;  // not Inf, not NaN
  return finite && (rule == ScaleRule::finite || x > 0.0f);
}

// Fails with `code`: "<name> = <value>: rule: <rule_text>".
inline void check_scale(float x, ScaleRule rule, ErrorCode code, const std::string& name, const char* rule_text) {
  if (!scale_holds(x, rule)) fail(code, name + " = " + float_text(x) + ": rule: " + rule_text);
}

// ---------------------------------------------------------------- nvfp4: one writer per byte
// Two e2m1 codes share a byte, so a work item may write a row only if no other
// item writes the other nibble of any byte it touches: every nibble pair
// (2i, 2i + 1) of a row must be one byte. Over the pool's layout (its axes,
// pool_layout in core/geometry.hpp) that is exactly:
//   * the packed axis -- the innermost dim axis with more than one index, with
//     dim/x and dim%x taken as one axis where they are one (dim_outer =
//     x * dim_inner: CuTe's coalesce) -- has stride 1 and an even extent;
//   * every other axis with more than one index has an even stride (so every
//     row starts on a byte).
// Both are needed (a coordinate of 1 on an odd-strided axis starts a row
// mid-byte) and together sufficient (validate_strides already keeps distinct
// coordinates on distinct nibbles). Returns what breaks it, or "" if nothing.
inline std::string nvfp4_byte_rule_break(const PoolLayout& layout) {
  const LayoutAxis& outer = layout.of(LayoutAxisId::dim_outer);
  const LayoutAxis& inner = layout.of(LayoutAxisId::dim_inner);
  const LayoutAxis* packed = &inner;  // the axis whose stride must be 1
  int64_t packed_extent = inner.extent;
  bool merged = false;                // dim/x and dim%x are one axis of stride dim_inner
  if (inner.extent <= 1) {
    packed = &outer;
    packed_extent = outer.extent;
  } else if (outer.extent > 1 && outer.stride == inner.extent * inner.stride) {
    packed_extent = inner.extent * outer.extent;
    merged = true;
  }
  if (packed->stride != 1)
    return std::string(packed->name) + " stride = " + std::to_string(packed->stride) + " (must be 1)";
  if (packed_extent % 2 != 0)
    return std::string(packed->name) + " extent = " + std::to_string(packed_extent) + " (must be even)";
  for (int32_t i = 0; i < PoolLayout::kAxes; ++i) {
    const LayoutAxis& a = layout.axis[i];
    if (&a == packed || (merged && &a == &outer)) continue;
    if (a.extent > 1 && a.stride % 2 != 0)
      return std::string(a.name) + " stride = " + std::to_string(a.stride) + " (must be even)";
  }
  return "";
}

// The rule for every op that writes (or copies) nvfp4 rows of pool `kind`;
// `op` prefixes the message. Call after validate_pool (strides in bounds, x >= 1).
inline void check_nvfp4_one_writer_per_byte(const KvPools& pools, PoolKind kind, const char* op) {
  const PoolGeometry& g = pools.geometry;
  if (g.dtype != CacheDtype::nvfp4 || g.blocks(kind) == 0) return;
  for (int kv = 0; kv < g.kv_factor; ++kv) {
    const std::string bad = nvfp4_byte_rule_break(pool_layout(g, pools.strides_of(kind), kind, kv));
    if (!bad.empty())
      fail(ErrorCode::bad_strides, std::string(op) + ": nvfp4 " + pool_kind_text(kind) + " pool, kv " +
                                       std::to_string(kv) + ": " + bad +
                                       ": rule: each nibble pair (2i, 2i+1) of a row lies in one byte, so every "
                                       "byte has one writer");
  }
}

// ---------------------------------------------------------------- dense block tables
// A dense block table [batch, max_blocks] (TensorRT-LLM / vLLM), row-major;
// `o` prefixes the message ("decode_attention: ").
inline void check_dense_table_shape(std::span<const int32_t> table, size_t batch, int32_t max_blocks,
                                    const std::string& o) {
  if (max_blocks < 0 || static_cast<int64_t>(table.size()) != static_cast<int64_t>(batch) * max_blocks)
    fail(ErrorCode::shape_mismatch, o + "block_table has " + std::to_string(table.size()) +
                                        " entries: rule: batch " + std::to_string(batch) +
                                        " x max_blocks_per_seq " + std::to_string(max_blocks) +
                                        " (max_blocks_per_seq >= 0)");
}

}  // namespace kvsim
