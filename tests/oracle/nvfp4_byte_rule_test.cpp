// The one nvfp4 one-writer-per-byte rule (validation/checks.hpp):
//   * it accepts a stride set exactly when brute force over every element
//     finds each nibble pair (2i, 2i+1) of every row in one byte (random
//     stride sets, both answers drawn often), including the cases the three
//     per-op rules it replaces got wrong;
//   * on every op that writes or copies nvfp4 rows, through the Backend entry
//     points of the CPU oracle: append_paged, qkv_preprocess_write,
//     partial_copy, copy_blocks and offload/onboard each
//   * accept the strides the old per-op rules got wrong in the strict
//     direction (x = 1; an odd block stride of a one-block pool) and write the
//     same bytes as through the dense strides (the offsets are the same);
//   * reject, with one message, strides whose nibble pairs straddle a byte
//     (x = 8 with an odd dim/x stride, which qkv_preprocess_write accepted),
//     leaving the pool unchanged.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kvsim/validation.hpp"
#include "backends/backend.hpp"

#include "../support/rng.hpp"
#include "../support/validation.hpp"

using namespace kvsim;
using kvsim::test::catch_validation;
using kvsim::testing::Rng;

namespace {

constexpr int32_t kHeads = 2, kTokens = 4, kDim = 32;

PoolGeometry nvfp4_geometry(int64_t blocks) {
  return {.kv_heads = kHeads,
          .tokens_per_block = kTokens,
          .head_dim = kDim,
          .dtype = CacheDtype::nvfp4,
          .primary_blocks = blocks,
          .secondary_blocks = blocks};
}

// Host pools with caller strides over buffers large enough for any strides here.
struct HostPools {
  std::vector<uint8_t> data[2], scales[2];
  KvPools pools;
  HostPools(const PoolGeometry& g, const PoolStrides& s) {
    pools.geometry = g;
    const PoolStrides dense_scales = contiguous_strides(g.scale_geometry());
    for (int k = 0; k < 2; ++k) {
      data[k].assign(1 << 16, 0);
      scales[k].assign(1 << 12, 0);
      for (size_t i = 0; i < data[k].size(); ++i) data[k][i] = static_cast<uint8_t>(i * 7 + 3);
      pools.data[k] = data[k].data();
      pools.scales[k] = scales[k].data();
      pools.strides[k] = s;
      pools.scale_strides[k] = dense_scales;
      pools.allocation_elements[k] = static_cast<int64_t>(data[k].size()) * 2;
      pools.scale_allocation_elements[k] = static_cast<int64_t>(scales[k].size());
    }
  }
  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> all = data[0];
    for (const auto* v : {&data[1], &scales[0], &scales[1]}) all.insert(all.end(), v->begin(), v->end());
    return all;
  }
};

// Every op that writes or copies nvfp4 rows, run on `pools` (one token at
// position 0 of block 0; block copies 0 -> 1 where there are two blocks).
struct Ops {
  std::vector<float> k, v, qkv, q_out;
  std::vector<int32_t> zero{0}, one{1}, indptr{0, 1}, one_list{1};
  Ops() : k(kHeads * kDim), v(kHeads * kDim), qkv(3 * kHeads * kDim), q_out(kHeads * kDim) {
    for (size_t i = 0; i < k.size(); ++i) k[i] = 0.25f * static_cast<float>(i % 13) - 1.0f, v[i] = -k[i];
    for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = 0.5f * static_cast<float>(i % 11) - 2.0f;
  }
  std::vector<std::pair<std::string, std::function<void(Backend&, const KvPools&)>>> all(int64_t blocks) {
    std::vector<std::pair<std::string, std::function<void(Backend&, const KvPools&)>>> ops;
    ops.emplace_back("append_paged", [this](Backend& b, const KvPools& p) {
      AppendPagedOp op;
      op.k = contiguous_view(k.data(), CacheDtype::fp32, {1, kHeads, kDim});
      op.v = contiguous_view(v.data(), CacheDtype::fp32, {1, kHeads, kDim});
      op.coordinates() = {zero, zero, indptr, zero, one};
      b.append_paged(p, op);
    });
    ops.emplace_back("qkv_preprocess_write", [this](Backend& b, const KvPools& p) {
      QkvPreprocessOp op;
      op.num_q_heads = kHeads;
      op.qkv = contiguous_view(qkv.data(), CacheDtype::fp32, {1, 3 * kHeads * kDim});
      op.q_out = contiguous_view(q_out.data(), CacheDtype::fp32, {1, kHeads, kDim});
      op.seq_lens = one, op.cache_lens = one, op.block_table = zero, op.max_blocks_per_seq = 1;
      b.qkv_preprocess_write(p, op);
    });
    if (blocks < 2) return ops;
    ops.emplace_back("partial_copy", [](Backend& b, const KvPools& p) { b.partial_copy(p, PartialCopyOp{0, 1, 0}); });
    ops.emplace_back("copy_blocks", [](Backend& b, const KvPools& p) {
      b.copy_blocks(p, CopyBlocksOp{std::vector<std::pair<int32_t, int32_t>>{{0, 1}}});
    });
    ops.emplace_back("move_blocks", [this](Backend& b, const KvPools& p) { b.offload(p, MoveBlocksOp{one_list, zero}); });
    return ops;
  }
};

}  // namespace

TEST_CASE("every nvfp4 op accepts strides whose nibble pairs share a byte, and writes what the dense strides write") {
  auto backend = make_backend("cpu");
  Ops ops;
  for (int64_t blocks : {1, 2}) {
    const PoolGeometry g = nvfp4_geometry(blocks);
    const PoolStrides dense = contiguous_strides(g);
    PoolStrides x1 = dense;  // dim as dim/x with x = 1: the same offsets
    for (InnerStrides& in : x1.inner) in.x = 1, in.dim_outer = 1, in.dim_inner = 1;
    std::vector<PoolStrides> same = {x1};
    if (blocks == 1) {  // an odd block stride never multiplies a coordinate > 0
      PoolStrides odd_block = dense;
      odd_block.block += 1;
      same.push_back(odd_block);
    }
    // Named references, not structured bindings: clang 14 cannot capture bindings in lambdas.
    for (const auto& op : ops.all(blocks))
      for (const PoolStrides& s : same) {
        const std::string& name = op.first;
        const auto& run = op.second;
        HostPools want(g, dense), got(g, s);
        run(*backend, want.pools);
        const auto e = catch_validation([&] { run(*backend, got.pools); });
        CHECK_MESSAGE(!e.has_value(), name, ": ", e ? e->what() : "");
        CHECK_MESSAGE(got.bytes() == want.bytes(), name);
      }
  }
}

TEST_CASE("every nvfp4 op rejects, with one message, strides whose nibble pairs straddle a byte") {
  auto backend = make_backend("cpu");
  Ops ops;
  const PoolGeometry g = nvfp4_geometry(2);
  PoolStrides odd_outer = contiguous_strides(g);  // x = 8 and dim/x stride 9: dims 8.. start mid-byte
  for (InnerStrides& in : odd_outer.inner) in.x = 8, in.dim_outer = 9, in.dim_inner = 1, in.head = 40, in.token = 80;
  odd_outer.kv = 320, odd_outer.layer = 640, odd_outer.block = 640;
  PoolStrides odd_token = contiguous_strides(g);
  for (InnerStrides& in : odd_token.inner) in.token += 1;
  odd_token.kv *= 2, odd_token.layer *= 2, odd_token.block *= 2;
  const std::pair<PoolStrides, std::string> cases[] = {{odd_outer, "dim/x stride = 9 (must be even)"},
                                                       {odd_token, "token stride = 65 (must be even)"}};
  for (const auto& [s, why] : cases)
    for (const auto& op : ops.all(2)) {
      const std::string& name = op.first;
      const auto& run = op.second;
      HostPools pools(g, s);
      const std::vector<uint8_t> before = pools.bytes();
      const auto e = catch_validation([&] { run(*backend, pools.pools); });
      REQUIRE_MESSAGE(e.has_value(), name);
      CHECK(e->code() == ErrorCode::bad_strides);
      CHECK(std::string(e->what()) == "bad_strides: " + name + ": nvfp4 primary pool, kv 0: " + why +
                                          ": rule: each nibble pair (2i, 2i+1) of a row lies in one byte, so every "
                                          "byte has one writer");
      CHECK(pools.bytes() == before);
    }
}

// ---------------------------------------------------------------- nvfp4: one writer per byte

namespace {

// Brute force: every nibble pair (2i, 2i+1) of every row is one byte.
bool pairs_share_bytes(const PoolGeometry& g, const PoolStrides& s, PoolKind kind) {
  for (int32_t kv = 0; kv < g.kv_factor; ++kv)
    for (int64_t b = 0; b < g.blocks(kind); ++b)
      for (int32_t layer = 0; layer < g.layers; ++layer)
        for (int32_t h = 0; h < g.kv_heads; ++h)
          for (int32_t t = 0; t < g.tokens_per_block; ++t)
            for (int32_t d = 0; d < g.head_dim; d += 2) {
              const int64_t lo = element_offset(s, b, layer, kv, h, t, d);
              if (lo % 2 != 0 || element_offset(s, b, layer, kv, h, t, d + 1) != lo + 1) return false;
            }
  return true;
}

int64_t max_offset(const PoolGeometry& g, const PoolStrides& s, PoolKind kind) {
  int64_t m = 0;
  for (int32_t kv = 0; kv < g.kv_factor; ++kv) {
    const PoolLayout l = pool_layout(g, s, kind, kv);
    int64_t o = 0;
    for (const LayoutAxis& a : l.axis) o += a.extent > 0 ? a.stride * (a.extent - 1) : 0;
    m = std::max(m, o);
  }
  return m;
}

KvPools pools_with(const PoolGeometry& g, const PoolStrides& s) {
  KvPools p;
  p.geometry = g;
  p.strides[0] = p.strides[1] = s;
  return p;
}

}  // namespace

TEST_CASE("the nvfp4 byte rule accepts exactly the strides whose nibble pairs share a byte") {
  Rng r(16);
  int accepted = 0, rejected = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    PoolGeometry g;
    g.dtype = CacheDtype::nvfp4;
    g.layers = static_cast<int32_t>(r.uniform(1, 2));
    g.kv_factor = static_cast<int32_t>(r.uniform(1, 2));
    g.kv_heads = static_cast<int32_t>(r.uniform(1, 2));
    g.tokens_per_block = static_cast<int32_t>(r.uniform(1, 3));
    g.head_dim = 16 * static_cast<int32_t>(r.uniform(1, 2));
    g.layout = r.below(2) ? BlockLayout::nhd : BlockLayout::hnd;
    g.primary_blocks = r.uniform(1, 2);
    PoolStrides s = contiguous_strides(g);
    // Perturb: x from the divisors worth trying, the dim strides and each outer stride.
    const int32_t xs[] = {1, 2, 3, 4, 8, 16, g.head_dim};
    for (int kv = 0; kv < 2; ++kv) {
      InnerStrides& in = s.inner[kv];
      in.x = xs[r.below(7)];
      if (g.head_dim % in.x != 0) in.x = g.head_dim;
      in.dim_inner = r.below(4) ? 1 : r.uniform(2, 3);
      in.dim_outer = r.below(2) ? in.x * in.dim_inner : in.x * in.dim_inner + r.uniform(0, 3);
      const int64_t row = (g.head_dim / in.x - 1) * in.dim_outer + (in.x - 1) * in.dim_inner + 1;
      in.token = row + r.below(2);
      in.head = in.token * g.tokens_per_block + r.below(2);
    }
    s.inner[1].x = s.inner[0].x;  // validate_strides: K and V share x outside split-x
    s.inner[1].dim_inner = s.inner[0].dim_inner;
    s.inner[1].dim_outer = s.inner[0].dim_outer;
    const int64_t sub = s.inner[0].head * g.kv_heads + r.below(2);
    s.kv = sub;
    s.layer = sub * g.kv_factor + r.below(2);
    s.block = s.layer * g.layers + r.below(2);
    const KvPools p = pools_with(g, s);
    if (catch_validation([&] { validate_strides(g, s, PoolKind::primary, max_offset(g, s, PoolKind::primary) + 1); }))
      continue;  // not a pool at all
    const bool truth = pairs_share_bytes(g, s, PoolKind::primary);
    const auto e = catch_validation([&] { check_nvfp4_one_writer_per_byte(p, PoolKind::primary, "op"); });
    CHECK_MESSAGE(truth == !e.has_value(), geometry_summary(g), " x ", s.inner[0].x, " dim_inner ",
                  s.inner[0].dim_inner, " dim_outer ", s.inner[0].dim_outer, " block ", s.block, " layer ", s.layer,
                  " kv ", s.kv, " head ", s.inner[0].head, " token ", s.inner[0].token);
    if (e) CHECK(e->code() == ErrorCode::bad_strides);
    (truth ? accepted : rejected)++;
  }
  // Both answers are drawn often, so the sweep tests the rule both ways.
  CHECK(accepted > 200);
  CHECK(rejected > 200);
}

// The three answers the rule replaces (write ops, block copies, qkv_preprocess
// each had their own): the cases where they disagreed with the truth.
TEST_CASE("the nvfp4 byte rule's cases where the old per-op rules were wrong") {
  PoolGeometry g;
  g.dtype = CacheDtype::nvfp4;
  g.kv_heads = 2;
  g.tokens_per_block = 4;
  g.head_dim = 32;
  g.primary_blocks = 1;
  const PoolStrides dense = contiguous_strides(g);
  auto verdict = [&](const PoolStrides& s) {
    const auto e = catch_validation([&] { check_nvfp4_one_writer_per_byte(pools_with(g, s), PoolKind::primary, "op"); });
    CHECK(pairs_share_bytes(g, s, PoolKind::primary) == !e.has_value());
    return e ? std::string(e->what()) : std::string();
  };
  // One block: its stride never multiplies a coordinate > 0 (write ops took its extent as 2 and rejected an odd one).
  PoolStrides one_block = dense;
  one_block.block += 1;
  CHECK(verdict(one_block) == "");
  // x = 1: dim/x is the packed axis, of stride 1 (write ops and block copies demanded x even).
  PoolStrides x1 = dense;
  for (InnerStrides& in : x1.inner) in.x = 1, in.dim_outer = 1, in.dim_inner = 1;
  CHECK(verdict(x1) == "");
  // dim/x of odd stride with x = 8: dims 8.. start mid-byte (qkv_preprocess never looked at x or dim/x).
  PoolStrides odd_outer = dense;
  for (InnerStrides& in : odd_outer.inner) in.x = 8, in.dim_outer = 9;
  for (InnerStrides& in : odd_outer.inner) in.token = 40, in.head = 160;
  odd_outer.kv = 320, odd_outer.layer = 640, odd_outer.block = 640;
  CHECK(verdict(odd_outer) ==
        "bad_strides: op: nvfp4 primary pool, kv 0: dim/x stride = 9 (must be even): rule: each nibble pair (2i, 2i+1) "
        "of a row lies in one byte, so every byte has one writer");
}
