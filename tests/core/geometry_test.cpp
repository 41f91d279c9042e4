// Property tests of core's geometry (contract §2, §9): THE element_offset function
// is checked against offsets written out independently here, over every
// coordinate of every pool of a sweep of layouts, placements, dtypes, odd page
// sizes and head counts; the offsets must form a bijection onto the pool and
// blocks must never overlap. Then: writing through one layout and reading
// through another, PageDivider's fast path, nibble/byte and scale offsets,
// stride validation, and 64-bit offsets.
#include <doctest/doctest.h>
#include <tbb/parallel_for.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "kvsim/core/geometry.hpp"

#include "../support/validation.hpp"

using namespace kvsim;
using kvsim::test::catch_validation;

namespace {

// ---------------------------------------------------------------- independent reference
// What the contract says, written without looking at core's stride tables.

// vLLM's x: how many elements make 16 bytes.
int32_t reference_split_x(CacheDtype t) {
  switch (t) {
    case CacheDtype::fp32: return 4;
    case CacheDtype::fp16:
    case CacheDtype::bf16: return 8;
    case CacheDtype::fp8_e4m3:
    case CacheDtype::fp8_e5m2:
    case CacheDtype::int8: return 16;
    case CacheDtype::nvfp4: return 32;  // 16 bytes hold 32 nibbles; split-x rejects nvfp4 anyway
  }
  return 0;
}

// Offset inside one (block, layer, kv) sub-block of H*P*D elements.
int64_t reference_inner_offset(const PoolGeometry& g, int32_t kv, int32_t head, int32_t token, int32_t dim) {
  const int64_t H = g.kv_heads, P = g.tokens_per_block, D = g.head_dim;
  switch (g.layout) {
    case BlockLayout::nhd: return (token * H + head) * D + dim;  // [token][head][dim]
    case BlockLayout::hnd: return (head * P + token) * D + dim;  // [head][token][dim]
    case BlockLayout::split_x: {
      if (kv == 1) return (head * D + dim) * P + token;  // V: [head][dim][token]
      const int64_t x = reference_split_x(g.dtype);
      return ((head * (D / x) + dim / x) * P + token) * x + dim % x;  // K: [head][dim/x][token][x]
    }
  }
  return -1;
}

int64_t reference_offset(const PoolGeometry& g, PoolKind kind, int64_t block, int32_t layer, int32_t kv,
                         int32_t head, int32_t token, int32_t dim) {
  const int64_t sub = static_cast<int64_t>(g.kv_heads) * g.tokens_per_block * g.head_dim;
  const int64_t inner = reference_inner_offset(g, kv, head, token, dim);
  if (g.placement == LayerPlacement::in_block)  // [block][layer][kv][inner]
    return ((block * g.layers + layer) * g.kv_factor + kv) * sub + inner;
  return ((layer * g.blocks(kind) + block) * g.kv_factor + kv) * sub + inner;  // [layer][block][kv][inner]
}

// Which geometries the contract supports (contract §2), and which codes a rejection may carry.
bool expected_supported(const PoolGeometry& g) {
  const bool nvfp4 = g.dtype == CacheDtype::nvfp4;
  if (nvfp4 && g.head_dim % 16 != 0) return false;
  if (g.layout == BlockLayout::split_x && nvfp4) return false;
  if (g.layout == BlockLayout::split_x && g.head_dim % reference_split_x(g.dtype) != 0) return false;
  return true;
}
bool rejection_code_fits(const PoolGeometry& g, ErrorCode c) {
  const bool nvfp4 = g.dtype == CacheDtype::nvfp4;
  if (nvfp4 && g.head_dim % 16 != 0 && c == ErrorCode::unsupported_head_dim) return true;
  if (g.layout == BlockLayout::split_x && nvfp4 && c == ErrorCode::bad_geometry) return true;
  if (g.layout == BlockLayout::split_x && !nvfp4 && g.head_dim % reference_split_x(g.dtype) != 0 &&
      c == ErrorCode::unsupported_head_dim)
    return true;
  return false;
}

std::string describe(const PoolGeometry& g, PoolKind kind) {
  return geometry_summary(g) + " B=" + std::to_string(g.primary_blocks) + "/" + std::to_string(g.secondary_blocks) +
         (kind == PoolKind::primary ? " primary" : " secondary");
}

template <class F>
void for_each_coordinate(const PoolGeometry& g, PoolKind kind, F&& f) {
  for (int64_t b = 0; b < g.blocks(kind); ++b)
    for (int32_t l = 0; l < g.layers; ++l)
      for (int32_t kv = 0; kv < g.kv_factor; ++kv)
        for (int32_t h = 0; h < g.kv_heads; ++h)
          for (int32_t t = 0; t < g.tokens_per_block; ++t)
            for (int32_t d = 0; d < g.head_dim; ++d) f(b, l, kv, h, t, d);
}

// Checks one pool: offsets match the reference, land in [0, pool_elements),
// hit every element exactly once, and stay inside their block's region.
// Returns "" or the first failure (collected per geometry, asserted serially:
// the sweep runs on oneTBB threads).
std::string check_pool_offsets(const PoolGeometry& g, PoolKind kind) {
  const PoolStrides s = contiguous_strides(g, kind);
  const int64_t n = g.pool_elements(kind);
  const int64_t expected_n = g.blocks(kind) * g.layers * g.kv_factor * g.kv_heads * g.tokens_per_block * g.head_dim;
  if (n != expected_n) return "pool_elements " + std::to_string(n) + " != " + std::to_string(expected_n);
  try {
    validate_strides(g, s, kind, n);
  } catch (const ValidationError& e) {
    return std::string("contiguous strides rejected: ") + e.what();
  }
  const int64_t sub = static_cast<int64_t>(g.kv_heads) * g.tokens_per_block * g.head_dim;
  std::vector<uint8_t> hits(static_cast<size_t>(n), 0);
  std::string failure;
  for_each_coordinate(g, kind, [&](int64_t b, int32_t l, int32_t kv, int32_t h, int32_t t, int32_t d) {
    if (!failure.empty()) return;
    const int64_t off = element_offset(s, b, l, kv, h, t, d);
    auto where = [&] {  // built only on failure: the sweep visits ~10^9 coordinates
      return "(b" + std::to_string(b) + " l" + std::to_string(l) + " kv" + std::to_string(kv) + " h" +
             std::to_string(h) + " t" + std::to_string(t) + " d" + std::to_string(d) + ")";
    };
    const int64_t ref = reference_offset(g, kind, b, l, kv, h, t, d);
    if (off != ref) {
      failure = where() + " offset " + std::to_string(off) + " != reference " + std::to_string(ref);
      return;
    }
    if (off < 0 || off >= n) {
      failure = where() + " offset " + std::to_string(off) + " outside [0, " + std::to_string(n) + ")";
      return;
    }
    if (++hits[static_cast<size_t>(off)] != 1) {
      failure = where() + " offset " + std::to_string(off) + " hit twice";
      return;
    }
    // Block regions: in_block gives block b one contiguous range of every
    // layer; per_layer gives (layer, block) one contiguous range of F*H*P*D.
    int64_t lo, len;
    if (g.placement == LayerPlacement::in_block) {
      len = g.block_elements();
      lo = b * len;
    } else {
      len = g.kv_factor * sub;
      lo = (l * g.blocks(kind) + b) * len;
    }
    if (off < lo || off >= lo + len)
      failure = where() + " offset " + std::to_string(off) + " outside its block region [" + std::to_string(lo) + ", " +
                std::to_string(lo + len) + ")";
  });
  if (!failure.empty()) return failure;
  for (int64_t i = 0; i < n; ++i)
    if (hits[static_cast<size_t>(i)] != 1) return "element " + std::to_string(i) + " never addressed";
  return {};
}

// ---------------------------------------------------------------- element storage
// A pool is raw bytes; an element is `bits` wide, nvfp4 two per byte with
// element 2i in the low nibble (contract §4), multi-byte elements little-endian.
void store_element(std::vector<uint8_t>& pool, CacheDtype t, int64_t offset, uint32_t code) {
  const int64_t byte = element_byte_offset(offset, t);
  const int bits = bits_per_element(t);
  if (bits == 4) {
    uint8_t& cell = pool.at(static_cast<size_t>(byte));
    cell = (offset & 1) ? static_cast<uint8_t>((cell & 0x0F) | (code << 4)) : static_cast<uint8_t>((cell & 0xF0) | code);
    return;
  }
  for (int k = 0; k < bits / 8; ++k) pool.at(static_cast<size_t>(byte + k)) = static_cast<uint8_t>(code >> (8 * k));
}
uint32_t load_element(const std::vector<uint8_t>& pool, CacheDtype t, int64_t offset) {
  const int64_t byte = element_byte_offset(offset, t);
  const int bits = bits_per_element(t);
  if (bits == 4) {
    const uint8_t cell = pool.at(static_cast<size_t>(byte));
    return (offset & 1) ? (cell >> 4) : (cell & 0x0F);
  }
  uint32_t v = 0;
  for (int k = 0; k < bits / 8; ++k) v |= static_cast<uint32_t>(pool.at(static_cast<size_t>(byte + k))) << (8 * k);
  return v;
}

// The logical tensor: a value per coordinate, truncated to the element width.
uint32_t logical_value(int64_t b, int32_t l, int32_t kv, int32_t h, int32_t t, int32_t d, int bits) {
  uint64_t x = static_cast<uint64_t>(b) * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(l) << 48) ^
               (static_cast<uint64_t>(kv) << 40) ^ (static_cast<uint64_t>(h) << 28) ^
               (static_cast<uint64_t>(t) << 14) ^ static_cast<uint64_t>(d);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  const uint64_t mask = bits == 32 ? 0xFFFFFFFFull : ((1ull << bits) - 1);
  return static_cast<uint32_t>(x & mask);
}

}  // namespace

// ---------------------------------------------------------------- the sweep

TEST_CASE("element_offset is a bijection onto the pool and blocks never overlap, over every coordinate") {
  const BlockLayout layouts[] = {BlockLayout::nhd, BlockLayout::hnd, BlockLayout::split_x};
  const LayerPlacement placements[] = {LayerPlacement::in_block, LayerPlacement::per_layer};
  const int32_t page_sizes[] = {1, 3, 7, 16, 17};
  const int32_t head_counts[] = {1, 3, 5};
  // 8: split-x needs x | D, rejects 8-bit (x = 16); 12: also rejects 16-bit (x = 8);
  // 16, 48: multiples of 16 (48 = 3 scale groups, not a power of two), so nvfp4
  // and every split-x x are exercised.
  const int32_t head_dims[] = {8, 12, 16, 48};
  const int64_t block_counts[] = {1, 2, 5};

  std::vector<PoolGeometry> geometries;
  size_t rejected = 0;
  std::vector<std::string> rejection_failures;
  for (BlockLayout layout : layouts)
    for (LayerPlacement placement : placements)
      for (CacheDtype dtype : kAllCacheDtypes)
        for (int32_t P : page_sizes)
          for (int32_t H : head_counts)
            for (int32_t D : head_dims)
              for (int32_t L = 1; L <= 3; ++L)
                for (int32_t F = 1; F <= 2; ++F)
                  for (int64_t B : block_counts) {
                    PoolGeometry g{.layers = L, .kv_factor = F, .kv_heads = H, .tokens_per_block = P, .head_dim = D,
                                   .dtype = dtype, .layout = layout, .placement = placement, .primary_blocks = B};
                    g.secondary_blocks = B % 5 + 2;  // 1->3, 2->4, 5->2: never equal to primary
                    const auto err = catch_validation([&] { validate_geometry(g); });
                    if (expected_supported(g)) {
                      if (err) rejection_failures.push_back(describe(g, PoolKind::primary) + " rejected: " + err->what());
                      else geometries.push_back(g);
                    } else {
                      ++rejected;
                      if (!err) rejection_failures.push_back(describe(g, PoolKind::primary) + " accepted but unsupported");
                      else if (!rejection_code_fits(g, err->code()))
                        rejection_failures.push_back(describe(g, PoolKind::primary) + " rejected with " + err->what());
                    }
                  }
  CHECK(rejection_failures.empty());
  for (size_t i = 0; i < rejection_failures.size() && i < 10; ++i) MESSAGE(rejection_failures[i]);
  // Sanity of the sweep itself: both outcomes occur in quantity.
  CHECK(rejected > 1000);
  CHECK(geometries.size() > 10000);

  std::vector<std::string> failures(geometries.size() * 2);
  tbb::parallel_for(size_t{0}, geometries.size() * 2, [&](size_t i) {
    const PoolGeometry& g = geometries[i / 2];
    const PoolKind kind = (i % 2) ? PoolKind::secondary : PoolKind::primary;
    const std::string f = check_pool_offsets(g, kind);
    if (!f.empty()) failures[i] = describe(g, kind) + ": " + f;
  });
  size_t failed = 0;
  for (const std::string& f : failures)
    if (!f.empty() && ++failed <= 10) MESSAGE(f);
  CHECK(failed == 0);
}

TEST_CASE("per_layer layer stride depends on the pool kind's block count") {
  PoolGeometry g{.layers = 3, .kv_heads = 2, .tokens_per_block = 5, .head_dim = 16,
                 .placement = LayerPlacement::per_layer, .primary_blocks = 4, .secondary_blocks = 7};
  const int64_t slab = 2 * 2 * 5 * 16;  // one block of one layer: F*H*P*D
  CHECK(contiguous_strides(g, PoolKind::primary).layer == 4 * slab);
  CHECK(contiguous_strides(g, PoolKind::secondary).layer == 7 * slab);
  CHECK(contiguous_strides(g, PoolKind::primary).block == slab);
}

TEST_CASE("an empty secondary pool (secondary_blocks = 0) has valid contiguous strides in either placement") {
  // validate_geometry accepts secondary_blocks = 0 (no offload), so the
  // contiguous strides of that empty pool must pass validate_strides too. In
  // per_layer the layer stride is blocks * slab = 0, which must not count as an
  // overlap: an empty pool has no two elements to overlap.
  PoolGeometry g{.layers = 3, .kv_heads = 2, .tokens_per_block = 5, .head_dim = 16, .primary_blocks = 4,
                 .secondary_blocks = 0};
  REQUIRE_NOTHROW(validate_geometry(g));
  g.placement = LayerPlacement::in_block;
  CHECK_NOTHROW(validate_strides(g, contiguous_strides(g, PoolKind::secondary), PoolKind::secondary, 0));
  g.placement = LayerPlacement::per_layer;
  CHECK(g.pool_elements(PoolKind::secondary) == 0);
  CHECK(g.pool_bytes(PoolKind::secondary) == 0);
  CHECK_NOTHROW(validate_strides(g, contiguous_strides(g, PoolKind::secondary), PoolKind::secondary, 0));
}

// ---------------------------------------------------------------- write through one, read through another

TEST_CASE("a logical tensor written through NHD reads back identically through HND and split-x (contract §9)") {
  const int32_t page_sizes[] = {3, 16, 17};
  const int32_t head_dims[] = {16, 48};
  const LayerPlacement placements[] = {LayerPlacement::in_block, LayerPlacement::per_layer};
  const PoolKind kinds[] = {PoolKind::primary, PoolKind::secondary};
  int pairs_checked = 0;
  for (CacheDtype dtype : kAllCacheDtypes)
    for (int32_t P : page_sizes)
      for (int32_t D : head_dims)
        for (LayerPlacement src_placement : placements)
          for (PoolKind kind : kinds) {
            PoolGeometry src{.layers = 2, .kv_factor = 2, .kv_heads = 3, .tokens_per_block = P, .head_dim = D,
                             .dtype = dtype, .layout = BlockLayout::nhd, .placement = src_placement,
                             .primary_blocks = 3, .secondary_blocks = 2};
            REQUIRE_NOTHROW(validate_geometry(src));
            const int bits = bits_per_element(dtype);
            const PoolStrides src_strides = contiguous_strides(src, kind);

            std::vector<uint8_t> nhd_pool(static_cast<size_t>(src.pool_bytes(kind)), 0);
            for_each_coordinate(src, kind, [&](int64_t b, int32_t l, int32_t kv, int32_t h, int32_t t, int32_t d) {
              store_element(nhd_pool, dtype, element_offset(src_strides, b, l, kv, h, t, d),
                            logical_value(b, l, kv, h, t, d, bits));
            });

            for (BlockLayout dst_layout : {BlockLayout::hnd, BlockLayout::split_x})
              for (LayerPlacement dst_placement : placements) {
                PoolGeometry dst = src;
                dst.layout = dst_layout;
                dst.placement = dst_placement;
                if (!expected_supported(dst)) continue;  // split-x with nvfp4
                CAPTURE(describe(dst, kind));
                const PoolStrides dst_strides = contiguous_strides(dst, kind);
                REQUIRE(dst.pool_bytes(kind) == src.pool_bytes(kind));

                // Copy by logical coordinate: read through NHD, write through dst.
                std::vector<uint8_t> dst_pool(nhd_pool.size(), 0);
                for_each_coordinate(src, kind, [&](int64_t b, int32_t l, int32_t kv, int32_t h, int32_t t, int32_t d) {
                  store_element(dst_pool, dtype, element_offset(dst_strides, b, l, kv, h, t, d),
                                load_element(nhd_pool, dtype, element_offset(src_strides, b, l, kv, h, t, d)));
                });
                // Read through dst: the same logical element at the offset dst names.
                int64_t wrong = 0;
                for_each_coordinate(src, kind, [&](int64_t b, int32_t l, int32_t kv, int32_t h, int32_t t, int32_t d) {
                  if (load_element(dst_pool, dtype, element_offset(dst_strides, b, l, kv, h, t, d)) !=
                      logical_value(b, l, kv, h, t, d, bits))
                    ++wrong;
                });
                CHECK(wrong == 0);
                // The bytes really moved (H, P > 1): a layout change is not a no-op.
                if (dst_placement == src_placement) CHECK(dst_pool != nhd_pool);
                // And back: dst -> NHD reproduces the original pool byte for byte.
                std::vector<uint8_t> round_trip(nhd_pool.size(), 0);
                for_each_coordinate(src, kind, [&](int64_t b, int32_t l, int32_t kv, int32_t h, int32_t t, int32_t d) {
                  store_element(round_trip, dtype, element_offset(src_strides, b, l, kv, h, t, d),
                                load_element(dst_pool, dtype, element_offset(dst_strides, b, l, kv, h, t, d)));
                });
                CHECK(round_trip == nhd_pool);
                ++pairs_checked;
              }
          }
  // 6 non-nvfp4 dtypes x 4 targets + nvfp4 x 2 (HND only), per (P, D, placement, kind).
  CHECK(pairs_checked == 3 * 2 * 2 * 2 * (6 * 4 + 2));
}

// ---------------------------------------------------------------- PageDivider

TEST_CASE("PageDivider: the power-of-two fast path gives the same div/mod as plain division for P in 1..1024") {
  std::vector<int64_t> xs;
  for (int64_t x = 0; x <= 4200; ++x) xs.push_back(x);
  for (int64_t base : {int64_t{1} << 31, int64_t{1} << 32, int64_t{1} << 40, int64_t{1} << 62})
    for (int64_t k = -3; k <= 3; ++k) xs.push_back(base + k);
  xs.push_back(std::numeric_limits<int64_t>::max());

  int64_t mismatches = 0;
  int pow2_count = 0;
  for (int32_t p = 1; p <= kMaxTokensPerBlock; ++p) {
    const PageDivider fast = PageDivider::make(p);
    const bool is_pow2 = (p & (p - 1)) == 0;
    CHECK(fast.page_size == p);
    CHECK(fast.pow2 == is_pow2);
    if (is_pow2) {
      ++pow2_count;
      CHECK((int64_t{1} << fast.shift) == p);
    }
    PageDivider slow = fast;  // same P forced through plain division
    slow.pow2 = false;
    for (int64_t x : xs) {
      if (fast.div(x) != x / p || fast.mod(x) != static_cast<int32_t>(x % p)) ++mismatches;
      if (slow.div(x) != fast.div(x) || slow.mod(x) != fast.mod(x)) ++mismatches;
    }
  }
  CHECK(pow2_count == 11);  // 1, 2, 4, ..., 1024
  CHECK(mismatches == 0);
}

// ---------------------------------------------------------------- bytes, nibbles, scales

TEST_CASE("element_byte_offset: nibbles for nvfp4, whole elements otherwise, 64-bit") {
  for (int64_t off : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{3}, int64_t{77}, (int64_t{1} << 40) + 3}) {
    CAPTURE(off);
    CHECK(element_byte_offset(off, CacheDtype::nvfp4) == off / 2);  // element 2i and 2i+1 share byte i
    CHECK(element_byte_offset(off, CacheDtype::fp8_e4m3) == off);
    CHECK(element_byte_offset(off, CacheDtype::fp8_e5m2) == off);
    CHECK(element_byte_offset(off, CacheDtype::int8) == off);
    CHECK(element_byte_offset(off, CacheDtype::bf16) == off * 2);
    CHECK(element_byte_offset(off, CacheDtype::fp16) == off * 2);
    CHECK(element_byte_offset(off, CacheDtype::fp32) == off * 4);
  }
  // Bytes of a pool round up for an odd nibble count.
  PoolGeometry g;
  g.dtype = CacheDtype::nvfp4;
  CHECK(g.bytes_for(1) == 1);
  CHECK(g.bytes_for(2) == 1);
  CHECK(g.bytes_for(33) == 17);
}

TEST_CASE("nvfp4 scale pool: head_dim / 16 one-byte scales, each covering 16 consecutive dims") {
  for (BlockLayout layout : {BlockLayout::nhd, BlockLayout::hnd})
    for (LayerPlacement placement : {LayerPlacement::in_block, LayerPlacement::per_layer})
      for (PoolKind kind : {PoolKind::primary, PoolKind::secondary}) {
        PoolGeometry g{.layers = 2, .kv_factor = 2, .kv_heads = 3, .tokens_per_block = 7, .head_dim = 48,
                       .dtype = CacheDtype::nvfp4, .layout = layout, .placement = placement, .primary_blocks = 2,
                       .secondary_blocks = 3};
        CAPTURE(describe(g, kind));
        REQUIRE_NOTHROW(validate_geometry(g));
        REQUIRE(g.has_scale_pool());
        const PoolGeometry sg = g.scale_geometry();
        CHECK(sg.head_dim == 3);
        CHECK(bits_per_element(sg.dtype) == 8);
        CHECK(sg.pool_elements(kind) * 16 == g.pool_elements(kind));
        CHECK(sg.pool_bytes(kind) == g.pool_elements(kind) / 16);  // one byte per 16 elements

        const PoolStrides ss = contiguous_strides(sg, kind);
        std::vector<int> hits(static_cast<size_t>(sg.pool_elements(kind)), 0);
        int64_t wrong = 0;
        for_each_coordinate(g, kind, [&](int64_t b, int32_t l, int32_t kv, int32_t h, int32_t t, int32_t d) {
          const int64_t off = scale_offset(ss, b, l, kv, h, t, d);
          // Same layout and placement as the data pool, with D/16 "dims".
          if (off != reference_offset(sg, kind, b, l, kv, h, t, d / 16)) ++wrong;
          if (off < 0 || off >= static_cast<int64_t>(hits.size())) ++wrong;
          else ++hits[static_cast<size_t>(off)];
        });
        CHECK(wrong == 0);
        int64_t not_sixteen = 0;
        for (int h : hits) not_sixteen += (h != 16);
        CHECK(not_sixteen == 0);
      }
}

// ---------------------------------------------------------------- validate_strides

namespace {
PoolGeometry small_fp16(BlockLayout layout) {
  PoolGeometry g{.layers = 2, .kv_factor = 2, .kv_heads = 3, .tokens_per_block = 7, .head_dim = 16,
                 .dtype = CacheDtype::fp16, .layout = layout, .primary_blocks = 5, .secondary_blocks = 2};
  return g;
}
void check_bad_strides(const PoolGeometry& g, const PoolStrides& s, int64_t pool_elements, const std::string& mention) {
  const auto err = catch_validation([&] { validate_strides(g, s, PoolKind::primary, pool_elements); });
  REQUIRE(err.has_value());
  CHECK(err->code() == ErrorCode::bad_strides);
  CHECK(err->name() == "bad_strides");
  INFO("message: ", err->what());
  CHECK(std::string(err->what()).find(mention) != std::string::npos);
}
}  // namespace

TEST_CASE("validate_strides accepts contiguous strides and padded ones that stay inside the pool") {
  for (BlockLayout layout : {BlockLayout::nhd, BlockLayout::hnd, BlockLayout::split_x}) {
    const PoolGeometry g = small_fp16(layout);
    CHECK_NOTHROW(validate_strides(g, contiguous_strides(g), PoolKind::primary, g.pool_elements(PoolKind::primary)));
  }
  // NHD rows padded to 20 elements per head, blocks padded to a round number:
  // non-contiguous but injective and inside a pool sized for it.
  PoolGeometry g = small_fp16(BlockLayout::nhd);
  PoolStrides s{};
  for (int kv = 0; kv < 2; ++kv) s.inner[kv] = InnerStrides{20, 3 * 20, 16, 1, 16};
  s.kv = 7 * 3 * 20;                 // 420
  s.layer = 2 * s.kv;                // 840
  s.block = 2 * s.layer + 100;       // 1780: a gap between blocks
  const int64_t pool = 5 * s.block;  // 8900
  CHECK_NOTHROW(validate_strides(g, s, PoolKind::primary, pool));
  std::vector<uint8_t> hits(static_cast<size_t>(pool), 0);
  int64_t collisions = 0;
  for_each_coordinate(g, PoolKind::primary, [&](int64_t b, int32_t l, int32_t kv, int32_t h, int32_t t, int32_t d) {
    collisions += hits.at(static_cast<size_t>(element_offset(s, b, l, kv, h, t, d)))++ != 0;
  });
  CHECK(collisions == 0);
}

TEST_CASE("validate_strides rejects overlapping strides with bad_strides") {
  const PoolGeometry g = small_fp16(BlockLayout::nhd);
  const int64_t pool = g.pool_elements(PoolKind::primary);
  // (what, the change to contiguous strides, what the message must mention)
  const std::tuple<const char*, std::function<void(PoolStrides&)>, const char*> cases[] = {
      {"head stride smaller than the span of a head's dims (head h+1 starts inside head h's row)",
       [&](PoolStrides& s) { s.inner[0].head = g.head_dim - 1; }, "stride of head"},
      {"V alone overlapping (K fine)", [](PoolStrides& s) { s.inner[1].head = 8; }, "stride of head"},
      {"token stride equal to head stride", [](PoolStrides& s) { s.inner[0].token = s.inner[0].head; }, "overlaps"},
      {"a zero stride over an extent > 1", [](PoolStrides& s) { s.layer = 0; }, "stride of layer = 0"},
      {"a negative stride", [](PoolStrides& s) { s.block = -s.block; }, "negative"},
      {"x that does not divide head_dim", [](PoolStrides& s) { s.inner[0].x = 5; }, "x = 5"},
  };
  for (const auto& c : cases) {
    INFO(std::get<0>(c));
    PoolStrides s = contiguous_strides(g);
    std::get<1>(c)(s);
    check_bad_strides(g, s, pool, std::get<2>(c));
  }
}

TEST_CASE("validate_strides rejects strides that leave the pool with bad_strides") {
  const PoolGeometry g = small_fp16(BlockLayout::hnd);
  const int64_t pool = g.pool_elements(PoolKind::primary);
  const PoolStrides s = contiguous_strides(g);
  CHECK_NOTHROW(validate_strides(g, s, PoolKind::primary, pool));
  // One element short: the last element lies beyond the pool.
  check_bad_strides(g, s, pool - 1, "beyond the pool");
  PoolStrides wide = s;
  wide.block += 1;  // still injective, but the last block ends 4 elements past the pool
  check_bad_strides(g, wide, pool, "largest offset " + std::to_string(pool - 1 + 4));
}

TEST_CASE("FlashInfer's [pages, 2, H, P, D] tensor: one pool with a kv stride, or unbound into K and V views") {
  PoolGeometry g;
  g.layers = 1;  // FlashInfer: one tensor per layer
  g.kv_factor = 2;
  g.kv_heads = 3;
  g.tokens_per_block = 7;
  g.head_dim = 16;
  g.dtype = CacheDtype::bf16;
  g.layout = BlockLayout::hnd;
  g.primary_blocks = 5;
  const int64_t H = 3, P = 7, D = 16, pages = 5;
  const int64_t total = pages * 2 * H * P * D;
  const int64_t kv_slab = H * P * D;

  // (a) K and V in one pool: kv stride H*P*D, page stride 2*H*P*D.
  PoolStrides one{};
  one.block = 2 * kv_slab;
  one.layer = 2 * kv_slab;  // extent 1: irrelevant
  one.kv = kv_slab;
  one.inner[0] = one.inner[1] = InnerStrides{P * D, D, D, 1, static_cast<int32_t>(D)};
  CHECK_NOTHROW(validate_strides(g, one, PoolKind::primary, total));
  for (int64_t b = 0; b < pages; ++b)
    for (int32_t kv = 0; kv < 2; ++kv) {
      CHECK(element_offset(one, b, 0, kv, 2, 6, 15) == (((b * 2 + kv) * H + 2) * P + 6) * D + 15);
      CHECK(element_offset(one, b, 0, kv, 1, 3, 4) ==
            element_offset(contiguous_strides(g), b, 0, kv, 1, 3, 4));  // it is in_block with L = 1
    }

  // (b) Unbound: K = t[:, 0], V = t[:, 1], each a kv_factor-1 pool with stride_page = 2*H*P*D.
  PoolGeometry view = g;
  view.kv_factor = 1;
  PoolStrides unbound{};
  unbound.block = 2 * kv_slab;
  unbound.layer = unbound.block;
  unbound.kv = 0;
  unbound.inner[0] = InnerStrides{P * D, D, D, 1, static_cast<int32_t>(D)};
  CHECK_NOTHROW(validate_strides(view, unbound, PoolKind::primary, total));            // K view starts at 0
  CHECK_NOTHROW(validate_strides(view, unbound, PoolKind::primary, total - kv_slab));  // V view starts at H*P*D
  // Together the two views cover the tensor exactly once.
  std::vector<uint8_t> hits(static_cast<size_t>(total), 0);
  for (int64_t base : {int64_t{0}, kv_slab})
    for_each_coordinate(view, PoolKind::primary, [&](int64_t b, int32_t l, int32_t kv, int32_t h, int32_t t, int32_t d) {
      ++hits.at(static_cast<size_t>(base + element_offset(unbound, b, l, kv, h, t, d)));
    });
  int64_t not_once = 0;
  for (uint8_t h : hits) not_once += (h != 1);
  CHECK(not_once == 0);
  // A view that claims to be compact (H*P*D per page) while striding 2*H*P*D leaves its pool.
  check_bad_strides(view, unbound, pages * kv_slab, "beyond the pool");
}

// ---------------------------------------------------------------- 64-bit

TEST_CASE("offsets beyond 2^31 are computed in 64 bits") {
  SUBCASE("a Llama-70B-sized in_block pool of 100000 blocks") {
    PoolGeometry g{.layers = 80, .kv_factor = 2, .kv_heads = 8, .tokens_per_block = 64, .head_dim = 128,
                   .dtype = CacheDtype::bf16, .primary_blocks = 100000};
    REQUIRE_NOTHROW(validate_geometry(g));
    // block = 80*2*8*64*128 = 10,485,760 elements; pool = 1,048,576,000,000.
    CHECK(g.block_elements() == 10485760);
    CHECK(g.pool_elements(PoolKind::primary) == 1048576000000LL);
    for (LayerPlacement placement : {LayerPlacement::in_block, LayerPlacement::per_layer}) {
      g.placement = placement;
      const PoolStrides s = contiguous_strides(g);
      CHECK_NOTHROW(validate_strides(g, s, PoolKind::primary, g.pool_elements(PoolKind::primary)));
      // The last coordinate is the last element in either placement.
      CHECK(element_offset(s, 99999, 79, 1, 7, 63, 127) == 1048575999999LL);
      CHECK(element_byte_offset(element_offset(s, 99999, 79, 1, 7, 63, 127), g.dtype) == 2097151999998LL);
    }
    g.placement = LayerPlacement::in_block;
    // (54321, 40, 0, 3, 17, 99): 54321*10485760 + 40*2*65536 + (17*8 + 3)*128 + 99
    //   = 569,596,968,960 + 5,242,880 + 17,792 + 99 = 569,602,229,731
    CHECK(element_offset(contiguous_strides(g), 54321, 40, 0, 3, 17, 99) == 569602229731LL);
    g.placement = LayerPlacement::per_layer;
    // per_layer: (40*100000 + 54321)*2*65536 + (17*8 + 3)*128 + 99
    //   = 4,054,321 * 131,072 + 17,891 = 531,407,962,112 + 17,891 = 531,407,980,003
    CHECK(element_offset(contiguous_strides(g), 54321, 40, 0, 3, 17, 99) == 531407980003LL);
  }
  SUBCASE("a single term (token or head times its stride) past 2^31") {
    PoolGeometry g{.layers = 1, .kv_factor = 1, .kv_heads = 4096, .tokens_per_block = 1024, .head_dim = 1024,
                   .dtype = CacheDtype::fp32, .primary_blocks = 1};
    REQUIRE_NOTHROW(validate_geometry(g));
    g.layout = BlockLayout::nhd;  // token stride H*D = 4,194,304; 1023 of them = 4,290,772,992
    CHECK(element_offset(contiguous_strides(g), 0, 0, 0, 0, 1023, 0) == 4290772992LL);
    CHECK(element_byte_offset(4290772992LL, CacheDtype::fp32) == 17163091968LL);
    g.layout = BlockLayout::hnd;  // head stride P*D = 1,048,576; 4095 of them = 4,293,918,720
    CHECK(element_offset(contiguous_strides(g), 0, 0, 0, 4095, 0, 0) == 4293918720LL);
    g.layout = BlockLayout::split_x;  // K: dim/x stride P*x = 4096; head 4095 + dim 1023 (x = 4)
    // 4095*1,048,576 + (1023/4)*4096 + 3 = 4,293,918,720 + 1,044,480 + 3
    CHECK(element_offset(contiguous_strides(g), 0, 0, 0, 4095, 0, 1023) == 4294963203LL);
  }
}

TEST_CASE("validate_geometry rejects a pool whose size in bits does not fit int64") {
  // bytes_for() and element_byte_offset() multiply an element count by the
  // element's bit width in int64, so an accepted geometry must keep
  // pool_elements * bits below 2^63. 1e18 fp32 elements = 3.2e19 bits.
  PoolGeometry g{.layers = 1, .kv_factor = 1, .kv_heads = 1, .tokens_per_block = 1024, .head_dim = 1024,
                 .dtype = CacheDtype::fp32};
  g.primary_blocks = 953674316406LL;  // * 2^20 elements/block ~= 1.0e18 elements
  const long double bits = static_cast<long double>(g.primary_blocks) * 1024 * 1024 * 32;
  REQUIRE(bits > static_cast<long double>(std::numeric_limits<int64_t>::max()));
  const auto err = catch_validation([&] { validate_geometry(g); });
  REQUIRE(err.has_value());
  CHECK(err->code() == ErrorCode::bad_geometry);
}
