// Host validation of MLA attention (absorbed decode and chunked prefill over
// one latent pool).
#pragma once

#include <string>
#include <utility>

#include "attention.hpp"
#include "kvsim/core/ops/mla_attention.hpp"

namespace kvsim {

// ---------------------------------------------------------------- validation
inline void validate_mla_attention(const KvPools& pools, const MlaAttentionOp& op) {
  const std::string o = "mla_attention: ";
  const PoolGeometry& g = pools.geometry;
  if (g.kv_factor != 1 || g.kv_heads != 1)
    fail(ErrorCode::bad_argument, o + "needs a latent pool (kv_factor 1, one head), got kv_factor " +
                                      std::to_string(g.kv_factor) + ", " + std::to_string(g.kv_heads) + " heads");
  validate_layer(g, op.layer, o);
  validate_pool(pools, PoolKind::primary, o);
  if (op.d_ckv < 1 || op.d_kpe < 0)
    fail(ErrorCode::shape_mismatch, o + "d_ckv = " + std::to_string(op.d_ckv) + ", d_kpe = " + std::to_string(op.d_kpe) +
                                        ": rule: d_ckv >= 1, d_kpe >= 0");
  const bool nvfp4 = g.dtype == CacheDtype::nvfp4;
  const int64_t width = static_cast<int64_t>(op.d_ckv) + (nvfp4 ? 2 : 1) * static_cast<int64_t>(op.d_kpe);
  if (width != g.head_dim)
    fail(ErrorCode::shape_mismatch, o + "the pool's row is " + std::to_string(g.head_dim) + " elements but d_ckv " +
                                        (nvfp4 ? "+ 2 * d_kpe" : "+ d_kpe") + " = " + std::to_string(width));
  if (nvfp4 && op.d_ckv % codec::kNvfp4BlockElems != 0)
    fail(ErrorCode::unsupported_head_dim, o + "nvfp4 ckv of " + std::to_string(op.d_ckv) +
                                              " elements: rule: a multiple of the 16-element scale block");
  const int64_t dq = static_cast<int64_t>(op.d_ckv) + op.d_kpe;
  if (dq > 8192) fail(ErrorCode::unsupported_head_dim, o + "d_ckv + d_kpe = " + std::to_string(dq) + " > 8192");
  const int64_t batch = static_cast<int64_t>(op.seq_lens.size());
  if (!op.q_indptr.empty()) detail::validate_q_indptr(op.q_indptr, op.seq_lens, o);
  const int64_t rows = op.q_indptr.empty() ? batch : op.q_indptr.back();
  const std::pair<const TensorView*, int64_t> tensors[2] = {{&op.q, dq}, {&op.out, op.d_ckv}};
  for (const auto& [t, width_t] : tensors) {
    const char* name = t == &op.q ? "q" : "out";
    if (t->data == nullptr || t->rank != 3 || !is_float_input(t->dtype) || t->shape[0] != rows ||
        t->shape[2] != width_t || t->shape[1] < 1 || t->shape[1] > INT32_MAX)
      fail(ErrorCode::shape_mismatch, o + name + " must be [" + std::to_string(rows) + ", Hq, " +
                                          std::to_string(width_t) + "] fp32/fp16/bf16");
  }
  if (op.q.shape[1] != op.out.shape[1]) fail(ErrorCode::shape_mismatch, o + "q and out have different head counts");
  const bool coded = has_tensor_scale(g.dtype);
  for (const auto& [v, name] : {std::pair{op.sm_scale, "sm_scale"}, {op.scale, "scale"}, {op.kpe_scale, "kpe_scale"}})
    check_scale(v, ScaleRule::finite, ErrorCode::bad_argument, o + name, "sm_scale, scale and kpe_scale must be finite");
  if (!coded && op.scale != 1.0f)
    fail(ErrorCode::bad_argument, o + "scale = " + std::to_string(op.scale) + ": rule: a per-tensor scale is for fp8 / int8 latents only");
  if (nvfp4) validate_global_scale(op.ckv_global_scale, o + "ckv_global_scale");
  detail::validate_attention_table(g, op.seq_lens, op.block_table, op.max_blocks_per_seq, WindowMapping{}, o);
}

}  // namespace kvsim
