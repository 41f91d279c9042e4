// DifferentialBackend (backends/differential_backend.hpp) without a GPU: the
// CPU oracle against itself reports no difference over every op, and a
// candidate that flips one byte after an op is caught, with the byte mapped
// back to its pool coordinates, sequence and token, and the offset arithmetic.
#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <string>

#include "backends/cpu/cpu_backend.hpp"
#include "backends/differential_backend.hpp"
#include "backends/op_generator.hpp"
#include "tests/support/corrupting_backend.hpp"

using namespace kvsim;
using kvsim::testing::CorruptingBackend;


TEST_CASE("DifferentialBackend: cpu against cpu reports no difference over every generated op") {
  DifferentialBackend diff(std::make_unique<CpuBackend>(2), std::make_unique<CpuBackend>(3));
  CHECK(diff.name() == "diff(cpu,cpu)");
  std::mt19937_64 rng(7);
  int64_t ops = 0;
  for (GeneratedOp op : kGeneratedOps)
    for (int rep = 0; rep < 4; ++rep) {
      OpGenerator gen(diff, rng());
      gen.set_geometry(OpGenerator::random_geometry(op, rng));
      CAPTURE(generated_op_name(op));
      for (int i = 0; i < 3; ++i) {
        const std::string what = gen.run(op);
        CAPTURE(what);
        REQUIRE_FALSE(diff.first_difference().has_value());
        ++ops;
      }
    }
  CHECK(diff.counters().ops == ops);
  CHECK(diff.counters().bytes_compared > 0);
  const int64_t seq_ops = run_generated_sequences(diff, 3, 11, 14, [&](const std::string& s) { diff.set_context(s); });
  CHECK(seq_ops == 3 * 15);
  CHECK_FALSE(diff.first_difference().has_value());
}

TEST_CASE("DifferentialBackend: one flipped pool byte is reported with its coordinates, sequence and token") {
  auto corrupting = std::make_unique<CorruptingBackend>();
  CorruptingBackend& bad = *corrupting;
  DifferentialBackend diff(std::make_unique<CpuBackend>(2), std::move(corrupting));

  PoolGeometry g{.layers = 2, .kv_heads = 2, .tokens_per_block = 3, .head_dim = 8, .dtype = CacheDtype::fp16,
                 .layout = BlockLayout::hnd, .placement = LayerPlacement::per_layer, .primary_blocks = 10};
  KvPools pools = diff.allocate_pools(g, 0x11);

  // Sequence 1 (5 tokens) lives in blocks {7, 2}; its token 4 is block 2, entry 1.
  const PoolStrides& s = pools.strides[0];
  const int64_t elem = element_offset(s, 2, 1, 1, 1, 1, 5);  // V of head 1, dim 5
  bad.corrupt_op = "append_paged";
  bad.pool_byte = elem * 2 + 1;

  const int32_t indptr[] = {0, 1, 3}, indices[] = {4, 7, 2}, last[] = {2, 2};
  const int32_t batch_indices[] = {0, 1, 1, 1, 1, 1}, positions[] = {1, 0, 1, 2, 3, 4};
  std::vector<uint16_t> kv(6 * 2 * 8);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = codec::f32_to_f16(0.25f * static_cast<float>(i));
  BackendBuffer k(diff, kv.size() * 2), v(diff, kv.size() * 2);
  k.upload(kv.data(), kv.size() * 2);
  v.upload(kv.data(), kv.size() * 2);
  AppendPagedOp op;
  op.layer = 1;
  op.k = contiguous_view(k.get(), CacheDtype::fp16, {6, 2, 8});
  op.v = contiguous_view(v.get(), CacheDtype::fp16, {6, 2, 8});
  op.coordinates() = {batch_indices, positions, indptr, indices, last};

  diff.set_context("step 3 layer 1 append_paged", {"req-a", "req-b"});
  diff.append_paged(pools, op);
  REQUIRE(diff.first_difference().has_value());
  const DiffReport& r = *diff.first_difference();
  INFO(r.text());
  CHECK(r.op == "append_paged");
  CHECK(r.context == "step 3 layer 1 append_paged");
  CHECK(r.buffer == "primary pool");
  CHECK(r.dtype == CacheDtype::fp16);
  CHECK(r.byte_offset == elem * 2 + 1);
  CHECK(r.element == elem);
  REQUIRE(r.pool_at.has_value());
  CHECK(r.pool_at->block == 2);
  CHECK(r.pool_at->layer == 1);
  CHECK(r.pool_at->kv == 1);
  CHECK(r.pool_at->head == 1);
  CHECK(r.pool_at->entry == 1);
  CHECK(r.pool_at->dim == 5);
  CHECK(r.sequence == 1);
  CHECK(r.sequence_id == "req-b");
  CHECK(r.token == 4);
  CHECK(r.head == 1);
  CHECK(r.dim == 5);
  // Token 4 of sequence 1 is input row 5: value 0.25 * ((5 * 2 + 1) * 8 + 5).
  const uint16_t expected = codec::f32_to_f16(0.25f * 93.0f);
  char hex[16];
  std::snprintf(hex, sizeof hex, "0x%04X", expected);
  CHECK(r.reference_hex == hex);
  std::snprintf(hex, sizeof hex, "0x%04X", expected ^ 0xFF00);
  CHECK(r.candidate_hex == hex);
  CHECK(r.reference_value == "23.25");
  CHECK(r.explain.find("= " + std::to_string(elem)) != std::string::npos);
  CHECK(r.text().find("sequence 1 (req-b), token position 4") != std::string::npos);

  // Later ops keep the first report and still count.
  diff.append_paged(pools, op);
  CHECK(diff.counters().ops == 2);
  CHECK(diff.first_difference()->context == "step 3 layer 1 append_paged");
  diff.release_pools(pools);
}

TEST_CASE("DifferentialBackend: one flipped output byte of gather_paged is reported with its index") {
  auto corrupting = std::make_unique<CorruptingBackend>();
  CorruptingBackend& bad = *corrupting;
  DifferentialBackend diff(std::make_unique<CpuBackend>(1), std::move(corrupting));
  PoolGeometry g{.kv_heads = 3, .tokens_per_block = 7, .head_dim = 16, .dtype = CacheDtype::fp8_e4m3,
                 .primary_blocks = 4};
  KvPools pools = diff.allocate_pools(g, 0x38);  // e4m3 1.0 everywhere
  const int32_t ids[] = {3, 1};
  BackendBuffer out(diff, 9 * 3 * 16 * 4);
  GatherPagedOp op;
  op.block_ids = ids;
  op.num_tokens = 9;
  op.out = contiguous_view(out.get(), CacheDtype::fp32, {9, 3, 16});
  op.scale = 0.5f;
  const int64_t flipped = ((8 * 3 + 2) * 16 + 11) * 4 + 3;  // out[8, 2, 11], top byte
  bad.corrupt_op = "gather_paged";
  bad.out_byte = flipped;
  diff.gather_paged(pools, op);
  REQUIRE(diff.first_difference().has_value());
  const DiffReport& r = *diff.first_difference();
  INFO(r.text());
  CHECK(r.buffer == "out");
  CHECK(r.byte_offset == flipped);
  CHECK(r.tensor_index == std::vector<int64_t>{8, 2, 11});
  CHECK(r.head == 2);
  CHECK(r.dim == 11);
  CHECK(r.reference_hex == "0x3F000000");
  CHECK(r.reference_value == "0.5");
  CHECK(r.candidate_hex == "0xC0000000");
  diff.release_pools(pools);
}
