// What every benchmark fixture needs: deterministic contents, buffers that
// live on a backend and on the host at once, pools filled block by block from
// a host pattern (so the oracle can rebuild any block without a download),
// and byte comparisons.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backends/backend.hpp"
#include "kvsim/bench/bench.hpp"

namespace kvsim::bench {

// splitmix64: the one generator of every benchmark input.
uint64_t mix(uint64_t x);

// n random finite values of a float dtype (fp32/fp16/bf16) in [-1, 1), as bytes.
std::vector<uint8_t> random_floats(CacheDtype t, int64_t n, uint64_t seed);
// n random codes of a cache dtype: finite values only (no fp8 NaN codes,
// nvfp4 scale bytes are a separate pattern).
std::vector<uint8_t> random_codes(CacheDtype t, int64_t n, uint64_t seed);

// A host array and its copy on a backend.
struct Mirrored {
  std::vector<uint8_t> host;
  BackendBuffer device;
  Mirrored() = default;
  Mirrored(Backend& be, std::vector<uint8_t> bytes);
  void* get() const { return device.get(); }
};

// Element bytes of a pool's data and scales for one block (in_block, one
// layer: every block is one run of bytes whose start comes from element_offset).
struct PoolPattern {
  PoolGeometry geometry;
  int64_t blocks = 0;  // distinct pattern blocks; pool block b holds pattern block b % blocks
  std::vector<uint8_t> data, scales;
  int64_t data_block_bytes = 0, scale_block_bytes = 0;
};
PoolPattern make_pool_pattern(const PoolGeometry& g, uint64_t seed, int64_t max_bytes);

// Byte offset of block b in a pool of contiguous strides (data or scales).
int64_t block_byte_offset(const PoolGeometry& g, const PoolStrides& s, int64_t block);

// Fills blocks [0, g.blocks(kind)) of pools' `kind` pool with the pattern:
// one upload of the pattern, then device copies tile it.
void fill_pool(Backend& be, const KvPools& pools, PoolKind kind, const PoolPattern& p);

// A pool on `be` holding only `blocks` (pool ids), pattern-filled, renumbered
// 0..n-1 in the order given: what an oracle needs to recompute a sample.
KvPools sample_pool(Backend& be, const PoolGeometry& g, const PoolPattern& p, const std::vector<int32_t>& blocks);

// Every byte of both pools (data and scales) of `pools`, downloaded.
struct PoolBytes {
  std::vector<uint8_t> data[2], scales[2];
};
PoolBytes download_pools(Backend& be, const KvPools& pools);
std::vector<uint8_t> download(Backend& be, const void* p, size_t bytes);

// Adds a comparison of `a` (benchmarked backend) against `b` (oracle) to r.
void compare(CheckResult& r, const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, const std::string& what);
void compare_pools(CheckResult& r, const PoolBytes& a, const PoolBytes& b);

}  // namespace kvsim::bench
