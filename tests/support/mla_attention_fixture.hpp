// A latent pool written by append_mla and one mla_attention op over it, on any
// backend (cpu, cuda, or a DifferentialBackend comparing them). Shared by the
// CPU oracle test (tests/oracle/mla_attention_test.cpp) and the GPU
// differential test (tests/cuda/mla_attention_differential_test.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "backends/backend.hpp"

namespace kvsim::test {

struct MlaCase {
  CacheDtype dtype = CacheDtype::bf16;  // latent pool dtype
  int32_t page_size = 16;
  int32_t d_ckv = 64;
  int32_t d_kpe = 16;
  int32_t heads = 8;                    // query heads over the one latent head
  std::vector<int32_t> lens{5, 40};     // tokens per sequence
  int32_t chunk = 0;                    // 0: decode (one query per sequence); else the last `chunk` tokens as prefill rows
  CacheDtype q_dtype = CacheDtype::fp32;
  float scale = 1.0f;                   // fp8 / int8 latent scale
  uint64_t seed = 1;
};

inline float mla_value(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + a * 0xBF58476D1CE4E5B9ull + b * 0x94D049BB133111EBull + c;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<int64_t>(z >> 40) - (int64_t{1} << 23)) / static_cast<float>(1 << 23);
}

inline PoolGeometry mla_geometry(const MlaCase& c) {
  int64_t pages = 0;
  for (int32_t n : c.lens) pages += (n + c.page_size - 1) / c.page_size;
  const int32_t width = c.d_ckv + (c.dtype == CacheDtype::nvfp4 ? 2 : 1) * c.d_kpe;
  return PoolGeometry{2, 1, 1, c.page_size, width, c.dtype, BlockLayout::nhd, LayerPlacement::in_block, pages + 3, 0};
}

// Everything the op reads, kept alive together.
struct MlaSetup {
  Backend* backend = nullptr;
  KvPools pools;
  std::vector<int32_t> table, seq_lens, q_indptr;
  int32_t max_blocks = 0;
  int64_t rows = 0;
  BackendBuffer q, out;
  MlaAttentionOp op;
  ~MlaSetup() {
    if (backend) backend->release_pools(pools);
  }
};

// Fills both layers of a fresh pool through append_mla (layer 0 with other
// values, so a layer mix-up shows), builds q and the op (layer 1).
inline void mla_setup(Backend& be, const MlaCase& c, MlaSetup& s) {
  const PoolGeometry g = mla_geometry(c);
  s.backend = &be;
  s.pools = be.allocate_pools(g, 0x5A);
  const int32_t P = c.page_size;
  for (int32_t n : c.lens) s.max_blocks = std::max(s.max_blocks, (n + P - 1) / P);
  // Blocks in a shuffled order, so a table that is not the identity is read.
  std::vector<int32_t> ids(static_cast<size_t>(g.primary_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  for (size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[(i * 7 + c.seed) % i]);
  std::vector<int32_t> indptr{0}, indices, last_page_len, batch, positions;
  size_t next = 0;
  s.table.assign(c.lens.size() * static_cast<size_t>(s.max_blocks), kBadPage);
  for (size_t b = 0; b < c.lens.size(); ++b) {
    const int32_t pages = (c.lens[b] + P - 1) / P;
    for (int32_t p = 0; p < pages; ++p) {
      s.table[b * s.max_blocks + p] = ids[next];
      indices.push_back(ids[next++]);
    }
    indptr.push_back(static_cast<int32_t>(indices.size()));
    last_page_len.push_back(c.lens[b] - (pages - 1) * P);
    for (int32_t t = 0; t < c.lens[b]; ++t) {
      batch.push_back(static_cast<int32_t>(b));
      positions.push_back(t);
    }
    s.seq_lens.push_back(c.lens[b]);
  }
  const int64_t nnz = static_cast<int64_t>(batch.size());
  // The input dtype append_mla takes: the pool's own for 8-bit codes and floats, fp32 for nvfp4.
  const CacheDtype in = c.dtype == CacheDtype::nvfp4 ? CacheDtype::fp32 : c.dtype;
  const int32_t eb = bits_per_element(in) / 8;
  for (int32_t layer = 0; layer < 2; ++layer) {
    std::vector<uint8_t> ckv(static_cast<size_t>(nnz * c.d_ckv * eb)), kpe(static_cast<size_t>(nnz * std::max(c.d_kpe, 1) * eb));
    auto put = [&](std::vector<uint8_t>& buf, int64_t i, float x) {
      if (is_float_input(in)) store_float(buf.data(), in, i, x);
      else if (in == CacheDtype::fp8_e4m3) buf[i] = codec::f32_to_e4m3(x / c.scale);
      else if (in == CacheDtype::fp8_e5m2) buf[i] = codec::f32_to_e5m2(x / c.scale);
      else buf[i] = static_cast<uint8_t>(codec::f32_to_int8(x / c.scale));
    };
    for (int64_t i = 0; i < nnz; ++i) {
      for (int32_t d = 0; d < c.d_ckv; ++d) put(ckv, i * c.d_ckv + d, mla_value(c.seed + layer, 1, i, d));
      for (int32_t d = 0; d < c.d_kpe; ++d) put(kpe, i * c.d_kpe + d, mla_value(c.seed + layer, 2, i, d));
    }
    BackendBuffer ckv_b(be, ckv.size()), kpe_b(be, kpe.size());
    ckv_b.upload(ckv.data(), ckv.size());
    kpe_b.upload(kpe.data(), kpe.size());
    AppendMlaOp w;
    w.layer = layer;
    w.ckv = contiguous_view(ckv_b.get(), in, {nnz, c.d_ckv});
    w.kpe = contiguous_view(kpe_b.get(), in, {nnz, c.d_kpe});
    w.coordinates() = {batch, positions, indptr, indices, last_page_len};
    w.ckv_global_scale = 0.02f;
    w.kpe_scale = 0.125f;
    be.append_mla(s.pools, w);
  }
  // Queries: decode, or the last `chunk` tokens of each sequence.
  if (c.chunk > 0) {
    s.q_indptr.push_back(0);
    for (int32_t n : c.lens) s.q_indptr.push_back(s.q_indptr.back() + std::min(c.chunk, n));
    s.rows = s.q_indptr.back();
  } else {
    s.rows = static_cast<int64_t>(c.lens.size());
  }
  const int32_t dq = c.d_ckv + c.d_kpe;
  const int32_t qb = bits_per_element(c.q_dtype) / 8;
  std::vector<uint8_t> q(static_cast<size_t>(s.rows * c.heads * dq * qb));
  // A query's values depend on its sequence and position, not its row: a chunk's rows equal the whole prefill's.
  int64_t r = 0;
  for (size_t b = 0; b < c.lens.size(); ++b) {
    const int32_t n = c.chunk > 0 ? std::min(c.chunk, c.lens[b]) : 1;
    for (int32_t i = 0; i < n; ++i, ++r)
      for (int64_t e = 0; e < int64_t{c.heads} * dq; ++e)
        store_float(q.data(), c.q_dtype, r * c.heads * dq + e,
                    mla_value(c.seed, 3, b * 1000003 + static_cast<uint64_t>(c.lens[b] - n + i), static_cast<uint64_t>(e)));
  }
  s.q = BackendBuffer(be, q.size());
  s.q.upload(q.data(), q.size());
  s.out = BackendBuffer(be, static_cast<size_t>(s.rows * c.heads * c.d_ckv * 4));
  be.fill(s.out.get(), 0, s.out.bytes());
  const bool coded = has_tensor_scale(c.dtype);
  s.op = {.layer = 1, .q = contiguous_view(s.q.get(), c.q_dtype, {s.rows, c.heads, dq}),
          .out = contiguous_view(s.out.get(), CacheDtype::fp32, {s.rows, c.heads, c.d_ckv}),
          .q_indptr = s.q_indptr, .seq_lens = s.seq_lens, .block_table = s.table, .max_blocks_per_seq = s.max_blocks,
          .d_ckv = c.d_ckv, .d_kpe = c.d_kpe, .sm_scale = 1.0f / 24.0f, .scale = coded ? c.scale : 1.0f,
          .ckv_global_scale = 0.02f, .kpe_scale = 0.125f};
}

// The op's output, as fp32 values.
inline std::vector<float> mla_output(const MlaSetup& s) {
  std::vector<float> out(s.out.bytes() / 4);
  s.out.download(out.data(), s.out.bytes());
  return out;
}

}  // namespace kvsim::test
