// FlashInfer's arrangement on the CPU oracle: K and V as strided views into one
// [pages, 2, P, H, D] (NHD) / [pages, 2, H, P, D] (HND) tensor per layer, the
// layers back to back in one allocation that holds more pages than the pool
// uses (core's make_shared_kv_pools). Pools carry their allocation's size, so
// these strides validate against the real allocation:
//  * append_paged writes each element at the offset FlashInfer's tensor
//    layout gives (written out here, not from core), nothing else changes;
//  * gather_paged reads the values back; decode_attention through the shared
//    pools is bit-equal to the same data in dense per_layer pools;
//  * nvfp4 (data and scale tensors in the shared arrangement) too;
//  * the same strides without the allocation size are rejected (bad_strides).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kvsim/validation.hpp"
#include "backends/backend.hpp"

using namespace kvsim;

namespace {

float value_of(int seq, int pos, int kv, int head, int dim) {
  return static_cast<float>(((seq * 131 + pos * 31 + kv * 17 + head * 7 + dim) % 61) - 30) / 16.0f;
}

// The element offset of FlashInfer's tensor, from its shape alone.
int64_t flashinfer_offset(const PoolGeometry& g, int64_t pages, int layer, int64_t page, int kv, int head, int token,
                          int dim) {
  const int64_t H = g.kv_heads, P = g.tokens_per_block, D = g.head_dim;
  const int64_t inner = g.layout == BlockLayout::nhd ? (token * H + head) * D + dim : (head * P + token) * D + dim;
  return ((static_cast<int64_t>(layer) * pages + page) * 2 + kv) * H * P * D + inner;
}

struct Batch {
  std::vector<int32_t> indptr{0}, indices, last_page_len, batch_indices, positions, lens;
  std::vector<int32_t> dense;  // [batch, max_blocks]
  int32_t max_blocks = 0;
};

constexpr int32_t kLens[] = {9, 12};
int32_t pages_for(int32_t len, int P) { return (len + P - 1) / P; }

// Two sequences of 9 and 12 tokens; pages handed out in reverse block order
// (logical pages are not contiguous), block 0 left unused.
Batch make_batch(int P) {
  Batch b;
  const int32_t total = pages_for(kLens[0], P) + pages_for(kLens[1], P);
  int32_t next = 0;
  for (size_t s = 0; s < 2; ++s) {
    const int32_t pages = pages_for(kLens[s], P);
    for (int32_t p = 0; p < pages; ++p) b.indices.push_back(total - next++);
    b.indptr.push_back(b.indptr.back() + pages);
    b.last_page_len.push_back(kLens[s] - (pages - 1) * P);
    for (int32_t t = 0; t < kLens[s]; ++t) {
      b.batch_indices.push_back(static_cast<int32_t>(s));
      b.positions.push_back(t);
    }
    b.lens.push_back(kLens[s]);
  }
  b.max_blocks = std::max(pages_for(kLens[0], P), pages_for(kLens[1], P));
  for (size_t s = 0; s < 2; ++s)
    for (int32_t p = 0; p < b.max_blocks; ++p) {
      const int32_t pages = b.indptr[s + 1] - b.indptr[s];
      b.dense.push_back(p < pages ? b.indices[b.indptr[s] + p] : kBadPage);
    }
  return b;
}

struct Run {
  std::vector<uint8_t> allocation;  // shared runs only: the whole allocation after the ops
  std::vector<float> gathered;      // [seq][token][head][dim] of K then V, layer 1
  std::vector<float> attention;     // decode outputs, layer 1
};

// Writes the batch into layer 1 with append_paged, gathers it back and runs
// decode attention, through shared or dense pools.
Run run_ops(Backend& be, const PoolGeometry& g, bool shared, int64_t pages) {
  const Batch b = make_batch(g.tokens_per_block);
  const int H = g.kv_heads, D = g.head_dim;
  const int64_t nnz = static_cast<int64_t>(b.positions.size());
  const int layer = 1;

  KvPools pools;
  BackendBuffer data, scales;
  std::vector<uint8_t> sentinel;
  if (shared) {
    const int64_t elements = g.layers * pages * 2 * g.inner_elements();
    sentinel.assign(static_cast<size_t>(g.bytes_for(elements)), 0xA5);
    data = BackendBuffer(be, sentinel.size());
    data.upload(sentinel.data(), sentinel.size());
    SharedKvAllocation a{data.get(), nullptr, pages};
    if (g.has_scale_pool()) {
      const PoolGeometry sg = g.scale_geometry();
      std::vector<uint8_t> s(static_cast<size_t>(sg.layers * pages * 2 * sg.inner_elements()), 0x5A);
      scales = BackendBuffer(be, s.size());
      scales.upload(s.data(), s.size());
      a.scales = scales.get();
    }
    pools = make_shared_kv_pools(g, a);
  } else {
    pools = be.allocate_pools(g, 0xA5);
  }

  std::vector<float> k(static_cast<size_t>(nnz * H * D)), v(k.size());
  for (int64_t i = 0; i < nnz; ++i)
    for (int h = 0; h < H; ++h)
      for (int d = 0; d < D; ++d) {
        k[(i * H + h) * D + d] = value_of(b.batch_indices[i], b.positions[i], 0, h, d);
        v[(i * H + h) * D + d] = value_of(b.batch_indices[i], b.positions[i], 1, h, d);
      }
  const CacheDtype input = g.dtype == CacheDtype::nvfp4 ? CacheDtype::fp32 : g.dtype;
  std::vector<uint8_t> kin(k.size() * 4), vin(v.size() * 4);
  for (size_t i = 0; i < k.size(); ++i) {
    store_float(kin.data(), input, static_cast<int64_t>(i), k[i]);
    store_float(vin.data(), input, static_cast<int64_t>(i), v[i]);
  }
  BackendBuffer kb(be, kin.size()), vb(be, vin.size());
  kb.upload(kin.data(), kin.size());
  vb.upload(vin.data(), vin.size());
  AppendPagedOp ap;
  ap.layer = layer;
  ap.k = contiguous_view(kb.get(), input, {nnz, H, D});
  ap.v = contiguous_view(vb.get(), input, {nnz, H, D});
  ap.coordinates() = {b.batch_indices, b.positions, b.indptr, b.indices, b.last_page_len};
  be.append_paged(pools, ap);

  Run r;
  for (size_t s = 0; s + 1 < b.indptr.size(); ++s)
    for (int kv = 0; kv < 2; ++kv) {
      const std::vector<int32_t> ids(b.indices.begin() + b.indptr[s], b.indices.begin() + b.indptr[s + 1]);
      BackendBuffer out(be, static_cast<size_t>(b.lens[s]) * H * D * 4);
      GatherPagedOp gp;
      gp.layer = layer;
      gp.kv = kv;
      gp.block_ids = ids;
      gp.num_tokens = b.lens[s];
      gp.out = contiguous_view(out.get(), CacheDtype::fp32, {b.lens[s], H, D});
      be.gather_paged(pools, gp);
      std::vector<float> host(static_cast<size_t>(b.lens[s]) * H * D);
      out.download(host.data(), host.size() * 4);
      r.gathered.insert(r.gathered.end(), host.begin(), host.end());
    }

  const int64_t batch = static_cast<int64_t>(b.lens.size());
  std::vector<float> q(static_cast<size_t>(batch * H * D));
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>(static_cast<int>(i % 13) - 6) / 8.0f;
  BackendBuffer qb(be, q.size() * 4), ob(be, q.size() * 4);
  qb.upload(q.data(), q.size() * 4);
  DecodeAttentionOp da;
  da.layer = layer;
  da.q = contiguous_view(qb.get(), CacheDtype::fp32, {batch, H, D});
  da.out = contiguous_view(ob.get(), CacheDtype::fp32, {batch, H, D});
  da.seq_lens = b.lens;
  da.block_table = b.dense;
  da.max_blocks_per_seq = b.max_blocks;
  da.scales.sm_scale = 0.25f;
  be.decode_attention(pools, da);
  r.attention.resize(q.size());
  ob.download(r.attention.data(), q.size() * 4);

  if (shared) {
    r.allocation.resize(sentinel.size());
    data.download(r.allocation.data(), r.allocation.size());
  } else {
    be.release_pools(pools);
  }
  return r;
}

PoolGeometry shared_geometry(BlockLayout layout, int P, CacheDtype dtype) {
  PoolGeometry g{.layers = 2, .kv_factor = 2, .kv_heads = 3, .tokens_per_block = P, .head_dim = 32, .dtype = dtype,
                 .layout = layout, .placement = LayerPlacement::per_layer,
                 .primary_blocks = pages_for(kLens[0], P) + pages_for(kLens[1], P) + 1};
  return g;
}

}  // namespace

TEST_CASE("shared [pages, 2, P, H, D] allocation: append_paged writes FlashInfer's offsets, gather and decode read them") {
  auto be = make_backend("cpu");
  for (BlockLayout layout : {BlockLayout::nhd, BlockLayout::hnd})
    for (int P : {1, 3, 7, 17}) {
      const PoolGeometry g = shared_geometry(layout, P, CacheDtype::bf16);
      const int64_t pages = g.primary_blocks + 3;  // 3 pages per layer the pool does not use
      INFO(layout_name(layout) << " P " << P);
      const Run shared = run_ops(*be, g, true, pages);
      const Run dense = run_ops(*be, g, false, 0);

      // Every written element at FlashInfer's offset; every other byte untouched.
      const Batch b = make_batch(P);
      std::vector<uint8_t> expected(shared.allocation.size(), 0xA5);
      for (size_t i = 0; i < b.positions.size(); ++i) {
        const int s = b.batch_indices[i], pos = b.positions[i];
        const int64_t page = b.indices[b.indptr[s] + pos / P];
        for (int kv = 0; kv < 2; ++kv)
          for (int h = 0; h < g.kv_heads; ++h)
            for (int d = 0; d < g.head_dim; ++d)
              store_float(expected.data(), CacheDtype::bf16, flashinfer_offset(g, pages, 1, page, kv, h, pos % P, d),
                          value_of(s, pos, kv, h, d));
      }
      CHECK(shared.allocation == expected);

      // Reads: the values come back, and equal the dense pools' bit for bit.
      size_t at = 0;
      bool values_ok = true;
      for (size_t s = 0; s < b.lens.size(); ++s)
        for (int kv = 0; kv < 2; ++kv)
          for (int t = 0; t < b.lens[s]; ++t)
            for (int h = 0; h < g.kv_heads; ++h)
              for (int d = 0; d < g.head_dim; ++d)
                values_ok = values_ok && shared.gathered[at++] == value_of(static_cast<int>(s), t, kv, h, d);
      CHECK(values_ok);
      CHECK(std::memcmp(shared.gathered.data(), dense.gathered.data(), dense.gathered.size() * 4) == 0);
      CHECK(std::memcmp(shared.attention.data(), dense.attention.data(), dense.attention.size() * 4) == 0);
    }
}

TEST_CASE("shared allocation with nvfp4: data and block scales in the shared arrangement, bit-equal to dense pools") {
  auto be = make_backend("cpu");
  for (int P : {3, 16}) {
    INFO("P " << P);
    const PoolGeometry g = shared_geometry(BlockLayout::hnd, P, CacheDtype::nvfp4);
    const int64_t pages = g.primary_blocks + 2;
    const Run shared = run_ops(*be, g, true, pages);
    const Run dense = run_ops(*be, g, false, 0);
    CHECK(std::memcmp(shared.gathered.data(), dense.gathered.data(), dense.gathered.size() * 4) == 0);
    CHECK(std::memcmp(shared.attention.data(), dense.attention.data(), dense.attention.size() * 4) == 0);
    // The last 2 pages of each layer are outside the pool, layer 0 is not written: untouched.
    const int64_t page_bytes = g.bytes_for(2 * g.inner_elements());
    bool untouched = true;
    for (int64_t byte = 0; byte < pages * page_bytes; ++byte)
      untouched = untouched && shared.allocation[static_cast<size_t>(byte)] == 0xA5;
    for (int64_t byte = (pages + g.primary_blocks) * page_bytes; byte < 2 * pages * page_bytes; ++byte)
      untouched = untouched && shared.allocation[static_cast<size_t>(byte)] == 0xA5;
    CHECK(untouched);
  }
}

TEST_CASE("pools carry their allocation's size: the shared strides are rejected against the pool's own size") {
  const PoolGeometry g = shared_geometry(BlockLayout::nhd, 7, CacheDtype::bf16);  // 5 blocks
  REQUIRE(g.primary_blocks == 5);
  std::vector<uint16_t> memory(static_cast<size_t>(g.layers * 8 * 2 * g.inner_elements()));
  KvPools pools = make_shared_kv_pools(g, SharedKvAllocation{memory.data(), nullptr, 8});
  CHECK(pools.data_allocation(PoolKind::primary) == static_cast<int64_t>(memory.size()));
  CHECK_NOTHROW(validate_pool(pools, PoolKind::primary, "test: "));
  // Layer 1 starts 8 pages in: beyond a pool of 5 blocks' own dense size.
  pools.allocation_elements[0] = kPoolOwnSize;
  try {
    validate_pool(pools, PoolKind::primary, "test: ");
    FAIL("accepted strides that leave the pool's own size");
  } catch (const ValidationError& e) {
    CHECK(e.code() == ErrorCode::bad_strides);
  }
  // An allocation one element too small is rejected too.
  pools.allocation_elements[0] = static_cast<int64_t>(memory.size()) - 1 - 3 * 2 * g.inner_elements();
  CHECK_THROWS_AS(validate_pool(pools, PoolKind::primary, "test: "), ValidationError);
  // Fewer pages than blocks, a split-x or in_block geometry: rejected by the helper.
  CHECK_THROWS_AS(make_shared_kv_pools(g, SharedKvAllocation{memory.data(), nullptr, 4}), ValidationError);
  PoolGeometry in_block = g;
  in_block.placement = LayerPlacement::in_block;
  CHECK_THROWS_AS(make_shared_kv_pools(in_block, SharedKvAllocation{memory.data(), nullptr, 8}), ValidationError);
  static_assert(std::is_trivially_copyable_v<KvPools>);
}
