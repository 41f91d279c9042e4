// Integer overflow at the edges of what validation accepts (issue 9): every
// expression an accepted descriptor drives is computed in 64 bits or the
// inputs that would overflow are rejected with a named error. Run under
// UBSan (the asan preset) these cases also prove no signed overflow happens
// on the way to the verdict.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kvsim/validation.hpp"
#include "kvsim/core.hpp"
#include "kvsim/core/ops/attention.hpp"
#include "kvsim/core/ops/qkv_preprocess.hpp"
#include "kvsim/core/ops/read_copy_ops.hpp"
#include "kvsim/core/ops/write_ops.hpp"

using namespace kvsim;

namespace {

template <typename Fn>
ErrorCode code_of(Fn&& fn) {
  try {
    fn();
  } catch (const ValidationError& e) {
    return e.code();
  }
  FAIL("accepted");
  return ErrorCode::bad_argument;
}

PoolGeometry small_geometry() {
  PoolGeometry g{.layers = 1, .kv_heads = 1, .tokens_per_block = 16, .head_dim = 16, .dtype = CacheDtype::fp32,
                 .primary_blocks = 4};
  return g;
}

struct SmallPools {
  PoolGeometry g = small_geometry();
  std::vector<float> memory = std::vector<float>(static_cast<size_t>(g.pool_elements(PoolKind::primary)));
  KvPools pools;
  SmallPools() {
    pools.geometry = g;
    pools.data[0] = memory.data();
    pools.strides[0] = contiguous_strides(g);
  }
};

}  // namespace

TEST_CASE("decode attention: the issue's window (W = 2^31 - 1, S = 2^31 - 2) with seq_len 2^31 - 1 is rejected") {
  // Before: S + bubble + ... wrapped negative in 32 bits, no page was checked
  // and the oracle read past the block table.
  SmallPools p;
  std::vector<float> q(16), out(16);
  const std::vector<int32_t> lens{INT32_MAX}, table{0};
  for (bool more : {false, true}) {
    DecodeAttentionOp op;
    op.q = contiguous_view(q.data(), CacheDtype::fp32, {1, 1, 16});
    op.out = contiguous_view(out.data(), CacheDtype::fp32, {1, 1, 16});
    op.seq_lens = lens;
    op.block_table = table;
    op.max_blocks_per_seq = 1;
    op.window = WindowMapping::make(INT32_MAX, INT32_MAX - 1, 16, more);
    CHECK(code_of([&] { validate_decode_attention(p.pools, op); }) == ErrorCode::position_beyond_sequence);
    // Sinks only (length <= S): one page is enough, and accepted.
    const std::vector<int32_t> short_len{16};
    op.seq_lens = short_len;
    CHECK_NOTHROW(validate_decode_attention(p.pools, op));
  }
}

TEST_CASE("strides whose span overflows 64 bits are bad_strides, not a wrapped bound") {
  const PoolGeometry g = small_geometry();
  PoolStrides s = contiguous_strides(g);
  s.block = int64_t{1} << 62;  // 3 * 2^62 wraps
  CHECK(code_of([&] { validate_strides(g, s, PoolKind::primary, INT64_MAX); }) == ErrorCode::bad_strides);
  s = contiguous_strides(g);
  s.inner[0].token = INT64_MAX / 8;  // 15 * that wraps
  CHECK(code_of([&] { validate_strides(g, s, PoolKind::primary, INT64_MAX); }) == ErrorCode::bad_strides);
}

TEST_CASE("a pool's allocation size must be a real count") {
  SmallPools p;
  p.pools.allocation_elements[0] = -5;
  CHECK(code_of([&] { validate_pool(p.pools, PoolKind::primary, "t: "); }) == ErrorCode::bad_argument);
  p.pools.allocation_elements[0] = INT64_MAX;
  CHECK(code_of([&] { validate_pool(p.pools, PoolKind::primary, "t: "); }) == ErrorCode::bad_argument);
  p.pools.allocation_elements[0] = p.g.pool_elements(PoolKind::primary) - 1;  // one element short
  CHECK(code_of([&] { validate_pool(p.pools, PoolKind::primary, "t: "); }) == ErrorCode::bad_strides);
  p.pools.allocation_elements[0] = kPoolOwnSize;
  CHECK_NOTHROW(validate_pool(p.pools, PoolKind::primary, "t: "));
}

TEST_CASE("gather_paged: num_tokens near INT64_MAX needs more pages than any table, without overflow") {
  SmallPools p;
  std::vector<float> out(16);
  const std::vector<int32_t> ids{0, 1};
  GatherPagedOp op;
  op.block_ids = ids;
  op.num_tokens = INT64_MAX;
  op.out = contiguous_view(out.data(), CacheDtype::fp32, {1, 1, 16});
  CHECK(code_of([&] { validate_gather_paged(p.pools, op); }) == ErrorCode::position_beyond_sequence);
}

TEST_CASE("append coordinates: a length past 32-bit positions is rejected, not wrapped") {
  const std::vector<int32_t> indptr{0, 1};
  const std::vector<int64_t> lens{int64_t{INT32_MAX} + 1};
  CHECK(code_of([&] { append_coordinates(indptr, lens); }) == ErrorCode::position_beyond_sequence);
  const std::vector<int64_t> ok{INT32_MAX};
  const BatchIndicesPositions c = append_coordinates(indptr, ok);
  REQUIRE(c.positions.size() == 1);
  CHECK(c.positions[0] == INT32_MAX - 1);
}

TEST_CASE("qkv_preprocess: num_q_heads + 2 * kv_heads past 2^31 is rejected") {
  SmallPools p;
  QkvPreprocessOp op;
  op.num_q_heads = INT32_MAX;  // a multiple of kv_heads = 1
  CHECK(code_of([&] { validate_qkv_preprocess(p.pools, op); }) == ErrorCode::shape_mismatch);
}

TEST_CASE("indexer_k_scatter: a cache whose element count or span overflows 64 bits is rejected") {
  std::vector<uint8_t> bytes(64), data(4), scale(4);
  const std::vector<int64_t> slots{0}, scale_slots{8};
  IndexerKScatterOp op;
  op.k_fp8 = contiguous_view(data.data(), CacheDtype::fp8_e4m3, {1, 4});
  op.k_scale = contiguous_view(scale.data(), CacheDtype::fp8_e4m3, {1, 4});
  op.slot_mapping_fp8 = slots;
  op.slot_mapping_scale = scale_slots;
  op.cache = contiguous_view(bytes.data(), CacheDtype::fp8_e4m3, {1, 1, 1, 64});
  CHECK_NOTHROW(validate_indexer_k_scatter(op));
  op.cache.shape[0] = op.cache.shape[1] = int64_t{1} << 40;  // numel 2^86
  CHECK(code_of([&] { validate_indexer_k_scatter(op); }) == ErrorCode::shape_mismatch);
  op.cache = contiguous_view(bytes.data(), CacheDtype::fp8_e4m3, {4, 1, 1, 16});
  op.cache.stride[0] = INT64_MAX / 2;  // span 3 * 2^62
  CHECK(code_of([&] { validate_indexer_k_scatter(op); }) == ErrorCode::shape_mismatch);
}

TEST_CASE("window mapping: negative sinks or page sizes never overflow in make(), and are rejected") {
  for (int32_t S : {INT32_MIN, -1})
    for (int32_t P : {1, 16, INT32_MAX}) {
      const WindowMapping m = WindowMapping::make(INT32_MAX, S, P, true);
      CHECK(code_of([&] { validate_window(m); }) == ErrorCode::bad_window);
    }
  const WindowMapping zero_p = WindowMapping::make(64, 3, 0, false);
  CHECK(code_of([&] { validate_window(zero_p); }) == ErrorCode::bad_window);
}
