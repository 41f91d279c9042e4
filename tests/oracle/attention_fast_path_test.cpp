// The CPU oracle's fast attention path (backends/cpu/attention_fast.hpp) is
// byte-identical to core's attend_query, on every ISA this machine has:
//  * the AVX-512 row decoders against core's codecs for every 8- and 16-bit
//    code, and its exp against canon::exp_f32 over a stride of all 2^32 floats;
//  * whole decode and prefill ops over a sweep: page sizes 1, 3, 7, 16, 17;
//    odd batch sizes; head_dim 64/128/80/256 and odd ones (24, 40, 1024);
//    GQA 1/3/4/5/8; bf16/fp16/fp32/fp8 e4m3/e5m2/int8/nvfp4 caches; NHD, HND,
//    split-x, both layer placements; NaN/Inf/-0/subnormal codes in K, V and
//    Q (NaN payloads too); sliding windows with sinks (ring wrapped and not);
//    context lengths around the 256-key partition (255, 256, 257, 1000);
//    fp32/fp16/bf16 q and out, strided q/out views; 1 and 3 threads;
//  * the tiled prefill (blocks of 32 / G consecutive rows): chunks from 0 and
//    after a cached prefix crossing pages 1/3/16/17 and 256-key partitions,
//    GQA 1/2/4/8, D 64/128, rows past the kept scores (2,600 keys);
//  * the CPU backend's public decode/prefill entry against the reference;
//  * the optional LSE output of every path against attend_query's.
// Reference and candidate write into separately poisoned output buffers and
// the whole buffers (padding included) are compared with memcmp.
#include <doctest/doctest.h>

#include <tbb/info.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kvsim/validation.hpp"
#include "backends/backend.hpp"
#include "backends/cpu/attention_fast.hpp"
#include "backends/cpu/cpu_backend.hpp"

#include "../support/cpu_isas.hpp"

using namespace kvsim;
namespace fast = kvsim::cpu_attention;

namespace {

using kvsim::testing::machine_isas;

// Every path against the reference (core's attend_query compiled for
// baseline x86-64): the fast path at every ISA this CPU runs, and the
// reference's AVX2 + FMA copy where the CPU runs AVX2.
struct Candidate {
  fast::AttentionPath path;
  CpuIsa isa;
};
std::vector<Candidate> candidates() {
  std::vector<Candidate> v;
  for (CpuIsa isa : machine_isas()) v.push_back({fast::AttentionPath::fast, isa});
  if (cpu_isa_supported(CpuIsa::avx2)) v.push_back({fast::AttentionPath::reference, CpuIsa::avx2});
  return v;
}

struct Case {
  CacheDtype dtype = CacheDtype::bf16;
  BlockLayout layout = BlockLayout::hnd;
  LayerPlacement placement = LayerPlacement::in_block;
  int P = 16, D = 128, H = 2, G = 4;
  std::vector<int32_t> lens{255, 256, 257};
  int window = 0, sinks = 0;
  bool one_more_block = false;
  bool decode = true;
  int max_queries = 1;  // prefill: queries of sequence b = 1 + b % max_queries (capped by its length)
  std::vector<int32_t> queries;  // prefill: queries of sequence b, when given (overrides max_queries)
  CacheDtype q_dtype = CacheDtype::fp32, out_dtype = CacheDtype::fp32;
  bool strided_views = false;
  float sm_scale = 0.088f;
  float amplitude = 1.0f;    // values in [-amplitude, amplitude)
  int pool_specials = 0;     // NaN/Inf codes dropped at random pool elements
  bool q_specials = false;   // NaN/Inf/-0 in some query heads
  uint32_t seed = 1;

  std::string describe() const {
    return std::string(dtype_name(dtype)) + " " + std::string(layout_name(layout)) + " " +
           std::string(placement_name(placement)) + " P" + std::to_string(P) + " D" + std::to_string(D) + " H" +
           std::to_string(H) + " G" + std::to_string(G) + " batch " + std::to_string(lens.size()) + " first len " +
           std::to_string(lens[0]) + " W" + std::to_string(window) + " S" + std::to_string(sinks) +
           (one_more_block ? "+1" : "") + (decode ? " decode" : " prefill x" + std::to_string(max_queries)) + " q " +
           std::string(dtype_name(q_dtype)) + " out " + std::string(dtype_name(out_dtype)) +
           (strided_views ? " strided" : "") + " scale " + std::to_string(sm_scale) + " amp " +
           std::to_string(amplitude) + " specials " + std::to_string(pool_specials) + (q_specials ? "+q" : "") +
           " seed " + std::to_string(seed);
  }
};

// A finite code of `dtype` near v (stored as element bytes).
void store_code(uint8_t* pool, CacheDtype dtype, int64_t elem, float v) {
  switch (dtype) {
    case CacheDtype::fp32: std::memcpy(pool + elem * 4, &v, 4); break;
    case CacheDtype::fp16: {
      const uint16_t c = codec::f32_to_f16(v);
      std::memcpy(pool + elem * 2, &c, 2);
      break;
    }
    case CacheDtype::bf16: {
      const uint16_t c = codec::f32_to_bf16(v);
      std::memcpy(pool + elem * 2, &c, 2);
      break;
    }
    case CacheDtype::fp8_e4m3: pool[elem] = codec::f32_to_e4m3(v); break;
    case CacheDtype::fp8_e5m2: pool[elem] = codec::f32_to_e5m2(v); break;
    case CacheDtype::int8: pool[elem] = static_cast<uint8_t>(codec::f32_to_int8(v)); break;
    case CacheDtype::nvfp4: store_nibble(pool, elem, codec::f32_to_e2m1(v)); break;
  }
}

// A NaN / Inf / extreme code of `dtype` (k picks which).
void store_special(uint8_t* pool, CacheDtype dtype, int64_t elem, uint32_t k) {
  switch (dtype) {
    case CacheDtype::fp32: {
      const uint32_t codes[] = {0x7FC00000u, 0xFFC01234u, 0x7F800001u, 0x7F800000u, 0xFF800000u, 0x00000001u, 0x7F7FFFFFu};
      std::memcpy(pool + elem * 4, &codes[k % 7], 4);
      break;
    }
    case CacheDtype::fp16:
    case CacheDtype::bf16: {
      const uint16_t f16[] = {0x7E00, 0xFC01, 0x7C00, 0xFC00, 0x0001, 0x7BFF, 0x7C01};
      const uint16_t b16[] = {0x7FC0, 0xFF81, 0x7F80, 0xFF80, 0x0001, 0x7F7F, 0x7F81};
      const uint16_t c = dtype == CacheDtype::fp16 ? f16[k % 7] : b16[k % 7];
      std::memcpy(pool + elem * 2, &c, 2);
      break;
    }
    case CacheDtype::fp8_e4m3: {
      const uint8_t c[] = {0x7F, 0xFF, 0x7E, 0xFE, 0x01};
      pool[elem] = c[k % 5];
      break;
    }
    case CacheDtype::fp8_e5m2: {
      const uint8_t c[] = {0x7C, 0xFC, 0x7D, 0xFF, 0x7B, 0x01};
      pool[elem] = c[k % 6];
      break;
    }
    case CacheDtype::int8: pool[elem] = (k & 1) ? 0x80 : 0x7F; break;
    case CacheDtype::nvfp4: store_nibble(pool, elem, (k & 1) ? 0xF : 0x7); break;
  }
}

struct Pools {
  PoolGeometry g;
  std::vector<uint8_t> data, scales;
  KvPools kv;
  std::vector<int32_t> table;
  int32_t max_blocks = 0;
  WindowMapping window;
};

void build_pools(const Case& c, Pools& p) {
  p.g = PoolGeometry{.layers = 2, .kv_factor = 2, .kv_heads = c.H, .tokens_per_block = c.P, .head_dim = c.D,
                     .dtype = c.dtype, .layout = c.layout, .placement = c.placement};
  PoolGeometry& g = p.g;
  p.window = c.window > 0 ? WindowMapping::make(c.window, c.sinks, c.P, c.one_more_block) : WindowMapping{};
  for (int32_t len : c.lens)
    p.max_blocks = std::max<int32_t>(p.max_blocks, static_cast<int32_t>((p.window.cache_length(len) + c.P - 1) / c.P));
  const int64_t total = static_cast<int64_t>(c.lens.size()) * p.max_blocks;
  g.primary_blocks = total + 3;
  validate_geometry(g);
  p.table.assign(total, kBadPage);
  int64_t m = 7;
  while (std::gcd(m, g.primary_blocks) != 1) ++m;
  int64_t next = 0;
  for (size_t b = 0; b < c.lens.size(); ++b) {
    const int64_t pages = (p.window.cache_length(c.lens[b]) + c.P - 1) / c.P;
    for (int64_t pg = 0; pg < pages; ++pg)
      p.table[b * p.max_blocks + pg] = static_cast<int32_t>((next++ * m + 2) % g.primary_blocks);
  }

  // Every element of the pool (live, tails and unused blocks alike) gets a
  // finite value; -0 and subnormal-sized values appear, then a few specials.
  std::mt19937 rng(c.seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const int64_t elements = g.pool_elements(PoolKind::primary);
  p.data.assign(g.pool_bytes(PoolKind::primary), 0);
  for (int64_t e = 0; e < elements; ++e) {
    const uint32_t r = rng();
    float v = uni(rng) * c.amplitude;
    if (r % 61 == 0) v = -0.0f;
    if (r % 97 == 1) v *= 1e-7f;
    store_code(p.data.data(), g.dtype, e, v);
  }
  for (int i = 0; i < c.pool_specials; ++i) store_special(p.data.data(), g.dtype, static_cast<int64_t>(rng() % elements), rng());
  p.kv.geometry = g;
  p.kv.data[0] = p.data.data();
  p.kv.strides[0] = contiguous_strides(g, PoolKind::primary);
  if (g.dtype == CacheDtype::nvfp4) {
    const PoolGeometry sg = g.scale_geometry();
    p.scales.resize(sg.pool_bytes(PoolKind::primary));
    for (auto& s : p.scales) s = static_cast<uint8_t>(0x20 + rng() % 0x38);  // e4m3 scales ~[2^-4, 2^3)
    for (int i = 0; i < c.pool_specials; ++i) p.scales[rng() % p.scales.size()] = (i & 1) ? 0x7F : 0x00;  // NaN, 0
    p.kv.scales[0] = p.scales.data();
    p.kv.scale_strides[0] = contiguous_strides(sg, PoolKind::primary);
  }
  validate_pool(p.kv, PoolKind::primary, "test: ");
}

struct View {
  std::vector<uint8_t> bytes;
  TensorView t;
};

View make_view(CacheDtype dtype, int64_t rows, int64_t heads, int64_t D, bool strided, uint8_t fill) {
  View v;
  const int64_t dim_pad = strided ? 3 : 0, row_pad = strided ? 5 : 0;
  const int64_t hs = D + dim_pad, rs = heads * hs + row_pad;
  v.bytes.assign(static_cast<size_t>(rows * rs + 1) * (bits_per_element(dtype) / 8), fill);
  v.t.data = v.bytes.data();
  v.t.dtype = dtype;
  v.t.rank = 3;
  v.t.shape[0] = rows;
  v.t.shape[1] = heads;
  v.t.shape[2] = D;
  v.t.stride[0] = rs;
  v.t.stride[1] = hs;
  v.t.stride[2] = 1;
  return v;
}

// Runs the case on the reference and on every candidate ISA; CHECKs bytes.
void check_case(const Case& c, int threads = 2) {
  INFO(c.describe());
  Pools p;
  build_pools(c, p);
  const int64_t hq = static_cast<int64_t>(c.H) * c.G;

  // Rows: decode = the last token of each sequence; prefill = the last
  // 1 + b % max_queries tokens of sequence b.
  std::vector<std::pair<int32_t, int64_t>> rows;
  std::vector<int32_t> q_indptr{0};
  for (size_t b = 0; b < c.lens.size(); ++b) {
    const int32_t wanted = b < c.queries.size() ? c.queries[b] : 1 + static_cast<int32_t>(b) % c.max_queries;
    const int32_t nq = c.decode ? 1 : std::min<int32_t>(c.lens[b], wanted);
    for (int32_t i = 0; i < nq; ++i)
      rows.emplace_back(static_cast<int32_t>(b), prefill_position(c.lens[b], q_indptr.back(), q_indptr.back() + nq,
                                                                  q_indptr.back() + i));
    q_indptr.push_back(q_indptr.back() + nq);
  }
  const int64_t nrows = static_cast<int64_t>(rows.size());
  View q = make_view(c.q_dtype, nrows, hq, c.D, c.strided_views, 0);
  std::mt19937 rng(c.seed * 7 + 1);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  for (int64_t r = 0; r < nrows; ++r)
    for (int64_t h = 0; h < hq; ++h)
      for (int d = 0; d < c.D; ++d) {
        float v = uni(rng);
        if (c.q_specials && (r + h) % 5 == 1 && d == (r * 7 + h) % c.D) {
          const float specials[] = {bits_float(0x7FC00000u), bits_float(0x7F800000u), bits_float(0xFF800000u), -0.0f,
                                    bits_float(0xFFC0BEEFu)};
          v = specials[(r + h + d) % 5];
        }
        if (c.q_specials && h % 3 == 0 && d % 4 == 0) v = -0.0f;
        store_float(q.t.data, q.t.dtype, q.t.offset(r, h, d), v);
      }
  // The op must be valid (attend_query reads whatever the table says).
  PagedAttentionQuery query;
  query.q = query.out = q.t;
  query.seq_lens = c.lens;
  query.block_table = p.table;
  query.max_blocks_per_seq = p.max_blocks;
  query.window = p.window;
  if (c.decode) {
    DecodeAttentionOp op;
    op.query() = query;
    validate_decode_attention(p.kv, op);
  } else {
    PrefillAttentionOp op;
    op.query() = query;
    op.q_indptr = q_indptr;
    validate_prefill_attention(p.kv, op);
  }

  AttentionArgs a;
  a.pools = p.kv;
  a.layer = 1;
  a.q = q.t;
  a.block_table = p.table.data();
  a.max_blocks_per_seq = p.max_blocks;
  a.scales.sm_scale = c.sm_scale;
  if (is_fp8(c.dtype)) a.scales.k_scale = a.scales.v_scale = 0.125f;
  if (c.dtype == CacheDtype::int8) a.scales.k_scale = a.scales.v_scale = 0.01f;
  if (c.dtype == CacheDtype::nvfp4) {
    a.scales.k_global_scale = 0.01f;
    a.scales.v_global_scale = 0.02f;
  }
  a.window = p.window;
  a.group = c.G;

  tbb::task_arena arena(std::min(threads, tbb::info::default_concurrency()));
  View ref = make_view(c.out_dtype, nrows, hq, c.D, c.strided_views, 0xA5);
  a.out = ref.t;
  // The LSE output too (store_lse after each path's merge), poisoned alike.
  std::vector<float> lse_ref(static_cast<size_t>(nrows * hq), -7.0f), lse_got(lse_ref.size());
  a.lse = contiguous_view(lse_ref.data(), CacheDtype::fp32, {nrows, hq});
  fast::run_attention_rows(arena, a, rows, fast::AttentionPath::reference, CpuIsa::portable);
  for (const Candidate& cand : candidates()) {
    INFO((cand.path == fast::AttentionPath::fast ? "fast path, isa " : "reference, isa ")
         << std::string(cpu_isa_name(cand.isa)));
    View got = make_view(c.out_dtype, nrows, hq, c.D, c.strided_views, 0xA5);
    a.out = got.t;
    std::fill(lse_got.begin(), lse_got.end(), -7.0f);
    a.lse = contiguous_view(lse_got.data(), CacheDtype::fp32, {nrows, hq});
    fast::run_attention_rows(arena, a, rows, cand.path, cand.isa);
    CHECK(std::memcmp(lse_ref.data(), lse_got.data(), lse_ref.size() * 4) == 0);
    CHECK(std::count(lse_got.begin(), lse_got.end(), -7.0f) == 0);  // every (row, head) written
    const bool same = ref.bytes == got.bytes;
    if (!same) {
      const size_t bytes = static_cast<size_t>(bits_per_element(c.out_dtype) / 8);
      for (size_t i = 0; i < ref.bytes.size(); ++i)
        if (ref.bytes[i] != got.bytes[i]) {
          const int64_t e = static_cast<int64_t>(i / bytes);
          INFO("first difference at output element " << e << " (row " << e / ref.t.stride[0] << ", head "
                                                     << (e % ref.t.stride[0]) / ref.t.stride[1] << ", dim "
                                                     << (e % ref.t.stride[0]) % ref.t.stride[1] << ")");
          CHECK(same);
          break;
        }
    } else {
      CHECK(same);
    }
  }
}

}  // namespace

TEST_CASE("every ISA's row decoders give core's codec value for every code") {
  for (CpuIsa isa : machine_isas()) {
  INFO("isa " << cpu_isa_name(isa));
  const fast::Kernels& k = fast::kernels_for(isa);
  // 16-bit: all 65536 codes, 16 per row (head_dim 16 rows back to back).
  std::vector<uint16_t> codes(65536);
  std::iota(codes.begin(), codes.end(), uint16_t{0});
  std::vector<float> out(65536);
  for (fast::RowFormat f : {fast::RowFormat::bf16, fast::RowFormat::f16}) {
    k.decode_row(f, reinterpret_cast<const uint8_t*>(codes.data()), out.data(), 65536);
    int bad = 0;
    for (uint32_t i = 0; i < 65536; ++i) {
      const float want = f == fast::RowFormat::bf16 ? codec::bf16_to_f32(static_cast<uint16_t>(i))
                                                    : codec::f16_to_f32(static_cast<uint16_t>(i));
      bad += float_bits(want) != float_bits(out[i]);
    }
    CHECK(bad == 0);
  }
  std::vector<uint8_t> bytes(256);
  std::iota(bytes.begin(), bytes.end(), uint8_t{0});
  for (fast::RowFormat f : {fast::RowFormat::e4m3, fast::RowFormat::e5m2, fast::RowFormat::i8}) {
    k.decode_row(f, bytes.data(), out.data(), 256);
    int bad = 0;
    for (uint32_t i = 0; i < 256; ++i) {
      const uint8_t b = static_cast<uint8_t>(i);
      const float want = f == fast::RowFormat::e4m3   ? codec::e4m3_to_f32(b)
                         : f == fast::RowFormat::e5m2 ? codec::e5m2_to_f32(b)
                                                      : codec::int8_to_f32(static_cast<int8_t>(b));
      bad += float_bits(want) != float_bits(out[i]);
    }
    CHECK(bad == 0);
  }
  std::vector<float> f32(64);
  for (size_t i = 0; i < f32.size(); ++i) f32[i] = bits_float(0x7F800001u + static_cast<uint32_t>(i) * 0x01234567u);
  k.decode_row(fast::RowFormat::f32, reinterpret_cast<const uint8_t*>(f32.data()), out.data(), 64);
  CHECK(std::memcmp(f32.data(), out.data(), 64 * 4) == 0);
  }
  if (!cpu_isa_supported(CpuIsa::avx512)) MESSAGE("no AVX-512 on this machine: the AVX-512 kernels are not exercised here");
}

TEST_CASE("every ISA's exp is canon::exp_f32 bit for bit") {
  for (CpuIsa isa : machine_isas()) {
  INFO("isa " << cpu_isa_name(isa));
  const fast::Kernels& k = fast::kernels_for(isa);
  // Every 61st bit pattern of all 2^32 (every sign, exponent, NaN payloads),
  // then every float of [-104, 89.5] near the range edges and around 0.
  std::vector<float> x, y;
  auto check_batch = [&] {
    y.resize(x.size());
    k.exp(x.data(), y.data(), static_cast<int64_t>(x.size()));
    int64_t bad = 0;
    for (size_t i = 0; i < x.size(); ++i) bad += float_bits(y[i]) != float_bits(canon::exp_f32(x[i]));
    CHECK(bad == 0);
    x.clear();
  };
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 61) {
    x.push_back(bits_float(static_cast<uint32_t>(u)));
    if (x.size() == (1u << 20)) check_batch();
  }
  for (float edge : {88.72283935546875f, -103.97208404541015625f, 0.0f, -87.33654f, -0.0f}) {
    float v = edge;
    for (int i = 0; i < 20000; ++i) v = std::nextafter(v, -1e30f);
    for (int i = 0; i < 40000; ++i, v = std::nextafter(v, 1e30f)) x.push_back(v);
  }
  x.push_back(bits_float(0x7F800000u));
  x.push_back(bits_float(0xFF800000u));
  x.push_back(bits_float(0x7FC00001u));
  check_batch();
  }
}

TEST_CASE("fast attention: every dtype and layout, lengths around the 256-key partition") {
  for (CacheDtype dtype : kAllCacheDtypes)
    for (BlockLayout layout : {BlockLayout::hnd, BlockLayout::nhd, BlockLayout::split_x}) {
      if (dtype == CacheDtype::nvfp4 && layout == BlockLayout::split_x) continue;
      Case c;
      c.dtype = dtype;
      c.layout = layout;
      c.placement = layout == BlockLayout::nhd ? LayerPlacement::per_layer : LayerPlacement::in_block;
      c.lens = {255, 256, 257, 1000, 1};
      c.seed = 100 + static_cast<uint32_t>(dtype) * 3 + static_cast<uint32_t>(layout);
      if (is_fp8(dtype)) c.amplitude = 8.0f;
      if (dtype == CacheDtype::int8) c.amplitude = 100.0f;
      if (dtype == CacheDtype::nvfp4) c.amplitude = 6.0f;
      check_case(c);
      c.decode = false;
      c.max_queries = 5;
      c.lens = {257, 40, 255};
      check_case(c);
    }
}

TEST_CASE("fast attention: NaN, Inf, -0 and subnormal codes in K, V and Q") {
  for (CacheDtype dtype : kAllCacheDtypes)
    for (int specials : {2, 9, 40}) {
      Case c;
      c.dtype = dtype;
      c.H = 3;
      c.G = 4;
      c.P = 7;
      c.lens = {300, 33, 257};
      c.pool_specials = specials;
      c.q_specials = true;
      c.seed = 7 + static_cast<uint32_t>(specials) + 31 * static_cast<uint32_t>(dtype);
      c.amplitude = dtype == CacheDtype::fp8_e4m3 ? 400.0f : dtype == CacheDtype::int8 ? 120.0f : 4.0f;
      c.sm_scale = specials == 9 ? 30.0f : 0.088f;  // a large scale drives exp below -104 and to subnormals
      check_case(c);
      c.decode = false;
      c.max_queries = 3;
      c.q_dtype = CacheDtype::bf16;
      c.out_dtype = CacheDtype::fp16;
      check_case(c);
    }
}

TEST_CASE("fast attention: sliding windows with sinks, wrapped and not") {
  struct W {
    int window, sinks;
    bool one_more;
  };
  for (W w : {W{64, 0, false}, W{64, 4, false}, W{100, 5, true}, W{300, 3, false}, W{256, 16, true}, W{1000, 1, false}})
    for (int P : {1, 3, 7, 16, 17}) {
      Case c;
      c.P = P;
      c.window = w.window;
      c.sinks = w.sinks;
      c.one_more_block = w.one_more;
      c.lens = {1000, 2, static_cast<int32_t>(w.window), static_cast<int32_t>(w.window) + 1, 257};
      c.G = P % 2 ? 1 : 4;
      c.dtype = P == 7 ? CacheDtype::fp8_e4m3 : CacheDtype::bf16;
      c.seed = static_cast<uint32_t>(w.window * 31 + P);
      check_case(c);
      c.decode = false;
      c.max_queries = 4;
      c.lens = {600, 3, static_cast<int32_t>(w.window) + 2};
      check_case(c);
    }
}

TEST_CASE("fast attention: a sweep of page sizes, head dims, GQA groups, batch sizes and views") {
  const int pages[] = {1, 3, 7, 16, 17};
  const int dims[] = {64, 128, 80, 256, 40, 24, 96};
  const int groups[] = {1, 4, 8, 3, 5};
  const CacheDtype dtypes[] = {CacheDtype::bf16, CacheDtype::fp16, CacheDtype::fp32, CacheDtype::fp8_e4m3,
                               CacheDtype::fp8_e5m2, CacheDtype::nvfp4, CacheDtype::int8};
  const BlockLayout layouts[] = {BlockLayout::hnd, BlockLayout::nhd, BlockLayout::split_x};
  const std::vector<std::vector<int32_t>> len_sets = {{255}, {256, 1, 257}, {1000, 2, 255, 256, 257}, {17, 600, 31}, {513}};
  const CacheDtype io[] = {CacheDtype::fp32, CacheDtype::bf16, CacheDtype::fp16};
  for (int i = 0; i < 150; ++i) {
    Case c;
    c.P = pages[i % 5];
    c.D = dims[(i / 5 + i) % 7];
    c.G = groups[(i * 3 + 1) % 5];
    c.dtype = dtypes[(i * 5 + i / 7) % 7];
    c.layout = layouts[(i / 3) % 3];
    c.placement = (i / 2) % 2 ? LayerPlacement::per_layer : LayerPlacement::in_block;
    c.lens = len_sets[(i * 7 + i / 5) % 5];
    c.H = 1 + i % 3;
    c.decode = i % 4 != 3;
    c.max_queries = 1 + i % 6;
    c.q_dtype = io[i % 3];
    c.out_dtype = io[(i / 3) % 3];
    c.strided_views = i % 5 == 2;
    c.seed = 1000 + static_cast<uint32_t>(i);
    c.pool_specials = i % 7 == 0 ? 3 : 0;
    if (c.dtype == CacheDtype::nvfp4 && c.D % 16 != 0) c.D = 64;
    if (c.dtype == CacheDtype::nvfp4 && c.layout == BlockLayout::split_x) c.layout = BlockLayout::nhd;
    if (c.layout == BlockLayout::split_x && c.D % (128 / bits_per_element(c.dtype)) != 0) c.layout = BlockLayout::hnd;
    if (is_fp8(c.dtype)) c.amplitude = 8.0f;
    if (c.dtype == CacheDtype::int8) c.amplitude = 100.0f;
    check_case(c, i % 2 ? 3 : 1);
  }
}

TEST_CASE("fast attention: head_dim 1024 and 16 (runtime-c and one-vector paths)") {
  for (int D : {1024, 16, 32}) {
    Case c;
    c.D = D;
    c.H = 1;
    c.G = 2;
    c.lens = {257, 3};
    check_case(c);
    c.dtype = CacheDtype::fp8_e5m2;
    c.layout = BlockLayout::split_x;
    c.decode = false;
    c.max_queries = 2;
    check_case(c);
  }
}

// Prefill chunks long enough for the tiled path's blocks (32 / G consecutive
// rows) to cross pages, 256-key partitions and the block's end mid-page, after
// a cached prefix (chunks that start past 0) and from position 0.
TEST_CASE("fast attention: tiled prefill blocks across pages, partitions and GQA groups") {
  const CacheDtype dtypes[] = {CacheDtype::bf16, CacheDtype::fp16, CacheDtype::fp32, CacheDtype::fp8_e4m3,
                               CacheDtype::fp8_e5m2};
  int i = 0;
  for (int P : {1, 3, 16, 17})
    for (int G : {1, 2, 4, 8}) {
      Case c;
      c.P = P;
      c.G = G;
      c.H = 2;
      c.D = (i / 4 + i) % 2 ? 64 : 128;  // each GQA group at both head dims over the page sizes
      c.dtype = dtypes[i % 5];
      c.layout = (i / 2) % 2 ? BlockLayout::nhd : BlockLayout::hnd;
      c.placement = (i / 4) % 2 ? LayerPlacement::per_layer : LayerPlacement::in_block;
      c.decode = false;
      c.lens = {300, 530, 45, 260};
      c.queries = {300, 41, 45, 7};  // one chunk from 0; chunks after a cached prefix
      c.pool_specials = i % 3 == 0 ? 6 : 0;
      c.q_specials = i % 4 == 1;
      if (is_fp8(c.dtype)) c.amplitude = 8.0f;
      c.seed = 4000 + static_cast<uint32_t>(i);
      check_case(c, i % 2 ? 3 : 1);
      ++i;
    }
}

// Rows past kCachedPartitions' kept scores: pass 2 computes scores again.
TEST_CASE("fast attention: tiled prefill past the kept scores (4,900 keys: three partitions past them)") {
  for (CacheDtype dtype : {CacheDtype::bf16, CacheDtype::fp8_e4m3}) {
    Case c;
    c.dtype = dtype;
    c.P = 16;
    c.G = 4;
    c.H = 1;
    c.decode = false;
    c.lens = {4900};
    c.queries = {37};
    c.pool_specials = dtype == CacheDtype::bf16 ? 4 : 0;
    if (dtype == CacheDtype::fp8_e4m3) c.amplitude = 8.0f;
    check_case(c, 2);
  }
}

TEST_CASE("the CPU backend's decode and prefill are the reference's bytes") {
  auto be = make_backend("cpu");
  Case c;
  c.H = 8;
  c.G = 4;
  c.lens = {1000, 257, 256};
  Pools p;
  build_pools(c, p);
  const int64_t hq = 32;
  std::vector<float> q(3 * hq * c.D);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  for (float& v : q) v = uni(rng);
  std::vector<float> out(q.size(), -1.0f), ref(q.size(), -2.0f);
  DecodeAttentionOp op;
  op.layer = 1;
  op.q = contiguous_view(q.data(), CacheDtype::fp32, {3, hq, c.D});
  op.out = contiguous_view(out.data(), CacheDtype::fp32, {3, hq, c.D});
  op.seq_lens = c.lens;
  op.block_table = p.table;
  op.max_blocks_per_seq = p.max_blocks;
  op.scales.sm_scale = 0.088f;
  be->decode_attention(p.kv, op);

  AttentionArgs a;
  a.pools = p.kv;
  a.layer = 1;
  a.q = op.q;
  a.out = contiguous_view(ref.data(), CacheDtype::fp32, {3, hq, c.D});
  a.block_table = p.table.data();
  a.max_blocks_per_seq = p.max_blocks;
  a.scales = op.scales;
  a.group = 4;
  tbb::task_arena arena(1);
  std::vector<std::pair<int32_t, int64_t>> rows{{0, 999}, {1, 256}, {2, 255}};
  fast::run_attention_rows(arena, a, rows, fast::AttentionPath::reference, CpuIsa::portable);
  CHECK(std::memcmp(out.data(), ref.data(), out.size() * 4) == 0);
  for (CpuIsa isa : machine_isas()) {  // a backend forced to each ISA: the same bytes
    INFO("isa " << cpu_isa_name(isa));
    CpuBackend forced(1, isa);
    CHECK(forced.isa() == isa);
    std::fill(out.begin(), out.end(), -1.0f);
    forced.decode_attention(p.kv, op);
    CHECK(std::memcmp(out.data(), ref.data(), out.size() * 4) == 0);
  }

  // Prefill: 3 queries of sequence 0 (positions 997..999) through the backend.
  std::vector<int32_t> indptr{0, 3}, lens{1000}, table(p.table.begin(), p.table.begin() + p.max_blocks);
  PrefillAttentionOp pf;
  pf.layer = 1;
  pf.q = contiguous_view(q.data(), CacheDtype::fp32, {3, hq, c.D});
  pf.out = contiguous_view(out.data(), CacheDtype::fp32, {3, hq, c.D});
  pf.q_indptr = indptr;
  pf.seq_lens = lens;
  pf.block_table = table;
  pf.max_blocks_per_seq = p.max_blocks;
  pf.scales.sm_scale = 0.088f;
  be->prefill_attention(p.kv, pf);
  rows = {{0, 997}, {0, 998}, {0, 999}};
  fast::run_attention_rows(arena, a, rows, fast::AttentionPath::reference, CpuIsa::portable);
  CHECK(std::memcmp(out.data(), ref.data(), out.size() * 4) == 0);
  MESSAGE("CPU backend ISA: " << std::string(cpu_isa_name(selected_cpu_isa())));
}
