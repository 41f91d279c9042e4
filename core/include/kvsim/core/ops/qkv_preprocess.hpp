// qkv_preprocess_write — TensorRT-LLM applyBiasRopeUpdateKVCache (SPEC §5.3).
#pragma once

#include <span>

#include "../cache_io.hpp"
#include "../page_table.hpp"
#include "../rope.hpp"
#include "../tensor.hpp"
#include "../window.hpp"

namespace kvsim {

// Fused QKV [num_tokens, (Hq + 2H) * D] (fp32/fp16/bf16), tokens of sequence
// b packed at cumsum(seq_lens)[b] (remove_padding). past = cache_len -
// seq_len; token t of the chunk is at position past + t, rotated at
// position + position_offsets[b]. Q (bias, RoPE) -> q_out, never the pool;
// K (bias, RoPE) and V (bias) -> the pool through window.cache_token() and
// the dense block table, quantized with TensorRT-LLM's conventions:
// fp8/int8 store code(x * scale_orig_quant[1 or 2]); nvfp4 uses the second
// level decode scales nvfp4_global_scale[1] (K) and [2] (V).
// In a context step the V rows of the last block beyond cache_len are zeroed
// by the unique writer (zeroPagedVCacheTail); zero_v_tail = false turns that
// off to demonstrate the NaN it prevents.
struct QkvPreprocessOp {
  int32_t layer = 0;
  int32_t num_q_heads = 1;
  TensorView qkv;     // [num_tokens, (Hq + 2H) * D]
  TensorView bias;    // optional [(Hq + 2H) * D], same dtype as qkv
  TensorView q_out;   // [num_tokens, Hq, D], same dtype as qkv
  RopeStyle rope_style = RopeStyle::none;
  int32_t rotary_dim = 0;
  TensorView cos_sin;  // [max_position, rotary_dim] fp32, from build_rope_table
  std::span<const int32_t> seq_lens;          // new tokens per sequence
  std::span<const int32_t> cache_lens;        // tokens per sequence after this step
  std::span<const int32_t> position_offsets;  // optional, per sequence
  std::span<const int32_t> block_table;       // dense [batch, max_blocks_per_seq], -1 padded
  int32_t max_blocks_per_seq = 0;
  WindowMapping window;
  bool context_phase = true;
  bool zero_v_tail = true;
  float scale_orig_quant[3] = {1.0f, 1.0f, 1.0f};    // [Q, K, V] fp8/int8 encode scales
  float nvfp4_global_scale[3] = {1.0f, 1.0f, 1.0f};  // [Q, K, V] nvfp4 decode scales g
};

// Host validation: throws a named ValidationError before any byte moves.
void validate_qkv_preprocess(const KvPools& pools, const QkvPreprocessOp& op);

}  // namespace kvsim
