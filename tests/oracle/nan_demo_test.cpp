// The NaN demonstration of contract §5.3/§5.7, end to end through two ops: a
// context step of qkv_preprocess_write writes K/V into a pool poisoned with
// NaN, then decode_attention reads whole pages. With TensorRT-LLM's V-tail
// zeroing on, no output holds NaN; with it off, NaN reaches exactly the
// sequence whose last page is partly empty, and no other.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "backends/backend.hpp"

using namespace kvsim;

namespace {

// Returns, per sequence, whether its decode output holds a NaN.
std::vector<bool> run_step(Backend& be, bool zero_v_tail, CacheDtype dtype) {
  PoolGeometry g{.layers = 1, .kv_heads = 2, .tokens_per_block = 16, .head_dim = 64, .dtype = dtype,
                 .layout = BlockLayout::hnd, .primary_blocks = 8};
  KvPools pools = be.allocate_pools(g, /*fill_byte=*/0xFF);  // bf16 0xFFFF, fp8 0xFF, e2m1 0xF...: NaN or -max

  const std::vector<int32_t> lens{16, 21, 32};  // full page, 5 + 11 empty slots, two full pages
  const int hq = 4, D = g.head_dim, H = g.kv_heads;
  const int max_blocks = 2;
  const std::vector<int32_t> table{5, -1, 0, 3, 7, 1};
  int64_t nnz = 0;
  for (int32_t l : lens) nnz += l;
  const int64_t fused = static_cast<int64_t>(hq + 2 * H) * D;
  std::vector<uint16_t> qkv(nnz * fused);
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = codec::f32_to_bf16(static_cast<float>((i * 37) % 101) / 101.0f - 0.5f);
  BackendBuffer qkv_b(be, qkv.size() * 2), q_out(be, static_cast<size_t>(nnz) * hq * D * 2);
  qkv_b.upload(qkv.data(), qkv.size() * 2);

  QkvPreprocessOp w{.num_q_heads = hq,
                    .qkv = contiguous_view(qkv_b.get(), CacheDtype::bf16, {nnz, fused}),
                    .q_out = contiguous_view(q_out.get(), CacheDtype::bf16, {nnz, hq, D}),
                    .seq_lens = lens,
                    .cache_lens = lens,
                    .block_table = table,
                    .max_blocks_per_seq = max_blocks,
                    .context_phase = true,
                    .zero_v_tail = zero_v_tail};
  if (dtype == CacheDtype::nvfp4) w.nvfp4_global_scale[1] = w.nvfp4_global_scale[2] = 0.01f;
  be.qkv_preprocess_write(pools, w);

  std::vector<float> q(lens.size() * hq * D, 0.05f), out(lens.size() * hq * D);
  BackendBuffer q_b(be, q.size() * 4), out_b(be, out.size() * 4);
  q_b.upload(q.data(), q.size() * 4);
  DecodeAttentionOp d;
  d.q = contiguous_view(q_b.get(), CacheDtype::fp32, {static_cast<int64_t>(lens.size()), hq, D});
  d.out = contiguous_view(out_b.get(), CacheDtype::fp32, {static_cast<int64_t>(lens.size()), hq, D});
  d.seq_lens = lens;
  d.block_table = table;
  d.max_blocks_per_seq = max_blocks;
  d.scales.sm_scale = 0.125f;
  if (dtype == CacheDtype::nvfp4) d.scales.k_global_scale = d.scales.v_global_scale = 0.01f;
  be.decode_attention(pools, d);
  out_b.download(out.data(), out.size() * 4);
  be.release_pools(pools);

  std::vector<bool> has_nan(lens.size(), false);
  for (size_t b = 0; b < lens.size(); ++b)
    for (int i = 0; i < hq * D; ++i) has_nan[b] = has_nan[b] || std::isnan(out[b * hq * D + i]);
  return has_nan;
}

}  // namespace

TEST_CASE("V-tail zeroing on: a NaN-poisoned pool gives no NaN; off: NaN reaches only the partly filled sequence") {
  auto be = make_backend("cpu");
  // bf16 and fp8 poison bytes are NaN codes (0xFFFF, 0xFF); the ops must
  // handle both the same way.
  for (CacheDtype dtype : {CacheDtype::bf16, CacheDtype::fp8_e4m3}) {
    INFO("dtype " << dtype_name(dtype));
    const auto on = run_step(*be, /*zero_v_tail=*/true, dtype);
    CHECK(on == std::vector<bool>{false, false, false});
    const auto off = run_step(*be, /*zero_v_tail=*/false, dtype);
    CHECK(off == std::vector<bool>{false, true, false});
  }
}
