// Write ops: append_paged (FlashInfer), reshape_and_cache (vLLM), append_mla
// (FlashInfer MLA), indexer_k_scatter (DeepSeek sparse-attention indexer).
// Each op: a descriptor, a host validate_*() that throws a named
// ValidationError before any byte moves, and KVSIM_HD work-item functions
// that both backends call unchanged.
#pragma once

#include <span>

#include "../cache_io.hpp"
#include "../page_table.hpp"
#include "../tensor.hpp"

namespace kvsim {

// SPEC §5.1 — FlashInfer append_paged_kv_cache. Token i of sequence
// b = batch_indices[i] at position positions[i] goes to
//   (page_slot, entry) = divmod(indptr[b] * P + positions[i], P),  block = indices[page_slot].
// Inputs [nnz, H, D] with arbitrary strides (K/V sliced from a fused QKV);
// input dtype == cache dtype (bytes copied), except nvfp4 caches, which take
// fp32/fp16/bf16 and quantize per 16 elements with the layer's K/V global
// decode scales (SPEC §4).
struct AppendPagedOp {
  int32_t layer = 0;
  TensorView k, v;                          // [nnz, H, D]
  std::span<const int32_t> batch_indices;   // [nnz]
  std::span<const int32_t> positions;       // [nnz]
  std::span<const int32_t> indptr;          // [batch + 1], tables already include the appended tokens
  std::span<const int32_t> indices;         // [indptr[batch]]
  std::span<const int32_t> last_page_len;   // [batch]
  float k_global_scale = 1.0f;              // nvfp4 only
  float v_global_scale = 1.0f;
};

// SPEC §5.2 — vLLM reshape_and_cache(_flash). Token t goes to
// slot_mapping[t] = block * P + offset (negative: skipped), any layout
// including split-x. Cache dtype == input dtype: bytes copied; fp8 caches
// store e4m3/e5m2_satfinite(x / k_scale) (vLLM's scaled_convert divides).
struct ReshapeAndCacheOp {
  int32_t layer = 0;
  TensorView key, value;                 // [num_tokens, H, D], fp32/fp16/bf16
  std::span<const int64_t> slot_mapping; // [num_tokens]
  float k_scale = 1.0f;
  float v_scale = 1.0f;
};

// SPEC §5.4 — FlashInfer append_paged_mla_kv_cache into a latent pool
// (kv_factor 1, kv_heads 1): row = [ckv (d_ckv) | kpe (d_kpe)]. Page table and
// coordinates as append_paged.
struct AppendMlaOp {
  int32_t layer = 0;
  TensorView ckv;  // [nnz, d_ckv]
  TensorView kpe;  // [nnz, d_kpe]
  std::span<const int32_t> batch_indices, positions;
  std::span<const int32_t> indptr, indices, last_page_len;
  float ckv_global_scale = 1.0f;  // nvfp4 ckv
  float kpe_scale = 1.0f;         // fp8 kpe in the nvfp4 mix
};

// SPEC §5.5 — DeepSeek indexer K cache scatter (TensorRT-LLM
// indexerKCacheScatter): fp8 bytes [T, D] and 4-byte scales [T] go into a
// 4-D strided byte cache [blocks, block_size, 1, bytes_per_token] addressed
// by flat element indices; negative slot skips the token.
struct IndexerKScatterOp {
  TensorView k_fp8;    // [T, D] bytes
  TensorView k_scale;  // [T, 4] bytes
  std::span<const int64_t> slot_mapping_fp8;    // flat element index of the token's first data byte
  std::span<const int64_t> slot_mapping_scale;  // flat element index of the token's scale bytes
  TensorView cache;    // rank 4, bytes, explicit strides
};

// Host validation: throws a named ValidationError before any byte moves.
void validate_append_paged(const KvPools& pools, const AppendPagedOp& op);
void validate_reshape_and_cache(const KvPools& pools, const ReshapeAndCacheOp& op);
void validate_append_mla(const KvPools& pools, const AppendMlaOp& op);
void validate_indexer_k_scatter(const IndexerKScatterOp& op);

}  // namespace kvsim
