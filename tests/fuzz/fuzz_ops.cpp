// libFuzzer target: a fuzzed geometry, pool strides/allocation and page
// tables, then one of every op of contract §5 on small pools on the CPU backend
// (one thread). Built under ASan + UBSan, it holds kvsim to its contract:
//   * validation accepts  => every byte the op touches is inside memory the
//     descriptors describe (pools are exactly their allocation's size, every
//     input tensor exactly its shape: ASan reports any stray access);
//   * validation rejects  => a named kvsim::ValidationError, and every pool
//     byte (data and nvfp4 scales, both kinds) is unchanged.
// Numbers are drawn mostly from small ranges around the valid ones, with a
// fuzzer-chosen share of raw 32/64-bit values (2^31 - 1, negatives, the
// secondary bit), so both sides of every rule are reached.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "kvsim/validation.hpp"
#include "backends/backend.hpp"

using namespace kvsim;

namespace {

// a + b with two's-complement wrap: hostile tables are built on purpose.
int32_t wrap_add(int32_t a, int32_t b) { return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b)); }

struct Draw {
  FuzzedDataProvider& in;
  // A value in [lo, hi] most of the time, any int32 when the fuzzer says so.
  int32_t i32(int32_t lo, int32_t hi) {
    if (in.ConsumeIntegralInRange<int>(0, 15) == 0) return in.ConsumeIntegral<int32_t>();
    return in.ConsumeIntegralInRange<int32_t>(lo, hi);
  }
  int64_t i64(int64_t lo, int64_t hi) {
    if (in.ConsumeIntegralInRange<int>(0, 15) == 0) return in.ConsumeIntegral<int64_t>();
    return in.ConsumeIntegralInRange<int64_t>(lo, hi);
  }
  int32_t small(int32_t lo, int32_t hi) { return in.ConsumeIntegralInRange<int32_t>(lo, hi); }
  bool flag() { return in.ConsumeBool(); }
  float scale() {
    switch (in.ConsumeIntegralInRange<int>(0, 7)) {
      case 0: return 0.0f;
      case 1: return -1.0f;
      case 2: return __builtin_nanf("");
      case 3: return __builtin_inff();
      case 4: return in.ConsumeFloatingPoint<float>();
      default: return 0.5f;
    }
  }
  std::vector<int32_t> list32(size_t max_size, int32_t lo, int32_t hi) {
    std::vector<int32_t> v(in.ConsumeIntegralInRange<size_t>(0, max_size));
    for (auto& x : v) x = i32(lo, hi);
    return v;
  }
};

// Exactly-sized memory for one tensor: an access past its end is an ASan report.
struct Buffer {
  std::unique_ptr<uint8_t[]> bytes;
  size_t size = 0;
  explicit Buffer(size_t n = 0) : bytes(n ? new uint8_t[n] : nullptr), size(n) {
    static const std::vector<uint8_t> pattern = [] {
      std::vector<uint8_t> p(4096);
      for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>(i * 37 + 11);
      return p;
    }();
    for (size_t at = 0; at < n; at += pattern.size()) std::memcpy(&bytes[at], pattern.data(), std::min(pattern.size(), n - at));
  }
};

// A contiguous tensor of `shape` in its own exactly-sized buffer.
TensorView tensor(std::vector<Buffer>& keep, CacheDtype dtype, std::initializer_list<int64_t> shape) {
  int64_t n = 1;
  for (int64_t s : shape) n = s < 0 ? 0 : n * s;
  keep.emplace_back(static_cast<size_t>((n * bits_per_element(dtype) + 7) / 8));
  return contiguous_view(keep.back().bytes.get(), dtype, shape);
}

CacheDtype any_dtype(Draw& d) { return static_cast<CacheDtype>(d.small(0, 6)); }
CacheDtype float_dtype(Draw& d) {
  const CacheDtype t[] = {CacheDtype::fp32, CacheDtype::fp16, CacheDtype::bf16};
  return t[d.small(0, 2)];
}

Backend& cpu() {
  static std::unique_ptr<Backend> be = make_backend("cpu", BackendOptions{1});
  return *be;
}

// Small geometries, every dtype/layout/placement, now and then a raw field.
bool draw_geometry(Draw& d, PoolGeometry& g) {
  const int32_t pages[] = {1, 2, 3, 4, 7, 16, 17};
  const int32_t dims[] = {16, 32, 48};
  g.layers = d.i32(1, 2);
  g.kv_factor = d.i32(1, 2);
  g.kv_heads = d.i32(1, 3);
  g.tokens_per_block = d.flag() ? pages[d.small(0, 6)] : d.i32(0, 40);
  g.head_dim = d.flag() ? dims[d.small(0, 2)] : d.i32(1, 64);
  g.dtype = any_dtype(d);
  g.layout = static_cast<BlockLayout>(d.small(0, 2));
  g.placement = static_cast<LayerPlacement>(d.small(0, 1));
  g.primary_blocks = d.i64(1, 6);
  g.secondary_blocks = d.i64(0, 3);
  try {
    validate_geometry(g);
  } catch (const ValidationError&) {
    return false;
  }
  // Accepted but larger than a fuzz run needs (small pools keep it fast): skipped.
  return g.pool_bytes(PoolKind::primary) <= (1 << 16) && g.pool_bytes(PoolKind::secondary) <= (1 << 16);
}

struct Pools {
  KvPools pools;
  Buffer data[2], scales[2];
};

// Contiguous, FlashInfer-shared or fuzzed strides; the memory is exactly the
// allocation the pools claim (their own size unless the strides say otherwise).
void draw_pools(Draw& d, const PoolGeometry& g, Pools& p) {
  KvPools& k = p.pools;
  k.geometry = g;
  const int mode = d.small(0, 3);
  for (int kind = 0; kind < 2; ++kind) {
    const PoolKind pk = static_cast<PoolKind>(kind);
    k.strides[kind] = contiguous_strides(g, pk);
    if (g.has_scale_pool()) k.scale_strides[kind] = contiguous_strides(g.scale_geometry(), pk);
    if (mode == 1 && g.kv_factor == 2 && g.layout != BlockLayout::split_x && g.placement == LayerPlacement::per_layer) {
      const int64_t pages = g.blocks(pk) + d.small(0, 2);
      k.strides[kind] = shared_kv_strides(g, pages);
      k.allocation_elements[kind] = g.layers * pages * 2 * g.inner_elements();
      if (g.has_scale_pool()) {
        k.scale_strides[kind] = shared_kv_strides(g.scale_geometry(), pages);
        k.scale_allocation_elements[kind] = g.layers * pages * 2 * g.scale_geometry().inner_elements();
      }
    } else if (mode == 2) {  // perturbed strides and allocation
      PoolStrides& s = k.strides[kind];
      int64_t* fields[] = {&s.block, &s.layer, &s.kv, &s.inner[0].head, &s.inner[0].token, &s.inner[0].dim_outer,
                           &s.inner[0].dim_inner, &s.inner[1].head, &s.inner[1].token, &s.inner[1].dim_outer,
                           &s.inner[1].dim_inner};
      for (int64_t* f : fields)
        if (d.small(0, 3) == 0) *f = d.flag() ? *f + d.small(-3, 3) : d.i64(0, 4096);
      if (d.small(0, 3) == 0) s.inner[d.small(0, 1)].x = d.i32(1, 64);
      if (d.flag())
        k.allocation_elements[kind] =
            static_cast<int64_t>(static_cast<uint64_t>(g.pool_elements(pk)) + static_cast<uint64_t>(d.i64(-8, 4096)));
    }
    const int64_t elements = k.data_allocation(pk);
    if (g.blocks(pk) > 0 && elements >= 0 && elements <= (int64_t{1} << 18)) {
      p.data[kind] = Buffer(static_cast<size_t>(g.bytes_for(elements)) + (elements == 0));
      k.data[kind] = p.data[kind].bytes.get();
    }
    if (g.has_scale_pool()) {
      const int64_t se = k.scale_allocation(pk);
      if (g.blocks(pk) > 0 && se >= 0 && se <= (int64_t{1} << 18)) {
        p.scales[kind] = Buffer(static_cast<size_t>(se) + (se == 0));
        k.scales[kind] = p.scales[kind].bytes.get();
      }
    }
  }
}

std::vector<uint8_t> snapshot(const Pools& p) {
  std::vector<uint8_t> all;
  for (const Buffer* b : {&p.data[0], &p.data[1], &p.scales[0], &p.scales[1]})
    all.insert(all.end(), b->bytes.get(), b->bytes.get() + b->size);
  return all;
}

// A CSR table with fuzzed structure and entries.
struct Csr {
  std::vector<int32_t> indptr, indices, last;
};
Csr draw_csr(Draw& d, const PoolGeometry& g, int32_t batch) {
  Csr c;
  c.indptr.push_back(d.small(0, 7) == 0 ? d.i32(-1, 2) : 0);
  for (int32_t b = 0; b < batch; ++b) c.indptr.push_back(wrap_add(c.indptr.back(), d.i32(-1, 4)));
  if (d.small(0, 7) == 0) c.indptr.resize(d.small(0, batch + 2));
  const int32_t n = c.indptr.empty() ? 0 : c.indptr.back();
  const size_t count = n >= 0 && n <= 64 && d.small(0, 7) != 0 ? static_cast<size_t>(n) : d.small(0, 16);
  for (size_t i = 0; i < count; ++i) c.indices.push_back(d.i32(-2, static_cast<int32_t>(g.primary_blocks) + 1));
  for (int32_t b = 0; b < batch + (d.small(0, 7) == 0 ? d.small(-1, 1) : 0); ++b)
    c.last.push_back(d.i32(0, g.tokens_per_block + 1));
  return c;
}

// An append's coordinates: a CSR table of 1..3 sequences and nnz tokens whose
// (sequence, position) may each be out of range.
struct DrawnAppend {
  Csr c;
  int32_t nnz = 0;
  std::vector<int32_t> bi, pos;
  AppendCoordinates coordinates() const { return {bi, pos, c.indptr, c.indices, c.last}; }
};
DrawnAppend draw_append(Draw& d, const PoolGeometry& g, int32_t max_nnz) {
  DrawnAppend a;
  const int32_t batch = d.small(1, 3);
  a.c = draw_csr(d, g, batch);
  a.nnz = d.small(0, max_nnz);
  a.bi.resize(a.nnz);
  a.pos.resize(a.nnz);
  for (auto& x : a.bi) x = d.i32(-1, batch);
  for (auto& x : a.pos) x = d.i32(-1, 40);
  return a;
}

WindowMapping draw_window(Draw& d, const PoolGeometry& g) {
  if (d.flag()) return {};
  const int32_t W = d.flag() ? d.small(1, 40) : d.i32(0, 0x7FFFFFFF);
  const int32_t S = d.flag() ? d.small(0, 8) : (d.flag() ? wrap_add(W, -1) : d.i32(0, 0x7FFFFFFF));
  WindowMapping m = WindowMapping::make(W, S, d.flag() ? g.tokens_per_block : d.i32(1, 20), d.flag());
  if (d.small(0, 15) == 0) m.cyclic_len = d.i64(0, 4);  // a hand-built descriptor
  return m;
}

void run_one(Draw& d, Pools& p) {
  Backend& be = cpu();
  const PoolGeometry& g = p.pools.geometry;
  const KvPools& pools = p.pools;
  std::vector<Buffer> keep;
  keep.reserve(16);
  const int32_t layer = d.i32(0, g.layers);
  switch (d.small(0, 11)) {
    case 0: {  // append_paged
      DrawnAppend at = draw_append(d, g, 12);
      const int32_t nnz = at.nnz;
      if (d.small(0, 7) == 0) at.pos.resize(d.small(0, nnz));
      const CacheDtype in = d.flag() ? (g.dtype == CacheDtype::nvfp4 ? float_dtype(d) : g.dtype) : any_dtype(d);
      AppendPagedOp op;
      op.layer = layer;
      op.k = tensor(keep, in, {nnz, g.kv_heads, g.head_dim});
      op.v = tensor(keep, in, {nnz, g.kv_heads, d.flag() ? g.head_dim : d.small(1, 64)});
      op.coordinates() = at.coordinates();
      op.k_global_scale = d.flag() ? 1.0f : d.scale();
      op.v_global_scale = d.flag() ? 1.0f : d.scale();
      be.append_paged(pools, op);
      break;
    }
    case 1: {  // reshape_and_cache
      const int32_t T = d.small(0, 12);
      std::vector<int64_t> slots(T);
      for (auto& s : slots) s = d.i64(-2, g.primary_blocks * g.tokens_per_block + 2);
      const CacheDtype in = d.flag() ? g.dtype : any_dtype(d);
      ReshapeAndCacheOp op;
      op.layer = layer;
      op.key = tensor(keep, in, {T, g.kv_heads, g.head_dim});
      op.value = tensor(keep, in, {T, g.kv_heads, g.head_dim});
      op.slot_mapping = slots;
      op.k_scale = d.flag() ? 1.0f : d.scale();
      op.v_scale = d.flag() ? 1.0f : d.scale();
      be.reshape_and_cache(pools, op);
      break;
    }
    case 2: {  // qkv_preprocess_write
      const int32_t batch = d.small(1, 3);
      std::vector<int32_t> seq(batch), cache(batch), offsets;
      int64_t tokens = 0;
      for (int32_t b = 0; b < batch; ++b) {
        seq[b] = d.i32(0, 5);
        cache[b] = wrap_add(seq[b], d.i32(0, 12));
        tokens += seq[b] > 0 && seq[b] <= 64 ? seq[b] : 0;
      }
      if (d.flag()) offsets.assign(batch, d.i32(-2, 4));
      const int32_t max_blocks = d.i32(0, 6);
      std::vector<int32_t> table(static_cast<size_t>(batch) * (max_blocks >= 0 && max_blocks <= 64 ? max_blocks : 0));
      for (auto& x : table) x = d.i32(-1, static_cast<int32_t>(g.primary_blocks));
      const int32_t hq = g.kv_heads * d.small(1, 2);
      const CacheDtype in = is_float_input(g.dtype) ? g.dtype : float_dtype(d);
      QkvPreprocessOp op;
      op.layer = layer;
      op.num_q_heads = d.flag() ? hq : d.i32(0, 8);
      const int64_t width = static_cast<int64_t>(hq + 2 * g.kv_heads) * g.head_dim;
      op.qkv = tensor(keep, in, {tokens, width});
      op.q_out = tensor(keep, in, {tokens, hq, g.head_dim});
      if (d.flag()) op.bias = tensor(keep, in, {width});
      RopeTable rope;
      if (d.flag() && g.head_dim % 2 == 0) {
        rope = build_rope_table(g.head_dim, 48);
        op.rope_style = d.flag() ? RopeStyle::neox : RopeStyle::gptj;
        op.rotary_dim = d.flag() ? g.head_dim : d.i32(0, g.head_dim + 2);
        op.cos_sin = contiguous_view(rope.cos_sin.data(), CacheDtype::fp32, {48, g.head_dim});
      }
      op.seq_lens = seq;
      op.cache_lens = cache;
      op.position_offsets = offsets;
      op.block_table = table;
      op.max_blocks_per_seq = max_blocks;
      op.window = draw_window(d, g);
      op.context_phase = d.flag();
      op.zero_v_tail = d.flag();
      for (int i = 1; i < 3; ++i) {
        op.scale_orig_quant[i] = d.flag() ? 1.0f : d.scale();
        op.nvfp4_global_scale[i] = d.flag() ? 1.0f : d.scale();
      }
      be.qkv_preprocess_write(pools, op);
      break;
    }
    case 3: {  // append_mla
      const DrawnAppend at = draw_append(d, g, 8);
      const int32_t nnz = at.nnz;
      const int64_t d_ckv = d.flag() ? 16 : d.small(1, 40);
      const int64_t rest = g.head_dim - d_ckv;
      const int64_t d_kpe = g.dtype == CacheDtype::nvfp4 ? (rest > 1 ? rest / 2 : 1) : (rest > 0 ? rest : 1);
      AppendMlaOp op;
      op.layer = layer;
      op.ckv = tensor(keep, d.flag() ? g.dtype : float_dtype(d), {nnz, d_ckv});
      op.kpe = tensor(keep, d.flag() ? g.dtype : (d.flag() ? CacheDtype::fp8_e4m3 : float_dtype(d)), {nnz, d_kpe});
      op.coordinates() = at.coordinates();
      op.ckv_global_scale = d.flag() ? 1.0f : d.scale();
      op.kpe_scale = d.flag() ? 1.0f : d.scale();
      be.append_mla(pools, op);
      break;
    }
    case 4: {  // indexer_k_scatter: its own strided byte cache, memory for its whole span
      int64_t shape[4], stride[4], span = 1;
      for (int i = 0; i < 4; ++i) shape[i] = d.flag() ? d.small(1, 6) : d.i64(0, 8);
      for (int i = 0; i < 4; ++i) stride[i] = d.flag() ? d.small(0, 64) : d.i64(-1, 300);
      bool sane = true;
      for (int i = 0; i < 4; ++i) {
        sane = sane && shape[i] >= 1 && shape[i] <= 64 && stride[i] >= 0 && stride[i] <= 4096;
        if (sane) span += stride[i] * (shape[i] - 1);
      }
      keep.emplace_back(sane ? static_cast<size_t>(span) : 1);
      TensorView cache;
      cache.data = keep.back().bytes.get();
      cache.dtype = d.flag() ? CacheDtype::fp8_e4m3 : any_dtype(d);
      cache.rank = d.flag() ? 4 : d.small(0, 4);
      for (int i = 0; i < 4; ++i) {
        cache.shape[i] = shape[i];
        cache.stride[i] = stride[i];
      }
      if (!sane) {  // the validator still sees the shape/stride; memory is only the span it could address
        bool rejects = false;
        for (int i = 0; i < 4; ++i) rejects = rejects || shape[i] < 1 || stride[i] < 0;
        if (!rejects) return;  // an accepted huge tensor would claim memory this buffer does not have
      }
      const int32_t T = d.small(0, 6);
      const int64_t D = d.small(1, 8);
      std::vector<int64_t> fp8(T), sc(T);
      for (auto& x : fp8) x = d.i64(-1, 80);
      for (auto& x : sc) x = d.i64(-1, 80);
      IndexerKScatterOp op;
      op.k_fp8 = tensor(keep, CacheDtype::fp8_e4m3, {T, D});
      op.k_scale = tensor(keep, d.flag() ? CacheDtype::int8 : any_dtype(d), {T, d.flag() ? 4 : d.small(1, 5)});
      op.slot_mapping_fp8 = fp8;
      op.slot_mapping_scale = sc;
      op.cache = cache;
      const std::vector<uint8_t> before(keep.front().bytes.get(), keep.front().bytes.get() + keep.front().size);
      try {
        be.indexer_k_scatter(op);
      } catch (const ValidationError&) {
        if (std::memcmp(before.data(), cache.data, before.size()) != 0) std::abort();  // rejected => unchanged
      }
      return;
    }
    case 5: {  // gather_paged
      std::vector<int32_t> ids = d.list32(8, -2, static_cast<int32_t>(g.primary_blocks) + 1);
      const int64_t n = d.i64(-1, 40);
      GatherPagedOp op;
      op.layer = layer;
      op.kv = d.i32(0, 2);
      op.block_ids = ids;
      op.num_tokens = n;
      op.out = tensor(keep, d.flag() ? CacheDtype::fp32 : any_dtype(d), {n >= 0 && n <= 64 ? n : 0, g.kv_heads, g.head_dim});
      op.scale = d.flag() ? 1.0f : d.scale();
      op.global_scale = d.flag() ? 1.0f : d.scale();
      be.gather_paged(pools, op);
      break;
    }
    case 6:
    case 7: {  // decode_attention / prefill_attention
      const int32_t batch = d.small(1, 3);
      std::vector<int32_t> lens(batch), qptr{0};
      for (auto& x : lens) x = d.i32(1, 40);
      for (int32_t b = 0; b < batch; ++b) qptr.push_back(wrap_add(qptr.back(), d.i32(0, 4)));
      const int32_t max_blocks = d.i32(0, 8);
      std::vector<int32_t> table(static_cast<size_t>(batch) * (max_blocks >= 0 && max_blocks <= 64 ? max_blocks : 0));
      for (auto& x : table) x = d.i32(-1, static_cast<int32_t>(g.primary_blocks));
      const int32_t hq = g.kv_heads * d.small(1, 2);
      AttentionScales sc;
      sc.sm_scale = d.flag() ? 0.125f : d.scale();
      sc.k_global_scale = d.flag() ? 1.0f : d.scale();
      sc.v_global_scale = d.flag() ? 1.0f : d.scale();
      const WindowMapping w = draw_window(d, g);
      const CacheDtype qt = d.flag() ? CacheDtype::fp32 : any_dtype(d);
      const auto query = [&](int64_t rows) {
        return PagedAttentionQuery{.layer = layer,
                                   .q = tensor(keep, qt, {rows, hq, g.head_dim}),
                                   .out = tensor(keep, qt, {rows, hq, g.head_dim}),
                                   .seq_lens = lens,
                                   .block_table = table,
                                   .max_blocks_per_seq = max_blocks,
                                   .scales = sc,
                                   .window = w};
      };
      if (d.small(0, 1) == 0) {
        DecodeAttentionOp op;
        op.query() = query(batch);
        be.decode_attention(pools, op);
      } else {
        PrefillAttentionOp op;
        op.query() = query(qptr.back() >= 0 && qptr.back() <= 64 ? qptr.back() : 0);
        op.q_indptr = qptr;
        be.prefill_attention(pools, op);
      }
      break;
    }
    case 8: {
      PartialCopyOp op;
      op.src_block = d.i32(-1, static_cast<int32_t>(g.primary_blocks));
      op.dst_block = d.i32(-1, static_cast<int32_t>(g.primary_blocks));
      op.num_tokens = d.i32(-1, g.tokens_per_block + 1);
      be.partial_copy(pools, op);
      break;
    }
    case 9: {
      std::vector<std::pair<int32_t, int32_t>> pairs(d.small(0, 4));
      for (auto& pr : pairs) pr = {d.i32(-1, static_cast<int32_t>(g.primary_blocks)), d.i32(-1, static_cast<int32_t>(g.primary_blocks))};
      CopyBlocksOp op;
      op.pairs = pairs;
      be.copy_blocks(pools, op);
      break;
    }
    default: {  // offload / onboard
      const std::vector<int32_t> prim = d.list32(4, -1, static_cast<int32_t>(g.primary_blocks));
      const std::vector<int32_t> sec = d.list32(4, -1, static_cast<int32_t>(g.secondary_blocks));
      MoveBlocksOp op;
      op.primary = prim;
      op.secondary = sec;
      if (d.flag())
        be.offload(pools, op);
      else
        be.onboard(pools, op);
      break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  Draw d{in};
  PoolGeometry g;
  if (!draw_geometry(d, g)) return 0;
  Pools p;
  draw_pools(d, g, p);
  const std::vector<uint8_t> before = snapshot(p);
  try {
    run_one(d, p);
  } catch (const ValidationError&) {
    // Validation before mutation: a rejected op leaves every pool byte as it was.
    if (snapshot(p) != before) std::abort();
  }
  return 0;
}
