// decode_attention / prefill_attention on the CPU oracle:
//  * against attention computed with Eigen in double over the logically
//    gathered K/V, within a stated bound;
//  * bit-equal across layouts, placements and page sizes for the same data;
//  * a one-token prefill chunk bit-equal to decode, chunked prefill bit-equal
//    to one chunk; identical for any thread count;
//  * the NaN demonstration: a NaN left in a V page tail poisons exactly the
//    sequence whose last page holds it;
//  * a window >= every length gives the outputs of no window;
//  * rejections leave outputs and pools unchanged.
// Pools are written here through this test's own offset formula (from the
// layout definitions), not through core's element_offset.
#include <doctest/doctest.h>

#include <Eigen/Dense>

#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <thread>
#include <vector>

#include "backends/backend.hpp"

#include "../support/rng.hpp"

using namespace kvsim;

namespace {

// Deterministic value of a logical element in [-1, 1).
float logical_value(uint32_t seed, int layer, int kv, int head, int64_t pos, int dim) {
  uint64_t h = seed * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(layer) << 48) ^ (static_cast<uint64_t>(kv) << 44) ^
               (static_cast<uint64_t>(head) << 36) ^ (static_cast<uint64_t>(pos) << 12) ^ static_cast<uint64_t>(dim);
  return kvsim::testing::mixed_unit_value(h);
}

// The pool offset of a logical element, written out from contract §2 here.
int64_t test_offset(const PoolGeometry& g, int64_t block, int layer, int kv, int head, int token, int dim) {
  const int64_t H = g.kv_heads, P = g.tokens_per_block, D = g.head_dim, F = g.kv_factor, L = g.layers;
  int64_t inner = 0;
  switch (g.layout) {
    case BlockLayout::nhd: inner = (token * H + head) * D + dim; break;
    case BlockLayout::hnd: inner = (head * P + token) * D + dim; break;
    case BlockLayout::split_x: {
      const int64_t x = 128 / bits_per_element(g.dtype);
      inner = kv == 0 ? ((head * (D / x) + dim / x) * P + token) * x + dim % x : (head * D + dim) * P + token;
      break;
    }
  }
  const int64_t sub = H * P * D;
  if (g.placement == LayerPlacement::in_block) return ((block * L + layer) * F + kv) * sub + inner;
  return ((layer * g.primary_blocks + block) * F + kv) * sub + inner;
}

struct Fixture {
  PoolGeometry g;
  int hq = 0;
  std::vector<int32_t> seq_lens;
  int32_t max_blocks = 0;
  std::vector<int32_t> table;  // dense
  WindowMapping window;
};

// Blocks are handed out in a scrambled order so logical pages are not contiguous.
Fixture make_fixture(BlockLayout layout, LayerPlacement placement, int P, CacheDtype dtype, int H, int group, int D,
                     std::vector<int32_t> lens, WindowMapping window = {}) {
  Fixture f;
  f.g = {.layers = 2, .kv_factor = 2, .kv_heads = H, .tokens_per_block = P, .head_dim = D, .dtype = dtype,
         .layout = layout, .placement = placement};
  f.hq = H * group;
  f.seq_lens = lens;
  f.window = window;
  for (int32_t len : lens) {
    const int64_t pages = (window.cache_length(len) + P - 1) / P;
    f.max_blocks = std::max<int32_t>(f.max_blocks, static_cast<int32_t>(pages));
  }
  const int64_t total = static_cast<int64_t>(lens.size()) * f.max_blocks;
  f.g.primary_blocks = total + 3;
  f.table.assign(total, kBadPage);
  // idx -> (idx * m + 2) mod blocks is a permutation when gcd(m, blocks) = 1.
  int64_t m = 7;
  while (std::gcd(m, f.g.primary_blocks) != 1) ++m;
  int64_t next = 0;
  for (size_t b = 0; b < lens.size(); ++b) {
    const int64_t pages = (window.cache_length(lens[b]) + P - 1) / P;
    for (int64_t pg = 0; pg < pages; ++pg) f.table[b * f.max_blocks + pg] = static_cast<int32_t>((next++ * m + 2) % f.g.primary_blocks);
  }
  return f;
}

// Writes every token of every sequence (both layers) into a host image of
// the pool, through the window mapping, as bf16/fp32/fp8 codes.
// nvfp4 rows are quantized 16 dims at a time; the scale bytes go to `scales`
// at the scale pool's offsets (the data layout with head_dim / 16).
constexpr float kGlobalScale = 0.01f;
std::vector<uint8_t> g_scale_image;

std::vector<uint8_t> build_pool_image(const Fixture& f, uint32_t seed, uint8_t poison) {
  const PoolGeometry& g = f.g;
  std::vector<uint8_t> img(g.pool_bytes(PoolKind::primary), poison);
  if (g.dtype == CacheDtype::nvfp4) g_scale_image.assign(g.scale_geometry().pool_bytes(PoolKind::primary), poison);
  const int bytes = bits_per_element(g.dtype) / 8;
  for (size_t b = 0; b < f.seq_lens.size(); ++b)
    for (int64_t t = 0; t < f.seq_lens[b]; ++t) {
      const int64_t slot = f.window.cache_token(t);
      const int64_t block = f.table[b * f.max_blocks + slot / g.tokens_per_block];
      const int entry = static_cast<int>(slot % g.tokens_per_block);
      for (int l = 0; l < g.layers; ++l)
        for (int kv = 0; kv < 2; ++kv)
          for (int h = 0; h < g.kv_heads; ++h)
            for (int d = 0; d < g.head_dim; ++d) {
              const float v = logical_value(seed + static_cast<uint32_t>(b), l, kv, h, t, d);
              if (g.dtype == CacheDtype::nvfp4) {
                if (d % 16 != 0) continue;
                float group[16];
                uint8_t packed[8];
                for (int i = 0; i < 16; ++i) group[i] = logical_value(seed + static_cast<uint32_t>(b), l, kv, h, t, d + i);
                PoolGeometry sg = g;
                sg.head_dim = g.head_dim / 16;
                sg.dtype = CacheDtype::fp8_e4m3;
                g_scale_image[test_offset(sg, block, l, kv, h, entry, d / 16)] = codec::nvfp4_quantize16(group, kGlobalScale, packed);
                for (int i = 0; i < 16; ++i) {
                  const int64_t nib = test_offset(g, block, l, kv, h, entry, d + i);
                  const uint8_t code = (packed[i / 2] >> (4 * (i % 2))) & 0xF;
                  img[nib / 2] = static_cast<uint8_t>((nib % 2) ? ((img[nib / 2] & 0x0F) | (code << 4)) : ((img[nib / 2] & 0xF0) | code));
                }
                continue;
              }
              uint8_t* dst = img.data() + test_offset(g, block, l, kv, h, entry, d) * bytes;
              if (g.dtype == CacheDtype::bf16) {
                const uint16_t c = codec::f32_to_bf16(v);
                std::memcpy(dst, &c, 2);
              } else if (g.dtype == CacheDtype::fp32) {
                std::memcpy(dst, &v, 4);
              } else if (g.dtype == CacheDtype::fp16) {
                const uint16_t c = codec::f32_to_f16(v);
                std::memcpy(dst, &c, 2);
              } else if (g.dtype == CacheDtype::fp8_e4m3) {
                *dst = codec::f32_to_e4m3(v * 8.0f);  // stored with k/v scale 1/8
              } else if (g.dtype == CacheDtype::fp8_e5m2) {
                *dst = codec::f32_to_e5m2(v * 8.0f);
              } else if (g.dtype == CacheDtype::int8) {
                *dst = static_cast<uint8_t>(codec::f32_to_int8(v * 100.0f));  // scale 1/100
              }
            }
    }
  return img;
}

// Stored value of a logical element as the kernel sees it (before scales).
double stored_value(const Fixture& f, uint32_t seed, size_t b, int layer, int kv, int head, int64_t t, int d) {
  const float v = logical_value(seed + static_cast<uint32_t>(b), layer, kv, head, t, d);
  switch (f.g.dtype) {
    case CacheDtype::bf16: return codec::bf16_to_f32(codec::f32_to_bf16(v));
    case CacheDtype::fp16: return codec::f16_to_f32(codec::f32_to_f16(v));
    case CacheDtype::fp8_e4m3: return codec::e4m3_to_f32(codec::f32_to_e4m3(v * 8.0f));
    case CacheDtype::fp8_e5m2: return codec::e5m2_to_f32(codec::f32_to_e5m2(v * 8.0f));
    case CacheDtype::int8: return codec::f32_to_int8(v * 100.0f);
    case CacheDtype::nvfp4: {
      float group[16];
      uint8_t packed[8];
      const int d0 = d / 16 * 16;
      for (int i = 0; i < 16; ++i) group[i] = logical_value(seed + static_cast<uint32_t>(b), layer, kv, head, t, d0 + i);
      const uint8_t sf = codec::nvfp4_quantize16(group, kGlobalScale, packed);
      return codec::nvfp4_decode(codec::nibble_at(packed, d - d0), sf, kGlobalScale);
    }
    default: return v;
  }
}

struct Run {
  std::vector<float> out;
};

// Query values as bf16 (still passed as fp32) when set: the accuracy cases
// measure both orders with q already in the operand type.
bool g_q_bf16 = false;
float query_value(uint32_t seed, int layer, int head, int64_t pos, int dim) {
  const float v = logical_value(seed, layer, 7, head, pos, dim);
  return g_q_bf16 ? codec::bf16_to_f32(codec::f32_to_bf16(v)) : v;
}

// The attention order run_attention asks for (the mma-order cases set it).
AttentionOrder g_order = AttentionOrder::fp32;
struct OrderScope {
  explicit OrderScope(AttentionOrder o) { g_order = o; }
  ~OrderScope() { g_order = AttentionOrder::fp32; }
};

// Runs decode (prefill_chunks empty) or prefill over the given chunk split of
// the last `tail_queries` tokens of every sequence.
std::vector<float> run_attention(Backend& be, const Fixture& f, const std::vector<uint8_t>& image, int layer,
                                 const AttentionScales& sc, bool decode, int tail_queries = 1, int chunk = 0) {
  const PoolGeometry& g = f.g;
  KvPools pools = be.allocate_pools(g);
  be.to_backend(pools.data[0], image.data(), image.size());
  if (g.dtype == CacheDtype::nvfp4) be.to_backend(pools.scales[0], g_scale_image.data(), g_scale_image.size());
  const int batch = static_cast<int>(f.seq_lens.size());
  const int64_t rows = decode ? batch : static_cast<int64_t>(batch) * tail_queries;
  std::vector<float> q(rows * f.hq * g.head_dim), out(rows * f.hq * g.head_dim, -7.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int h = 0; h < f.hq; ++h)
      for (int d = 0; d < g.head_dim; ++d) {
        const size_t b = decode ? r : r / tail_queries;
        const int64_t pos = decode ? f.seq_lens[b] - 1 : f.seq_lens[b] - tail_queries + r % tail_queries;
        q[(r * f.hq + h) * g.head_dim + d] = query_value(999 + static_cast<uint32_t>(b), layer, h, pos, d);
      }
  BackendBuffer qb(be, q.size() * 4), ob(be, out.size() * 4);
  qb.upload(q.data(), q.size() * 4);
  ob.upload(out.data(), out.size() * 4);
  const TensorView qv = contiguous_view(qb.get(), CacheDtype::fp32, {rows, f.hq, g.head_dim});
  if (decode) {
    DecodeAttentionOp op;
    op.layer = layer;
    op.q = qv;
    op.out = contiguous_view(ob.get(), CacheDtype::fp32, {rows, f.hq, g.head_dim});
    op.seq_lens = f.seq_lens;
    op.block_table = f.table;
    op.max_blocks_per_seq = f.max_blocks;
    op.scales = sc;
    op.window = f.window;
    op.order = g_order;
    be.decode_attention(pools, op);
  } else {
    // Chunks: queries [c0, c1) of every sequence per call, seq_lens truncated to the chunk end.
    const int step = chunk > 0 ? chunk : tail_queries;
    for (int c0 = 0; c0 < tail_queries; c0 += step) {
      const int c1 = std::min(tail_queries, c0 + step);
      std::vector<int32_t> indptr{0}, lens;
      for (int b = 0; b < batch; ++b) {
        indptr.push_back(indptr.back() + (c1 - c0));
        lens.push_back(f.seq_lens[b] - tail_queries + c1);
      }
      // Gather this chunk's rows into contiguous q/out views via strides:
      // row r of the chunk = sequence r / (c1 - c0), query c0 + r % (c1 - c0).
      PrefillAttentionOp op;
      op.layer = layer;
      op.q_indptr = indptr;
      op.seq_lens = lens;
      op.block_table = f.table;
      op.max_blocks_per_seq = f.max_blocks;
      op.scales = sc;
      op.window = f.window;
      op.order = g_order;
      if (c1 - c0 == tail_queries) {
        op.q = qv;
        op.out = contiguous_view(ob.get(), CacheDtype::fp32, {rows, f.hq, g.head_dim});
        be.prefill_attention(pools, op);
      } else {
        // One sequence at a time keeps the chunk rows contiguous in q/out.
        for (int b = 0; b < batch; ++b) {
          std::vector<int32_t> ip{0, c1 - c0}, ln{lens[b]};
          std::vector<int32_t> tb(f.table.begin() + b * f.max_blocks, f.table.begin() + (b + 1) * f.max_blocks);
          op.q_indptr = ip;
          op.seq_lens = ln;
          op.block_table = tb;
          const int64_t first_row = static_cast<int64_t>(b) * tail_queries + c0;
          op.q = contiguous_view(static_cast<float*>(qb.get()) + first_row * f.hq * g.head_dim, CacheDtype::fp32,
                                 {c1 - c0, f.hq, g.head_dim});
          op.out = contiguous_view(static_cast<float*>(ob.get()) + first_row * f.hq * g.head_dim, CacheDtype::fp32,
                                   {c1 - c0, f.hq, g.head_dim});
          be.prefill_attention(pools, op);
        }
      }
    }
  }
  ob.download(out.data(), out.size() * 4);
  be.release_pools(pools);
  return out;
}

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// Decode attention in double over the logically gathered K/V (Eigen), q as
// given (fp32 logical values), against a run's fp32 outputs: the worst error
// relative to max |V| of the head, and how many outputs are the correctly
// rounded bf16 of the double result.
struct ReferenceError {
  double worst = 0.0;
  int64_t outputs = 0, bf16_correctly_rounded = 0;
};

// The bf16 nearest to x (ties to even), from double.
uint16_t bf16_nearest(double x) {
  const uint16_t c = codec::f32_to_bf16(static_cast<float>(x));
  uint16_t best = c;
  for (int delta : {-1, 1}) {
    const uint16_t n = static_cast<uint16_t>(c + delta);
    const double dn = std::fabs(codec::bf16_to_f32(n) - x), db = std::fabs(codec::bf16_to_f32(best) - x);
    if (dn < db || (dn == db && (n & 1u) == 0)) best = n;
  }
  return best;
}

ReferenceError double_reference_error(const Fixture& f, uint32_t seed, int layer, const AttentionScales& sc,
                                      const std::vector<float>& out) {
  const int D = f.g.head_dim, group = f.hq / f.g.kv_heads;
  ReferenceError r;
  for (size_t b = 0; b < f.seq_lens.size(); ++b) {
    const int64_t n = f.seq_lens[b];
    for (int qh = 0; qh < f.hq; ++qh) {
      const int kvh = qh / group;
      Eigen::MatrixXd K(n, D), V(n, D);
      Eigen::VectorXd q(D);
      for (int64_t t = 0; t < n; ++t)
        for (int d = 0; d < D; ++d) {
          K(t, d) = stored_value(f, seed, b, layer, 0, kvh, t, d) * sc.k_scale;
          V(t, d) = stored_value(f, seed, b, layer, 1, kvh, t, d) * sc.v_scale;
        }
      for (int d = 0; d < D; ++d) q(d) = query_value(999 + static_cast<uint32_t>(b), layer, qh, n - 1, d);
      Eigen::VectorXd s = K * q * static_cast<double>(sc.sm_scale);
      s = (s.array() - s.maxCoeff()).exp();
      const Eigen::VectorXd ref = V.transpose() * s / s.sum();
      const double vmax = V.cwiseAbs().maxCoeff();
      for (int d = 0; d < D; ++d) {
        const float o = out[(b * f.hq + qh) * D + d];
        r.worst = std::max(r.worst, std::fabs(o - ref(d)) / vmax);
        r.bf16_correctly_rounded += codec::f32_to_bf16(o) == bf16_nearest(ref(d));
        ++r.outputs;
      }
    }
  }
  return r;
}

}  // namespace

TEST_CASE("decode attention matches Eigen double attention on the gathered K/V (GQA, head dims, dtypes)") {
  auto be = make_backend("cpu");
  // Bound: |out - ref| <= 1e-5 * max|v| per element for fp32 outputs. The
  // fp32 canonical order differs from double by rounding in the dot
  // products (D <= 256 terms), exp (1 ulp) and the sums; 1e-5 is two orders
  // of magnitude above what was measured (max seen ~5e-7) and far below any
  // indexing error (which moves outputs by O(1)).
  for (CacheDtype dtype : {CacheDtype::bf16, CacheDtype::fp16, CacheDtype::fp32, CacheDtype::fp8_e4m3,
                           CacheDtype::fp8_e5m2, CacheDtype::int8, CacheDtype::nvfp4})
    for (auto [D, group] : {std::pair{64, 1}, {80, 4}, {96, 8}, {128, 4}, {256, 1}}) {
      if (dtype == CacheDtype::nvfp4 && D % 16 != 0) continue;
      const Fixture f = make_fixture(BlockLayout::hnd, LayerPlacement::in_block, 16, dtype, 2, group, D, {1, 37, 600});
      const uint32_t seed = 11;
      const auto img = build_pool_image(f, seed, 0);
      AttentionScales sc;
      sc.sm_scale = 1.0f / std::sqrt(static_cast<float>(D));
      if (is_fp8(dtype)) sc.k_scale = sc.v_scale = 0.125f;
      if (dtype == CacheDtype::int8) sc.k_scale = sc.v_scale = 0.01f;
      if (dtype == CacheDtype::nvfp4) sc.k_global_scale = sc.v_global_scale = kGlobalScale;
      const int layer = 1;
      const auto out = run_attention(*be, f, img, layer, sc, /*decode=*/true);
      const double worst = double_reference_error(f, seed, layer, sc, out).worst;
      const int info_d = D, info_group = group;  // clang < 16 cannot capture structured bindings in INFO's lambda
      INFO("dtype " << dtype_name(dtype) << " D " << info_d << " group " << info_group << " worst " << worst);
      CHECK(worst <= 1e-5);
    }
}

TEST_CASE("attention outputs are bit-equal across layouts, placements and page sizes 1, 3, 7, 16, 17, 1024") {
  auto be = make_backend("cpu");
  AttentionScales sc;
  sc.sm_scale = 0.125f;
  std::vector<float> reference;
  for (BlockLayout layout : {BlockLayout::nhd, BlockLayout::hnd, BlockLayout::split_x})
    for (LayerPlacement placement : {LayerPlacement::in_block, LayerPlacement::per_layer})
      for (int P : {1, 3, 7, 16, 17, 1024}) {  // 1024: the largest page, one page holds everything
        const Fixture f = make_fixture(layout, placement, P, CacheDtype::bf16, 3, 2, 64, {5, 1, 300});
        const auto out = run_attention(*be, f, build_pool_image(f, 3, 0), 0, sc, true);
        if (reference.empty()) reference = out;
        INFO(layout_name(layout) << " " << placement_name(placement) << " P=" << P);
        CHECK(same_bytes(out, reference));
      }
}

TEST_CASE("one-token prefill equals decode; chunked prefill equals one chunk; any thread count") {
  AttentionScales sc;
  sc.sm_scale = 0.1f;
  const Fixture f = make_fixture(BlockLayout::nhd, LayerPlacement::per_layer, 7, CacheDtype::bf16, 2, 4, 80, {9, 520, 33});
  const auto img = build_pool_image(f, 5, 0);
  auto be = make_backend("cpu");
  const auto decode = run_attention(*be, f, img, 1, sc, true);
  const auto prefill1 = run_attention(*be, f, img, 1, sc, false, /*tail_queries=*/1);
  CHECK(same_bytes(decode, prefill1));
  const auto whole = run_attention(*be, f, img, 1, sc, false, /*tail_queries=*/9);
  for (int chunk : {1, 2, 4}) {
    INFO("chunk " << chunk);
    CHECK(same_bytes(run_attention(*be, f, img, 1, sc, false, 9, chunk), whole));
  }
  const unsigned max_threads = std::max(1u, std::thread::hardware_concurrency());
  for (int threads : {1, 2, 3, static_cast<int>(max_threads)}) {
    auto bt = make_backend("cpu", BackendOptions{threads});
    INFO("threads " << threads);
    CHECK(same_bytes(run_attention(*bt, f, img, 1, sc, true), decode));
    CHECK(same_bytes(run_attention(*bt, f, img, 1, sc, false, 9), whole));
  }
  CHECK(same_bytes(run_attention(*be, f, img, 1, sc, false, 9), whole));  // run to run
}

TEST_CASE("a window wider than every sequence gives the outputs of no window (sinks with a bubble)") {
  AttentionScales sc;
  sc.sm_scale = 0.2f;
  auto be = make_backend("cpu");
  const Fixture plain = make_fixture(BlockLayout::hnd, LayerPlacement::in_block, 16, CacheDtype::bf16, 1, 2, 64, {40, 3, 290});
  const Fixture windowed = make_fixture(BlockLayout::hnd, LayerPlacement::in_block, 16, CacheDtype::bf16, 1, 2, 64,
                                        {40, 3, 290}, WindowMapping::make(1000, 4, 16, false));
  CHECK(same_bytes(run_attention(*be, plain, build_pool_image(plain, 8, 0), 0, sc, true),
                   run_attention(*be, windowed, build_pool_image(windowed, 8, 0), 0, sc, true)));
  // A real window: the output of a long sequence differs from no window and
  // equals attention over sinks + the last W - S tokens (checked in double).
  const Fixture narrow = make_fixture(BlockLayout::hnd, LayerPlacement::in_block, 16, CacheDtype::fp32, 1, 1, 64, {200},
                                      WindowMapping::make(48, 4, 16, false));
  const auto out = run_attention(*be, narrow, build_pool_image(narrow, 8, 0), 0, sc, true);
  std::vector<int64_t> keys;
  for (int64_t t = 0; t < 4; ++t) keys.push_back(t);
  for (int64_t t = 200 - 44; t < 200; ++t) keys.push_back(t);
  Eigen::VectorXd s(keys.size());
  for (size_t j = 0; j < keys.size(); ++j) {
    double acc = 0;
    for (int d = 0; d < 64; ++d)
      acc += static_cast<double>(logical_value(999, 0, 7, 0, 199, d)) * logical_value(8, 0, 0, 0, keys[j], d);
    s(j) = acc * 0.2;
  }
  s = (s.array() - s.maxCoeff()).exp();
  for (int d = 0; d < 64; ++d) {
    double o = 0;
    for (size_t j = 0; j < keys.size(); ++j) o += s(j) * logical_value(8, 0, 1, 0, keys[j], d);
    CHECK(std::fabs(out[d] - o / s.sum()) <= 1e-5);
  }
}

TEST_CASE("NaN in a V page tail poisons exactly the sequence whose last page holds it") {
  AttentionScales sc;
  sc.sm_scale = 0.125f;
  auto be = make_backend("cpu");
  // Lengths 16 (full last page), 21 (tail of 11 slots), 32 (full).
  const Fixture f = make_fixture(BlockLayout::nhd, LayerPlacement::in_block, 16, CacheDtype::bf16, 2, 2, 64, {16, 21, 32});
  // Poison with 0xFF: bf16 0xFFFF is a NaN. Written tokens overwrite it; tails keep it.
  const auto poisoned = build_pool_image(f, 4, 0xFF);
  const auto out = run_attention(*be, f, poisoned, 0, sc, true);
  const int per_seq = f.hq * 64;
  for (int b = 0; b < 3; ++b) {
    bool any_nan = false;
    for (int i = 0; i < per_seq; ++i) any_nan |= std::isnan(out[b * per_seq + i]);
    INFO("sequence " << b);
    CHECK(any_nan == (b == 1));
  }
  // The same pool with the tail zeroed (what qkv_preprocess_write's V-tail
  // zeroing does) is NaN-free and equal to a pool zeroed from the start.
  const auto clean = run_attention(*be, f, build_pool_image(f, 4, 0x00), 0, sc, true);
  for (float v : clean) CHECK_FALSE(std::isnan(v));
}

TEST_CASE("attention rejections name the rule and leave outputs and pools unchanged") {
  auto be = make_backend("cpu");
  Fixture f = make_fixture(BlockLayout::nhd, LayerPlacement::in_block, 4, CacheDtype::bf16, 2, 2, 64, {5, 9});
  f.g.secondary_blocks = 2;
  const auto img = build_pool_image(f, 1, 0x5A);
  KvPools pools = be->allocate_pools(f.g);
  be->to_backend(pools.data[0], img.data(), img.size());
  std::vector<float> q(2 * 4 * 64, 0.5f), out(2 * 4 * 64, -3.0f);
  DecodeAttentionOp op;
  op.q = contiguous_view(q.data(), CacheDtype::fp32, {2, 4, 64});
  op.out = contiguous_view(out.data(), CacheDtype::fp32, {2, 4, 64});
  op.seq_lens = f.seq_lens;
  op.max_blocks_per_seq = f.max_blocks;
  auto expect = [&](std::vector<int32_t> table, ErrorCode code, const char* needle, auto&& tweak) {
    DecodeAttentionOp bad = op;
    bad.block_table = table;
    tweak(bad);
    bool thrown = false;
    try {
      be->decode_attention(pools, bad);
    } catch (const ValidationError& e) {
      thrown = true;
      CHECK(e.code() == code);
      INFO(std::string(e.what()));
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
    }
    CHECK(thrown);
    for (float v : out) CHECK(v == -3.0f);
    std::vector<uint8_t> now(img.size());
    be->to_host(now.data(), pools.data[0], now.size());
    CHECK(now == img);
  };
  auto none = [](DecodeAttentionOp&) {};
  std::vector<int32_t> t = f.table;
  t[1 * f.max_blocks + 1] = kBadPage;
  expect(t, ErrorCode::write_through_bad_page, "block_table[1][1]", none);
  t = f.table;
  t[1] = BlockRef::secondary(0).raw;  // sequence 0, page 1 (needed: length 5, P = 4)
  expect(t, ErrorCode::secondary_not_onboarded, "onboarded", none);
  t = f.table;
  t[0] = 1000;
  expect(t, ErrorCode::block_out_of_range, "1000", none);
  expect(f.table, ErrorCode::shape_mismatch, "q must be", [](DecodeAttentionOp& o) { o.q.shape[2] = 32; });
  std::vector<int32_t> zero_len{0, 9};
  expect(f.table, ErrorCode::position_beyond_sequence, "sequence 0", [&](DecodeAttentionOp& o) { o.seq_lens = zero_len; });
  expect(f.table, ErrorCode::bad_window, "window", [](DecodeAttentionOp& o) { o.window = WindowMapping::make(4, 4, 4, false); });
  be->release_pools(pools);
}

// ---------------------------------------------------------------- the mma order
// docs/canonical-arithmetic.md, "The mma order": tensor-core inner products
// through core's mma.sync model.

namespace {
AttentionScales scales_for(CacheDtype dtype, int D) {
  AttentionScales sc;
  sc.sm_scale = 1.0f / std::sqrt(static_cast<float>(D));
  if (is_fp8(dtype)) sc.k_scale = sc.v_scale = 0.125f;
  if (dtype == CacheDtype::int8) sc.k_scale = sc.v_scale = 0.01f;
  if (dtype == CacheDtype::nvfp4) sc.k_global_scale = sc.v_global_scale = kGlobalScale;
  return sc;
}
}  // namespace

TEST_CASE("mma order: close to double attention, not the fp32 order's bytes (bf16, fp16, fp8, int8; D 64/80/128/256)") {
  auto be = make_backend("cpu");
  for (CacheDtype dtype :
       {CacheDtype::bf16, CacheDtype::fp16, CacheDtype::fp8_e4m3, CacheDtype::fp8_e5m2, CacheDtype::int8})
    for (auto [D, group] : {std::pair{64, 1}, {80, 4}, {128, 4}, {256, 2}}) {
      const Fixture f = make_fixture(BlockLayout::hnd, LayerPlacement::in_block, 16, dtype, 2, group, D, {1, 37, 600});
      const auto img = build_pool_image(f, 11, 0);
      const AttentionScales sc = scales_for(dtype, D);
      const auto fp32 = run_attention(*be, f, img, 1, sc, true);
      OrderScope mma(AttentionOrder::mma);
      const auto out = run_attention(*be, f, img, 1, sc, true);
      const double worst = double_reference_error(f, 11, 1, sc, out).worst;
      const int info_d = D;
      INFO("dtype " << dtype_name(dtype) << " D " << info_d << " worst " << worst);
      // q is rounded to the operand type (bf16: 2^-9 relative): the bound is
      // the fp32 order's times 100, far below an indexing error's O(1).
      CHECK(worst <= 1e-3);
      CHECK_FALSE(same_bytes(out, fp32));
    }
}

TEST_CASE("mma order: bit-equal across layouts, placements and page sizes; one-token prefill equals decode; chunked "
          "prefill equals one chunk; batch invariance; any thread count") {
  OrderScope mma(AttentionOrder::mma);
  auto be = make_backend("cpu");
  AttentionScales sc;
  sc.sm_scale = 0.125f;
  std::vector<float> reference;
  for (BlockLayout layout : {BlockLayout::nhd, BlockLayout::hnd, BlockLayout::split_x})
    for (int P : {1, 7, 16, 1024}) {
      const Fixture f = make_fixture(layout, P % 2 ? LayerPlacement::per_layer : LayerPlacement::in_block, P,
                                     CacheDtype::bf16, 3, 2, 64, {5, 1, 300});
      const auto out = run_attention(*be, f, build_pool_image(f, 3, 0), 0, sc, true);
      if (reference.empty()) reference = out;
      INFO("layout " << layout_name(layout) << " P " << P);
      CHECK(same_bytes(out, reference));
    }
  const Fixture f = make_fixture(BlockLayout::nhd, LayerPlacement::per_layer, 7, CacheDtype::fp16, 2, 4, 80, {9, 520, 33});
  const auto img = build_pool_image(f, 5, 0);
  const auto decode = run_attention(*be, f, img, 1, sc, true);
  CHECK(same_bytes(decode, run_attention(*be, f, img, 1, sc, false, /*tail_queries=*/1)));
  const auto whole = run_attention(*be, f, img, 1, sc, false, /*tail_queries=*/9);
  for (int chunk : {1, 4}) {
    INFO("chunk " << chunk);
    CHECK(same_bytes(run_attention(*be, f, img, 1, sc, false, 9, chunk), whole));
  }
  // Batch invariance: sequence 0 alone (other blocks) gives its row of a batch.
  const Fixture batch = make_fixture(BlockLayout::nhd, LayerPlacement::per_layer, 7, CacheDtype::fp16, 2, 4, 80, {520, 9, 33});
  const Fixture one = make_fixture(BlockLayout::nhd, LayerPlacement::per_layer, 7, CacheDtype::fp16, 2, 4, 80, {520});
  const auto in_batch = run_attention(*be, batch, build_pool_image(batch, 6, 0), 1, sc, true);
  const auto alone = run_attention(*be, one, build_pool_image(one, 6, 0), 1, sc, true);
  REQUIRE(alone.size() * 3 == in_batch.size());
  CHECK(std::memcmp(alone.data(), in_batch.data(), alone.size() * 4) == 0);
  for (int threads : {1, 3}) {
    auto bt = make_backend("cpu", BackendOptions{threads});
    INFO("threads " << threads);
    CHECK(same_bytes(run_attention(*bt, f, img, 1, sc, false, 9), whole));
  }
}

TEST_CASE("mma order: the definition, written out from docs/canonical-arithmetic.md with mma_inner_product") {
  // One sequence of 300 keys (two partitions), D 40 (a zero-padded last
  // chunk), GQA 1, bf16 cache and q; page 4 with 300 = 75 pages: no tail.
  OrderScope mma(AttentionOrder::mma);
  auto be = make_backend("cpu");
  const int D = 40, n = 300;
  const Fixture f = make_fixture(BlockLayout::nhd, LayerPlacement::in_block, 4, CacheDtype::bf16, 1, 1, D, {n});
  const auto img = build_pool_image(f, 21, 0);
  AttentionScales sc;
  sc.sm_scale = 0.3f;
  const auto out = run_attention(*be, f, img, 1, sc, true);
  auto code = [&](int kv, int64_t t, int d) {
    return static_cast<uint32_t>(codec::f32_to_bf16(logical_value(21, 1, kv, 0, t, d)));
  };
  std::vector<uint32_t> q(D);
  for (int d = 0; d < D; ++d) q[d] = codec::f32_to_bf16(logical_value(999, 1, 7, 0, n - 1, d));
  std::vector<float> m, l, acc;  // per partition
  for (int first = 0; first < n; first += 256) {
    const int count = std::min(256, n - first);
    std::vector<float> s(count), p(count);
    for (int j = 0; j < count; ++j) {
      float a = 0.0f;
      for (int c = 0; c < 3; ++c) {  // chunks [0,16), [16,32), [32,40) + 8 zeros
        uint32_t qa[16] = {}, kb[16] = {};
        for (int i = 0; i < 16 && 16 * c + i < D; ++i) {
          qa[i] = q[16 * c + i];
          kb[i] = code(0, first + j, 16 * c + i);
        }
        a = mma::mma_inner_product(mma::Operand::bf16, qa, kb, a);
      }
      s[j] = a * sc.sm_scale;
    }
    const float mp = canon::partition_max(s.data(), count);
    for (int j = 0; j < count; ++j) p[j] = canon::exp_f32(s[j] - mp);
    m.push_back(mp);
    l.push_back(canon::partition_sum(p.data(), count));
    for (int d = 0; d < D; ++d) {
      float a = 0.0f;
      for (int j0 = 0; j0 < count; j0 += 8) {
        uint32_t pa[16] = {}, vb[16] = {};
        for (int i = 0; i < 8 && j0 + i < count; ++i) {
          const uint16_t hi = codec::f32_to_bf16(p[j0 + i]);
          pa[i] = hi;
          pa[8 + i] = codec::f32_to_bf16(p[j0 + i] - codec::bf16_to_f32(hi));
          vb[i] = vb[8 + i] = code(1, first + j0 + i, d);
        }
        a = mma::mma_inner_product(mma::Operand::bf16, pa, vb, a);
      }
      acc.push_back(a);
    }
  }
  const float M = std::max(m[0], m[1]);
  float L = 0.0f;
  std::vector<float> O(D, 0.0f);
  for (int part = 0; part < 2; ++part) {
    const float w = canon::exp_f32(m[part] - M);
    L = canon::fma_f32(l[part], w, L);
    for (int d = 0; d < D; ++d) O[d] = canon::fma_f32(acc[part * D + d], w, O[d]);
  }
  int same = 0;
  for (int d = 0; d < D; ++d) same += float_bits(out[d]) == float_bits(O[d] / L);
  CHECK(same == D);
}

TEST_CASE("mma order: offered for bf16, fp16, fp8 and int8 caches; fp32 and nvfp4 are refused by name, outputs and "
          "pools unchanged") {
  auto be = make_backend("cpu");
  for (CacheDtype dtype : {CacheDtype::fp32, CacheDtype::nvfp4}) {
    const Fixture f = make_fixture(BlockLayout::nhd, LayerPlacement::in_block, 4, dtype, 2, 2, 64, {5, 9});
    const auto img = build_pool_image(f, 1, 0x5A);
    KvPools pools = be->allocate_pools(f.g);
    be->to_backend(pools.data[0], img.data(), img.size());
    std::vector<float> q(2 * 4 * 64, 0.5f), out(2 * 4 * 64, -3.0f);
    std::vector<int32_t> indptr{0, 1, 2};
    DecodeAttentionOp op;
    op.q = contiguous_view(q.data(), CacheDtype::fp32, {2, 4, 64});
    op.out = contiguous_view(out.data(), CacheDtype::fp32, {2, 4, 64});
    op.seq_lens = f.seq_lens;
    op.block_table = f.table;
    op.max_blocks_per_seq = f.max_blocks;
    op.scales = scales_for(dtype, 64);
    op.order = AttentionOrder::mma;
    PrefillAttentionOp pre;
    pre.query() = op;  // the same query rows, as a one-token prefill chunk per sequence
    pre.q_indptr = indptr;
    for (int which = 0; which < 2; ++which) {
      INFO("dtype " << dtype_name(dtype) << (which ? " prefill" : " decode"));
      bool thrown = false;
      try {
        if (which) be->prefill_attention(pools, pre);
        else be->decode_attention(pools, op);
      } catch (const ValidationError& e) {
        thrown = true;
        CHECK(e.code() == ErrorCode::unsupported_attention_order);
        CHECK(std::string(e.what()).find("mma is not offered for a " + std::string(dtype_name(dtype))) != std::string::npos);
      }
      CHECK(thrown);
    }
    for (float v : out) CHECK(v == -3.0f);
    std::vector<uint8_t> now(img.size());
    be->to_host(now.data(), pools.data[0], now.size());
    CHECK(now == img);
    be->release_pools(pools);
  }
}

// issue 20 item 4: each order's share of correctly rounded bf16 outputs
// against float64 and its worst error, bf16 / fp8 / nvfp4 caches (nvfp4: the
// fp32 order only). The numbers are printed (docs/canonical-arithmetic.md
// quotes them) and held to floors a wrong order would miss.
TEST_CASE("accuracy of the fp32 and mma orders against float64 (GQA 32:8 slice, D 128, 4 sequences up to 2000 keys)") {
  auto be = make_backend("cpu");
  for (bool q_bf16 : {false, true})
    for (CacheDtype dtype : {CacheDtype::bf16, CacheDtype::fp8_e4m3, CacheDtype::nvfp4})
      for (AttentionOrder order : {AttentionOrder::fp32, AttentionOrder::mma}) {
        if (order == AttentionOrder::mma && !mma_order::offered_for(dtype)) continue;
        g_q_bf16 = q_bf16;
        const Fixture f =
            make_fixture(BlockLayout::nhd, LayerPlacement::in_block, 16, dtype, 2, 4, 128, {2000, 700, 1, 257});
        const auto img = build_pool_image(f, 31, 0);
        const AttentionScales sc = scales_for(dtype, 128);
        OrderScope scope(order);
        const ReferenceError r = double_reference_error(f, 31, 1, sc, run_attention(*be, f, img, 1, sc, true));
        g_q_bf16 = false;
        const double share = static_cast<double>(r.bf16_correctly_rounded) / static_cast<double>(r.outputs);
        MESSAGE("accuracy: " << std::string(dtype_name(dtype)) << " cache, q " << (q_bf16 ? "bf16" : "fp32")
                             << ", order " << std::string(attention_order_name(order)) << ": "
                             << r.bf16_correctly_rounded << " / " << r.outputs << " bf16 outputs correctly rounded ("
                             << share * 100.0 << "%), worst |out - ref| / max|V| = " << r.worst);
        // Floors a wrong order misses: q rounded to bf16 (fp32 q, mma order)
        // costs correctly rounded outputs, nothing else may.
        CHECK(share >= (order == AttentionOrder::mma && !q_bf16 ? 0.8 : 0.99));
        CHECK(r.worst <= (order == AttentionOrder::mma && !q_bf16 ? 2e-4 : 1e-6));
      }
}
