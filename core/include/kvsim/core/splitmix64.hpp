// splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
// generators", 2014): the one mixer behind every deterministic value in kvsim
// (synthetic model, prefix-reuse keys, generated prompts, benchmark inputs,
// test inputs). Written once so a seed means the same stream everywhere.
#pragma once

#include <cstdint>

#include "config.hpp"

namespace kvsim {

inline constexpr uint64_t kSplitmix64Gamma = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio, odd

// The finaliser: a bijection of 64-bit words that spreads every input bit.
KVSIM_HD constexpr uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The next value of the stream whose state is `state` (advanced by gamma).
KVSIM_HD constexpr uint64_t splitmix64_next(uint64_t& state) { return splitmix64_mix(state += kSplitmix64Gamma); }

}  // namespace kvsim
