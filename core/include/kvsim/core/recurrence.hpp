// The synthetic recurrence of a hybrid model's recurrent (Mamba / Gated
// DeltaNet style) layers: one fixed-size fp32 state per request per layer,
// folded one token at a time. It is not Mamba's arithmetic; it is a
// deterministic stand-in with the property prefix reuse relies on: the state
// after token p depends on every token 0..p, in order, so a snapshot restored
// at the wrong position differs from the recomputed state.
//
// Explicit order, host and device: element i is updated as
//   state[i] = decay(i) * state[i] + input(seed, layer, i, token hash)
// with one fp32 multiply and one fp32 add, rounded to nearest each (the
// build's -ffp-contract=off / -fmad=false keep them two roundings), elements
// in increasing i; decay(i) = 0.5 + (i mod 16) / 32 and every input are
// exact fp32 values (a 24-bit integer times 2^-23, in [-1, 1)), so a CUDA
// kernel calling these functions gives the CPU's bytes.
#pragma once

#include <cstdint>

#include "config.hpp"
#include "splitmix64.hpp"

namespace kvsim {

KVSIM_HD constexpr float recurrent_decay(int32_t i) { return 0.5f + 0.03125f * static_cast<float>(i % 16); }

// The token's input to element i of layer `layer`'s state: the token enters
// through the hash of the whole prefix up to it (tokens 0..p).
KVSIM_HD constexpr float recurrent_input(uint64_t seed, int32_t layer, int32_t i, uint64_t prefix_hash) {
  const uint64_t z = splitmix64_mix(seed ^ splitmix64_mix(prefix_hash + kSplitmix64Gamma * static_cast<uint64_t>(layer + 1)) ^
                                    (static_cast<uint64_t>(i) << 32));
  const int32_t q = static_cast<int32_t>(z >> 40) - (1 << 23);  // 24 bits, centred
  return static_cast<float>(q) * (1.0f / 8388608.0f);            // exact: |q| < 2^24, times 2^-23
}

// Folds one token into a state of n elements.
KVSIM_HD inline void recurrent_step(float* state, int32_t n, uint64_t seed, int32_t layer, uint64_t prefix_hash) {
  for (int32_t i = 0; i < n; ++i) {
    const float kept = recurrent_decay(i) * state[i];
    state[i] = kept + recurrent_input(seed, layer, i, prefix_hash);
  }
}

}  // namespace kvsim
