// The synthetic model: see synthetic_model.hpp.
#include "kvsim/sim/synthetic_model.hpp"

#include <limits>

#include <kvsim/validation/errors.hpp>
#include <kvsim/core/splitmix64.hpp>

#include "kvsim/sim/scenario_file.hpp"
#include "backends/cpu/cpu_target.hpp"

namespace kvsim::sim {

namespace {
// hash_mix with v * gamma already made (a row's position and prefix hash are
// multiplied once, not per element).
[[gnu::always_inline]] inline uint64_t mix_premultiplied(uint64_t h, uint64_t v_gamma) {
  return splitmix64_mix((h ^ v_gamma) + kSplitmix64Gamma);
}
}  // namespace

uint64_t hash_mix(uint64_t h, uint64_t v) {  // splitmix64 finaliser over (h, v)
  return mix_premultiplied(h, v * kSplitmix64Gamma);
}

namespace {
// Uniform in [-1, 1) from the top 24 bits: exact in fp32 (and as int32,
// which vectorizes where a 64-bit conversion would not).
[[gnu::always_inline]] inline float unit(uint64_t bits) {
  return static_cast<float>(static_cast<int32_t>(bits >> 40)) * (2.0f / 16777216.0f) - 1.0f;
}

// The draws of one element: h from (dim seed, position, prefix hash), then a
// and b, whose four 24-bit uniforms sum to the bell-shaped value (sigma
// 1.1547, scaled to sigma = value_scale by `scale`).
struct Draws {
  uint64_t h, a, b;
};
[[gnu::always_inline]] inline Draws draws(uint64_t dim_seed, uint64_t position_gamma, uint64_t prefix_gamma) {
  const uint64_t h = mix_premultiplied(mix_premultiplied(dim_seed, position_gamma), prefix_gamma);
  return {h, mix_premultiplied(h, kSplitmix64Gamma), mix_premultiplied(h, 2 * kSplitmix64Gamma)};
}
inline float bell_scale(const ModelSpec& spec) { return spec.value_scale / 1.1547005f; }
[[gnu::always_inline]] inline float bell(const Draws& d, float scale) {
  const float s = unit(d.a) + unit(d.a << 24) + unit(d.b) + unit(d.b << 24);
  return s * scale;
}
}  // namespace

uint64_t SyntheticModel::dim_seed(ModelTensor t, int32_t layer, int32_t head, int32_t dim) const {
  uint64_t h = hash_mix(spec_.seed, static_cast<uint64_t>(t) + 1);
  h = hash_mix(h, static_cast<uint64_t>(layer));
  h = hash_mix(h, static_cast<uint64_t>(head));
  return hash_mix(h, static_cast<uint64_t>(dim));
}

float SyntheticModel::value(ModelTensor t, int32_t layer, int32_t head, int32_t dim, int64_t position,
                            uint64_t prefix_hash) const {
  return value_from_seed(t, dim_seed(t, layer, head, dim), position, prefix_hash);
}

namespace {
// The value at a position from its dim seed: the one definition behind
// value_from_seed and row_from_seeds.
inline float seeded_value(const ModelSpec& spec, ModelTensor t, uint64_t dim_seed, int64_t position,
                          uint64_t prefix_hash) {
  const Draws d = draws(dim_seed, static_cast<uint64_t>(position) * kSplitmix64Gamma, prefix_hash * kSplitmix64Gamma);
  const uint64_t h = d.h, a = d.a;
  float x = bell(d, bell_scale(spec));
  if (spec.outlier_rate > 0.0f) {
    const float u = (unit(hash_mix(h, 3)) + 1.0f) * 0.5f;
    if (u < spec.outlier_rate) x *= spec.outlier_scale;
  }
  if ((spec.nan_rate > 0.0f || spec.inf_rate > 0.0f) && t != ModelTensor::q && t != ModelTensor::indexer_k) {
    const float u = (unit(hash_mix(h, 4)) + 1.0f) * 0.5f;
    if (u < spec.nan_rate) return std::numeric_limits<float>::quiet_NaN();
    if (u < spec.nan_rate + spec.inf_rate)
      return (a & 1) ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
  }
  return x;
}
}  // namespace

float SyntheticModel::value_from_seed(ModelTensor t, uint64_t dim_seed, int64_t position, uint64_t prefix_hash) const {
  return seeded_value(spec_, t, dim_seed, position, prefix_hash);
}

namespace {
// seeded_value where no outlier, NaN or Inf is drawn: its draws and bell
// without the branches, so the loop vectorizes (the integer mixing is exact
// and the float steps are the same operations in the same order in every
// lane: the same bits). Compiled once per ISA below.
[[gnu::always_inline]] inline void plain_row(float scale, const uint64_t* dim_seeds, int32_t n, int64_t position,
                                             uint64_t prefix_hash, float* out) {
  const uint64_t p = static_cast<uint64_t>(position) * kSplitmix64Gamma, q = prefix_hash * kSplitmix64Gamma;
  for (int32_t i = 0; i < n; ++i) out[i] = bell(draws(dim_seeds[i], p, q), scale);
}
using PlainRowFn = void (*)(float, const uint64_t*, int32_t, int64_t, uint64_t, float*);
}  // namespace
// plain_row compiled for the ISA of the target region it stands in.
#define KVSIM_PLAIN_ROW_AT(NAME)                                                                       \
  namespace {                                                                                          \
  void NAME(float scale, const uint64_t* d, int32_t n, int64_t pos, uint64_t ph, float* out) {         \
    plain_row(scale, d, n, pos, ph, out);                                                              \
  }                                                                                                    \
  }
KVSIM_PLAIN_ROW_AT(plain_row_portable)
#if KVSIM_CPU_X86
KVSIM_CPU_TARGET_BEGIN(KVSIM_CPU_TARGET_AVX2)
KVSIM_PLAIN_ROW_AT(plain_row_avx2)
KVSIM_CPU_TARGET_END
KVSIM_CPU_TARGET_BEGIN(KVSIM_CPU_TARGET_AVX512)
KVSIM_PLAIN_ROW_AT(plain_row_avx512)
KVSIM_CPU_TARGET_END
#endif
#undef KVSIM_PLAIN_ROW_AT

namespace {
PlainRowFn plain_row_for(CpuIsa isa) {
#if KVSIM_CPU_X86
  if (isa == CpuIsa::avx512) return plain_row_avx512;
  if (isa == CpuIsa::avx2) return plain_row_avx2;
#endif
  (void)isa;
  return plain_row_portable;
}
}  // namespace

void SyntheticModel::row_from_seeds(ModelTensor t, const uint64_t* dim_seeds, int32_t n, int64_t position,
                                    uint64_t prefix_hash, float* out) const {
  static const CpuIsa isa = selected_cpu_isa();
  row_from_seeds(t, dim_seeds, n, position, prefix_hash, out, isa);
}

void SyntheticModel::row_from_seeds(ModelTensor t, const uint64_t* dim_seeds, int32_t n, int64_t position,
                                    uint64_t prefix_hash, float* out, CpuIsa isa) const {
  const ModelSpec spec = spec_;  // a local copy: the loop's conditions are invariant
  // seeded_value's two draws that can change a value, as it tests them.
  const bool outliers = spec.outlier_rate > 0.0f;
  const bool specials = (spec.nan_rate > 0.0f || spec.inf_rate > 0.0f) && t != ModelTensor::q && t != ModelTensor::indexer_k;
  if (!outliers && !specials) return plain_row_for(isa)(bell_scale(spec), dim_seeds, n, position, prefix_hash, out);
  for (int32_t i = 0; i < n; ++i) out[i] = seeded_value(spec, t, dim_seeds[i], position, prefix_hash);
}

std::vector<uint64_t> SyntheticModel::prefix_hashes(std::span<const int32_t> tokens) {
  std::vector<uint64_t> h(tokens.size());
  uint64_t running = kEmptyHash;
  for (size_t i = 0; i < tokens.size(); ++i) h[i] = running = extend_hash(running, tokens[i]);
  return h;
}

uint64_t SyntheticModel::extend_hash(uint64_t previous, int32_t token) {
  return hash_mix(previous, static_cast<uint32_t>(token));
}

int32_t SyntheticModel::next_token(uint64_t request_seed, int64_t position) {
  return static_cast<int32_t>(hash_mix(hash_mix(request_seed, 0xdec0de), static_cast<uint64_t>(position)) % kVocab);
}

uint64_t SyntheticModel::request_seed(const RequestSpec& r) {
  if (r.seed != 0) return r.seed;
  uint64_t h = 0x9ae16a3b2f90404full;
  for (char c : r.id) h = hash_mix(h, static_cast<unsigned char>(c));
  return h;
}

std::vector<int32_t> build_prompt(const Scenario& s, const RequestSpec& r) {
  std::vector<int32_t> prompt;
  for (const std::string& name : r.prefixes) {
    const PrefixSpec* found = nullptr;
    for (const PrefixSpec& p : s.prefixes)
      if (p.name == name) found = &p;
    if (!found) fail(ErrorCode::bad_scenario, "request " + r.id + ": unknown prefix \"" + name + "\"");
    prompt.insert(prompt.end(), found->tokens.begin(), found->tokens.end());
  }
  if (!r.tokens.empty())
    prompt.insert(prompt.end(), r.tokens.begin(), r.tokens.end());
  else {
    const auto gen = generated_tokens(SyntheticModel::request_seed(r), r.generated);  // the scenario files' generator
    prompt.insert(prompt.end(), gen.begin(), gen.end());
  }
  return prompt;
}

}  // namespace kvsim::sim
