// RoPE (contract §1, §5.3): the cos/sin table of real engines (vLLM's
// cos_sin_cache), computed once on the host in double and rounded to fp32,
// shared by both backends so no libm transcendental reaches an output. The
// rotation itself is a core function with an explicit order.
//
// Table layout: cos_sin[pos * rotary_dim + i] = cos(pos * f_i) for i < R/2,
//               cos_sin[pos * rotary_dim + R/2 + i] = sin(pos * f_i),
// with f_i = base^(-2i / R) and R = rotary_dim (even, <= head_dim).
#pragma once

#include <cmath>
#include <vector>

#include "config.hpp"

namespace kvsim {

enum class RopeStyle : uint8_t {
  none,
  neox,  // GPT-NeoX: pairs (i, i + R/2)
  gptj,  // GPT-J: interleaved pairs (2i, 2i + 1)
};

// Rotate x[0..R) of one head in place, from the table row of its position.
//   out_a = a*c - b*s;  out_b = b*c + a*s   (two products, then one add; no FMA)
KVSIM_HD constexpr void rope_rotate(float* x, const float* cos_sin_row, int32_t rotary_dim, RopeStyle style) {
  const int32_t half = rotary_dim / 2;
  for (int32_t i = 0; i < half; ++i) {
    const float c = cos_sin_row[i];
    const float s = cos_sin_row[half + i];
    const int32_t ia = style == RopeStyle::gptj ? 2 * i : i;
    const int32_t ib = style == RopeStyle::gptj ? 2 * i + 1 : i + half;
    const float a = x[ia];
    const float b = x[ib];
    const float ac = a * c, bs = b * s, bc = b * c, as = a * s;
    x[ia] = ac - bs;
    x[ib] = bc + as;
  }
}

}  // namespace kvsim
