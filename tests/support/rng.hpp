// The tests' one random stream: splitmix64 (core/splitmix64.hpp) from a seed,
// so a failing case is reproduced by its seed alone on any machine.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <kvsim/core/splitmix64.hpp>

namespace kvsim::testing {

struct Rng {
  uint64_t state;
  explicit Rng(uint64_t seed) : state(seed) {}
  uint64_t next() { return splitmix64_next(state); }
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
  int64_t uniform(int64_t lo, int64_t hi) { return lo + below(hi - lo + 1); }  // [lo, hi]
  float unit() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }  // [0, 1), 24 bits, exact
  float real(float lo, float hi) { return lo + (hi - lo) * unit(); }
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[static_cast<size_t>(below(static_cast<int64_t>(i)))]);
  }
};

// Murmur3's 64-bit finalizer of a hashed coordinate, its top 24 bits as a
// float in [-1, 1): the deterministic element values of the attention tests.
inline float mixed_unit_value(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return static_cast<float>(h >> 40) / 8388608.0f - 1.0f;
}

}  // namespace kvsim::testing
