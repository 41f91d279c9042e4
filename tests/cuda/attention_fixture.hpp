// A paged-attention problem built once on the host and placed in both the CPU
// oracle's memory and device memory (tests/cuda/attention_*_test.cu and the
// attention benchmark share it). Pools are poisoned with 0xFF bytes (NaN in
// every float cache dtype) except the pages the block table references, which
// hold random valid codes; blocks are handed out in a shuffled order.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvsim/validation.hpp"
#include "backends/backend.hpp"

namespace kvsim::test {

struct AttentionCase {
  CacheDtype dtype = CacheDtype::bf16;
  BlockLayout layout = BlockLayout::nhd;
  LayerPlacement placement = LayerPlacement::in_block;
  int32_t page = 16;
  int32_t kv_heads = 2;
  int32_t group = 4;
  int32_t head_dim = 128;
  std::vector<int32_t> seq_lens;
  std::vector<int32_t> chunk;  // prefill: new tokens per sequence (empty for decode)
  int32_t window = 0, sinks = 0;
  bool one_more_block = false;
  CacheDtype q_dtype = CacheDtype::fp32, out_dtype = CacheDtype::fp32;
  bool nan_tail = false;  // leave the last page's slots after the sequence poisoned
  // Every special_every-th element of a live slot (0: none) gets an Inf or NaN
  // code of the cache dtype (fp32/fp16/bf16/e4m3/e5m2; none in int8/nvfp4).
  int32_t special_every = 0;
  uint32_t seed = 1;
  AttentionOrder order = AttentionOrder::fp32;
  // >= 0: every live K row is one base row (per KV head) plus key_spread times
  // uniform noise in [-1, 1]: near-tie scores (0: every key the same).
  float key_spread = -1.0f;

  std::string describe() const {
    std::string s = std::string(dtype_name(dtype)) + " " + std::string(layout_name(layout)) + " " +
                    std::string(placement_name(placement)) + " P=" + std::to_string(page) + " H=" +
                    std::to_string(kv_heads) + " G=" + std::to_string(group) + " D=" + std::to_string(head_dim) +
                    " q=" + std::string(dtype_name(q_dtype)) + " out=" + std::string(dtype_name(out_dtype)) +
                    " window=" + std::to_string(window) + "/" + std::to_string(sinks) + (one_more_block ? "+1" : "") +
                    (nan_tail ? " nan-tail" : "") +
                    (special_every ? " inf/nan every " + std::to_string(special_every) : "") +
                    (key_spread >= 0.0f ? " key spread " + std::to_string(key_spread) : "") + " order " +
                    attention_order_name(order) + " lens=";
    for (int32_t l : seq_lens) s += std::to_string(l) + ",";
    if (!chunk.empty()) {
      s += " chunks=";
      for (int32_t c : chunk) s += std::to_string(c) + ",";
    }
    return s;
  }
};

inline void cuda_or_throw(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Host images of the problem.
struct AttentionProblem {
  AttentionCase c;
  PoolGeometry geometry;
  WindowMapping window;
  int32_t max_blocks = 0;
  std::vector<int32_t> table;
  std::vector<int32_t> q_indptr;  // prefill
  int64_t rows = 0;
  std::vector<uint8_t> pool, scales, q;
  AttentionScales attention_scales;
  int32_t query_heads() const { return c.kv_heads * c.group; }
  int64_t out_bytes() const { return rows * query_heads() * c.head_dim * (bits_per_element(c.out_dtype) / 8); }
};

inline uint8_t random_code(CacheDtype t, std::mt19937& rng, std::vector<uint8_t>& bytes_out) {
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  bytes_out.clear();
  switch (t) {
    case CacheDtype::fp32: {
      const float f = uni(rng);
      bytes_out.resize(4);
      std::memcpy(bytes_out.data(), &f, 4);
      break;
    }
    case CacheDtype::fp16:
    case CacheDtype::bf16: {
      const uint16_t h = t == CacheDtype::fp16 ? codec::f32_to_f16(uni(rng)) : codec::f32_to_bf16(uni(rng));
      bytes_out.resize(2);
      std::memcpy(bytes_out.data(), &h, 2);
      break;
    }
    case CacheDtype::fp8_e4m3: bytes_out.push_back(codec::f32_to_e4m3(uni(rng) * 8.0f)); break;
    case CacheDtype::fp8_e5m2: bytes_out.push_back(codec::f32_to_e5m2(uni(rng) * 8.0f)); break;
    case CacheDtype::int8: bytes_out.push_back(static_cast<uint8_t>(static_cast<int8_t>(rng() % 255 - 127))); break;
    case CacheDtype::nvfp4: return static_cast<uint8_t>(rng() & 0xF);
  }
  return 0;
}

// An Inf or NaN code of a float cache dtype (k picks which, both signs),
// little-endian bytes; empty for dtypes without such codes.
inline std::vector<uint8_t> special_code(CacheDtype t, uint32_t k) {
  const bool neg = (k >> 2) & 1;
  switch (t) {
    case CacheDtype::fp32: {
      const uint32_t v[] = {0x7F800000u, 0x7FC00000u, 0x7FC01234u, 0x7F800001u};
      const uint32_t x = v[k % 4] | (neg ? 0x80000000u : 0u);
      return {uint8_t(x), uint8_t(x >> 8), uint8_t(x >> 16), uint8_t(x >> 24)};
    }
    case CacheDtype::fp16: {
      const uint16_t v[] = {0x7C00u, 0x7E00u, 0x7C01u, 0x7FFFu};
      const uint16_t x = uint16_t(v[k % 4] | (neg ? 0x8000u : 0u));
      return {uint8_t(x), uint8_t(x >> 8)};
    }
    case CacheDtype::bf16: {
      const uint16_t v[] = {0x7F80u, 0x7FC0u, 0x7F81u, 0x7FFFu};
      const uint16_t x = uint16_t(v[k % 4] | (neg ? 0x8000u : 0u));
      return {uint8_t(x), uint8_t(x >> 8)};
    }
    case CacheDtype::fp8_e4m3: return {uint8_t(neg ? 0xFF : 0x7F)};
    case CacheDtype::fp8_e5m2: {
      const uint8_t v[] = {0x7C, 0x7D, 0x7E, 0x7F};
      return {uint8_t(v[k % 4] | (neg ? 0x80 : 0))};
    }
    default: return {};
  }
}

inline AttentionProblem make_problem(const AttentionCase& c) {
  AttentionProblem p;
  p.c = c;
  PoolGeometry& g = p.geometry;
  g = {.layers = 2, .kv_factor = 2, .kv_heads = c.kv_heads, .tokens_per_block = c.page, .head_dim = c.head_dim,
       .dtype = c.dtype, .layout = c.layout, .placement = c.placement};
  p.window = c.window > 0 ? WindowMapping::make(c.window, c.sinks, c.page, c.one_more_block) : WindowMapping{};
  std::mt19937 rng(c.seed);
  std::vector<int64_t> pages(c.seq_lens.size());
  int64_t total_pages = 0;
  for (size_t b = 0; b < c.seq_lens.size(); ++b) {
    pages[b] = (p.window.cache_length(c.seq_lens[b]) + c.page - 1) / c.page;
    p.max_blocks = std::max<int32_t>(p.max_blocks, static_cast<int32_t>(pages[b]));
    total_pages += pages[b];
  }
  g.primary_blocks = total_pages + 5;  // spare blocks stay poisoned
  validate_geometry(g);
  std::vector<int32_t> ids(g.primary_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  p.table.assign(c.seq_lens.size() * p.max_blocks, kBadPage);
  size_t next = 0;
  for (size_t b = 0; b < c.seq_lens.size(); ++b)
    for (int64_t pg = 0; pg < pages[b]; ++pg) p.table[b * p.max_blocks + pg] = ids[next++];

  const PoolStrides st = contiguous_strides(g);
  p.pool.assign(g.pool_bytes(PoolKind::primary), 0xFF);
  PoolStrides sst{};
  if (g.has_scale_pool()) {
    sst = contiguous_strides(g.scale_geometry());
    p.scales.assign(g.scale_geometry().pool_bytes(PoolKind::primary), 0xFF);
  }
  const int elem = bits_per_element(g.dtype) / 8;
  std::vector<uint8_t> code;
  std::vector<float> key_base;  // [kv_heads][head_dim]
  if (c.key_spread >= 0.0f) {
    std::mt19937 base_rng(c.seed ^ 0x5EEDu);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    for (int64_t i = 0; i < int64_t{g.kv_heads} * g.head_dim; ++i) key_base.push_back(uni(base_rng));
  }
  for (size_t b = 0; b < c.seq_lens.size(); ++b) {
    const int64_t live_slots = p.window.cache_length(c.seq_lens[b]);
    for (int64_t pg = 0; pg < pages[b]; ++pg) {
      const int64_t block = p.table[b * p.max_blocks + pg];
      for (int32_t t = 0; t < c.page; ++t) {
        if (c.nan_tail && pg * c.page + t >= live_slots) continue;
        for (int32_t l = 0; l < g.layers; ++l)
          for (int32_t kv = 0; kv < 2; ++kv)
            for (int32_t h = 0; h < g.kv_heads; ++h)
              for (int32_t d = 0; d < g.head_dim; ++d) {
                const int64_t off = element_offset(st, block, l, kv, h, t, d);
                if (g.dtype == CacheDtype::nvfp4) {
                  store_nibble(p.pool.data(), off, random_code(g.dtype, rng, code));
                  if (d % 16 == 0)  // block scale near 1 (e4m3 of 0.5 .. 2)
                    p.scales[scale_offset(sst, block, l, kv, h, t, d)] =
                        codec::f32_to_e4m3(0.5f + 1.5f * static_cast<float>(rng() % 1024) / 1024.0f);
                } else {
                  random_code(g.dtype, rng, code);
                  if (kv == 0 && !key_base.empty()) {
                    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
                    const float f = key_base[int64_t{h} * g.head_dim + d] + c.key_spread * uni(rng);
                    if (g.dtype == CacheDtype::fp32) {
                      std::memcpy(code.data(), &f, 4);
                    } else {
                      const uint16_t x = g.dtype == CacheDtype::fp16 ? codec::f32_to_f16(f) : codec::f32_to_bf16(f);
                      std::memcpy(code.data(), &x, 2);
                    }
                  }
                  if (c.special_every > 0 && rng() % c.special_every == 0) {
                    const std::vector<uint8_t> sp = special_code(g.dtype, rng());
                    if (!sp.empty()) code = sp;
                  }
                  std::memcpy(p.pool.data() + off * elem, code.data(), elem);
                }
              }
      }
    }
  }

  // Query rows.
  if (c.chunk.empty()) {
    p.rows = static_cast<int64_t>(c.seq_lens.size());
  } else {
    p.q_indptr.push_back(0);
    for (int32_t n : c.chunk) p.q_indptr.push_back(p.q_indptr.back() + n);
    p.rows = p.q_indptr.back();
  }
  const int qbytes = bits_per_element(c.q_dtype) / 8;
  p.q.resize(p.rows * p.query_heads() * c.head_dim * qbytes);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  for (int64_t i = 0; i < p.rows * p.query_heads() * c.head_dim; ++i) store_float(p.q.data(), c.q_dtype, i, uni(rng));

  AttentionScales& s = p.attention_scales;
  s.sm_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  if (is_fp8(c.dtype)) {
    s.k_scale = 0.125f;
    s.v_scale = 0.1f;
  } else if (c.dtype == CacheDtype::int8) {
    s.k_scale = 1.0f / 127.0f;
    s.v_scale = 0.0078125f;
  } else if (c.dtype == CacheDtype::nvfp4) {
    s.k_global_scale = 0.3f;
    s.v_global_scale = 0.01f;
  }
  return p;
}

// The problem's pools / q / out in one backend's memory (host for cpu).
struct PlacedProblem {
  KvPools pools;
  void* q = nullptr;
  void* out = nullptr;
};

inline TensorView q_view(const AttentionProblem& p, void* data) {
  return contiguous_view(data, p.c.q_dtype, {p.rows, p.query_heads(), p.c.head_dim});
}
inline TensorView out_view(const AttentionProblem& p, void* data) {
  return contiguous_view(data, p.c.out_dtype, {p.rows, p.query_heads(), p.c.head_dim});
}

// The fields a decode and a prefill op of the problem share.
template <class Op>
Op attention_op(const AttentionProblem& p, const PlacedProblem& placed) {
  Op op;
  op.layer = 1;
  op.q = q_view(p, placed.q);
  op.out = out_view(p, placed.out);
  op.seq_lens = p.c.seq_lens;
  op.block_table = p.table;
  op.max_blocks_per_seq = p.max_blocks;
  op.scales = p.attention_scales;
  op.window = p.window;
  op.order = p.c.order;
  return op;
}

inline DecodeAttentionOp decode_op(const AttentionProblem& p, const PlacedProblem& placed) {
  return attention_op<DecodeAttentionOp>(p, placed);
}

inline PrefillAttentionOp prefill_op(const AttentionProblem& p, const PlacedProblem& placed) {
  PrefillAttentionOp op = attention_op<PrefillAttentionOp>(p, placed);
  op.q_indptr = p.q_indptr;
  return op;
}

// Device copy (cudaMalloc) of a problem; the output is poisoned with 0xFF.
struct DeviceProblem {
  PlacedProblem placed;
  explicit DeviceProblem(const AttentionProblem& p) {
    const PoolGeometry& g = p.geometry;
    placed.pools.geometry = g;
    placed.pools.strides[0] = contiguous_strides(g);
    cuda_or_throw(cudaMalloc(&placed.pools.data[0], p.pool.size()), "cudaMalloc pool");
    cuda_or_throw(cudaMemcpy(placed.pools.data[0], p.pool.data(), p.pool.size(), cudaMemcpyHostToDevice), "upload pool");
    if (g.has_scale_pool()) {
      placed.pools.scale_strides[0] = contiguous_strides(g.scale_geometry());
      cuda_or_throw(cudaMalloc(&placed.pools.scales[0], p.scales.size()), "cudaMalloc scales");
      cuda_or_throw(cudaMemcpy(placed.pools.scales[0], p.scales.data(), p.scales.size(), cudaMemcpyHostToDevice),
                    "upload scales");
    }
    cuda_or_throw(cudaMalloc(&placed.q, p.q.size()), "cudaMalloc q");
    cuda_or_throw(cudaMemcpy(placed.q, p.q.data(), p.q.size(), cudaMemcpyHostToDevice), "upload q");
    cuda_or_throw(cudaMalloc(&placed.out, p.out_bytes()), "cudaMalloc out");
    poison_out(p);
  }
  void poison_out(const AttentionProblem& p) { cuda_or_throw(cudaMemset(placed.out, 0xFF, p.out_bytes()), "poison out"); }
  std::vector<uint8_t> download_out(const AttentionProblem& p) const {
    std::vector<uint8_t> host(p.out_bytes());
    cuda_or_throw(cudaMemcpy(host.data(), placed.out, host.size(), cudaMemcpyDeviceToHost), "download out");
    return host;
  }
  ~DeviceProblem() {
    cudaFree(placed.pools.data[0]);
    cudaFree(placed.pools.scales[0]);
    cudaFree(placed.q);
    cudaFree(placed.out);
  }
  DeviceProblem(const DeviceProblem&) = delete;
  DeviceProblem& operator=(const DeviceProblem&) = delete;
};

// The oracle's output bytes for a problem (decode when c.chunk is empty).
inline std::vector<uint8_t> oracle_output(Backend& cpu, const AttentionProblem& p) {
  PlacedProblem placed;
  placed.pools = cpu.allocate_pools(p.geometry, 0xFF);
  cpu.to_backend(placed.pools.data[0], p.pool.data(), p.pool.size());
  if (p.geometry.has_scale_pool()) cpu.to_backend(placed.pools.scales[0], p.scales.data(), p.scales.size());
  BackendBuffer q(cpu, p.q.size()), out(cpu, p.out_bytes());
  q.upload(p.q.data(), p.q.size());
  cpu.fill(out.get(), 0xFF, p.out_bytes());
  placed.q = q.get();
  placed.out = out.get();
  if (p.c.chunk.empty())
    cpu.decode_attention(placed.pools, decode_op(p, placed));
  else
    cpu.prefill_attention(placed.pools, prefill_op(p, placed));
  std::vector<uint8_t> host(p.out_bytes());
  out.download(host.data(), host.size());
  cpu.release_pools(placed.pools);
  return host;
}

}  // namespace kvsim::test
