// [model] preset = "NAME": the attention shape of a public model, from its
// config.json (docs/scenarios.md lists every number and its source). A preset
// fills the scenario's model (layers, query and KV heads, head_dim, RoPE) and,
// where the model has them, its MLA latent widths and sliding window; any key
// the file sets itself overrides the preset's value.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "scenario.hpp"

namespace kvsim::sim {

struct ModelPreset {
  std::string_view name;
  int32_t layers = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  double rope_theta = 10000.0;
  RopeStyle rope = RopeStyle::neox;
  int32_t rotary_dim = 0;     // 0 = head_dim
  int32_t sliding_window = 0; // 0 = none
  bool mla = false;
  int32_t d_ckv = 0, d_kpe = 0;
};

const std::vector<ModelPreset>& model_presets();
std::optional<ModelPreset> find_model_preset(std::string_view name);
// Writes the preset's values into `s` (before the file's own keys are read).
void apply_model_preset(const ModelPreset& p, Scenario& s);

}  // namespace kvsim::sim
