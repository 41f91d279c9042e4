// Oracle tests of the read and block-copy ops (contract §5.6, §5.9, §6 offload):
// gather_paged, gather_view, partial_copy, copy_blocks, offload / onboard.
// Each op IsEquivalentToRef: an independent reference written here (scalar
// loops over logical coordinates, offsets from the layout definitions of contract
// §2 written out below, not core's element_offset; only core's codecs are
// shared) predicts every output byte and every pool byte, over NHD / HND /
// split-x x in_block / per_layer x every dtype (nvfp4 not with split-x), page
// sizes 1, 3, 7, 16, 17, head dims 64..256, odd head counts, K/V and MLA latent
// pools. Pools hold random bytes (NaN codes included) over a 0xA5 poison, so
// untouched bytes are checked by whole-pool comparison. Every op runs on CPU
// backends with 1, 2, 3 and all threads, each compared byte for byte with the
// reference. Every rejection path is checked for its error code and for
// unchanged pools (and an unchanged output buffer).
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvsim/validation.hpp"
#include "backends/backend.hpp"

using namespace kvsim;

namespace {

constexpr PoolKind kPrimary = PoolKind::primary;
constexpr PoolKind kSecondary = PoolKind::secondary;
constexpr uint8_t kPoison = 0xA5;

// ================================================================ independent reference layout

// vLLM's x: elements per 16 bytes.
int64_t reference_split_x(CacheDtype t) {
  switch (t) {
    case CacheDtype::fp32:
      return 4;
    case CacheDtype::fp16:
    case CacheDtype::bf16:
      return 8;
    default:
      return 16;
  }
}

// Offset inside one (block, layer, kv) sub-block of H * P * D elements (contract §2).
int64_t reference_inner_offset(BlockLayout layout, CacheDtype t, int64_t H, int64_t P, int64_t D, int kv, int64_t head,
                               int64_t token, int64_t dim) {
  switch (layout) {
    case BlockLayout::nhd:
      return (token * H + head) * D + dim;  // [token][head][dim]
    case BlockLayout::hnd:
      return (head * P + token) * D + dim;  // [head][token][dim]
    case BlockLayout::split_x:
      if (kv == 1) return (head * D + dim) * P + token;  // V [head][dim][token]
      {
        const int64_t x = reference_split_x(t);
        return ((head * (D / x) + dim / x) * P + token) * x + dim % x;  // K [head][dim/x][token][x]
      }
  }
  return -1;
}

int64_t pool_blocks(const PoolGeometry& g, PoolKind k) { return k == kPrimary ? g.primary_blocks : g.secondary_blocks; }

// in_block: [block][layer][kv][inner]; per_layer: [layer][block][kv][inner].
int64_t reference_offset_with(const PoolGeometry& g, BlockLayout layout, CacheDtype t, int64_t D, PoolKind kind,
                              int64_t block, int layer, int kv, int head, int token, int dim) {
  const int64_t H = g.kv_heads, P = g.tokens_per_block, L = g.layers, F = g.kv_factor;
  const int64_t sub = H * P * D;
  const int64_t inner = reference_inner_offset(layout, t, H, P, D, kv, head, token, dim);
  if (g.placement == LayerPlacement::in_block) return ((block * L + layer) * F + kv) * sub + inner;
  return ((layer * pool_blocks(g, kind) + block) * F + kv) * sub + inner;
}

// Offsets of data elements (nibbles for nvfp4) and nvfp4 scale bytes.
struct RefLayout {
  PoolGeometry g;
  std::function<int64_t(PoolKind, int64_t, int, int, int, int, int)> data;
  std::function<int64_t(PoolKind, int64_t, int, int, int, int, int)> scale;  // takes the element's dim
};

RefLayout standard_layout(const PoolGeometry& g) {
  RefLayout r{g, {}, {}};
  r.data = [g](PoolKind k, int64_t b, int l, int kv, int h, int t, int d) {
    return reference_offset_with(g, g.layout, g.dtype, g.head_dim, k, b, l, kv, h, t, d);
  };
  // The scale pool: one byte per 16 elements, the data layout with D / 16 (nvfp4 is never split-x).
  r.scale = [g](PoolKind k, int64_t b, int l, int kv, int h, int t, int d) {
    return reference_offset_with(g, g.layout, CacheDtype::fp8_e4m3, g.head_dim / 16, k, b, l, kv, h, t, d / 16);
  };
  return r;
}

int reference_element_bytes(CacheDtype t) {
  switch (t) {
    case CacheDtype::fp32:
      return 4;
    case CacheDtype::fp16:
    case CacheDtype::bf16:
      return 2;
    default:
      return 1;
  }
}

uint8_t get_nibble(const std::vector<uint8_t>& v, int64_t e) {
  return (e & 1) ? static_cast<uint8_t>(v[e / 2] >> 4) : static_cast<uint8_t>(v[e / 2] & 0xF);
}
void set_nibble(std::vector<uint8_t>& v, int64_t e, uint8_t n) {
  uint8_t& b = v[e / 2];
  b = (e & 1) ? static_cast<uint8_t>((b & 0x0F) | (n << 4)) : static_cast<uint8_t>((b & 0xF0) | n);
}

// Host image of every pool of a geometry.
struct PoolImage {
  std::vector<uint8_t> data[2], scales[2];
  bool operator==(const PoolImage& o) const {
    return data[0] == o.data[0] && data[1] == o.data[1] && scales[0] == o.scales[0] && scales[1] == o.scales[1];
  }
};

std::string first_difference(const PoolImage& got, const PoolImage& want) {
  const char* names[4] = {"primary data", "secondary data", "primary scales", "secondary scales"};
  const std::vector<uint8_t>* g[4] = {&got.data[0], &got.data[1], &got.scales[0], &got.scales[1]};
  const std::vector<uint8_t>* w[4] = {&want.data[0], &want.data[1], &want.scales[0], &want.scales[1]};
  for (int i = 0; i < 4; ++i) {
    if (g[i]->size() != w[i]->size()) return std::string(names[i]) + ": sizes differ";
    for (size_t j = 0; j < g[i]->size(); ++j)
      if ((*g[i])[j] != (*w[i])[j])
        return std::string(names[i]) + " byte " + std::to_string(j) + ": got " + std::to_string((*g[i])[j]) + " want " +
               std::to_string((*w[i])[j]);
  }
  return "";
}

PoolImage random_image(const PoolGeometry& g, std::mt19937_64& rng) {
  PoolImage img;
  for (PoolKind k : {kPrimary, kSecondary}) {
    const int i = static_cast<int>(k);
    img.data[i].resize(static_cast<size_t>(g.pool_bytes(k)));
    img.scales[i].resize(static_cast<size_t>(scale_pool_bytes(g, k)));
    for (auto* v : {&img.data[i], &img.scales[i]})
      for (auto& b : *v) b = static_cast<uint8_t>(rng());
  }
  return img;
}

// Reference copy of one element (and, for nvfp4 at dims 0, 16, ..., its scale byte).
void reference_copy_element(const RefLayout& r, const PoolImage& from, PoolKind fk, int64_t fb, PoolImage& to,
                            PoolKind tk, int64_t tb, int layer, int kv, int head, int token, int dim) {
  const int fi = static_cast<int>(fk), ti = static_cast<int>(tk);
  const int64_t fo = r.data(fk, fb, layer, kv, head, token, dim);
  const int64_t to_ = r.data(tk, tb, layer, kv, head, token, dim);
  if (r.g.dtype == CacheDtype::nvfp4) {
    set_nibble(to.data[ti], to_, get_nibble(from.data[fi], fo));
    if (dim % 16 == 0)
      to.scales[ti][r.scale(tk, tb, layer, kv, head, token, dim)] =
          from.scales[fi][r.scale(fk, fb, layer, kv, head, token, dim)];
    return;
  }
  const int eb = reference_element_bytes(r.g.dtype);
  std::memcpy(&to.data[ti][to_ * eb], &from.data[fi][fo * eb], eb);
}

// Copies the first `tokens` entries of every (layer, kv, head) of a block.
void reference_copy_block(const RefLayout& r, const PoolImage& from, PoolKind fk, int64_t fb, PoolImage& to,
                          PoolKind tk, int64_t tb, int tokens) {
  const PoolGeometry& g = r.g;
  for (int l = 0; l < g.layers; ++l)
    for (int kv = 0; kv < g.kv_factor; ++kv)
      for (int h = 0; h < g.kv_heads; ++h)
        for (int t = 0; t < tokens; ++t)
          for (int d = 0; d < g.head_dim; ++d) reference_copy_element(r, from, fk, fb, to, tk, tb, l, kv, h, t, d);
}

// The bits gather_paged must write for one element of a live primary block.
uint32_t reference_gather_bits(const RefLayout& r, const PoolImage& img, int64_t block, int layer, int kv, int head,
                               int token, int dim, float scale, float global_scale) {
  const std::vector<uint8_t>& p = img.data[0];
  const int64_t e = r.data(kPrimary, block, layer, kv, head, token, dim);
  float v = 0.0f;
  uint32_t bits = 0;
  switch (r.g.dtype) {
    case CacheDtype::fp32:
      std::memcpy(&bits, &p[e * 4], 4);
      return bits;  // bit copy: NaN payloads kept
    case CacheDtype::fp16:
    case CacheDtype::bf16: {
      uint16_t h = 0;
      std::memcpy(&h, &p[e * 2], 2);
      v = r.g.dtype == CacheDtype::fp16 ? codec::f16_to_f32(h) : codec::bf16_to_f32(h);
      break;
    }
    case CacheDtype::fp8_e4m3:
      v = codec::e4m3_to_f32(p[e]) * scale;
      break;
    case CacheDtype::fp8_e5m2:
      v = codec::e5m2_to_f32(p[e]) * scale;
      break;
    case CacheDtype::int8:
      v = static_cast<float>(static_cast<int8_t>(p[e])) * scale;
      break;
    case CacheDtype::nvfp4: {
      const uint8_t sf = img.scales[0][r.scale(kPrimary, block, layer, kv, head, token, dim)];
      v = codec::nvfp4_decode(get_nibble(p, e), sf, global_scale);
      break;
    }
  }
  std::memcpy(&bits, &v, 4);
  // A NaN that came out of arithmetic (scaled codes, nvfp4) is stored as the
  // canonical 0x7FFFFFFF, as GPU arithmetic makes it; decoded fp16/bf16 NaNs
  // keep their bits (no arithmetic).
  const bool computed = r.g.dtype != CacheDtype::fp16 && r.g.dtype != CacheDtype::bf16;
  if (computed && (bits & 0x7FFFFFFFu) > 0x7F800000u) bits = 0x7FFFFFFFu;
  return bits;
}

// Expected [n, H, D] output bytes of a gather (row-major).
std::vector<uint8_t> reference_gather(const RefLayout& r, const PoolImage& img, const std::vector<int32_t>& table,
                                      int64_t n, int layer, int kv, float scale, float global_scale) {
  const PoolGeometry& g = r.g;
  std::vector<uint8_t> out(static_cast<size_t>(n * g.kv_heads * g.head_dim * 4), 0);
  for (int64_t t = 0; t < n; ++t) {
    const int32_t block = table[t / g.tokens_per_block];
    const int entry = static_cast<int>(t % g.tokens_per_block);
    for (int h = 0; h < g.kv_heads; ++h)
      for (int d = 0; d < g.head_dim; ++d) {
        const uint32_t bits =
            block == -1 ? 0u : reference_gather_bits(r, img, block, layer, kv, h, entry, d, scale, global_scale);
        std::memcpy(&out[((t * g.kv_heads + h) * g.head_dim + d) * 4], &bits, 4);
      }
  }
  return out;
}

// ================================================================ backends and device pools

struct ThreadedBackend {
  int threads;  // 0 = all
  std::unique_ptr<Backend> backend;
};

// CPU backends with 1, 2, 3 and all threads: every op must give the same bytes on each.
std::vector<ThreadedBackend>& backends() {
  static std::vector<ThreadedBackend> list = [] {
    std::vector<ThreadedBackend> v;
    for (int t : {1, 2, 3, 0}) v.push_back({t, make_backend("cpu", BackendOptions{t})});
    return v;
  }();
  return list;
}

class DevicePools {
 public:
  DevicePools(Backend& be, const PoolGeometry& g) : be_(be), pools_(be.allocate_pools(g, kPoison)) {}
  ~DevicePools() { be_.release_pools(pools_); }
  DevicePools(const DevicePools&) = delete;
  DevicePools& operator=(const DevicePools&) = delete;

  const KvPools& pools() const { return pools_; }
  KvPools& pools() { return pools_; }
  void upload(const PoolImage& img) {
    for (int i = 0; i < 2; ++i) {
      if (!img.data[i].empty()) be_.to_backend(pools_.data[i], img.data[i].data(), img.data[i].size());
      if (!img.scales[i].empty()) be_.to_backend(pools_.scales[i], img.scales[i].data(), img.scales[i].size());
    }
  }
  PoolImage download() const {
    PoolImage img;
    const PoolGeometry& g = pools_.geometry;
    for (PoolKind k : {kPrimary, kSecondary}) {
      const int i = static_cast<int>(k);
      img.data[i].resize(static_cast<size_t>(g.pool_bytes(k)));
      img.scales[i].resize(static_cast<size_t>(scale_pool_bytes(g, k)));
      if (!img.data[i].empty()) be_.to_host(img.data[i].data(), pools_.data[i], img.data[i].size());
      if (!img.scales[i].empty()) be_.to_host(img.scales[i].data(), pools_.scales[i], img.scales[i].size());
    }
    return img;
  }

 private:
  Backend& be_;
  KvPools pools_;
};

// Runs a gather into a poisoned buffer with guard floats on both sides;
// returns the [n, H, D] bytes and checks the guards are untouched.
constexpr int64_t kGuardFloats = 16;
std::vector<uint8_t> run_gather(Backend& be, const KvPools& pools, GatherPagedOp op) {
  const int64_t count = op.num_tokens * pools.geometry.kv_heads * pools.geometry.head_dim;
  const size_t bytes = static_cast<size_t>((count + 2 * kGuardFloats) * 4);
  BackendBuffer buf(be, bytes);
  be.fill(buf.get(), kPoison, bytes);
  if (op.num_tokens > 0)
    op.out = contiguous_view(static_cast<float*>(buf.get()) + kGuardFloats, CacheDtype::fp32,
                             {op.num_tokens, pools.geometry.kv_heads, pools.geometry.head_dim});
  be.gather_paged(pools, op);
  std::vector<uint8_t> host(bytes);
  be.to_host(host.data(), buf.get(), bytes);
  int64_t touched_guards = 0;
  for (int64_t i = 0; i < kGuardFloats * 4; ++i) {
    touched_guards += host[i] != kPoison;
    touched_guards += host[bytes - 1 - i] != kPoison;
  }
  CHECK_MESSAGE(touched_guards == 0, "gather wrote outside its output");
  return std::vector<uint8_t>(host.begin() + kGuardFloats * 4, host.end() - kGuardFloats * 4);
}

std::string first_byte_difference(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  if (got.size() != want.size()) return "sizes differ";
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i])
      return "byte " + std::to_string(i) + " (float " + std::to_string(i / 4) + "): got " + std::to_string(got[i]) +
             " want " + std::to_string(want[i]);
  return "";
}

// ================================================================ the sweep

struct Config {
  BlockLayout layout;
  LayerPlacement placement;
  CacheDtype dtype;
  int32_t page;
  int32_t head_dim;
  int32_t heads;
  int32_t kv_factor;

  PoolGeometry geometry() const {
    PoolGeometry g{.layers = 2, .kv_factor = kv_factor, .kv_heads = heads, .tokens_per_block = page,
                   .head_dim = head_dim, .dtype = dtype, .layout = layout, .placement = placement,
                   .primary_blocks = 5, .secondary_blocks = 3};
    return g;
  }
  std::string name() const {
    return std::string(layout_name(layout)) + " " + std::string(placement_name(placement)) + " " +
           std::string(dtype_name(dtype)) + " P=" + std::to_string(page) + " D=" + std::to_string(head_dim) +
           " H=" + std::to_string(heads) + " F=" + std::to_string(kv_factor);
  }
};

// Every layout x placement x dtype x page size; head dims rotate so each
// (layout, placement, dtype) meets all five; odd head counts; every fifth
// configuration is an MLA-style latent pool (kv_factor 1).
std::vector<Config> sweep() {
  const int32_t pages[] = {1, 3, 7, 16, 17};
  const int32_t dims[] = {64, 80, 96, 128, 256};
  const int32_t heads[] = {1, 3, 5};
  std::vector<Config> out;
  int counter = 0;
  for (BlockLayout layout : {BlockLayout::nhd, BlockLayout::hnd, BlockLayout::split_x})
    for (LayerPlacement placement : {LayerPlacement::in_block, LayerPlacement::per_layer})
      for (CacheDtype dtype : kAllCacheDtypes)
        for (int pi = 0; pi < 5; ++pi) {
          if (dtype == CacheDtype::nvfp4 && layout == BlockLayout::split_x) continue;
          const int32_t D = dims[(pi + static_cast<int>(layout) + static_cast<int>(placement)) % 5];
          int32_t H = heads[counter % 3];
          if (H == 5 && D >= 128) H = 3;  // keeps the pools small
          const int32_t F = counter % 5 == 4 ? 1 : 2;
          out.push_back(Config{layout, placement, dtype, pages[pi], D, H, F});
          ++counter;
        }
  return out;
}

constexpr float kScale = 0.375f;       // applied to fp8 / int8 codes, ignored by the other dtypes
constexpr float kGlobalScale = 1.25f;  // nvfp4

}  // namespace

// ================================================================ gather_paged

TEST_CASE("gather_paged IsEquivalentToRef: layouts x placements x dtypes x pages, BAD_PAGE zeros, all thread counts") {
  const auto start = std::chrono::steady_clock::now();
  std::mt19937_64 rng(1234);
  int64_t gathers = 0;
  for (const Config& c : sweep()) {
    CAPTURE(c.name());
    const PoolGeometry g = c.geometry();
    const RefLayout ref = standard_layout(g);
    const PoolImage img = random_image(g, rng);
    const int32_t P = c.page;
    // Touched pages: live, BAD_PAGE, live, live; the 999 after them is never read.
    const std::vector<int32_t> table = {3, -1, 0, 4, 999};
    const std::vector<int32_t> bad_first = {-1, 1};
    struct Request {
      const std::vector<int32_t>* table;
      int64_t n;
      int layer, kv;
    };
    const std::vector<Request> requests = {
        {&table, 0, 0, 0},         {&table, 1, 0, 0},     {&table, P, 1, 1},         {&table, P + 1, 1, 0},
        {&table, 3 * P - 1, 0, 1}, {&table, 4 * P, 1, 1}, {&bad_first, P + 1, 1, 0},
    };
    for (auto& tb : backends()) {
      CAPTURE(tb.threads);
      DevicePools dev(*tb.backend, g);
      dev.upload(img);
      for (const Request& rq : requests) {
        const int kv = rq.kv % c.kv_factor;
        CAPTURE(rq.n);
        CAPTURE(rq.layer);
        CAPTURE(kv);
        GatherPagedOp op;
        op.layer = rq.layer;
        op.kv = kv;
        op.block_ids = *rq.table;
        op.num_tokens = rq.n;
        op.scale = kScale;
        op.global_scale = kGlobalScale;
        const std::vector<uint8_t> got = run_gather(*tb.backend, dev.pools(), op);
        const std::vector<uint8_t> want =
            reference_gather(ref, img, *rq.table, rq.n, rq.layer, kv, op.scale, kGlobalScale);
        const std::string diff = first_byte_difference(got, want);
        CHECK_MESSAGE(diff.empty(), diff);
        ++gathers;
      }
      CHECK_MESSAGE(dev.download() == img, "a gather changed the pool");
    }
  }
  MESSAGE("gathers: " << gathers << " in "
                      << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << " s");
}

TEST_CASE("gather_paged writes through arbitrary output strides and nothing else") {
  auto& be = *backends()[1].backend;
  std::mt19937_64 rng(7);
  PoolGeometry g{.layers = 2, .kv_heads = 3, .tokens_per_block = 7, .head_dim = 80, .dtype = CacheDtype::bf16,
                 .layout = BlockLayout::hnd, .placement = LayerPlacement::per_layer, .primary_blocks = 4,
                 .secondary_blocks = 1};
  const RefLayout ref = standard_layout(g);
  const PoolImage img = random_image(g, rng);
  DevicePools dev(be, g);
  dev.upload(img);
  const std::vector<int32_t> table = {2, -1, 0};
  const int64_t n = 17, H = g.kv_heads, D = g.head_dim;
  const std::vector<uint8_t> want = reference_gather(ref, img, table, n, 1, 1, 1.0f, 1.0f);

  // Padded rows ([n][H][D + 5]) and a transposed layout ([D][H][n] storage).
  const int64_t padded[3] = {H * (D + 5), D + 5, 1};
  const int64_t transposed[3] = {1, n, n * H};
  for (const int64_t* strides : {padded, transposed}) {
    const int64_t span = strides[0] * (n - 1) + strides[1] * (H - 1) + strides[2] * (D - 1) + 1;
    std::vector<float> host(static_cast<size_t>(span));
    std::memset(host.data(), kPoison, host.size() * 4);
    BackendBuffer buf(be, host.size() * 4);
    buf.upload(host.data(), host.size() * 4);
    GatherPagedOp op;
    op.layer = 1;
    op.kv = 1;
    op.block_ids = table;
    op.num_tokens = n;
    op.out.data = buf.get();
    op.out.dtype = CacheDtype::fp32;
    op.out.rank = 3;
    op.out.shape[0] = n;
    op.out.shape[1] = H;
    op.out.shape[2] = D;
    for (int i = 0; i < 3; ++i) op.out.stride[i] = strides[i];
    be.gather_paged(dev.pools(), op);
    std::vector<uint8_t> got(host.size() * 4);
    buf.download(got.data(), got.size());
    std::vector<uint8_t> expected(got.size(), kPoison);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d)
          std::memcpy(&expected[(t * strides[0] + h * strides[1] + d * strides[2]) * 4],
                      &want[((t * H + h) * D + d) * 4], 4);
    CHECK(first_byte_difference(got, expected) == "");
  }
}

// ================================================================ gather_view

TEST_CASE("gather_view aliases the pool for one-block fp32 requests and matches gather_paged") {
  std::mt19937_64 rng(99);
  auto& be = *backends()[0].backend;
  int views = 0, declined = 0;
  for (const Config& c : sweep()) {
    CAPTURE(c.name());
    const PoolGeometry g = c.geometry();
    const RefLayout ref = standard_layout(g);
    const PoolImage img = random_image(g, rng);
    DevicePools dev(be, g);
    dev.upload(img);
    const std::vector<int32_t> table = {2, 4, -1};
    for (int kv = 0; kv < c.kv_factor; ++kv)
      for (int64_t n : {int64_t{1}, int64_t{(c.page + 1) / 2}, int64_t{c.page}, int64_t{c.page + 1}}) {
        CAPTURE(kv);
        CAPTURE(n);
        GatherPagedOp op;
        op.layer = 1;
        op.kv = kv;
        op.block_ids = table;
        op.num_tokens = n;
        const std::optional<TensorView> view = gather_view(dev.pools(), op);
        // The contract: fp32, all tokens in one live block, dim one stride. Split-x K
        // ([head][dim/x][token][x]) has dim as one stride only when P == 1.
        const bool dim_one_stride = !(c.layout == BlockLayout::split_x && kv == 0) || c.page == 1;
        const bool expect_view = c.dtype == CacheDtype::fp32 && n <= c.page && dim_one_stride;
        REQUIRE(view.has_value() == expect_view);
        if (!view) {
          ++declined;
          continue;
        }
        ++views;
        CHECK(view->dtype == CacheDtype::fp32);
        REQUIRE(view->rank == 3);
        CHECK(view->shape[0] == n);
        CHECK(view->shape[1] == g.kv_heads);
        CHECK(view->shape[2] == g.head_dim);
        const std::vector<uint8_t> gathered = run_gather(be, dev.pools(), op);
        const float* base = static_cast<const float*>(dev.pools().data[0]);
        int64_t wrong_address = 0, wrong_value = 0;
        for (int64_t t = 0; t < n; ++t)
          for (int h = 0; h < g.kv_heads; ++h)
            for (int d = 0; d < g.head_dim; ++d) {
              const float* p = static_cast<const float*>(view->data) + view->offset(t, h, d);
              // Aliasing: the element's address is the pool's, by the reference layout.
              wrong_address += p != base + ref.data(kPrimary, table[0], 1, kv, h, static_cast<int>(t), d);
              wrong_value += std::memcmp(p, &gathered[((t * g.kv_heads + h) * g.head_dim + d) * 4], 4) != 0;
            }
        CHECK(wrong_address == 0);
        CHECK(wrong_value == 0);
      }
    // A first page that is BAD_PAGE, and an empty request, are never views.
    const std::vector<int32_t> bad_first = {-1};
    GatherPagedOp op;
    op.block_ids = bad_first;
    op.num_tokens = 1;
    CHECK_FALSE(gather_view(dev.pools(), op).has_value());
    op.num_tokens = 0;
    CHECK_FALSE(gather_view(dev.pools(), op).has_value());
  }
  CHECK(views > 0);
  MESSAGE("views: " << views << ", declined: " << declined);
}

TEST_CASE("gather_view sees later writes to its block (it is not a copy)") {
  auto& be = *backends()[0].backend;
  PoolGeometry g{.layers = 1, .kv_heads = 3, .tokens_per_block = 5, .head_dim = 64, .dtype = CacheDtype::fp32,
                 .layout = BlockLayout::nhd, .primary_blocks = 2};
  DevicePools dev(be, g);
  const std::vector<int32_t> table = {1};
  GatherPagedOp op;
  op.kv = 1;
  op.block_ids = table;
  op.num_tokens = 4;
  const std::optional<TensorView> view = gather_view(dev.pools(), op);
  REQUIRE(view.has_value());
  const float value = 3.5f;
  const int64_t e = ((1 * 2 + 1) * 3 * 5 * 64) + (3 * 3 + 2) * 64 + 7;  // block 1, V, token 3, head 2, dim 7 (NHD)
  be.to_backend(static_cast<float*>(dev.pools().data[0]) + e, &value, 4);
  float seen = 0;
  be.to_host(&seen, static_cast<const float*>(view->data) + view->offset(3, 2, 7), 4);
  CHECK(seen == value);
}

// ================================================================ partial_copy

TEST_CASE("partial_copy IsEquivalentToRef: first n tokens of every layer/kv/head, the rest untouched") {
  std::mt19937_64 rng(555);
  int64_t copies = 0;
  for (const Config& c : sweep()) {
    CAPTURE(c.name());
    const PoolGeometry g = c.geometry();
    const RefLayout ref = standard_layout(g);
    const PoolImage img = random_image(g, rng);
    for (int32_t n : {0, -2, 1, std::max(1, c.page / 2), c.page}) {
      CAPTURE(n);
      // n <= 0 copies the whole block; nvfp4 always copies whole blocks, scales too.
      const int tokens = (n <= 0 || c.dtype == CacheDtype::nvfp4) ? c.page : n;
      PoolImage want = img;
      reference_copy_block(ref, img, kPrimary, 3, want, kPrimary, 1, tokens);
      for (auto& tb : backends()) {
        CAPTURE(tb.threads);
        DevicePools dev(*tb.backend, g);
        dev.upload(img);
        tb.backend->partial_copy(dev.pools(), PartialCopyOp{3, 1, n});
        const std::string diff = first_difference(dev.download(), want);
        CHECK_MESSAGE(diff.empty(), diff);
        ++copies;
      }
    }
  }
  MESSAGE("partial copies: " << copies);
}

// ================================================================ copy_blocks

TEST_CASE("copy_blocks IsEquivalentToRef: independent whole-block pairs, a source may fork") {
  std::mt19937_64 rng(31337);
  for (const Config& c : sweep()) {
    CAPTURE(c.name());
    const PoolGeometry g = c.geometry();
    const RefLayout ref = standard_layout(g);
    const PoolImage img = random_image(g, rng);
    const std::vector<std::pair<int32_t, int32_t>> pairs = {{2, 0}, {3, 1}, {2, 4}};
    PoolImage want = img;
    for (const auto& [src, dst] : pairs) reference_copy_block(ref, img, kPrimary, src, want, kPrimary, dst, c.page);
    for (auto& tb : backends()) {
      CAPTURE(tb.threads);
      DevicePools dev(*tb.backend, g);
      dev.upload(img);
      tb.backend->copy_blocks(dev.pools(), CopyBlocksOp{pairs});
      const std::string diff = first_difference(dev.download(), want);
      CHECK_MESSAGE(diff.empty(), diff);
      tb.backend->copy_blocks(dev.pools(), CopyBlocksOp{});  // empty list: no-op
      CHECK(dev.download() == want);
    }
  }
}

// ================================================================ offload / onboard

TEST_CASE("offload / onboard IsEquivalentToRef, and offload then onboard returns the same bytes (contract §6)") {
  std::mt19937_64 rng(4242);
  for (const Config& c : sweep()) {
    CAPTURE(c.name());
    const PoolGeometry g = c.geometry();
    const RefLayout ref = standard_layout(g);
    const PoolImage img = random_image(g, rng);
    const std::vector<int32_t> primary = {2, 0, 4};
    const std::vector<int32_t> secondary = {1, 2, 0};
    const std::vector<int32_t> onboard_to = {3, 4, 1};

    PoolImage after_offload = img;
    for (size_t i = 0; i < primary.size(); ++i)
      reference_copy_block(ref, img, kPrimary, primary[i], after_offload, kSecondary, secondary[i], c.page);
    PoolImage after_onboard = after_offload;
    for (size_t i = 0; i < secondary.size(); ++i)
      reference_copy_block(ref, after_offload, kSecondary, secondary[i], after_onboard, kPrimary, onboard_to[i],
                           c.page);
    const PoolImage scrambled = random_image(g, rng);  // new primary contents between offload and onboard

    for (auto& tb : backends()) {
      CAPTURE(tb.threads);
      DevicePools dev(*tb.backend, g);
      dev.upload(img);
      tb.backend->offload(dev.pools(), MoveBlocksOp{primary, secondary});
      std::string diff = first_difference(dev.download(), after_offload);
      CHECK_MESSAGE(diff.empty(), "offload: " << diff);
      tb.backend->onboard(dev.pools(), MoveBlocksOp{onboard_to, secondary});
      diff = first_difference(dev.download(), after_onboard);
      CHECK_MESSAGE(diff.empty(), "onboard: " << diff);

      // Round trip: offload, overwrite the whole primary pool, onboard into the
      // same blocks: those blocks hold their original bytes again.
      dev.upload(img);
      tb.backend->offload(dev.pools(), MoveBlocksOp{primary, secondary});
      PoolImage mid = dev.download();
      mid.data[0] = scrambled.data[0];
      mid.scales[0] = scrambled.scales[0];
      dev.upload(mid);
      tb.backend->onboard(dev.pools(), MoveBlocksOp{primary, secondary});
      const PoolImage back = dev.download();
      int64_t differing = 0;
      for (int32_t b : primary)
        for (int l = 0; l < g.layers; ++l)
          for (int kv = 0; kv < g.kv_factor; ++kv)
            for (int h = 0; h < g.kv_heads; ++h)
              for (int t = 0; t < g.tokens_per_block; ++t)
                for (int d = 0; d < g.head_dim; ++d) {
                  const int64_t e = ref.data(kPrimary, b, l, kv, h, t, d);
                  if (g.dtype == CacheDtype::nvfp4) {
                    differing += get_nibble(back.data[0], e) != get_nibble(img.data[0], e);
                    const int64_t s = ref.scale(kPrimary, b, l, kv, h, t, d);
                    differing += back.scales[0][s] != img.scales[0][s];
                  } else {
                    const int eb = reference_element_bytes(g.dtype);
                    differing += std::memcmp(&back.data[0][e * eb], &img.data[0][e * eb], eb) != 0;
                  }
                }
      CHECK_MESSAGE(differing == 0, "round trip changed " << differing << " elements");
    }
  }
}

// ================================================================ caller strides

// A pool whose inner order is [head][dim][token] for K and V (token
// innermost): legal caller strides, not one of the named layouts. Copies and
// gathers must follow the strides, not a layout assumption.
TEST_CASE("caller strides: token-innermost pools gather and copy by their strides; nvfp4 copies reject them") {
  std::mt19937_64 rng(2024);
  for (CacheDtype dtype : {CacheDtype::fp16, CacheDtype::int8, CacheDtype::fp32, CacheDtype::nvfp4}) {
    CAPTURE(dtype_name(dtype));
    PoolGeometry g{.layers = 2, .kv_heads = 3, .tokens_per_block = 7, .head_dim = 64, .dtype = dtype,
                   .layout = BlockLayout::nhd, .placement = LayerPlacement::in_block, .primary_blocks = 4,
                   .secondary_blocks = 2};
    const int64_t H = g.kv_heads, P = g.tokens_per_block, D = g.head_dim, F = g.kv_factor, L = g.layers;
    RefLayout ref = standard_layout(g);  // scales keep the standard NHD layout
    ref.data = [=](PoolKind, int64_t b, int l, int kv, int h, int t, int d) {
      return ((b * L + l) * F + kv) * H * P * D + (h * D + d) * P + t;
    };
    auto& be = *backends()[2].backend;
    DevicePools dev(be, g);
    for (int i = 0; i < 2; ++i)
      for (int kv = 0; kv < 2; ++kv) dev.pools().strides[i].inner[kv] = InnerStrides{D * P, 1, 0, P, g.head_dim};
    const PoolImage img = random_image(g, rng);
    dev.upload(img);

    const std::vector<int32_t> table = {3, 0};
    GatherPagedOp gop;
    gop.layer = 1;
    gop.kv = 1;
    gop.block_ids = table;
    gop.num_tokens = 10;
    gop.scale = 0.5f;
    gop.global_scale = kGlobalScale;
    CHECK(first_byte_difference(run_gather(be, dev.pools(), gop),
                                reference_gather(ref, img, table, 10, 1, 1, 0.5f, kGlobalScale)) == "");
    if (dtype == CacheDtype::fp32) CHECK(gather_view(dev.pools(), gop) == std::nullopt);  // two blocks
    gop.num_tokens = 5;
    if (dtype == CacheDtype::fp32) {
      const auto view = gather_view(dev.pools(), gop);
      REQUIRE(view.has_value());  // dim is one stride (P), so still a view
      CHECK(view->stride[0] == 1);
      CHECK(view->stride[1] == D * P);
      CHECK(view->stride[2] == P);
    }

    if (dtype == CacheDtype::nvfp4) {
      // Two tokens' nibbles share a byte: a byte-wise block copy would race.
      for (auto call : std::vector<std::function<void()>>{
               [&] {
                 be.partial_copy(dev.pools(), PartialCopyOp{0, 1, 0});
               },
               [&] {
                 be.copy_blocks(dev.pools(), CopyBlocksOp{std::vector<std::pair<int32_t, int32_t>>{{0, 1}}});
               },
               [&] {
                 be.offload(dev.pools(), MoveBlocksOp{std::vector<int32_t>{0}, std::vector<int32_t>{1}});
               }}) {
        bool rejected = false;
        try {
          call();
        } catch (const ValidationError& e) {
          rejected = e.code() == ErrorCode::bad_strides;
        }
        CHECK(rejected);
        CHECK(dev.download() == img);
      }
      continue;
    }
    PoolImage want = img;
    reference_copy_block(ref, img, kPrimary, 3, want, kPrimary, 1, 4);
    be.partial_copy(dev.pools(), PartialCopyOp{3, 1, 4});
    CHECK(first_difference(dev.download(), want) == "");
    const std::vector<int32_t> prim = {1, 2}, sec = {1, 0};
    for (size_t i = 0; i < prim.size(); ++i)
      reference_copy_block(ref, want, kPrimary, prim[i], want, kSecondary, sec[i], g.tokens_per_block);
    be.offload(dev.pools(), MoveBlocksOp{prim, sec});
    CHECK(first_difference(dev.download(), want) == "");
  }
}

// ================================================================ rejections

namespace {

struct RejectFixture {
  PoolGeometry g;
  Backend& be;
  std::unique_ptr<DevicePools> dev;
  PoolImage img;

  RejectFixture(CacheDtype dtype, int32_t kv_factor = 2) : be(*backends()[1].backend) {
    g.layers = 2;
    g.kv_factor = kv_factor;
    g.kv_heads = 3;
    g.tokens_per_block = 7;
    g.head_dim = 64;
    g.dtype = dtype;
    g.layout = BlockLayout::hnd;
    g.placement = LayerPlacement::per_layer;
    g.primary_blocks = 4;
    g.secondary_blocks = 2;
    dev = std::make_unique<DevicePools>(be, g);
    std::mt19937_64 rng(static_cast<uint64_t>(dtype) + 100);
    img = random_image(g, rng);
    dev->upload(img);
  }
  const KvPools& pools() const { return dev->pools(); }

  // The call must throw `code` (message containing `needle`) and leave every pool unchanged.
  void expect(ErrorCode code, const std::string& needle, const std::function<void()>& call) {
    CAPTURE(error_name(code));
    CAPTURE(needle);
    bool thrown = false;
    try {
      call();
    } catch (const ValidationError& e) {
      thrown = true;
      CHECK_MESSAGE(e.code() == code, e.what());
      CHECK_MESSAGE(std::string(e.what()).find(needle) != std::string::npos, e.what());
    }
    CHECK_MESSAGE(thrown, "not rejected");
    CHECK(dev->download() == img);
  }
};

}  // namespace

TEST_CASE("gather_paged rejects: layer, kv, n, table, secondary, out tensor, scales; output and pools unchanged") {
  for (CacheDtype dtype : {CacheDtype::fp32, CacheDtype::fp8_e4m3, CacheDtype::nvfp4}) {
    CAPTURE(dtype_name(dtype));
    RejectFixture f(dtype);
    const int64_t H = f.g.kv_heads, D = f.g.head_dim;
    const int64_t n = 9;
    std::vector<float> out_host(static_cast<size_t>(n * H * D));
    std::memset(out_host.data(), kPoison, out_host.size() * 4);
    BackendBuffer out(f.be, out_host.size() * 4);
    out.upload(out_host.data(), out_host.size() * 4);
    const std::vector<int32_t> good_table = {1, 3};
    auto base = [&] {
      GatherPagedOp op;
      op.layer = 1;
      op.kv = 1;
      op.block_ids = good_table;
      op.num_tokens = n;
      op.out = contiguous_view(out.get(), CacheDtype::fp32, {n, H, D});
      return op;
    };
    auto gather_rejects = [&](ErrorCode code, const std::string& needle, GatherPagedOp op) {
      f.expect(code, needle, [&] { f.be.gather_paged(f.pools(), op); });
      std::vector<float> after(out_host.size());
      out.download(after.data(), after.size() * 4);
      CHECK(std::memcmp(after.data(), out_host.data(), after.size() * 4) == 0);
    };
    GatherPagedOp op = base();
    op.layer = 2;
    gather_rejects(ErrorCode::bad_argument, "layer = 2", op);
    op = base();
    op.layer = -1;
    gather_rejects(ErrorCode::bad_argument, "layer = -1", op);
    op = base();
    op.kv = 2;
    gather_rejects(ErrorCode::bad_argument, "kv = 2", op);
    op = base();
    op.num_tokens = -1;
    gather_rejects(ErrorCode::bad_argument, "num_tokens = -1", op);
    // 15 tokens need 3 pages of 7; the table has 2.
    op = base();
    op.num_tokens = 15;
    op.out = contiguous_view(out.get(), CacheDtype::fp32, {15, H, D});
    gather_rejects(ErrorCode::position_beyond_sequence, "num_tokens = 15", op);
    const std::vector<int32_t> with_secondary = {1, BlockRef::secondary(1).raw};
    op = base();
    op.block_ids = with_secondary;
    gather_rejects(ErrorCode::secondary_not_onboarded, "block_ids[1]", op);
    const std::vector<int32_t> secondary_out_of_range = {BlockRef::secondary(2).raw, 1};
    op = base();
    op.block_ids = secondary_out_of_range;
    gather_rejects(ErrorCode::block_out_of_range, "block_ids[0]", op);
    const std::vector<int32_t> primary_out_of_range = {1, 4};
    op = base();
    op.block_ids = primary_out_of_range;
    gather_rejects(ErrorCode::block_out_of_range, "block_ids[1]", op);
    const std::vector<int32_t> negative = {-7, 1};
    op = base();
    op.block_ids = negative;
    gather_rejects(ErrorCode::block_out_of_range, "block_ids[0]", op);
    // Out tensor: dtype, rank, each extent, strides, null data, overlap with the pool.
    op = base();
    op.out.dtype = CacheDtype::bf16;
    gather_rejects(ErrorCode::shape_mismatch, "out must be fp32", op);
    op = base();
    op.out.rank = 2;
    gather_rejects(ErrorCode::shape_mismatch, "rank 2", op);
    for (int i = 0; i < 3; ++i) {
      op = base();
      op.out.shape[i] += 1;
      gather_rejects(ErrorCode::shape_mismatch, "out must be fp32", op);
    }
    op = base();
    op.out.stride[0] = D;  // rows overlap heads
    gather_rejects(ErrorCode::shape_mismatch, "overlap", op);
    op = base();
    op.out.stride[2] = -1;
    gather_rejects(ErrorCode::shape_mismatch, "non-negative", op);
    op = base();
    op.out.data = nullptr;
    gather_rejects(ErrorCode::bad_argument, "null", op);
    op = base();
    op.out.data = f.pools().data[0];
    gather_rejects(ErrorCode::bad_argument, "overlaps the primary pool", op);
    if (dtype == CacheDtype::nvfp4) {
      for (float gs : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
        op = base();
        op.global_scale = gs;
        gather_rejects(ErrorCode::bad_global_scale, "global_scale", op);
      }
    }
    if (dtype == CacheDtype::fp8_e4m3) {
      for (float s : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
        op = base();
        op.scale = s;
        gather_rejects(ErrorCode::bad_argument, "scale", op);
      }
    }
    // Unallocated pool and overlapping caller strides.
    {
      KvPools broken = f.pools();
      broken.data[0] = nullptr;
      op = base();
      f.expect(ErrorCode::bad_argument, "not allocated", [&] { f.be.gather_paged(broken, op); });
      broken = f.pools();
      broken.strides[0].inner[1].token = 1;  // tokens overlap dims
      f.expect(ErrorCode::bad_strides, "overlaps", [&] { f.be.gather_paged(broken, op); });
    }
    // gather_view validates the same request the same way.
    op = base();
    op.block_ids = with_secondary;
    f.expect(ErrorCode::secondary_not_onboarded, "block_ids[1]", [&] { (void)gather_view(f.pools(), op); });
    op = base();
    op.layer = 5;
    f.expect(ErrorCode::bad_argument, "layer = 5", [&] { (void)gather_view(f.pools(), op); });
  }
  // MLA latent pool: only kv 0 exists.
  RejectFixture mla(CacheDtype::bf16, 1);
  const std::vector<int32_t> table = {0};
  GatherPagedOp op;
  op.kv = 1;
  op.block_ids = table;
  op.num_tokens = 0;
  mla.expect(ErrorCode::bad_argument, "kv = 1", [&] { mla.be.gather_paged(mla.pools(), op); });
  op.kv = 0;
  mla.be.gather_paged(mla.pools(), op);  // num_tokens 0 with an empty out: a no-op
  CHECK(mla.dev->download() == mla.img);
}

TEST_CASE("partial_copy rejects: src == dst, BAD_PAGE, secondary, out of range, n > P; pools unchanged") {
  for (CacheDtype dtype : {CacheDtype::bf16, CacheDtype::nvfp4}) {
    CAPTURE(dtype_name(dtype));
    RejectFixture f(dtype);
    auto pc = [&](int32_t src, int32_t dst, int32_t n) {
      return [&f, src, dst, n] { f.be.partial_copy(f.pools(), PartialCopyOp{src, dst, n}); };
    };
    f.expect(ErrorCode::bad_argument, "distinct", pc(2, 2, 3));
    f.expect(ErrorCode::bad_argument, "src_block = -1", pc(-1, 2, 3));
    f.expect(ErrorCode::write_through_bad_page, "dst_block = -1", pc(2, -1, 3));
    f.expect(ErrorCode::secondary_not_onboarded, "src_block", pc(BlockRef::secondary(0).raw, 2, 3));
    f.expect(ErrorCode::secondary_not_onboarded, "dst_block", pc(2, BlockRef::secondary(1).raw, 3));
    f.expect(ErrorCode::block_out_of_range, "src_block", pc(4, 2, 3));
    f.expect(ErrorCode::block_out_of_range, "dst_block", pc(2, 9, 3));
    f.expect(ErrorCode::block_out_of_range, "dst_block", pc(2, -3, 3));
    f.expect(ErrorCode::bad_argument, "num_tokens = 8", pc(1, 2, 8));
  }
}

TEST_CASE("copy_blocks rejects: repeated destination, destination that is a source, bad refs; pools unchanged") {
  RejectFixture f(CacheDtype::fp8_e5m2);
  auto cb = [&](std::vector<std::pair<int32_t, int32_t>> pairs) {
    return [&f, pairs] { f.be.copy_blocks(f.pools(), CopyBlocksOp{pairs}); };
  };
  f.expect(ErrorCode::bad_argument, "pairs[2].dst = 1", cb({{0, 1}, {3, 2}, {0, 1}}));
  f.expect(ErrorCode::bad_argument, "is also a source", cb({{0, 1}, {1, 2}}));  // chain: order would matter
  f.expect(ErrorCode::bad_argument, "is also a source", cb({{1, 2}, {0, 1}}));
  f.expect(ErrorCode::bad_argument, "is also a source", cb({{3, 3}}));
  f.expect(ErrorCode::bad_argument, "pairs[1].src", cb({{0, 1}, {-1, 2}}));
  f.expect(ErrorCode::write_through_bad_page, "pairs[0].dst", cb({{0, -1}}));
  f.expect(ErrorCode::secondary_not_onboarded, "pairs[0].src", cb({{BlockRef::secondary(0).raw, 1}}));
  f.expect(ErrorCode::block_out_of_range, "pairs[1].dst", cb({{0, 1}, {0, 4}}));
}

TEST_CASE(
    "offload / onboard reject: unequal lists, ids out of range, secondary BlockRefs, duplicates; pools unchanged") {
  for (CacheDtype dtype : {CacheDtype::int8, CacheDtype::nvfp4}) {
    CAPTURE(dtype_name(dtype));
    RejectFixture f(dtype);
    for (bool to_secondary : {true, false}) {
      CAPTURE(to_secondary);
      auto mv = [&f, to_secondary](std::vector<int32_t> prim, std::vector<int32_t> sec) {
        return [&f, to_secondary, prim, sec] {
          const MoveBlocksOp op{prim, sec};
          if (to_secondary)
            f.be.offload(f.pools(), op);
          else
            f.be.onboard(f.pools(), op);
        };
      };
      f.expect(ErrorCode::shape_mismatch, "primary has 2 blocks but secondary has 1", mv({0, 1}, {0}));
      f.expect(ErrorCode::block_out_of_range, "primary[1] = 4", mv({0, 4}, {0, 1}));
      f.expect(ErrorCode::block_out_of_range, "primary[0] = -1", mv({-1}, {0}));
      f.expect(ErrorCode::block_out_of_range, "secondary[0] = 2", mv({0}, {2}));
      f.expect(ErrorCode::block_out_of_range, "secondary[0]", mv({0}, {BlockRef::secondary(1).raw}));
      f.expect(ErrorCode::bad_argument, "primary[1] = 3 appears twice", mv({3, 3}, {0, 1}));
      f.expect(ErrorCode::bad_argument, "secondary[1] = 1 appears twice", mv({2, 3}, {1, 1}));
    }
    // A geometry without a secondary pool accepts no move but the empty one.
    PoolGeometry g = f.g;
    g.secondary_blocks = 0;
    DevicePools no_secondary(f.be, g);
    bool rejected = false;
    try {
      f.be.offload(no_secondary.pools(), MoveBlocksOp{std::vector<int32_t>{0}, std::vector<int32_t>{0}});
    } catch (const ValidationError& e) {
      rejected = e.code() == ErrorCode::block_out_of_range;
    }
    CHECK(rejected);
    f.be.offload(no_secondary.pools(), MoveBlocksOp{});
  }
}

TEST_CASE("every op rejects a corrupted geometry before touching memory") {
  RejectFixture f(CacheDtype::fp16);
  KvPools broken = f.pools();
  broken.geometry.kv_heads = 0;
  const std::vector<int32_t> table = {0};
  const std::vector<std::pair<int32_t, int32_t>> pairs = {{0, 1}};
  const std::vector<int32_t> prim = {0}, sec = {0};
  GatherPagedOp gather;
  gather.block_ids = table;
  f.expect(ErrorCode::bad_geometry, "kv_heads = 0", [&] { f.be.gather_paged(broken, gather); });
  f.expect(ErrorCode::bad_geometry, "kv_heads = 0", [&] { f.be.partial_copy(broken, PartialCopyOp{0, 1, 0}); });
  f.expect(ErrorCode::bad_geometry, "kv_heads = 0", [&] { f.be.copy_blocks(broken, CopyBlocksOp{pairs}); });
  f.expect(ErrorCode::bad_geometry, "kv_heads = 0", [&] { f.be.offload(broken, MoveBlocksOp{prim, sec}); });
  f.expect(ErrorCode::bad_geometry, "kv_heads = 0", [&] { f.be.onboard(broken, MoveBlocksOp{prim, sec}); });
}
