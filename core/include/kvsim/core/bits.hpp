// Bit casts usable on host and device and in constant expressions (the builtin
// behind std::bit_cast, which both g++ and nvcc's front end accept), so codecs
// can be checked with static_assert and run in kernels.
#pragma once

#include "config.hpp"

namespace kvsim {

KVSIM_HD constexpr uint32_t float_bits(float f) {
  return __builtin_bit_cast(uint32_t, f);
}

KVSIM_HD constexpr float bits_float(uint32_t u) {
  return __builtin_bit_cast(float, u);
}

KVSIM_HD constexpr bool is_nan_bits(uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u; }

KVSIM_HD constexpr bool is_nan(float f) { return is_nan_bits(float_bits(f)); }

KVSIM_HD constexpr float abs_f32(float f) { return bits_float(float_bits(f) & 0x7FFFFFFFu); }

}  // namespace kvsim
