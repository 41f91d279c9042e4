#include "support.hpp"

#include <kvsim/core/splitmix64.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace kvsim::bench {

uint64_t mix(uint64_t x) { return splitmix64_mix(x + kSplitmix64Gamma); }

namespace {
float unit(uint64_t r) { return static_cast<float>(r >> 40) * 0x1p-23f - 1.0f; }  // [-1, 1)
}  // namespace

std::vector<uint8_t> random_floats(CacheDtype t, int64_t n, uint64_t seed) {
  const int bytes = bits_per_element(t) / 8;
  std::vector<uint8_t> out(static_cast<size_t>(n) * bytes);
  for (int64_t i = 0; i < n; ++i) {
    const float v = unit(mix(seed * 0x100000001B3ull + static_cast<uint64_t>(i)));
    if (t == CacheDtype::fp32) {
      std::memcpy(&out[i * 4], &v, 4);
    } else {
      const uint16_t h = t == CacheDtype::bf16 ? codec::f32_to_bf16(v) : codec::f32_to_f16(v);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

std::vector<uint8_t> random_codes(CacheDtype t, int64_t n, uint64_t seed) {
  if (t == CacheDtype::fp32 || t == CacheDtype::fp16 || t == CacheDtype::bf16) return random_floats(t, n, seed);
  const int64_t bytes = (n * bits_per_element(t) + 7) / 8;
  std::vector<uint8_t> out(static_cast<size_t>(bytes));
  for (int64_t i = 0; i < bytes; i += 8) {
    const uint64_t r = mix(seed * 0x100000001B3ull + static_cast<uint64_t>(i));
    for (int64_t j = i; j < std::min(bytes, i + 8); ++j) {
      uint8_t b = static_cast<uint8_t>(r >> (8 * (j - i)));
      if (t == CacheDtype::fp8_e4m3 && (b & 0x7F) == 0x7F) b ^= 0x01;  // no NaN
      if (t == CacheDtype::fp8_e5m2 && (b & 0x7C) == 0x7C) b ^= 0x40;  // no Inf / NaN
      out[j] = b;
    }
  }
  return out;
}

Mirrored::Mirrored(Backend& be, std::vector<uint8_t> bytes) : host(std::move(bytes)), device(be, host.size()) {
  if (!host.empty()) device.upload(host.data(), host.size());
}

int64_t block_byte_offset(const PoolGeometry& g, const PoolStrides& s, int64_t block) {
  return element_byte_offset(element_offset(s, block, 0, 0, 0, 0, 0), g.dtype);
}

PoolPattern make_pool_pattern(const PoolGeometry& g, uint64_t seed, int64_t max_bytes) {
  PoolPattern p;
  p.geometry = g;
  p.data_block_bytes = g.block_bytes();
  if (g.has_scale_pool()) p.scale_block_bytes = g.scale_geometry().block_bytes();
  p.blocks = std::max<int64_t>(1, std::min<int64_t>(max_bytes / p.data_block_bytes, g.primary_blocks));
  p.data = random_codes(g.dtype, p.blocks * g.block_elements(), seed);
  if (g.has_scale_pool()) {
    // e4m3 block scales between 2^-3 and 2^1: decoded values stay moderate.
    p.scales.resize(static_cast<size_t>(p.blocks * p.scale_block_bytes));
    for (size_t i = 0; i < p.scales.size(); ++i)
      p.scales[i] = static_cast<uint8_t>(0x20 + mix(seed ^ (0xABCDull + i)) % 0x20);
  }
  return p;
}

namespace {
// Tiles `pattern` (whole pattern blocks of block_bytes) over `blocks` blocks at `dst`.
void tile(Backend& be, uint8_t* dst, int64_t blocks, const std::vector<uint8_t>& pattern, int64_t block_bytes) {
  if (blocks <= 0 || pattern.empty()) return;
  const int64_t pattern_blocks = static_cast<int64_t>(pattern.size()) / block_bytes;
  const int64_t first = std::min(blocks, pattern_blocks);
  be.to_backend(dst, pattern.data(), static_cast<size_t>(first * block_bytes));
  for (int64_t b = first; b < blocks; b += pattern_blocks) {
    const int64_t n = std::min(pattern_blocks, blocks - b);
    be.copy(dst + b * block_bytes, dst, static_cast<size_t>(n * block_bytes));
  }
  be.synchronize();
}
}  // namespace

void fill_pool(Backend& be, const KvPools& pools, PoolKind kind, const PoolPattern& p) {
  const PoolGeometry& g = pools.geometry;
  const int k = static_cast<int>(kind);
  tile(be, pools.bytes(kind) + block_byte_offset(g, pools.strides[k], 0), g.blocks(kind), p.data, p.data_block_bytes);
  if (g.has_scale_pool())
    tile(be, pools.scale_bytes(kind) + block_byte_offset(g.scale_geometry(), pools.scale_strides[k], 0),
         g.blocks(kind), p.scales, p.scale_block_bytes);
}

KvPools sample_pool(Backend& be, const PoolGeometry& g, const PoolPattern& p, const std::vector<int32_t>& blocks) {
  PoolGeometry sg = g;
  sg.primary_blocks = std::max<int64_t>(1, static_cast<int64_t>(blocks.size()));
  sg.secondary_blocks = 0;
  KvPools pools = be.allocate_pools(sg);
  for (size_t i = 0; i < blocks.size(); ++i) {
    const int64_t src = blocks[i] % p.blocks;
    be.to_backend(pools.bytes(PoolKind::primary) + block_byte_offset(sg, pools.strides[0], static_cast<int64_t>(i)),
                  p.data.data() + src * p.data_block_bytes, static_cast<size_t>(p.data_block_bytes));
    if (sg.has_scale_pool())
      be.to_backend(pools.scale_bytes(PoolKind::primary) +
                        block_byte_offset(sg.scale_geometry(), pools.scale_strides[0], static_cast<int64_t>(i)),
                    p.scales.data() + src * p.scale_block_bytes, static_cast<size_t>(p.scale_block_bytes));
  }
  return pools;
}

std::vector<uint8_t> download(Backend& be, const void* p, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  if (bytes) be.to_host(out.data(), p, bytes);
  return out;
}

PoolBytes download_pools(Backend& be, const KvPools& pools) {
  PoolBytes out;
  const PoolGeometry& g = pools.geometry;
  for (PoolKind k : {PoolKind::primary, PoolKind::secondary}) {
    const int i = static_cast<int>(k);
    if (pools.data[i]) out.data[i] = download(be, pools.data[i], static_cast<size_t>(g.pool_bytes(k)));
    if (pools.scales[i])
      out.scales[i] = download(be, pools.scales[i], static_cast<size_t>(g.scale_geometry().pool_bytes(k)));
  }
  return out;
}

void compare(CheckResult& r, const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, const std::string& what) {
  const size_t n = std::min(a.size(), b.size());
  r.bytes_compared += static_cast<int64_t>(std::max(a.size(), b.size()));
  if (a.size() != b.size()) {
    r.bytes_differing += static_cast<int64_t>(std::max(a.size(), b.size()) - n);
    if (r.first_difference.empty())
      r.first_difference = what + ": " + std::to_string(a.size()) + " bytes against " + std::to_string(b.size());
  }
  if (n == 0 || std::memcmp(a.data(), b.data(), n) == 0) return;  // memcmp of an empty vector's null data is UB
  for (size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) {
      if (r.first_difference.empty()) {
        char text[96];
        std::snprintf(text, sizeof text, " byte %zu: 0x%02x, oracle 0x%02x", i, a[i], b[i]);
        r.first_difference = what + text;
      }
      ++r.bytes_differing;
    }
}

void compare_pools(CheckResult& r, const PoolBytes& a, const PoolBytes& b) {
  const char* kinds[2] = {"primary pool", "secondary pool"};
  for (int i = 0; i < 2; ++i) {
    compare(r, a.data[i], b.data[i], kinds[i]);
    compare(r, a.scales[i], b.scales[i], std::string(kinds[i]) + " scales");
  }
}

}  // namespace kvsim::bench
