// The benchmark configurations and their fixtures.
//
// Bytes an op "must move" (the denominators of GB/s), per launch:
//   append_paged / reshape_and_cache : K+V input read + K+V cache bytes written (+ nvfp4 scales)
//   qkv_preprocess_write             : fused QKV read + Q written + K/V cache bytes written
//   gather_paged                     : cache bytes read + fp32 output written
//   decode_attention                 : every attended key's K and V row read (+ nvfp4 scales), Q read, out written
//   prefill_attention                : the sequence's K and V read once, Q read, out written
//   copy_blocks / partial_copy /
//   offload / onboard                : bytes copied, read + written
//   append_mla / indexer_k_scatter   : input read + cache written
//   scenario_replay                  : K and V bytes the replay put into the pool
//   fma_throughput                   : the probe's fp32 output written (its ceiling is flops, not bytes)
// FLOPs (Case::flops): attention 4 * D per (query head, attended key) (a
// score's D fma and P.V's D fma), the FMA probe 2 per fma.
// Pools have one layer, in_block placement (each block one run of bytes).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

#include "kvsim/validation.hpp"
#include "kvsim/bench/bench.hpp"
#include "kvsim/sim/replay.hpp"
#include "kvsim/sim/scenario_file.hpp"
#include "support.hpp"

namespace kvsim::bench {
namespace {

constexpr int64_t kPatternBytes = int64_t{64} << 20;  // content repeats every 64 MiB of blocks

std::string dtype_text(CacheDtype t) { return std::string(dtype_name(t)); }

PoolGeometry make_geometry(CacheDtype dtype, BlockLayout layout, int32_t page, int32_t kv_heads, int32_t head_dim,
                           int64_t blocks) {
  PoolGeometry g{.layers = 1, .kv_factor = 2, .kv_heads = kv_heads, .tokens_per_block = page, .head_dim = head_dim,
                 .dtype = dtype, .layout = layout, .placement = LayerPlacement::in_block, .primary_blocks = blocks,
                 .secondary_blocks = 0};
  return g;
}

// Cache bytes of `tokens` K+V rows (with nvfp4 scale bytes).
double kv_cache_bytes(const PoolGeometry& g, double tokens) {
  double row = static_cast<double>(g.bytes_for(static_cast<int64_t>(g.kv_heads) * g.head_dim));
  if (g.has_scale_pool()) row += static_cast<double>(g.kv_heads) * g.head_dim / codec::kNvfp4BlockElems;
  return 2.0 * tokens * row;
}

double float_bytes(CacheDtype t) { return bits_per_element(t) / 8.0; }

// A batch of sequences, each with its pages: block ids are a fixed
// permutation of [0, pool blocks), as a long-running allocator leaves them.
struct Batch {
  int32_t sequences = 0, tokens = 0, page = 0, pages_per_seq = 0;
  std::vector<int32_t> table;  // dense [sequences, pages_per_seq]
  Batch(int32_t b, int32_t t, int32_t p, int64_t pool_blocks, uint64_t seed) : sequences(b), tokens(t), page(p) {
    pages_per_seq = (t + p - 1) / p;
    std::vector<int32_t> ids(static_cast<size_t>(pool_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    for (size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[mix(seed + i) % i]);
    table.assign(ids.begin(), ids.begin() + static_cast<int64_t>(b) * pages_per_seq);
  }
  int64_t blocks() const { return static_cast<int64_t>(sequences) * pages_per_seq; }
  int64_t slot(int32_t b, int32_t t) const {
    return static_cast<int64_t>(table[static_cast<size_t>(b) * pages_per_seq + t / page]) * page + t % page;
  }
};

// The write fixtures' common part: a zero-filled pool on the backend; check()
// runs the same op from the same host inputs on a zero-filled oracle pool and
// compares every pool byte (plus any other output the op adds).
struct PoolWriteFixture : Fixture {
  Backend& be;
  PoolGeometry g;
  KvPools pools;
  PoolWriteFixture(Backend& b, const PoolGeometry& geometry) : be(b), g(geometry), pools(b.allocate_pools(geometry)) {}
  ~PoolWriteFixture() override { be.release_pools(pools); }
  virtual void run_on_oracle(Backend& oracle, const KvPools& want, CheckResult& r) = 0;
  CheckResult check(Backend& oracle) override {
    KvPools want = oracle.allocate_pools(g);
    CheckResult r;
    run_on_oracle(oracle, want, r);
    compare_pools(r, download_pools(be, pools), download_pools(oracle, want));
    oracle.release_pools(want);
    return r;
  }
};

// A pool-writing op benchmarked as is, and checked by running it on the
// oracle with its tensors re-made there through the op's traits: every tensor
// the op reads or writes (OpTraits::tensors) is copied from the benchmarked
// backend into an oracle buffer of its span, written tensors are compared
// after the op, and the pools by PoolWriteFixture. The op's host spans (page
// tables, coordinates) serve both backends as they are.
template <OpId id>
struct OpWriteFixture : PoolWriteFixture {
  OpOf<id> op;
  using PoolWriteFixture::PoolWriteFixture;
  double run() override {
    call_op<id>(be, pools, op);
    return be.last_kernel_seconds();
  }
  void run_on_oracle(Backend& oracle, const KvPools& want, CheckResult& r) override {
    OpOf<id> on_oracle = op;
    std::vector<BackendBuffer> copies;  // one per tensor of the traits, in their order
    for (const auto& t : OpTraits<id>::tensors) {
      TensorView& v = on_oracle.*t.member;
      const size_t bytes = static_cast<size_t>(v.span_bytes());
      copies.emplace_back(oracle, bytes);
      if (v.empty()) continue;
      // Written tensors start as the backend's did, so bytes an op may leave alone (row padding) agree.
      const std::vector<uint8_t> host = download(be, v.data, bytes);
      oracle.to_backend(copies.back().get(), host.data(), bytes);
      v.data = copies.back().get();
    }
    call_op<id>(oracle, want, on_oracle);
    for (size_t i = 0; i < OpTraits<id>::tensors.size(); ++i) {
      const auto& t = OpTraits<id>::tensors[i];
      const TensorView& v = op.*t.member;
      if (t.access != Access::write || v.empty()) continue;
      compare(r, download(be, v.data, copies[i].bytes()), download(oracle, copies[i].get(), copies[i].bytes()), t.name);
    }
  }
};

// A K/V write of sequences x tokens rows of `in` (8 heads of 128) into a
// pool with room for them and 8 spare blocks: name, parameters, bytes and
// the Fixture that runs it.
template <class Fixture>
Case kv_write_case(const char* op, CacheDtype cache, CacheDtype in, BlockLayout layout, int32_t page,
                   int32_t sequences, int32_t tokens) {
  const PoolGeometry g =
      make_geometry(cache, layout, page, 8, 128, static_cast<int64_t>(sequences) * ((tokens + page - 1) / page) + 8);
  const int64_t nnz = static_cast<int64_t>(sequences) * tokens;
  Case c;
  c.op = op;
  c.config = dtype_text(g.dtype) + " " + std::string(layout_name(g.layout)) + " P" + std::to_string(g.tokens_per_block) +
             " H" + std::to_string(g.kv_heads) + " D" + std::to_string(g.head_dim) + " " + std::to_string(sequences) +
             "x" + std::to_string(tokens) + " tokens";
  c.params = {{"cache", dtype_name(g.dtype)}, {"input", dtype_name(in)},     {"layout", layout_name(g.layout)},
              {"page", g.tokens_per_block},   {"kv_heads", g.kv_heads},      {"head_dim", g.head_dim},
              {"sequences", sequences},       {"tokens", tokens}};
  c.bytes = 2.0 * nnz * g.kv_heads * g.head_dim * float_bytes(in) + kv_cache_bytes(g, static_cast<double>(nnz));
  c.items = static_cast<double>(nnz);
  c.prepare = [=](Backend& be) { return std::make_unique<Fixture>(be, g, in, sequences, tokens); };
  return c;
}

// FlashInfer's append inputs for every token of a Batch: (sequence, position)
// per token and the CSR page table (indptr, indices, last_page_len).
struct AppendCoordinateLists {
  std::vector<int32_t> batch_indices, positions, indptr{0}, indices, last_page_len;
  explicit AppendCoordinateLists(const Batch& batch) {
    for (int32_t s = 0; s < batch.sequences; ++s) {
      for (int32_t t = 0; t < batch.tokens; ++t) {
        batch_indices.push_back(s);
        positions.push_back(t);
      }
      for (int32_t p = 0; p < batch.pages_per_seq; ++p) indices.push_back(batch.table[s * batch.pages_per_seq + p]);
      indptr.push_back(indptr.back() + batch.pages_per_seq);
      last_page_len.push_back(batch.tokens - (batch.pages_per_seq - 1) * batch.page);
    }
  }
  // The coordinates and CSR table of an append_paged or append_mla op.
  void into(AppendCoordinates& o) const { o = {batch_indices, positions, indptr, indices, last_page_len}; }
};

// ---------------------------------------------------------------- append_paged
struct AppendPagedFixture final : OpWriteFixture<OpId::append_paged> {
  Batch batch;
  Mirrored k, v;
  AppendCoordinateLists at;

  AppendPagedFixture(Backend& b, const PoolGeometry& geometry, CacheDtype in, int32_t sequences, int32_t tokens)
      : OpWriteFixture(b, geometry), batch(sequences, tokens, geometry.tokens_per_block, geometry.primary_blocks, 11),
        at(batch) {
    const int64_t nnz = static_cast<int64_t>(sequences) * tokens, n = nnz * g.kv_heads * g.head_dim;
    k = Mirrored(be, g.dtype == CacheDtype::nvfp4 ? random_floats(in, n, 1) : random_codes(in, n, 1));
    v = Mirrored(be, g.dtype == CacheDtype::nvfp4 ? random_floats(in, n, 2) : random_codes(in, n, 2));
    op.k = contiguous_view(k.get(), in, {nnz, g.kv_heads, g.head_dim});
    op.v = contiguous_view(v.get(), in, {nnz, g.kv_heads, g.head_dim});
    at.into(op);
    op.k_global_scale = op.v_global_scale = 0.5f;
  }
};

Case append_paged_case(CacheDtype cache, BlockLayout layout, int32_t page, int32_t sequences, int32_t tokens) {
  const CacheDtype in = cache == CacheDtype::nvfp4 ? CacheDtype::bf16 : cache;  // nvfp4 quantizes bf16 input
  return kv_write_case<AppendPagedFixture>("append_paged", cache, in, layout, page, sequences, tokens);
}

// ---------------------------------------------------------------- reshape_and_cache
struct ReshapeFixture final : OpWriteFixture<OpId::reshape_and_cache> {
  Batch batch;
  Mirrored key, value;
  std::vector<int64_t> slots;

  ReshapeFixture(Backend& b, const PoolGeometry& geometry, CacheDtype in, int32_t sequences, int32_t tokens)
      : OpWriteFixture(b, geometry), batch(sequences, tokens, geometry.tokens_per_block, geometry.primary_blocks, 12) {
    const int64_t T = static_cast<int64_t>(sequences) * tokens, n = T * g.kv_heads * g.head_dim;
    key = Mirrored(be, random_codes(in, n, 3));
    value = Mirrored(be, random_codes(in, n, 4));
    for (int32_t s = 0; s < sequences; ++s)
      for (int32_t t = 0; t < tokens; ++t) slots.push_back(batch.slot(s, t));
    op.key = contiguous_view(key.get(), in, {T, g.kv_heads, g.head_dim});
    op.value = contiguous_view(value.get(), in, {T, g.kv_heads, g.head_dim});
    op.slot_mapping = slots;
    op.k_scale = 0.125f;
    op.v_scale = 0.25f;
  }
};

Case reshape_case(CacheDtype cache, BlockLayout layout, int32_t page, int32_t sequences, int32_t tokens) {
  const CacheDtype in = CacheDtype::bf16;  // fp8 caches quantize bf16 input (x / scale)
  return kv_write_case<ReshapeFixture>("reshape_and_cache", cache, in, layout, page, sequences, tokens);
}

// ---------------------------------------------------------------- qkv_preprocess_write
struct QkvFixture final : OpWriteFixture<OpId::qkv_preprocess_write> {
  int32_t hq;
  Batch batch;
  Mirrored qkv, cos_sin;
  BackendBuffer q_out;
  std::vector<int32_t> seq_lens, cache_lens;

  QkvFixture(Backend& b, const PoolGeometry& geometry, int32_t q_heads, int32_t sequences, int32_t tokens)
      : OpWriteFixture(b, geometry), hq(q_heads),
        batch(sequences, tokens, geometry.tokens_per_block, geometry.primary_blocks, 13) {
    const int64_t rows = static_cast<int64_t>(sequences) * tokens;
    const int64_t fused = static_cast<int64_t>(hq + 2 * g.kv_heads) * g.head_dim;
    qkv = Mirrored(be, random_floats(CacheDtype::bf16, rows * fused, 5));
    const RopeTable rope = build_rope_table(g.head_dim, tokens);
    std::vector<uint8_t> cs(rope.cos_sin.size() * 4);
    std::memcpy(cs.data(), rope.cos_sin.data(), cs.size());
    cos_sin = Mirrored(be, std::move(cs));
    q_out = BackendBuffer(be, static_cast<size_t>(rows * hq * g.head_dim * 2));
    seq_lens.assign(static_cast<size_t>(sequences), tokens);
    cache_lens.assign(static_cast<size_t>(sequences), tokens);
    op.num_q_heads = hq;
    op.qkv = contiguous_view(qkv.get(), CacheDtype::bf16, {rows, fused});
    op.q_out = contiguous_view(q_out.get(), CacheDtype::bf16, {rows, hq, g.head_dim});
    op.rope_style = RopeStyle::neox;
    op.rotary_dim = g.head_dim;
    op.cos_sin = contiguous_view(cos_sin.get(), CacheDtype::fp32, {batch.tokens, g.head_dim});
    op.seq_lens = seq_lens;
    op.cache_lens = cache_lens;
    op.block_table = batch.table;
    op.max_blocks_per_seq = batch.pages_per_seq;
    op.scale_orig_quant[1] = 8.0f;
    op.scale_orig_quant[2] = 4.0f;
    op.nvfp4_global_scale[1] = op.nvfp4_global_scale[2] = 0.5f;
  }
};

Case qkv_case(CacheDtype cache, int32_t q_heads, int32_t sequences, int32_t tokens) {
  const int32_t H = 8, D = 128, page = 16;
  const int64_t rows = static_cast<int64_t>(sequences) * tokens;
  const PoolGeometry g = make_geometry(cache, BlockLayout::hnd, page, H, D,
                                       static_cast<int64_t>(sequences) * ((tokens + page - 1) / page) + 8);
  Case c;
  c.op = "qkv_preprocess_write";
  c.config = dtype_text(cache) + " hnd P16 GQA" + std::to_string(q_heads) + ":8 D128 neox " +
             std::to_string(sequences) + "x" + std::to_string(tokens) + " tokens";
  c.params = {{"cache", dtype_name(cache)}, {"input", "bf16"}, {"layout", "hnd"}, {"page", page},
              {"q_heads", q_heads}, {"kv_heads", H}, {"head_dim", D}, {"sequences", sequences}, {"tokens", tokens},
              {"rope", "neox"}};
  c.bytes = static_cast<double>(rows) * (q_heads + 2 * H) * D * 2 + static_cast<double>(rows) * q_heads * D * 2 +
            kv_cache_bytes(g, static_cast<double>(rows));
  c.items = static_cast<double>(rows);
  c.prepare = [=](Backend& be) { return std::make_unique<QkvFixture>(be, g, q_heads, sequences, tokens); };
  return c;
}

// The read and copy fixtures' common part: a pool on the backend whose
// primary blocks hold a deterministic pattern the oracle can rebuild.
struct PatternPoolFixture : Fixture {
  Backend& be;
  PoolGeometry g;
  PoolPattern pattern;
  KvPools pools;
  PatternPoolFixture(Backend& b, const PoolGeometry& geometry, uint64_t seed)
      : be(b), g(geometry), pattern(make_pool_pattern(geometry, seed, kPatternBytes)), pools(b.allocate_pools(geometry)) {
    fill_pool(be, pools, PoolKind::primary, pattern);
  }
  ~PatternPoolFixture() override { be.release_pools(pools); }
};

// ---------------------------------------------------------------- gather_paged
struct GatherFixture final : PatternPoolFixture {
  Batch batch;  // one sequence
  BackendBuffer out;
  GatherPagedOp op;

  GatherFixture(Backend& b, const PoolGeometry& geometry, int32_t tokens)
      : PatternPoolFixture(b, geometry, 21),
        batch(1, tokens, geometry.tokens_per_block, geometry.primary_blocks, 14) {
    out = BackendBuffer(be, static_cast<size_t>(tokens) * g.kv_heads * g.head_dim * 4);
    op = make_op(out.get(), batch.table);
  }
  GatherPagedOp make_op(void* out_p, std::span<const int32_t> table) const {
    GatherPagedOp o;
    o.kv = 0;
    o.block_ids = table;
    o.num_tokens = batch.tokens;
    o.out = contiguous_view(out_p, CacheDtype::fp32, {batch.tokens, g.kv_heads, g.head_dim});
    o.scale = 0.125f;
    o.global_scale = 0.5f;
    return o;
  }
  double run() override {
    be.gather_paged(pools, op);
    return be.last_kernel_seconds();
  }
  CheckResult check(Backend& oracle) override {
    KvPools want = sample_pool(oracle, g, pattern, batch.table);
    std::vector<int32_t> renumbered(batch.table.size());
    std::iota(renumbered.begin(), renumbered.end(), 0);
    BackendBuffer oout(oracle, out.bytes());
    oracle.gather_paged(want, make_op(oout.get(), renumbered));
    CheckResult r;
    compare(r, download(be, out.get(), out.bytes()), download(oracle, oout.get(), oout.bytes()), "out");
    oracle.release_pools(want);
    return r;
  }
};

Case gather_case(CacheDtype cache, int32_t page, int32_t tokens) {
  const int32_t H = 8, D = 128;
  const PoolGeometry g = make_geometry(cache, BlockLayout::hnd, page, H, D, (tokens + page - 1) / page + 8);
  Case c;
  c.op = "gather_paged";
  c.config = dtype_text(cache) + " hnd P" + std::to_string(page) + " H8 D128 " + std::to_string(tokens) + " tokens";
  c.params = {{"cache", dtype_name(cache)}, {"layout", "hnd"}, {"page", page}, {"kv_heads", H}, {"head_dim", D},
              {"tokens", tokens}};
  c.bytes = kv_cache_bytes(g, tokens) / 2 + static_cast<double>(tokens) * H * D * 4;
  c.items = tokens;
  c.prepare = [=](Backend& be) { return std::make_unique<GatherFixture>(be, g, tokens); };
  return c;
}

// ---------------------------------------------------------------- decode_attention
AttentionScales attention_scales(CacheDtype cache) {
  AttentionScales s;
  s.sm_scale = 0.08838834764831845f;  // 1 / sqrt(128)
  if (is_fp8(cache)) {
    s.k_scale = 0.125f;
    s.v_scale = 0.125f;
  }
  s.k_global_scale = s.v_global_scale = 0.5f;
  return s;
}

// The bf16 query rows [rows, hq, D] of the decode and prefill fixtures.
PagedAttentionQuery bf16_query(const PoolGeometry& g, int32_t hq, int32_t pages_per_seq, AttentionOrder order,
                               void* q, void* out, int64_t rows, std::span<const int32_t> lens,
                               std::span<const int32_t> table) {
  return {.q = contiguous_view(q, CacheDtype::bf16, {rows, hq, g.head_dim}),
          .out = contiguous_view(out, CacheDtype::bf16, {rows, hq, g.head_dim}),
          .seq_lens = lens,
          .block_table = table,
          .max_blocks_per_seq = pages_per_seq,
          .scales = attention_scales(g.dtype),
          .order = order};
}

struct DecodeFixture final : PatternPoolFixture {
  int32_t hq;
  Batch batch;
  Mirrored q;
  BackendBuffer out;
  std::vector<int32_t> seq_lens;
  AttentionOrder order;
  DecodeAttentionOp op;

  DecodeFixture(Backend& b, const PoolGeometry& geometry, int32_t q_heads, int32_t sequences, int32_t context,
                AttentionOrder attention_order)
      : PatternPoolFixture(b, geometry, 31), hq(q_heads), order(attention_order),
        batch(sequences, context, geometry.tokens_per_block, geometry.primary_blocks, 15) {
    q = Mirrored(be, random_floats(CacheDtype::bf16, static_cast<int64_t>(sequences) * hq * g.head_dim, 6));
    out = BackendBuffer(be, static_cast<size_t>(sequences) * hq * g.head_dim * 2);
    seq_lens.assign(static_cast<size_t>(sequences), context);
    op = make_op(q.get(), out.get(), sequences, seq_lens, batch.table);
  }
  DecodeAttentionOp make_op(void* qp, void* op_out, int32_t sequences, std::span<const int32_t> lens,
                            std::span<const int32_t> table) const {
    DecodeAttentionOp o;
    o.query() = bf16_query(g, hq, batch.pages_per_seq, order, qp, op_out, sequences, lens, table);
    return o;
  }
  double run() override {
    be.decode_attention(pools, op);
    return be.last_kernel_seconds();
  }
  // The first, middle and last sequences, recomputed from their blocks alone.
  CheckResult check(Backend& oracle) override {
    std::vector<int32_t> sample{0, batch.sequences / 2, batch.sequences - 1};
    sample.erase(std::unique(sample.begin(), sample.end()), sample.end());
    const int64_t row = static_cast<int64_t>(hq) * g.head_dim;
    std::vector<int32_t> blocks, table, lens;
    std::vector<uint8_t> q_rows;
    for (int32_t s : sample) {
      for (int32_t p = 0; p < batch.pages_per_seq; ++p) {
        table.push_back(static_cast<int32_t>(blocks.size()));
        blocks.push_back(batch.table[static_cast<size_t>(s) * batch.pages_per_seq + p]);
      }
      lens.push_back(seq_lens[s]);
      q_rows.insert(q_rows.end(), q.host.begin() + s * row * 2, q.host.begin() + (s + 1) * row * 2);
    }
    KvPools want = sample_pool(oracle, g, pattern, blocks);
    Mirrored oq(oracle, q_rows);
    BackendBuffer oout(oracle, q_rows.size());
    oracle.decode_attention(want, make_op(oq.get(), oout.get(), static_cast<int32_t>(sample.size()), lens, table));
    const std::vector<uint8_t> got_all = download(be, out.get(), out.bytes());
    std::vector<uint8_t> got;
    for (int32_t s : sample) got.insert(got.end(), got_all.begin() + s * row * 2, got_all.begin() + (s + 1) * row * 2);
    CheckResult r;
    compare(r, got, download(oracle, oout.get(), oout.bytes()), "out of sampled sequences");
    oracle.release_pools(want);
    return r;
  }
};

// The order's name in a configuration: nothing for fp32 (today's names), " mma".
std::string order_text(AttentionOrder order) { return order == AttentionOrder::mma ? " mma" : ""; }

Case decode_case(CacheDtype cache, int32_t page, int32_t q_heads, int32_t sequences, int32_t context,
                 AttentionOrder order = AttentionOrder::fp32) {
  const int32_t H = 8, D = 128;
  const PoolGeometry g = make_geometry(cache, BlockLayout::hnd, page, H, D,
                                       static_cast<int64_t>(sequences) * ((context + page - 1) / page) + 8);
  Case c;
  c.op = "decode_attention";
  c.config = dtype_text(cache) + " hnd P" + std::to_string(page) + " GQA" + std::to_string(q_heads) + ":8 D128 B" +
             std::to_string(sequences) + " ctx" + std::to_string(context) + order_text(order);
  c.params = {{"cache", dtype_name(cache)}, {"layout", "hnd"}, {"page", page}, {"q_heads", q_heads},
              {"kv_heads", H}, {"head_dim", D}, {"batch", sequences}, {"context", context}, {"q_dtype", "bf16"}};
  if (order == AttentionOrder::mma) c.params["order"] = "mma";
  c.bytes = kv_cache_bytes(g, static_cast<double>(sequences) * context) +
            2.0 * sequences * q_heads * D * 2;  // bf16 q read, bf16 out written
  c.items = sequences;
  c.prepare = [=](Backend& be) { return std::make_unique<DecodeFixture>(be, g, q_heads, sequences, context, order); };
  return c;
}

// ---------------------------------------------------------------- prefill_attention
// One sequence of `tokens` new tokens, causal, as one chunk.
struct PrefillFixture final : PatternPoolFixture {
  int32_t hq;
  Batch batch;
  Mirrored q;
  BackendBuffer out;
  std::vector<int32_t> q_indptr, seq_lens;
  AttentionOrder order;
  PrefillAttentionOp op;

  PrefillFixture(Backend& b, const PoolGeometry& geometry, int32_t q_heads, int32_t tokens, AttentionOrder attention_order)
      : PatternPoolFixture(b, geometry, 41), hq(q_heads), order(attention_order),
        batch(1, tokens, geometry.tokens_per_block, geometry.primary_blocks, 16) {
    q = Mirrored(be, random_floats(CacheDtype::bf16, static_cast<int64_t>(tokens) * hq * g.head_dim, 7));
    out = BackendBuffer(be, q.host.size());
    q_indptr = {0, tokens};
    seq_lens = {tokens};
    op = make_op(q.get(), out.get(), q_indptr, seq_lens, batch.table);
  }
  PrefillAttentionOp make_op(void* qp, void* op_out, std::span<const int32_t> indptr, std::span<const int32_t> lens,
                             std::span<const int32_t> table) const {
    PrefillAttentionOp o;
    o.query() = bf16_query(g, hq, batch.pages_per_seq, order, qp, op_out, indptr.back(), lens, table);
    o.q_indptr = indptr;
    return o;
  }
  double run() override {
    be.prefill_attention(pools, op);
    return be.last_kernel_seconds();
  }
  // The first 4 and the last 4 query rows: a prefix sequence of 4 tokens gives
  // the first rows' positions, the full sequence with a 4-row chunk the last.
  CheckResult check(Backend& oracle) override {
    const int32_t n = std::min(4, batch.tokens);
    const int64_t row = static_cast<int64_t>(hq) * g.head_dim * 2;
    std::vector<int32_t> renumbered(batch.table.size());
    std::iota(renumbered.begin(), renumbered.end(), 0);
    KvPools want = sample_pool(oracle, g, pattern, batch.table);
    const std::vector<uint8_t> got_all = download(be, out.get(), out.bytes());
    CheckResult r;
    for (const bool last : {false, true}) {
      const int64_t first_row = last ? batch.tokens - n : 0;
      std::vector<uint8_t> q_rows(q.host.begin() + first_row * row, q.host.begin() + (first_row + n) * row);
      const std::vector<int32_t> indptr{0, n}, lens{last ? batch.tokens : n};
      Mirrored oq(oracle, q_rows);
      BackendBuffer oout(oracle, q_rows.size());
      oracle.prefill_attention(want, make_op(oq.get(), oout.get(), indptr, lens, renumbered));
      const std::vector<uint8_t> got(got_all.begin() + first_row * row, got_all.begin() + (first_row + n) * row);
      compare(r, got, download(oracle, oout.get(), oout.bytes()), last ? "out (last rows)" : "out (first rows)");
    }
    oracle.release_pools(want);
    return r;
  }
};

Case prefill_case(CacheDtype cache, int32_t q_heads, int32_t tokens, AttentionOrder order = AttentionOrder::fp32) {
  const int32_t H = 8, D = 128, page = 16;
  const PoolGeometry g = make_geometry(cache, BlockLayout::hnd, page, H, D, (tokens + page - 1) / page + 8);
  Case c;
  c.op = "prefill_attention";
  c.config = dtype_text(cache) + " hnd P16 GQA" + std::to_string(q_heads) + ":8 D128 causal " +
             std::to_string(tokens) + " tokens" + order_text(order);
  c.params = {{"cache", dtype_name(cache)}, {"layout", "hnd"}, {"page", page}, {"q_heads", q_heads},
              {"kv_heads", H}, {"head_dim", D}, {"tokens", tokens}, {"q_dtype", "bf16"}};
  if (order == AttentionOrder::mma) c.params["order"] = "mma";
  c.bytes = kv_cache_bytes(g, tokens) + 2.0 * tokens * q_heads * D * 2;
  c.items = tokens;
  c.flops = 4.0 * D * q_heads * (static_cast<double>(tokens) * (tokens + 1) / 2);  // causal: key count p + 1
  c.prepare = [=](Backend& be) { return std::make_unique<PrefillFixture>(be, g, q_heads, tokens, order); };
  return c;
}

// ---------------------------------------------------------------- fma_throughput
// The FMA ceiling of the backend (Backend::fma_probe): the rate attention's
// FLOPs are quoted against. The check recomputes the first and last lanes'
// chains on the host with core's fma and compares bytes.
struct FmaFixture final : Fixture {
  Backend& be;
  int64_t lanes;
  int32_t steps;
  BackendBuffer out;
  FmaFixture(Backend& b, int64_t n, int32_t s)
      : be(b), lanes(n), steps(s), out(b, static_cast<size_t>(n) * canon::kFmaProbeChains * sizeof(float)) {}
  double run() override {
    be.fma_probe(static_cast<float*>(out.get()), lanes, steps);
    return be.last_kernel_seconds();
  }
  CheckResult check(Backend&) override {
    const std::vector<uint8_t> got = download(be, out.get(), out.bytes());
    std::vector<uint8_t> sample_got;
    std::vector<uint8_t> sample_want;
    for (int64_t lane : {int64_t{0}, int64_t{1}, lanes / 2, lanes - 1}) {
      if (lane < 0 || lane >= lanes) continue;
      for (int c = 0; c < canon::kFmaProbeChains; ++c) {
        float x = canon::fma_probe_seed(lane, c);
        for (int32_t st = 0; st < steps; ++st) x = canon::fma_f32(x, canon::kFmaProbeA, canon::kFmaProbeB);
        const size_t at = (static_cast<size_t>(lane) * canon::kFmaProbeChains + c) * sizeof(float);
        uint8_t b[4];
        std::memcpy(b, &x, 4);
        sample_want.insert(sample_want.end(), b, b + 4);
        sample_got.insert(sample_got.end(), got.begin() + static_cast<int64_t>(at), got.begin() + static_cast<int64_t>(at) + 4);
      }
    }
    CheckResult r;
    compare(r, sample_got, sample_want, "fma chains (sampled lanes)");
    return r;
  }
};

Case fma_case(int64_t lanes, int32_t steps) {
  Case c;
  c.op = "fma_throughput";
  c.config = "fp32 " + std::to_string(lanes) + " lanes x " + std::to_string(canon::kFmaProbeChains) + " chains x " +
             std::to_string(steps) + " steps";
  c.params = {{"lanes", lanes}, {"chains", canon::kFmaProbeChains}, {"steps", steps}};
  c.bytes = static_cast<double>(lanes) * canon::kFmaProbeChains * 4;
  c.items = static_cast<double>(lanes) * canon::kFmaProbeChains * steps;  // fmas
  c.flops = 2.0 * c.items;
  c.prepare = [=](Backend& be) { return std::make_unique<FmaFixture>(be, lanes, steps); };
  return c;
}

// ---------------------------------------------------------------- copy_blocks / partial_copy
// A pattern-filled pool; copies from the first half of the blocks to the second.
struct BlockCopyFixture final : PatternPoolFixture {
  int32_t pairs_n, partial_tokens;  // partial_tokens 0: copy_blocks
  std::vector<std::pair<int32_t, int32_t>> pairs;

  BlockCopyFixture(Backend& b, const PoolGeometry& geometry, int32_t n, int32_t partial)
      : PatternPoolFixture(b, geometry, 51), pairs_n(n), partial_tokens(partial) {
    for (int32_t i = 0; i < n; ++i) pairs.emplace_back(i, n + i);
  }
  double run_on(Backend& b, const KvPools& p) {
    if (partial_tokens == 0) {
      b.copy_blocks(p, CopyBlocksOp{pairs});
      return b.last_kernel_seconds();
    }
    double s = 0;
    for (const auto& [src, dst] : pairs) {
      b.partial_copy(p, PartialCopyOp{src, dst, partial_tokens});
      s += b.last_kernel_seconds();
    }
    return s;
  }
  double run() override { return run_on(be, pools); }
  CheckResult check(Backend& oracle) override {
    KvPools want = oracle.allocate_pools(g);
    fill_pool(oracle, want, PoolKind::primary, pattern);
    run_on(oracle, want);
    CheckResult r;
    compare_pools(r, download_pools(be, pools), download_pools(oracle, want));
    oracle.release_pools(want);
    return r;
  }
};

Case block_copy_case(CacheDtype cache, int32_t page, int32_t pairs, int32_t partial_tokens) {
  const int32_t H = 8, D = 128;
  const PoolGeometry g = make_geometry(cache, BlockLayout::hnd, page, H, D, 2 * static_cast<int64_t>(pairs));
  Case c;
  c.op = partial_tokens == 0 ? "copy_blocks" : "partial_copy";
  c.config = dtype_text(cache) + " hnd P" + std::to_string(page) + " H8 D128 " + std::to_string(pairs) +
             (partial_tokens == 0 ? " blocks" : " ops of " + std::to_string(partial_tokens) + " tokens");
  c.params = {{"cache", dtype_name(cache)}, {"layout", "hnd"}, {"page", page}, {"kv_heads", H}, {"head_dim", D},
              {"pairs", pairs}, {"tokens", partial_tokens}};
  const double fraction = partial_tokens == 0 ? 1.0 : static_cast<double>(partial_tokens) / page;
  c.bytes = 2.0 * pairs * fraction * kv_cache_bytes(g, page);
  c.items = pairs;
  c.prepare = [=](Backend& be) { return std::make_unique<BlockCopyFixture>(be, g, pairs, partial_tokens); };
  return c;
}

// ---------------------------------------------------------------- offload / onboard (small suite)
struct MoveFixture final : Fixture {
  Backend& be;
  PoolGeometry g;
  PoolPattern pattern, pattern2;
  bool to_secondary;
  std::vector<int32_t> ids;
  KvPools pools;

  MoveFixture(Backend& b, const PoolGeometry& geometry, bool offload)
      : be(b), g(geometry), pattern(make_pool_pattern(geometry, 61, kPatternBytes)),
        pattern2(make_pool_pattern(geometry, 62, kPatternBytes)), to_secondary(offload) {
    for (int64_t i = 0; i < g.secondary_blocks; ++i) ids.push_back(static_cast<int32_t>(i));
    pools = be.allocate_pools(g);
    fill(be, pools);
  }
  ~MoveFixture() override { be.release_pools(pools); }
  void fill(Backend& b, const KvPools& p) const {
    fill_pool(b, p, PoolKind::primary, pattern);
    fill_pool(b, p, PoolKind::secondary, pattern2);
  }
  double run_on(Backend& b, const KvPools& p) {
    const MoveBlocksOp op{ids, ids};
    if (to_secondary)
      b.offload(p, op);
    else
      b.onboard(p, op);
    return b.last_kernel_seconds();
  }
  double run() override { return run_on(be, pools); }
  CheckResult check(Backend& oracle) override {
    KvPools want = oracle.allocate_pools(g);
    fill(oracle, want);
    run_on(oracle, want);
    CheckResult r;
    compare_pools(r, download_pools(be, pools), download_pools(oracle, want));
    oracle.release_pools(want);
    return r;
  }
};

Case move_case(bool offload, int64_t blocks) {
  PoolGeometry g = make_geometry(CacheDtype::bf16, BlockLayout::hnd, 16, 8, 128, blocks);
  g.secondary_blocks = std::max<int64_t>(1, blocks / 2);
  Case c;
  c.op = offload ? "offload" : "onboard";
  c.config = "bf16 hnd P16 H8 D128 " + std::to_string(g.secondary_blocks) + " blocks";
  c.params = {{"cache", "bf16"}, {"layout", "hnd"}, {"page", 16}, {"blocks", g.secondary_blocks}};
  c.bytes = 2.0 * static_cast<double>(g.secondary_blocks) * static_cast<double>(g.block_bytes());
  c.items = static_cast<double>(g.secondary_blocks);
  c.prepare = [=](Backend& be) { return std::make_unique<MoveFixture>(be, g, offload); };
  return c;
}

// ---------------------------------------------------------------- append_mla (small suite)
struct AppendMlaFixture final : OpWriteFixture<OpId::append_mla> {
  Batch batch;
  Mirrored latent;  // [nnz, 576]: ckv and kpe sliced from one projection
  AppendCoordinateLists at;

  AppendMlaFixture(Backend& b, const PoolGeometry& geometry, int32_t sequences, int32_t tokens)
      : OpWriteFixture(b, geometry), batch(sequences, tokens, geometry.tokens_per_block, geometry.primary_blocks, 17),
        at(batch) {
    const int64_t nnz = static_cast<int64_t>(sequences) * tokens;
    latent = Mirrored(be, random_floats(CacheDtype::bf16, nnz * g.head_dim, 8));
    op.ckv = contiguous_view(latent.get(), CacheDtype::bf16, {nnz, 512});
    op.ckv.stride[0] = g.head_dim;
    op.kpe = contiguous_view(static_cast<uint16_t*>(latent.get()) + 512, CacheDtype::bf16, {nnz, 64});
    op.kpe.stride[0] = g.head_dim;
    at.into(op);
  }
};

Case append_mla_case(int32_t sequences, int32_t tokens) {
  PoolGeometry g = make_geometry(CacheDtype::bf16, BlockLayout::nhd, 16, 1, 576,
                                 static_cast<int64_t>(sequences) * ((tokens + 15) / 16) + 8);
  g.kv_factor = 1;
  const int64_t nnz = static_cast<int64_t>(sequences) * tokens;
  Case c;
  c.op = "append_mla";
  c.config = "bf16 nhd P16 ckv512+kpe64 " + std::to_string(sequences) + "x" + std::to_string(tokens) + " tokens";
  c.params = {{"cache", "bf16"}, {"sequences", sequences}, {"tokens", tokens}};
  c.bytes = 2.0 * nnz * 576 * 2;
  c.items = static_cast<double>(nnz);
  c.prepare = [=](Backend& be) { return std::make_unique<AppendMlaFixture>(be, g, sequences, tokens); };
  return c;
}

// ---------------------------------------------------------------- indexer_k_scatter (small suite)
// 128 fp8 bytes + 4 scale bytes per token into [blocks, 64, 1, 132].
struct IndexerFixture final : Fixture {
  static constexpr int64_t kBlock = 64, kPerToken = 132;
  Backend& be;
  int64_t tokens, blocks;
  Mirrored k_fp8, k_scale;
  BackendBuffer cache;
  std::vector<int64_t> slot_fp8, slot_scale;
  IndexerKScatterOp op;

  IndexerFixture(Backend& b, int64_t n) : be(b), tokens(n), blocks((n + kBlock - 1) / kBlock) {
    k_fp8 = Mirrored(be, random_codes(CacheDtype::fp8_e4m3, n * 128, 9));
    k_scale = Mirrored(be, random_codes(CacheDtype::fp8_e4m3, n * 4, 10));
    cache = BackendBuffer(be, static_cast<size_t>(blocks * kBlock * kPerToken));
    be.fill(cache.get(), 0, cache.bytes());
    for (int64_t t = 0; t < n; ++t) {
      slot_fp8.push_back(t * kPerToken);
      slot_scale.push_back(t * kPerToken + 128);
    }
    op = make_op(k_fp8.get(), k_scale.get(), cache.get());
  }
  IndexerKScatterOp make_op(void* data, void* scale, void* c) const {
    IndexerKScatterOp o;
    o.k_fp8 = contiguous_view(data, CacheDtype::fp8_e4m3, {tokens, 128});
    o.k_scale = contiguous_view(scale, CacheDtype::fp8_e4m3, {tokens, 4});
    o.slot_mapping_fp8 = slot_fp8;
    o.slot_mapping_scale = slot_scale;
    o.cache = contiguous_view(c, CacheDtype::fp8_e4m3, {blocks, kBlock, 1, kPerToken});
    return o;
  }
  double run() override {
    be.indexer_k_scatter(op);
    return be.last_kernel_seconds();
  }
  CheckResult check(Backend& oracle) override {
    Mirrored d(oracle, k_fp8.host), s(oracle, k_scale.host);
    BackendBuffer c(oracle, cache.bytes());
    oracle.fill(c.get(), 0, c.bytes());
    oracle.indexer_k_scatter(make_op(d.get(), s.get(), c.get()));
    CheckResult r;
    compare(r, download(be, cache.get(), cache.bytes()), download(oracle, c.get(), c.bytes()), "cache");
    return r;
  }
};

Case indexer_case(int64_t tokens) {
  Case c;
  c.op = "indexer_k_scatter";
  c.config = "fp8 128+4 bytes per token " + std::to_string(tokens) + " tokens";
  c.params = {{"tokens", tokens}};
  c.bytes = 2.0 * tokens * IndexerFixture::kPerToken;
  c.items = static_cast<double>(tokens);
  c.prepare = [=](Backend& be) { return std::make_unique<IndexerFixture>(be, tokens); };
  return c;
}

// ---------------------------------------------------------------- scenario_replay (small suite)
// The whole simulator -- block manager, scheduler, synthetic model, every op
// of every layer -- on one built-in scenario: its own run alone (without the
// comparison re-runs and the dense check), or with every invariant as `kvsim
// run` replays it (whose runs a host backend makes at once: replay.cpp).
// items = token-layers of the scenario's own run; checked by the content hash
// of the final pools against the oracle's replay (and, with every invariant,
// by the report: every invariant holds).
struct ReplayFixture final : Fixture {
  Backend& be;
  sim::Scenario scenario;
  sim::ReplayOptions options;
  uint64_t hash = 0;
  bool ok = true;
  ReplayFixture(Backend& b, bool every_invariant)
      : be(b), scenario(sim::load_scenario_file(sim::builtin_scenario_dir() + "/gqa_decode_batch_ragged.toml")) {
    options.comparison_invariants = every_invariant;
    options.dense_check = every_invariant;
  }
  double run() override {
    const auto t0 = std::chrono::steady_clock::now();
    const sim::ScenarioReport r = sim::replay(scenario, be, options);
    hash = r.content_hash;
    ok = ok && (r.ok || !options.comparison_invariants);  // alone, the [expect]ed comparisons report n/a
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  CheckResult check(Backend& oracle) override {
    const uint64_t want = sim::replay(scenario, oracle, options).content_hash;
    CheckResult r;
    r.bytes_compared = 8;
    if (want != hash) {
      r.bytes_differing = 8;
      r.first_difference = "content hash differs from the oracle's replay";
    } else if (!ok) {
      r.bytes_differing = 8;
      r.first_difference = "an invariant failed in the replay";
    }
    return r;
  }
};

Case replay_case(bool every_invariant) {
  const sim::Scenario s = sim::load_scenario_file(sim::builtin_scenario_dir() + "/gqa_decode_batch_ragged.toml");
  sim::ReplayOptions ro;
  ro.comparison_invariants = false;
  ro.dense_check = false;
  Case c;
  c.op = "scenario_replay";
  c.config = every_invariant ? "gqa_decode_batch_ragged, every invariant" : "gqa_decode_batch_ragged";
  c.params = {{"scenario", "gqa_decode_batch_ragged"}, {"invariants", every_invariant ? "every" : "none"}};
  const PoolGeometry g = sim::pool_geometry(s);
  // token-layers of one replay: counted once on the CPU (cheap, deterministic).
  auto cpu = make_backend("cpu");
  const double token_layers = static_cast<double>(sim::replay(s, *cpu, ro).counters.token_layers);
  c.bytes = token_layers * static_cast<double>(g.bytes_for(static_cast<int64_t>(g.kv_factor) * g.kv_heads * g.head_dim));
  c.items = token_layers;
  c.prepare = [every_invariant](Backend& be) { return std::make_unique<ReplayFixture>(be, every_invariant); };
  return c;
}

}  // namespace

std::vector<Case> make_suite(const SuiteOptions& o) {
  std::vector<Case> cases;
  const CacheDtype bf16 = CacheDtype::bf16, fp8 = CacheDtype::fp8_e4m3, nvfp4 = CacheDtype::nvfp4;
  if (o.suite == Suite::small) {
    const int32_t B = o.sequences, T = o.tokens;
    cases.push_back(fma_case(int64_t{1} << 16, 2048));  // first: the FLOP rows of the run quote it
    cases.push_back(append_paged_case(bf16, BlockLayout::hnd, 16, B, T));
    cases.push_back(reshape_case(bf16, BlockLayout::hnd, 16, B, T));
    cases.push_back(qkv_case(bf16, 32, B, T));
    cases.push_back(append_mla_case(B, T));
    cases.push_back(indexer_case(static_cast<int64_t>(B) * T));
    cases.push_back(gather_case(bf16, 16, T));
    cases.push_back(decode_case(bf16, 16, 32, B, T));
    cases.push_back(prefill_case(bf16, 32, std::min(T, 256)));
    const int32_t pairs = std::max(1, B * ((T + 15) / 16) / 2);
    cases.push_back(block_copy_case(bf16, 16, pairs, 0));
    cases.push_back(block_copy_case(bf16, 16, std::min(pairs, 64), 8));
    cases.push_back(move_case(true, 2 * static_cast<int64_t>(pairs)));
    cases.push_back(move_case(false, 2 * static_cast<int64_t>(pairs)));
    cases.push_back(replay_case(false));
    cases.push_back(replay_case(true));
    return cases;
  }
  cases.push_back(fma_case(int64_t{1} << 20, 4096));  // first: the FLOP rows of the run quote it
  // Writes: 16K and 64K tokens (16 and 64 sequences of 1024).
  for (int32_t B : {16, 64}) {
    cases.push_back(append_paged_case(bf16, BlockLayout::hnd, 16, B, 1024));
    cases.push_back(reshape_case(bf16, BlockLayout::hnd, 16, B, 1024));
    cases.push_back(qkv_case(bf16, 32, B, 1024));
  }
  cases.push_back(append_paged_case(bf16, BlockLayout::nhd, 16, 16, 1024));
  cases.push_back(append_paged_case(fp8, BlockLayout::hnd, 16, 16, 1024));
  cases.push_back(append_paged_case(nvfp4, BlockLayout::hnd, 16, 16, 1024));
  cases.push_back(append_paged_case(bf16, BlockLayout::hnd, 64, 16, 1024));
  cases.push_back(reshape_case(bf16, BlockLayout::nhd, 16, 16, 1024));
  cases.push_back(reshape_case(bf16, BlockLayout::split_x, 16, 16, 1024));
  cases.push_back(reshape_case(fp8, BlockLayout::nhd, 16, 16, 1024));
  cases.push_back(qkv_case(fp8, 32, 16, 1024));
  cases.push_back(qkv_case(nvfp4, 32, 16, 1024));
  cases.push_back(qkv_case(bf16, 64, 16, 1024));
  cases.push_back(gather_case(bf16, 16, 16384));
  cases.push_back(gather_case(fp8, 16, 16384));
  // Decode: batches 1, 16, 64, 256 at 1K, 8K and 32K (bf16, GQA 32:8, P16);
  // then page 64, GQA 64:8, fp8 and nvfp4 at the sizes the targets name.
  for (int32_t B : {1, 16, 64, 256})
    for (int32_t ctx : {1024, 8192, 32768}) cases.push_back(decode_case(bf16, 16, 32, B, ctx));
  for (const auto& [B, ctx] : std::vector<std::pair<int32_t, int32_t>>{{64, 8192}, {16, 32768}, {256, 1024}}) {
    cases.push_back(decode_case(bf16, 64, 32, B, ctx));
    cases.push_back(decode_case(bf16, 16, 64, B, ctx));
    cases.push_back(decode_case(fp8, 16, 32, B, ctx));
    cases.push_back(decode_case(nvfp4, 16, 32, B, ctx));
  }
  cases.push_back(decode_case(fp8, 16, 32, 256, 32768));
  cases.push_back(prefill_case(bf16, 32, 16384));
  cases.push_back(prefill_case(bf16, 32, 65536));
  // The mma order (issue 20): the rows its speed targets name.
  cases.push_back(decode_case(bf16, 16, 32, 64, 8192, AttentionOrder::mma));
  cases.push_back(decode_case(fp8, 16, 32, 64, 8192, AttentionOrder::mma));
  cases.push_back(prefill_case(bf16, 32, 16384, AttentionOrder::mma));
  cases.push_back(prefill_case(bf16, 32, 65536, AttentionOrder::mma));
  cases.push_back(block_copy_case(bf16, 16, 4096, 0));
  cases.push_back(block_copy_case(bf16, 64, 1024, 0));
  cases.push_back(block_copy_case(bf16, 16, 64, 8));
  return cases;
}

}  // namespace kvsim::bench
