// Model presets (model_presets.hpp). Numbers from each model's config.json on
// Hugging Face (docs/scenarios.md, "Model presets", cites each file):
// num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim (or
// hidden_size / num_attention_heads), rope_theta, sliding_window; DeepSeek-V3:
// kv_lora_rank (d_ckv) and qk_rope_head_dim (d_kpe). RoPE is rotate-half
// (neox) in each model's Hugging Face implementation; Llama 3.1's frequency
// scaling (rope_scaling "llama3") is not modelled: kvsim's table is plain
// theta^(-2i/d).
#include "kvsim/sim/model_presets.hpp"

namespace kvsim::sim {

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = {
      // meta-llama/Llama-3.1-8B: 32 layers, 32 heads, 8 KV heads, hidden 4096 / 32 = 128, theta 500000.
      {"llama-3.1-8b", 32, 32, 8, 128, 500000.0},
      // meta-llama/Llama-3.1-70B: 80 layers, 64 heads, 8 KV heads, hidden 8192 / 64 = 128, theta 500000.
      {"llama-3.1-70b", 80, 64, 8, 128, 500000.0},
      // Qwen/Qwen3-32B: 64 layers, 64 heads, 8 KV heads, head_dim 128, theta 1000000, no sliding window.
      {"qwen3-32b", 64, 64, 8, 128, 1000000.0},
      // mistralai/Mistral-7B-v0.1: 32 layers, 32 heads, 8 KV heads, hidden 4096 / 32 = 128, theta 10000,
      // sliding_window 4096.
      {"mistral-7b", 32, 32, 8, 128, 10000.0, RopeStyle::neox, 0, 4096},
      // deepseek-ai/DeepSeek-V3: 61 layers, MLA latent kv_lora_rank 512 + qk_rope_head_dim 64 (one latent
      // row per token), rope_theta 10000.
      {"deepseek-v3", 61, 1, 1, 0, 10000.0, RopeStyle::none, 0, 0, true, 512, 64},
  };
  return presets;
}

std::optional<ModelPreset> find_model_preset(std::string_view name) {
  for (const ModelPreset& p : model_presets())
    if (p.name == name) return p;
  return std::nullopt;
}

void apply_model_preset(const ModelPreset& p, Scenario& s) {
  s.model.layers = p.layers;
  s.model.q_heads = p.q_heads;
  s.model.kv_heads = p.kv_heads;
  s.model.rope_theta = p.rope_theta;
  s.model.rope = p.rope;
  s.model.rotary_dim = p.rotary_dim;
  if (p.mla) {
    s.mla.enabled = true;
    s.mla.d_ckv = p.d_ckv;
    s.mla.d_kpe = p.d_kpe;
  } else {
    s.model.head_dim = p.head_dim;
  }
  if (p.sliding_window > 0) {
    // vLLM's sliding-window attention: blocks that leave the window return to the free list.
    s.window.mode = WindowMode::release;
    s.window.window = p.sliding_window;
  }
}

}  // namespace kvsim::sim
