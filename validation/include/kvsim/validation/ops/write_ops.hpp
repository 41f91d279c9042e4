// Host validation of the write ops (append_paged, reshape_and_cache, append_mla,
// indexer_k_scatter): throws a named ValidationError before any byte moves.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdio>
#include <limits>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../page_table.hpp"
#include "../checks.hpp"
#include "../tensor.hpp"
#include "kvsim/core/ops/write_ops.hpp"

namespace kvsim {

// ================================================================ host validation
// Throws a named ValidationError before any byte moves.

namespace write_ops_detail {

// Rank, shape and (when it has elements) a data pointer.
inline void check_tensor(const TensorView& t, const char* name, std::initializer_list<int64_t> expected,
                         const char* meaning) {
  bool ok = t.rank == static_cast<int32_t>(expected.size());
  if (ok) {
    int i = 0;
    for (int64_t d : expected) ok = ok && t.shape[i++] == d;
  }
  if (!ok)
    fail(ErrorCode::shape_mismatch, std::string(name) + " has shape " + shape_text(t) + " (rank " +
                                        std::to_string(t.rank) + "): rule: the op needs " + dims_text(expected) +
                                        " = " + meaning);
  if (t.numel() > 0 && t.data == nullptr)
    fail(ErrorCode::shape_mismatch, std::string(name) + " has " + std::to_string(t.numel()) + " elements but no data");
}

inline void check_dtype(const TensorView& t, const char* name, bool ok, const std::string& rule) {
  if (!ok)
    fail(ErrorCode::shape_mismatch,
         std::string(name) + " has dtype " + std::string(dtype_name(t.dtype)) + ": rule: " + rule);
}

inline void check_kv_factor(const PoolGeometry& g, int32_t required, const char* op) {
  if (g.kv_factor != required)
    fail(ErrorCode::bad_geometry, std::string(op) + " needs kv_factor = " + std::to_string(required) +
                                      " but the pool has kv_factor = " + std::to_string(g.kv_factor) + " (" +
                                      geometry_summary(g) + ")");
}

// Memory, allocation and strides of the written pool (core's validate_pool).
inline void check_primary_pool(const KvPools& pools, const char* op) {
  validate_pool(pools, PoolKind::primary, std::string(op) + ": ");
}

// The K/V pool a write op fills: kv_factor 2, the layer in range, its memory and strides.
inline void check_kv_write_pool(const KvPools& pools, int32_t layer, const char* op) {
  check_kv_factor(pools.geometry, 2, op);
  validate_layer(pools.geometry, layer, std::string(op) + ": ");
  check_primary_pool(pools, op);
}

inline void check_fp8_scale(float s, const char* name) {
  check_scale(s, ScaleRule::finite_positive, ErrorCode::bad_argument, name, "an fp8 per-tensor scale is finite and > 0");
}

// FlashInfer append coordinates against a CSR table that already includes the
// appended tokens: every token's position lies in its sequence, its page is a
// live primary block, no block is written by two sequences and no (block,
// entry) slot by two tokens.
inline void validate_append_targets(const PoolGeometry& g, std::span<const int32_t> batch_indices,
                                    std::span<const int32_t> positions, std::span<const int32_t> indptr,
                                    std::span<const int32_t> indices, std::span<const int32_t> last_page_len,
                                    int64_t nnz) {
  if (static_cast<int64_t>(batch_indices.size()) != nnz || static_cast<int64_t>(positions.size()) != nnz)
    fail(ErrorCode::shape_mismatch, "batch_indices has " + std::to_string(batch_indices.size()) +
                                        " entries and positions " + std::to_string(positions.size()) +
                                        ": rule: both have nnz = " + std::to_string(nnz) + " entries");
  validate_csr(indptr, indices, last_page_len, g, /*for_write=*/false);
  const CsrPageTable table = make_csr_view(indptr, indices, last_page_len, g);
  std::vector<std::pair<int32_t, int64_t>> writes;
  writes.reserve(static_cast<size_t>(nnz));
  std::vector<int64_t> slots;  // block * tokens_per_block + entry of each token
  slots.reserve(static_cast<size_t>(nnz));
  for (int64_t i = 0; i < nnz; ++i) {
    const int32_t b = batch_indices[i];
    auto token = [&] { return "token " + std::to_string(i); };
    if (b < 0 || b >= table.batch)
      fail(ErrorCode::bad_argument, token() + ": batch_indices[" + std::to_string(i) + "] = " + std::to_string(b) +
                                        ": rule: a sequence index in [0, batch = " + std::to_string(table.batch) + ")");
    const int64_t length = table.length(b);
    if (positions[i] < 0 || positions[i] >= length)
      fail(ErrorCode::position_beyond_sequence,
           token() + " (sequence " + std::to_string(b) + "): positions[" + std::to_string(i) + "] = " +
               std::to_string(positions[i]) + " but the sequence's length from the CSR table is " +
               std::to_string(length) + ": rule: 0 <= position < length (the table already includes appended tokens)");
    int64_t page_slot = 0;
    int32_t entry = 0;
    table.locate(b, positions[i], page_slot, entry);
    const BlockRef ref = table.block_at(page_slot);
    validate_block_ref(
        ref, g,
        [&] {
          return token() + " (sequence " + std::to_string(b) + ", position " + std::to_string(positions[i]) +
                 ") writes through indices[" + std::to_string(page_slot) + "]";
        },
        /*is_write=*/true);
    writes.emplace_back(b, ref.block());
    slots.push_back(ref.block() * g.tokens_per_block + entry);
  }
  validate_exclusive_writers(writes);
  if (distinct_by_runs(slots)) return;
  std::unordered_map<int64_t, int64_t> slot_owner;
  slot_owner.reserve(static_cast<size_t>(nnz));
  for (int64_t i = 0; i < nnz; ++i) {
    int64_t page_slot = 0;
    int32_t entry = 0;
    table.locate(batch_indices[i], positions[i], page_slot, entry);
    const int64_t block = table.block_at(page_slot).block();
    auto [it, inserted] = slot_owner.emplace(block * g.tokens_per_block + entry, i);
    if (!inserted)
      fail(ErrorCode::bad_argument,
           "token " + std::to_string(it->second) + " and token " + std::to_string(i) + " (sequence " +
               std::to_string(batch_indices[i]) + ", position " + std::to_string(positions[i]) +
               ") both write block " + std::to_string(block) + " entry " + std::to_string(entry) +
               ": rule: each cache slot has one writer per op");
  }
}

}  // namespace write_ops_detail

inline void validate_append_paged(const KvPools& pools, const AppendPagedOp& op) {
  namespace d = write_ops_detail;
  const PoolGeometry& g = pools.geometry;
  d::check_kv_write_pool(pools, op.layer, "append_paged");
  const int64_t nnz = static_cast<int64_t>(op.batch_indices.size());
  d::check_tensor(op.k, "k", {nnz, g.kv_heads, g.head_dim}, "[nnz, kv_heads, head_dim]");
  d::check_tensor(op.v, "v", {nnz, g.kv_heads, g.head_dim}, "[nnz, kv_heads, head_dim]");
  if (g.dtype == CacheDtype::nvfp4) {
    const std::string rule = "an nvfp4 cache takes fp32/fp16/bf16 input and quantizes it";
    d::check_dtype(op.k, "k", is_float_input(op.k.dtype), rule);
    d::check_dtype(op.v, "v", is_float_input(op.v.dtype), rule);
    validate_global_scale(op.k_global_scale, "append_paged: k_global_scale");
    validate_global_scale(op.v_global_scale, "append_paged: v_global_scale");
    check_nvfp4_one_writer_per_byte(pools, PoolKind::primary, "append_paged");
  } else {
    const std::string rule = "input dtype equals the cache dtype " + std::string(dtype_name(g.dtype)) +
                             " (bytes are copied; only nvfp4 caches quantize)";
    d::check_dtype(op.k, "k", op.k.dtype == g.dtype, rule);
    d::check_dtype(op.v, "v", op.v.dtype == g.dtype, rule);
  }
  d::validate_append_targets(g, op.batch_indices, op.positions, op.indptr, op.indices, op.last_page_len, nnz);
}

inline void validate_reshape_and_cache(const KvPools& pools, const ReshapeAndCacheOp& op) {
  namespace d = write_ops_detail;
  const PoolGeometry& g = pools.geometry;
  d::check_kv_write_pool(pools, op.layer, "reshape_and_cache");
  if (g.dtype == CacheDtype::nvfp4)
    fail(ErrorCode::bad_argument,
         "reshape_and_cache does not write nvfp4 caches: rule: use append_paged or qkv_preprocess_write (" +
             geometry_summary(g) + ")");
  const int64_t T = static_cast<int64_t>(op.slot_mapping.size());
  d::check_tensor(op.key, "key", {T, g.kv_heads, g.head_dim}, "[num_tokens, kv_heads, head_dim]");
  d::check_tensor(op.value, "value", {T, g.kv_heads, g.head_dim}, "[num_tokens, kv_heads, head_dim]");
  const bool fp8_cache = is_fp8(g.dtype);
  const std::string rule = "input dtype equals the cache dtype " + std::string(dtype_name(g.dtype)) +
                           (fp8_cache ? " or is fp32/fp16/bf16 (quantized as x / scale)" : "");
  const TensorView* tensors[] = {&op.key, &op.value};
  const char* names[] = {"key", "value"};
  const float scales[] = {op.k_scale, op.v_scale};
  const char* scale_names[] = {"k_scale", "v_scale"};
  for (int kv = 0; kv < 2; ++kv) {
    const TensorView& t = *tensors[kv];
    const bool quantize = fp8_cache && is_float_input(t.dtype);
    d::check_dtype(t, names[kv], t.dtype == g.dtype || quantize, rule);
    if (quantize) d::check_fp8_scale(scales[kv], scale_names[kv]);
  }
  validate_slot_mapping(op.slot_mapping, g);
  if (distinct_by_runs(op.slot_mapping)) return;
  std::unordered_map<int64_t, int64_t> owner;
  owner.reserve(op.slot_mapping.size());
  for (int64_t t = 0; t < T; ++t) {
    const int64_t slot = op.slot_mapping[t];
    if (slot < 0) continue;
    auto [it, inserted] = owner.emplace(slot, t);
    if (!inserted)
      fail(ErrorCode::bad_argument, "token " + std::to_string(it->second) + " and token " + std::to_string(t) +
                                        " both have slot " + std::to_string(slot) +
                                        ": rule: each cache slot has one writer per op");
  }
}

inline void validate_append_mla(const KvPools& pools, const AppendMlaOp& op) {
  namespace d = write_ops_detail;
  const PoolGeometry& g = pools.geometry;
  d::check_kv_factor(g, 1, "append_mla");
  if (g.kv_heads != 1)
    fail(ErrorCode::bad_geometry, "append_mla needs kv_heads = 1 (one latent row per token) but the pool has " +
                                      std::to_string(g.kv_heads) + " (" + geometry_summary(g) + ")");
  validate_layer(g, op.layer, "append_mla: ");
  d::check_primary_pool(pools, "append_mla");
  const int64_t nnz = static_cast<int64_t>(op.batch_indices.size());
  if (op.ckv.rank != 2 || op.kpe.rank != 2 || op.ckv.shape[1] < 1 || op.kpe.shape[1] < 1)
    fail(ErrorCode::shape_mismatch, "ckv " + shape_text(op.ckv) + " and kpe " + shape_text(op.kpe) +
                                        ": rule: ckv is [nnz, d_ckv] and kpe [nnz, d_kpe], both dims >= 1");
  const int64_t d_ckv = op.ckv.shape[1], d_kpe = op.kpe.shape[1];
  d::check_tensor(op.ckv, "ckv", {nnz, d_ckv}, "[nnz, d_ckv]");
  d::check_tensor(op.kpe, "kpe", {nnz, d_kpe}, "[nnz, d_kpe]");
  if (g.dtype == CacheDtype::nvfp4) {
    if (d_ckv % codec::kNvfp4BlockElems != 0)
      fail(ErrorCode::unsupported_head_dim, "d_ckv = " + std::to_string(d_ckv) +
                                                ": rule: nvfp4 ckv is quantized in groups of 16, d_ckv % 16 == 0");
    if (d_ckv + 2 * d_kpe != g.head_dim)
      fail(ErrorCode::shape_mismatch, "d_ckv = " + std::to_string(d_ckv) + ", d_kpe = " + std::to_string(d_kpe) +
                                          ", head_dim = " + std::to_string(g.head_dim) +
                                          ": rule: an nvfp4 latent row holds d_ckv nibbles then d_kpe fp8 bytes, "
                                          "head_dim = d_ckv + 2 * d_kpe (in 4-bit units)");
    d::check_dtype(op.ckv, "ckv", is_float_input(op.ckv.dtype), "nvfp4 ckv takes fp32/fp16/bf16 and quantizes it");
    d::check_dtype(op.kpe, "kpe", op.kpe.dtype == CacheDtype::fp8_e4m3 || is_float_input(op.kpe.dtype),
                   "kpe in an nvfp4 latent pool is fp8_e4m3 codes or fp32/fp16/bf16 (encoded as x / kpe_scale)");
    validate_global_scale(op.ckv_global_scale, "append_mla: ckv_global_scale");
    if (is_float_input(op.kpe.dtype)) d::check_fp8_scale(op.kpe_scale, "kpe_scale");
    check_nvfp4_one_writer_per_byte(pools, PoolKind::primary, "append_mla");
  } else {
    if (d_ckv + d_kpe != g.head_dim)
      fail(ErrorCode::shape_mismatch, "d_ckv = " + std::to_string(d_ckv) + ", d_kpe = " + std::to_string(d_kpe) +
                                          ", head_dim = " + std::to_string(g.head_dim) +
                                          ": rule: head_dim = d_ckv + d_kpe");
    const std::string rule = "input dtype equals the cache dtype " + std::string(dtype_name(g.dtype)) +
                             " (bytes are copied; only nvfp4 latent pools quantize)";
    d::check_dtype(op.ckv, "ckv", op.ckv.dtype == g.dtype, rule);
    d::check_dtype(op.kpe, "kpe", op.kpe.dtype == g.dtype, rule);
  }
  d::validate_append_targets(g, op.batch_indices, op.positions, op.indptr, op.indices, op.last_page_len, nnz);
}

inline void validate_indexer_k_scatter(const IndexerKScatterOp& op) {
  namespace d = write_ops_detail;
  const TensorView& c = op.cache;
  if (c.rank != 4)
    fail(ErrorCode::shape_mismatch, "cache has rank " + std::to_string(c.rank) +
                                        ": rule: the indexer K cache is [blocks, block_size, 1, bytes_per_token]");
  for (int i = 0; i < 4; ++i) {
    if (c.shape[i] < 1)
      fail(ErrorCode::shape_mismatch, "cache shape " + shape_text(c) + ": rule: every dimension is >= 1");
    if (c.stride[i] < 0)
      fail(ErrorCode::bad_strides, "cache stride[" + std::to_string(i) + "] = " + std::to_string(c.stride[i]) +
                                       ": rule: strides are >= 0");
  }
  if (!c.data) fail(ErrorCode::bad_argument, "cache has no memory");
  d::check_dtype(c, "cache", bits_per_element(c.dtype) == 8, "the indexer cache is a byte tensor (8-bit dtype)");
  const int64_t T = static_cast<int64_t>(op.slot_mapping_fp8.size());
  if (static_cast<int64_t>(op.slot_mapping_scale.size()) != T)
    fail(ErrorCode::shape_mismatch, "slot_mapping_fp8 has " + std::to_string(T) + " entries, slot_mapping_scale " +
                                        std::to_string(op.slot_mapping_scale.size()) + ": rule: one of each per token");
  if (op.k_fp8.rank != 2)
    fail(ErrorCode::shape_mismatch, "k_fp8 has shape " + shape_text(op.k_fp8) + ": rule: [num_tokens, head_dim]");
  const int64_t D = op.k_fp8.shape[1];
  if (D < 1) fail(ErrorCode::shape_mismatch, "k_fp8 has head_dim " + std::to_string(D) + ": rule: head_dim >= 1");
  d::check_tensor(op.k_fp8, "k_fp8", {T, D}, "[num_tokens, head_dim]");
  d::check_tensor(op.k_scale, "k_scale", {T, kIndexerScaleBytes}, "[num_tokens, 4 scale bytes]");
  d::check_dtype(op.k_fp8, "k_fp8", bits_per_element(op.k_fp8.dtype) == 8, "fp8 data is bytes (8-bit dtype)");
  d::check_dtype(op.k_scale, "k_scale", bits_per_element(op.k_scale.dtype) == 8, "scales are bytes (8-bit dtype)");

  // numel and the memory span (largest offset + 1) in checked 64-bit
  // arithmetic: a shape or stride that overflows them is no real tensor.
  // (shapes are >= 1 and strides >= 0 here, so every term is non-negative.)
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  int64_t numel = 1, span = 1;
  for (int i = 0; i < 4; ++i) {
    const int64_t steps = c.shape[i] - 1;
    if (numel > kMax / c.shape[i] || (steps > 0 && c.stride[i] > kMax / steps) || span > kMax - c.stride[i] * steps)
      fail(ErrorCode::shape_mismatch, "cache shape " + shape_text(c) + " with its strides overflows 64-bit offsets");
    numel *= c.shape[i];
    span += c.stride[i] * steps;
  }
  for (int64_t t = 0; t < T; ++t) {
    const int64_t data_base = op.slot_mapping_fp8[t], scale_base = op.slot_mapping_scale[t];
    if (data_base < 0 || scale_base < 0) continue;  // skipped token
    if (data_base > numel - D)
      fail(ErrorCode::slot_beyond_pool, "token " + std::to_string(t) + ": slot_mapping_fp8[" + std::to_string(t) +
                                            "] = " + std::to_string(data_base) + " + head_dim " + std::to_string(D) +
                                            " exceeds the cache's " + std::to_string(numel) +
                                            " elements: rule: every written byte lies inside the cache");
    if (scale_base > numel - kIndexerScaleBytes)
      fail(ErrorCode::slot_beyond_pool, "token " + std::to_string(t) + ": slot_mapping_scale[" + std::to_string(t) +
                                            "] = " + std::to_string(scale_base) + " + 4 exceeds the cache's " +
                                            std::to_string(numel) +
                                            " elements: rule: every written byte lies inside the cache");
  }
  // One writer per byte, proven from runs where the cache is one row-major
  // block of memory (flat element indices are then byte offsets): each
  // token's data and scale bytes are intervals, gathered token by token
  // (data, then scale: vLLM's [data | scale] per token joins into one run) or
  // stream by stream (all data, then all scales: DeepSeek's [data of the
  // page | scales of the page]). A proof worth less than the bitmap (more
  // than T / 8 runs to sort) is not tried; otherwise, or where the runs
  // overlap, the bitmap below decides and names the byte.
  if (c.stride[3] == 1 && c.stride[2] == c.shape[3] && c.stride[1] == c.shape[2] * c.stride[2] &&
      c.stride[0] == c.shape[1] * c.stride[1]) {
    const size_t worth = static_cast<size_t>(T / 8 + 16);
    auto writes = [&](int64_t t) { return op.slot_mapping_fp8[t] >= 0 && op.slot_mapping_scale[t] >= 0; };
    for (const bool by_token : {true, false}) {
      RunSet runs;
      for (int64_t t = 0; t < T && runs.size() <= worth; ++t)
        if (writes(t)) {
          runs.add(op.slot_mapping_fp8[t], D);
          if (by_token) runs.add(op.slot_mapping_scale[t], kIndexerScaleBytes);
        }
      for (int64_t t = 0; !by_token && t < T && runs.size() <= worth; ++t)
        if (writes(t)) runs.add(op.slot_mapping_scale[t], kIndexerScaleBytes);
      if (runs.size() <= worth) {
        if (runs.disjoint()) return;
        break;  // an overlap: the bitmap names it
      }
    }
  }
  // One writer per byte: a bitmap over the cache's memory span marks every
  // byte a token will write (linear in the bytes written; a sort of all
  // offsets cost ~10x more), a run of unit stride a word's bits at a time.
  // On a collision, find the earlier writer.
  std::vector<uint64_t> seen(static_cast<size_t>((span + 63) / 64), 0);
  // visit_run(first, count, step) for the token's data and scale runs.
  auto for_each_run = [&](int64_t t, auto&& visit_run) {
    const int64_t data_base = op.slot_mapping_fp8[t], scale_base = op.slot_mapping_scale[t];
    if (data_base < 0 || scale_base < 0) return true;
    auto run_only = [&](int64_t, int64_t first, int64_t count, int64_t step) { return visit_run(first, count, step); };
    return indexer_for_each_run(c, data_base, D, run_only) &&
           indexer_for_each_run(c, scale_base, kIndexerScaleBytes, run_only);
  };
  // Marks the run's bytes; false (clash = a byte already marked) on a collision.
  int64_t clash = -1;
  auto mark = [&](int64_t first, int64_t count, int64_t step) {
    if (step == 1) {
      for (int64_t off = first; off < first + count;) {
        const int64_t bit = off & 63, bits = std::min<int64_t>(64 - bit, first + count - off);
        const uint64_t mask = (bits == 64 ? ~0ull : ((1ull << bits) - 1)) << bit;
        uint64_t& word = seen[static_cast<size_t>(off >> 6)];
        if (word & mask) {
          clash = (off & ~int64_t{63}) + std::countr_zero(word & mask);
          return false;
        }
        word |= mask;
        off += bits;
      }
      return true;
    }
    for (int64_t k = 0; k < count; ++k) {
      const int64_t off = first + k * step;
      const uint64_t bit = 1ull << (off & 63);
      uint64_t& word = seen[static_cast<size_t>(off >> 6)];
      if (word & bit) {
        clash = off;
        return false;
      }
      word |= bit;
    }
    return true;
  };
  for (int64_t t = 0; t < T; ++t) {
    if (for_each_run(t, mark)) continue;
    int64_t first = t;  // the token itself, if it writes one byte twice
    auto avoids_clash = [&](int64_t run_first, int64_t count, int64_t step) {
      for (int64_t k = 0; k < count; ++k)
        if (run_first + k * step == clash) return false;
      return true;
    };
    for (int64_t u = 0; u < t && first == t; ++u)
      if (!for_each_run(u, avoids_clash)) first = u;
    fail(ErrorCode::bad_argument, "cache byte at offset " + std::to_string(clash) + " is written twice (tokens " +
                                      std::to_string(first) + " and " + std::to_string(t) +
                                      "): rule: every written byte has one writer");
  }
}

}  // namespace kvsim
