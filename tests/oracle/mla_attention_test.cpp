// mla_attention (core/include/kvsim/core/ops/mla_attention.hpp) on the CPU:
// against attention in double (Eigen) over the latent rows the pool holds, for
// bf16 / fp16 / fp32 / fp8 / nvfp4 latent caches and 128 query heads over one
// latent head; sequences longer than a partition (the split-KV merge);
// chunked prefill bit-equal to one chunk, a one-token chunk to decode, any
// thread count; rejections named, output unchanged.
#include <doctest/doctest.h>

#include <Eigen/Dense>

#include <cmath>
#include <cstring>
#include <string>

#include "backends/cpu/cpu_backend.hpp"
#include "tests/support/mla_attention_fixture.hpp"

using namespace kvsim;
using namespace kvsim::test;

namespace {

Backend& cpu(int threads = 2) {
  static std::unique_ptr<Backend> one = make_backend("cpu", BackendOptions{1});
  static std::unique_ptr<Backend> two = make_backend("cpu", BackendOptions{2});
  static std::unique_ptr<Backend> three = make_backend("cpu", BackendOptions{3});
  return threads == 1 ? *one : threads == 3 ? *three : *two;
}

std::vector<float> run(const MlaCase& c, int threads = 2) {
  MlaSetup s;
  mla_setup(cpu(threads), c, s);
  cpu(threads).mla_attention(s.pools, s.op);
  return mla_output(s);
}

// Every output element within the dense bound of docs/invariants.md:
//   max|V| * (1e-5 + 4 * Dq * 2^-24 * sm_scale * scale * max_j sum_d |q_d k_jd|) (V, K as decoded values).
double worst_ratio(const MlaCase& c) {
  MlaSetup s;
  mla_setup(cpu(), c, s);
  cpu().mla_attention(s.pools, s.op);
  const std::vector<float> out = mla_output(s);
  MlaAttentionArgs a = make_mla_attention_args(s.pools, s.op);
  const MlaRows rows = make_mla_rows(s.op);
  const int32_t dq = c.d_ckv + c.d_kpe;
  double worst = 0;
  for (int64_t r = 0; r < s.rows; ++r) {
    const int64_t n = rows.position[r] + 1;
    Eigen::MatrixXd K(n, dq);
    std::vector<float> row(static_cast<size_t>(dq));
    for (int64_t t = 0; t < n; ++t) {
      load_latent_row(a, rows.seq[r], t, row.data());
      for (int32_t d = 0; d < dq; ++d) K(t, d) = row[d] * static_cast<double>(s.op.scale);
    }
    const Eigen::MatrixXd V = K.leftCols(c.d_ckv);
    for (int32_t h = 0; h < c.heads; ++h) {
      Eigen::VectorXd q(dq);
      for (int32_t d = 0; d < dq; ++d) q[d] = load_float(s.op.q.data, s.op.q.dtype, s.op.q.offset(r, h, d));
      const Eigen::VectorXd sc = (K * q) * static_cast<double>(s.op.sm_scale);
      const Eigen::VectorXd w = (sc.array() - sc.maxCoeff()).exp();
      const Eigen::VectorXd ref = (V.transpose() * w) / w.sum();
      const double dot_abs = (K.cwiseAbs() * q.cwiseAbs()).maxCoeff();
      const double bound = V.cwiseAbs().maxCoeff() * (1e-5 + 4.0 * dq * std::ldexp(1.0, -24) * s.op.sm_scale * dot_abs) + 1e-30;
      for (int32_t d = 0; d < c.d_ckv; ++d) {
        const double o = out[static_cast<size_t>((r * c.heads + h) * c.d_ckv + d)];
        REQUIRE(std::isfinite(o));
        worst = std::max(worst, std::fabs(o - ref[d]) / bound);
      }
    }
  }
  return worst;
}

}  // namespace

TEST_CASE("mla_attention matches Eigen double attention over the latent rows (dtypes, 128 heads, split-KV)") {
  for (CacheDtype dtype : {CacheDtype::bf16, CacheDtype::fp16, CacheDtype::fp32, CacheDtype::fp8_e4m3, CacheDtype::nvfp4}) {
    MlaCase c;
    c.dtype = dtype;
    c.scale = dtype == CacheDtype::fp8_e4m3 ? 0.01f : 1.0f;
    c.lens = {1, 37, 300};  // 300 > kPartitionSize: two partitions merged
    CAPTURE(dtype_name(dtype));
    CHECK(worst_ratio(c) <= 1.0);
  }
  MlaCase deepseek;  // DeepSeek-V3's latent: 512 + 64, 128 query heads over one latent head
  deepseek.d_ckv = 512;
  deepseek.d_kpe = 64;
  deepseek.heads = 128;
  deepseek.page_size = 64;
  deepseek.lens = {70, 9};
  deepseek.q_dtype = CacheDtype::bf16;
  CHECK(worst_ratio(deepseek) <= 1.0);
}

TEST_CASE("mla_attention: chunked prefill equals one chunk, a one-token chunk equals decode, any thread count") {
  MlaCase c;
  c.dtype = CacheDtype::nvfp4;
  c.page_size = 7;
  c.lens = {290, 12, 1};
  c.chunk = 300;  // every token a query row: the one-chunk prefill
  const std::vector<float> whole = run(c);
  // The same rows from chunks: the last 5 tokens of each sequence are the last rows of each.
  MlaCase tail = c;
  tail.chunk = 5;
  const std::vector<float> chunk = run(tail);
  const int64_t row = c.heads * c.d_ckv;
  // Rows of sequence 0 in `whole`: 0..289; its last 5 are 285..289. In `chunk`: rows 0..4.
  CHECK(std::memcmp(whole.data() + 285 * row, chunk.data(), static_cast<size_t>(5 * row) * 4) == 0);
  MlaCase decode = c;
  decode.chunk = 0;
  MlaCase one = c;
  one.chunk = 1;
  const std::vector<float> d = run(decode), o = run(one);
  CHECK(d == o);
  CHECK(std::memcmp(whole.data() + 289 * row, d.data(), static_cast<size_t>(row) * 4) == 0);
  CHECK(run(c, 1) == whole);
  CHECK(run(c, 3) == whole);
}

TEST_CASE("mla_attention: the same bytes at every ISA this CPU runs (baseline fmaf and the AVX2 + FMA copy)") {
  for (CacheDtype dtype : {CacheDtype::bf16, CacheDtype::nvfp4, CacheDtype::fp8_e4m3}) {
    MlaCase c;
    c.dtype = dtype;
    c.lens = {290, 12};
    c.chunk = 3;
    std::vector<float> portable;
    for (CpuIsa isa : {CpuIsa::portable, CpuIsa::avx2, CpuIsa::avx512}) {
      if (!cpu_isa_supported(isa)) continue;
      INFO(dtype_name(dtype) << " isa " << cpu_isa_name(isa));
      CpuBackend be(2, isa);
      MlaSetup s;
      mla_setup(be, c, s);
      be.mla_attention(s.pools, s.op);
      const std::vector<float> out = mla_output(s);
      if (isa == CpuIsa::portable) portable = out;
      CHECK(std::memcmp(out.data(), portable.data(), out.size() * 4) == 0);
    }
  }
}

TEST_CASE("mla_attention rejections name the rule and leave the output unchanged") {
  MlaCase c;
  MlaSetup s;
  mla_setup(cpu(), c, s);
  const std::vector<float> before = mla_output(s);
  auto expect = [&](ErrorCode code, const std::string& text, auto change) {
    MlaAttentionOp op = s.op;
    change(op);
    try {
      cpu().mla_attention(s.pools, op);
      FAIL("accepted: " << text);
    } catch (const ValidationError& e) {
      CHECK(e.code() == code);
      CHECK(std::string(e.what()).find(text) != std::string::npos);
    }
    CHECK(mla_output(s) == before);
  };
  expect(ErrorCode::shape_mismatch, "d_ckv + d_kpe", [](MlaAttentionOp& o) { o.d_kpe = 8; });
  expect(ErrorCode::bad_argument, "fp8 / int8 latents only", [](MlaAttentionOp& o) { o.scale = 2.0f; });
  expect(ErrorCode::position_beyond_sequence, "pages but the table has", [&](MlaAttentionOp& o) {
    o.max_blocks_per_seq = 1;
    o.block_table = std::span<const int32_t>(s.table).first(o.seq_lens.size());
  });
  expect(ErrorCode::shape_mismatch, "q must be", [](MlaAttentionOp& o) { o.q.shape[2] = 79; });
  expect(ErrorCode::bad_argument, "must be finite", [](MlaAttentionOp& o) { o.sm_scale = INFINITY; });
  // A K/V pool is no latent pool.
  const PoolGeometry kv{1, 2, 1, 16, 80, CacheDtype::bf16, BlockLayout::nhd, LayerPlacement::in_block, 8, 0};
  KvPools kv_pools = cpu().allocate_pools(kv);
  MlaAttentionOp op = s.op;
  op.layer = 0;
  CHECK_THROWS_WITH_AS(cpu().mla_attention(kv_pools, op), doctest::Contains("needs a latent pool"), ValidationError);
  cpu().release_pools(kv_pools);
}

TEST_CASE("load_latent_row reads nvfp4 pools as append_mla wrote them: ckv nibbles, kpe e4m3 bytes times kpe_scale") {
  MlaCase c;
  c.dtype = CacheDtype::nvfp4;
  c.lens = {3};
  MlaSetup s;
  mla_setup(cpu(), c, s);
  MlaAttentionArgs a = make_mla_attention_args(s.pools, s.op);
  std::vector<float> row(static_cast<size_t>(c.d_ckv + c.d_kpe));
  for (int64_t t = 0; t < 3; ++t) {
    load_latent_row(a, 0, t, row.data());
    for (int32_t d = 0; d < c.d_kpe; ++d) {
      // The fixture's layer-1 kpe input, encoded as append_mla does (x / kpe_scale, satfinite e4m3).
      const float x = mla_value(c.seed + 1, 2, static_cast<uint64_t>(t), static_cast<uint64_t>(d));
      const float expect = codec::e4m3_to_f32(codec::f32_to_e4m3(x / 0.125f, codec::Saturation::finite)) * 0.125f;
      CHECK(row[c.d_ckv + d] == expect);
    }
    for (int32_t d = 0; d < c.d_ckv; ++d) {  // ckv: within a quarter of its 16-element block's largest |x|
      float amax = 0.0f;
      for (int32_t e = d - d % 16; e < d - d % 16 + 16; ++e)
        amax = std::max(amax, std::fabs(mla_value(c.seed + 1, 1, static_cast<uint64_t>(t), static_cast<uint64_t>(e))));
      const float x = mla_value(c.seed + 1, 1, static_cast<uint64_t>(t), static_cast<uint64_t>(d));
      CHECK(std::fabs(row[d] - x) <= 0.25f * amax);
    }
  }
}
