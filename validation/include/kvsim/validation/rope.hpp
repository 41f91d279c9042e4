// The RoPE cos/sin table (contract §1, §5.3), built once on the host in double
// and rounded to fp32; its arguments are checked while it is built. The
// rotation that reads it is core's rope_rotate.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "errors.hpp"
#include "kvsim/core/rope.hpp"

namespace kvsim {

struct RopeTable {
  int32_t rotary_dim = 0;
  int64_t max_position = 0;
  double base = 10000.0;
  std::vector<float> cos_sin;  // [max_position][rotary_dim]
};

inline RopeTable build_rope_table(int32_t rotary_dim, int64_t max_position, double base = 10000.0) {
  if (rotary_dim <= 0 || rotary_dim % 2 != 0)
    fail(ErrorCode::bad_argument, "rotary_dim = " + std::to_string(rotary_dim) + " must be even and > 0");
  if (max_position <= 0) fail(ErrorCode::bad_argument, "max_position must be > 0");
  if (!(base > 1.0)) fail(ErrorCode::bad_argument, "rope base must be > 1");
  RopeTable t;
  t.rotary_dim = rotary_dim;
  t.max_position = max_position;
  t.base = base;
  const int32_t half = rotary_dim / 2;
  t.cos_sin.resize(static_cast<size_t>(max_position) * rotary_dim);
  for (int64_t p = 0; p < max_position; ++p)
    for (int32_t i = 0; i < half; ++i) {
      const double inv_freq = 1.0 / std::pow(base, (2.0 * i) / rotary_dim);
      const double angle = static_cast<double>(p) * inv_freq;
      t.cos_sin[p * rotary_dim + i] = static_cast<float>(std::cos(angle));
      t.cos_sin[p * rotary_dim + half + i] = static_cast<float>(std::sin(angle));
    }
  return t;
}

}  // namespace kvsim
