// The synthetic model (contract §6): every input a step feeds the cache is a
// deterministic function of (seed, layer, head, dim, position p, hash of
// tokens 0..p). A block reused from the prefix cache therefore holds exactly
// what the request would have computed itself, and two replays that differ
// only in how the work was cut (chunks, batches, layouts, reuse) must give
// the same bytes. Values spread like activations (roughly normal, sigma =
// value_scale, |x| < 3.5 sigma) so fp8 / int8 / nvfp4 caches see realistic
// ranges; with outlier_rate > 0 that share of elements is multiplied by
// outlier_scale, which exercises saturation and nvfp4 block scales.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "backends/cpu/cpu_isa.hpp"
#include "scenario.hpp"

namespace kvsim::sim {

enum class ModelTensor : uint8_t { q, k, v, ckv, kpe, indexer_k };

class SyntheticModel {
 public:
  explicit SyntheticModel(const ModelSpec& spec) : spec_(spec) {}

  // Element `dim` of head `head` of tensor `t` at `position`, whose tokens
  // 0..position hash to `prefix_hash`.
  float value(ModelTensor t, int32_t layer, int32_t head, int32_t dim, int64_t position, uint64_t prefix_hash) const;
  // value() in two parts, for making many elements: the hash of (tensor,
  // layer, head, dim), which a replay computes once per layer, and the value
  // at a position from it. value_from_seed(t, dim_seed(t, l, h, d), p, ph)
  // == value(t, l, h, d, p, ph), bit for bit.
  uint64_t dim_seed(ModelTensor t, int32_t layer, int32_t head, int32_t dim) const;
  float value_from_seed(ModelTensor t, uint64_t dim_seed, int64_t position, uint64_t prefix_hash) const;
  // value_from_seed for n consecutive dim seeds at one position: out[i] =
  // value_from_seed(t, dim_seeds[i], position, prefix_hash), the same
  // function in a loop the compiler sees whole (a replay's inputs are rows).
  // Rows without outlier, NaN or Inf draws take a branch-free loop built for
  // each CPU ISA and chosen at run time like the CPU backend's kernels
  // (backends/cpu/cpu_isa.hpp: KVSIM_CPU_ISA forces one); `isa` runs a
  // given one (the CPU must run it), for the tests that hold every ISA to
  // the same bits.
  void row_from_seeds(ModelTensor t, const uint64_t* dim_seeds, int32_t n, int64_t position, uint64_t prefix_hash,
                      float* out) const;
  void row_from_seeds(ModelTensor t, const uint64_t* dim_seeds, int32_t n, int64_t position, uint64_t prefix_hash,
                      float* out, CpuIsa isa) const;

  // h[p] = hash of tokens[0..p] (a chained hash: equal prefixes, equal hashes).
  static std::vector<uint64_t> prefix_hashes(std::span<const int32_t> tokens);
  // The hash of tokens[0..p] from the hash of tokens[0..p-1] (kEmptyHash for p = 0).
  static uint64_t extend_hash(uint64_t previous, int32_t token);
  static constexpr uint64_t kEmptyHash = 0x243f6a8885a308d3ull;
  // The token a request samples after `position` (contract §6: a function of the request and position).
  static int32_t next_token(uint64_t request_seed, int64_t position);
  // A request's seed: its own, or one derived from its id.
  static uint64_t request_seed(const RequestSpec& r);

  static constexpr int32_t kVocab = 32000;

 private:
  ModelSpec spec_;
};

// A request's prompt: its named prefixes in order, then its own tokens
// (explicit, or `generated` tokens from its seed). Throws bad_scenario on an
// unknown prefix name.
std::vector<int32_t> build_prompt(const Scenario& s, const RequestSpec& r);

uint64_t hash_mix(uint64_t h, uint64_t v);

}  // namespace kvsim::sim
