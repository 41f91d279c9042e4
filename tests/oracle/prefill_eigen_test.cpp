// prefill_attention on the CPU oracle against attention computed with Eigen
// in double: causal single chunks, chunked prefill (past tokens already in
// the cache), sliding windows with sinks (the ring as written), GQA, fp32 and
// bf16 caches, odd page sizes. The pool is written here through this test's
// own NHD offset formula (contract §2), not through core's element_offset.
//
// Bound, per output element (u = 2^-24, n keys, c = ceil(D/32), parts =
// ceil(n/256), max|v| over the attended keys, S = max over keys of
// sum_d |q_d k_d| * scale):
//   score error      e_s <= (c + 5 + 1) u S          (fma run, 5 butterfly levels, scale)
//   probability      eps_p <= 2 e_s + u |s - m|max + 2.02 u   (s - m rounding, exp <= 1.01 ulp)
//   out = sum p v / sum p: relative p errors move it by <= 2 eps_p max|v|;
//   accumulation chains (P.V: 256 fma in a partition, then the merge; sum:
//   8 adds, 5 levels, merge) add <= (256 + 13 + 2 parts + 3) u max|v|.
// bound = max|v| * (2 eps_p + (272 + 2 parts) u) * 1.25 (slack for the
// second-order terms). The test also asserts the bound is tight enough to
// matter: below 2e-4 for every case here.
#include <doctest/doctest.h>

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "backends/backend.hpp"

#include "../support/rng.hpp"

using namespace kvsim;

namespace {

float hashed_value(uint32_t seed, int b, int kv, int head, int64_t pos, int dim) {
  uint64_t h = (seed * 0x9E3779B97F4A7C15ull) ^ (static_cast<uint64_t>(b) << 52) ^ (static_cast<uint64_t>(kv) << 48) ^
               (static_cast<uint64_t>(head) << 40) ^ (static_cast<uint64_t>(pos) << 12) ^ static_cast<uint64_t>(dim);
  return kvsim::testing::mixed_unit_value(h);
}

struct PrefillCase {
  const char* name;
  CacheDtype dtype;
  int page, kv_heads, group, head_dim;
  std::vector<int32_t> seq_lens;  // after the chunk
  std::vector<int32_t> chunk;     // new tokens (queries) per sequence
  int window = 0, sinks = 0;
  bool one_more_block = false;
};

// Returns the worst (error / bound) over every output element.
double check_case(const PrefillCase& c) {
  auto cpu = make_backend("cpu");
  PoolGeometry g{.layers = 1, .kv_factor = 2, .kv_heads = c.kv_heads, .tokens_per_block = c.page,
                 .head_dim = c.head_dim, .dtype = c.dtype, .layout = BlockLayout::nhd,
                 .placement = LayerPlacement::in_block};
  const WindowMapping w = c.window > 0 ? WindowMapping::make(c.window, c.sinks, c.page, c.one_more_block) : WindowMapping{};
  const int B = static_cast<int>(c.seq_lens.size());
  const int H = c.kv_heads, G = c.group, D = c.head_dim, P = c.page, Hq = H * G;
  int32_t max_blocks = 0;
  for (int32_t len : c.seq_lens) max_blocks = std::max<int32_t>(max_blocks, static_cast<int32_t>((w.cache_length(len) + P - 1) / P));
  g.primary_blocks = static_cast<int64_t>(B) * max_blocks;
  std::vector<int32_t> table(static_cast<size_t>(B) * max_blocks);
  // Scrambled: i -> (i * m + 3) mod n is a permutation when gcd(m, n) = 1.
  size_t m = 5;
  while (std::gcd(m, table.size()) != 1) ++m;
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>((i * m + 3) % table.size());

  // Write every token in position order (a ring slot keeps its last writer)
  // and remember which token each slot holds.
  const int elem = bits_per_element(g.dtype) / 8;
  std::vector<uint8_t> pool(g.pool_bytes(PoolKind::primary), 0);
  std::vector<std::vector<int64_t>> slot_token(B);
  auto offset = [&](int64_t block, int kv, int head, int token, int dim) {
    return ((block * 2 + kv) * H * P + static_cast<int64_t>(token) * H + head) * D + dim;
  };
  auto stored = [&](float v) {
    return g.dtype == CacheDtype::bf16 ? static_cast<double>(codec::bf16_to_f32(codec::f32_to_bf16(v))) : static_cast<double>(v);
  };
  for (int b = 0; b < B; ++b) {
    // Slots no token wrote (page tails) get values of their own (negative ids).
    slot_token[b].assign(static_cast<size_t>(max_blocks) * P, 0);
    for (int64_t s = 0; s < static_cast<int64_t>(max_blocks) * P; ++s) slot_token[b][s] = -1 - s;
    for (int64_t t = 0; t < c.seq_lens[b]; ++t) slot_token[b][w.cache_token(t)] = t;
    for (int64_t s = 0; s < static_cast<int64_t>(max_blocks) * P; ++s) {
      const int64_t block = table[b * max_blocks + s / P];
      for (int kv = 0; kv < 2; ++kv)
        for (int h = 0; h < H; ++h)
          for (int d = 0; d < D; ++d) {
            const float v = hashed_value(11, b, kv, h, slot_token[b][s], d);
            uint8_t* dst = pool.data() + offset(block, kv, h, static_cast<int>(s % P), d) * elem;
            if (g.dtype == CacheDtype::bf16) {
              const uint16_t code = codec::f32_to_bf16(v);
              std::memcpy(dst, &code, 2);
            } else {
              std::memcpy(dst, &v, 4);
            }
          }
    }
  }

  std::vector<int32_t> indptr{0};
  for (int32_t n : c.chunk) indptr.push_back(indptr.back() + n);
  const int64_t rows = indptr.back();
  std::vector<float> q(rows * Hq * D), out(rows * Hq * D, -7.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int h = 0; h < Hq; ++h)
      for (int d = 0; d < D; ++d) q[(r * Hq + h) * D + d] = hashed_value(29, 0, 7, h, r, d);

  KvPools pools = cpu->allocate_pools(g);
  cpu->to_backend(pools.data[0], pool.data(), pool.size());
  BackendBuffer qb(*cpu, q.size() * 4), ob(*cpu, out.size() * 4);
  qb.upload(q.data(), q.size() * 4);
  PrefillAttentionOp op;
  op.q = contiguous_view(qb.get(), CacheDtype::fp32, {rows, Hq, D});
  op.out = contiguous_view(ob.get(), CacheDtype::fp32, {rows, Hq, D});
  op.q_indptr = indptr;
  op.seq_lens = c.seq_lens;
  op.block_table = table;
  op.max_blocks_per_seq = max_blocks;
  op.scales.sm_scale = 1.0f / std::sqrt(static_cast<float>(D));
  op.scales.v_scale = 0.75f;
  op.window = w;
  cpu->prefill_attention(pools, op);
  ob.download(out.data(), out.size() * 4);
  cpu->release_pools(pools);

  const double u = std::ldexp(1.0, -24);
  const double scale = static_cast<double>(op.scales.sm_scale);
  double worst = 0.0;
  for (int b = 0; b < B; ++b)
    for (int32_t i = indptr[b]; i < indptr[b + 1]; ++i) {
      const int64_t p = prefill_position(c.seq_lens[b], indptr[b], indptr[b + 1], i);
      // Attended positions: sinks, then the window (or 0..p).
      std::vector<int64_t> keys;
      if (w.enabled()) {
        for (int64_t t = 0; t < std::min<int64_t>(w.sinks, p + 1); ++t) keys.push_back(t);
        for (int64_t t = std::max<int64_t>(w.sinks, p + 1 - (w.window - w.sinks)); t <= p; ++t) keys.push_back(t);
      } else {
        for (int64_t t = 0; t <= p; ++t) keys.push_back(t);
      }
      const int n = static_cast<int>(keys.size());
      const int parts = (n + 255) / 256;
      for (int h = 0; h < Hq; ++h) {
        const int kvh = h / G;
        Eigen::MatrixXd K(n, D), V(n, D);
        for (int j = 0; j < n; ++j) {
          const int64_t writer = slot_token[b][w.cache_token(keys[j])];  // the token the slot holds
          for (int d = 0; d < D; ++d) {
            K(j, d) = stored(hashed_value(11, b, 0, kvh, writer, d));
            V(j, d) = stored(hashed_value(11, b, 1, kvh, writer, d));
          }
        }
        Eigen::VectorXd qv(D);
        for (int d = 0; d < D; ++d) qv(d) = q[(static_cast<int64_t>(i) * Hq + h) * D + d];
        const Eigen::VectorXd s = (K * qv) * scale;
        const double m = s.maxCoeff();
        const Eigen::VectorXd e = (s.array() - m).exp().matrix();
        const Eigen::VectorXd ref = (V.transpose() * e / e.sum()) * 0.75;
        const double S = (K.cwiseAbs() * qv.cwiseAbs()).maxCoeff() * scale;
        const double e_s = (std::ceil(D / 32.0) + 6) * u * S;
        const double eps_p = 2 * e_s + u * (s.maxCoeff() - s.minCoeff()) + 2.02 * u;
        const double vmax = V.cwiseAbs().maxCoeff() * 0.75;
        const double bound = vmax * (2 * eps_p + (272 + 2 * parts) * u) * 1.25;
        REQUIRE(bound < 2e-4);
        for (int d = 0; d < D; ++d) {
          const double got = out[(static_cast<int64_t>(i) * Hq + h) * D + d];
          const double err = std::fabs(got - ref(d));
          INFO(std::string(c.name) << ": seq " << b << " row " << i << " head " << h << " dim " << d << " got " << got << " ref "
                      << ref(d) << " bound " << bound);
          REQUIRE(err <= bound);
          worst = std::max(worst, err / bound);
        }
      }
    }
  return worst;
}

}  // namespace

TEST_CASE("prefill_attention matches Eigen double attention within the stated bound") {
  const PrefillCase cases[] = {
      {"causal one chunk, fp32, P=7, MHA", CacheDtype::fp32, 7, 2, 1, 64, {37, 300}, {37, 300}},
      {"causal one chunk, bf16, P=16, GQA 4", CacheDtype::bf16, 16, 2, 4, 128, {260, 5}, {260, 5}},
      {"chunked (past in cache), fp32, P=3, GQA 8", CacheDtype::fp32, 3, 1, 8, 80, {700, 513, 9}, {41, 1, 9}},
      {"chunked, bf16, P=17, GQA 4, D=256", CacheDtype::bf16, 17, 1, 4, 256, {600, 90}, {23, 30}},
      {"window + sinks, fp32, P=16, GQA 4", CacheDtype::fp32, 16, 2, 4, 64, {500, 150}, {1, 20}, 128, 4},
      {"window + sinks + one more block, bf16, P=7, GQA 8", CacheDtype::bf16, 7, 1, 8, 128, {400, 131}, {6, 7}, 97, 13, true},
      {"window without sinks, fp32, P=1", CacheDtype::fp32, 1, 1, 1, 64, {300}, {17}, 64, 0},
  };
  for (const PrefillCase& c : cases) {
    const double worst = check_case(c);
    MESSAGE(std::string(c.name) << ": worst error / bound = " << worst);
    CHECK(worst <= 1.0);
  }
}
