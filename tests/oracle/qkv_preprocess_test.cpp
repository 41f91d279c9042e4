// qkv_preprocess_write (contract §5.3, TensorRT-LLM applyBiasRopeUpdateKVCache)
// held byte-for-byte to an independent reference written here: scalar loops
// over logical coordinates, element offsets written out from the layout
// definitions (contract §2), its own RoPE loop from the formula in core/rope.hpp's
// comment over the same cos/sin table values, its own window mapping from
// contract §5.10, its own V-tail rule; only core's codecs are shared. Pools and
// q_out are poisoned first; the whole pool, scale pool and q_out buffer are
// compared, so every byte the op must not touch is checked too. Every case
// runs on 1, 2, 3 and all oneTBB threads. Then: chunked prefill equals one
// chunk, window wrap, V-tail zeroing against a NaN-poisoned pool, and every
// rejection path with all bytes unchanged.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "kvsim/validation.hpp"
#include "backends/backend.hpp"
#include "backends/cpu/cpu_backend.hpp"
#include "tests/support/rng.hpp"

using namespace kvsim;

namespace {

// ---------------------------------------------------------------- independent layout
int64_t ref_split_x(CacheDtype t) { return t == CacheDtype::fp32 ? 4 : (t == CacheDtype::fp16 || t == CacheDtype::bf16) ? 8 : 16; }

int64_t ref_bytes(CacheDtype t) {
  switch (t) {
    case CacheDtype::fp32: return 4;
    case CacheDtype::fp16:
    case CacheDtype::bf16: return 2;
    default: return 1;  // fp8, int8; nvfp4 handled as nibbles
  }
}

// Offset (elements) of (block, layer, kv, head, token, dim) in a contiguous
// pool with `blocks` blocks, `D` dims per head and the given layout.
int64_t ref_offset(const PoolGeometry& g, BlockLayout layout, int64_t D, int64_t x, int64_t block, int64_t layer,
                   int64_t kv, int64_t head, int64_t token, int64_t dim) {
  const int64_t H = g.kv_heads, P = g.tokens_per_block, L = g.layers, NB = g.primary_blocks;
  int64_t inner = 0;
  switch (layout) {
    case BlockLayout::nhd: inner = (token * H + head) * D + dim; break;  // [token][head][dim]
    case BlockLayout::hnd: inner = (head * P + token) * D + dim; break;  // [head][token][dim]
    case BlockLayout::split_x:
      inner = kv == 0 ? ((head * (D / x) + dim / x) * P + token) * x + dim % x  // K [head][dim/x][token][x]
                      : (head * D + dim) * P + token;                            // V [head][dim][token]
      break;
  }
  const int64_t sub = H * P * D;
  if (g.placement == LayerPlacement::in_block) return ((block * L + layer) * 2 + kv) * sub + inner;  // [block][layer][kv]
  return ((layer * NB + block) * 2 + kv) * sub + inner;                                               // [layer][block][kv]
}

int64_t ref_data_offset(const PoolGeometry& g, int64_t block, int64_t layer, int64_t kv, int64_t head, int64_t token,
                        int64_t dim) {
  return ref_offset(g, g.layout, g.head_dim, ref_split_x(g.dtype), block, layer, kv, head, token, dim);
}
// nvfp4 scale pool: the data pool's shape with head_dim / 16, one byte each.
int64_t ref_scale_offset(const PoolGeometry& g, int64_t block, int64_t layer, int64_t kv, int64_t head, int64_t token,
                         int64_t dim) {
  return ref_offset(g, g.layout, g.head_dim / 16, 1, block, layer, kv, head, token, dim / 16);
}

// ---------------------------------------------------------------- independent window mapping (contract §5.10)
struct RefWindow {
  int64_t W = 0, S = 0, P = 1;
  bool one_more = false;
  int64_t bubble() const { return S % P == 0 ? 0 : P - S % P; }
  int64_t cyclic() const { return one_more ? W + P - S : W - S; }
  int64_t slot(int64_t t) const { return W == 0 || t < S ? t : S + bubble() + (t - S) % cyclic(); }
  // Sinks and the last cyclic_len tokens are in the cache after a step.
  bool written(int64_t t, int64_t cache_len) const { return W == 0 || t < S || t >= cache_len - cyclic(); }
  int64_t occupied(int64_t len) const {
    if (W == 0 || len <= S) return len;
    return S + bubble() + std::min(len - S, cyclic());
  }
};

// ---------------------------------------------------------------- values
using testing::Rng;

float read_float(const std::vector<uint8_t>& bytes, CacheDtype t, int64_t elem) {
  if (t == CacheDtype::fp32) {
    float f;
    std::memcpy(&f, bytes.data() + elem * 4, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, bytes.data() + elem * 2, 2);
  return t == CacheDtype::fp16 ? codec::f16_to_f32(h) : codec::bf16_to_f32(h);
}

void write_float(std::vector<uint8_t>& bytes, CacheDtype t, int64_t elem, float v) {
  if (t == CacheDtype::fp32) {
    std::memcpy(bytes.data() + elem * 4, &v, 4);
    return;
  }
  const uint16_t h = t == CacheDtype::fp16 ? codec::f32_to_f16(v) : codec::f32_to_bf16(v);
  std::memcpy(bytes.data() + elem * 2, &h, 2);
}

void write_nibble(std::vector<uint8_t>& bytes, int64_t elem, uint8_t code) {
  uint8_t& b = bytes[elem / 2];
  b = elem % 2 == 0 ? static_cast<uint8_t>((b & 0xF0) | code) : static_cast<uint8_t>((b & 0x0F) | (code << 4));
}

// ---------------------------------------------------------------- one op call
struct Step {
  PoolGeometry g;
  int32_t layer = 0;
  int32_t hq = 1;
  CacheDtype in_dtype = CacheDtype::bf16;
  CacheDtype q_dtype = CacheDtype::bf16;
  RopeStyle style = RopeStyle::none;
  int32_t rotary_dim = 0;
  std::vector<int32_t> seq_lens, cache_lens, offsets, table;
  int32_t max_blocks = 0;
  RefWindow window;
  bool context = true, zero_tail = true;
  float scale_orig_quant[3] = {1.0f, 1.0f, 1.0f};
  float global_scale[3] = {1.0f, 1.0f, 1.0f};
  std::vector<uint8_t> qkv;   // [tokens][row_stride] elements of in_dtype
  int64_t row_stride = 0;
  std::vector<uint8_t> bias;  // empty: none
  const RopeTable* rope = nullptr;

  int64_t width() const { return static_cast<int64_t>(hq + 2 * g.kv_heads) * g.head_dim; }
  int64_t tokens() const { return std::accumulate(seq_lens.begin(), seq_lens.end(), int64_t{0}); }
  // q_out: [tokens][hq][D] with a gap of 2 elements after each head.
  int64_t q_head_stride() const { return g.head_dim + 2; }
  int64_t q_row_stride() const { return hq * q_head_stride(); }
  int64_t q_bytes() const { return tokens() * q_row_stride() * ref_bytes(q_dtype); }
  WindowMapping mapping() const {
    return window.W == 0 ? WindowMapping{} : WindowMapping::make(static_cast<int32_t>(window.W), static_cast<int32_t>(window.S),
                                                                 g.tokens_per_block, window.one_more);
  }
};

// A step on `g` writing `layer` with hq query heads of `in` input (q_out the same dtype).
Step make_step(const PoolGeometry& g, int32_t layer, int32_t hq, CacheDtype in) {
  Step st;
  st.g = g;
  st.layer = layer;
  st.hq = hq;
  st.in_dtype = st.q_dtype = in;
  return st;
}

// Pool contents (primary data + scales) and q_out.
struct State {
  std::vector<uint8_t> pool, scales, q;
  bool operator==(const State&) const = default;
};

// ---------------------------------------------------------------- the reference
void ref_rope(float* x, const float* row, int32_t R, RopeStyle style) {
  // core/rope.hpp: pairs (i, i + R/2) for NeoX, (2i, 2i + 1) for GPT-J;
  // a' = a*c - b*s, b' = b*c + a*s with c = row[i], s = row[R/2 + i].
  for (int32_t i = 0; i < R / 2; ++i) {
    const int32_t ia = style == RopeStyle::neox ? i : 2 * i;
    const int32_t ib = style == RopeStyle::neox ? i + R / 2 : 2 * i + 1;
    const float c = row[i], s = row[R / 2 + i];
    const float a = x[ia], b = x[ib];
    const float ac = a * c, bs = b * s, bc = b * c, as = a * s;
    x[ia] = ac - bs;
    x[ib] = bc + as;
  }
}

void ref_store_row(const Step& st, State& s, int64_t block, int64_t kv, int64_t head, int64_t entry,
                   const std::vector<float>& x) {
  const PoolGeometry& g = st.g;
  const int64_t D = g.head_dim;
  const float scale = st.scale_orig_quant[1 + kv];
  if (g.dtype == CacheDtype::nvfp4) {
    for (int64_t d0 = 0; d0 < D; d0 += 16) {
      uint8_t packed[8];
      const uint8_t sf = codec::nvfp4_quantize16(x.data() + d0, st.global_scale[1 + kv], packed);
      for (int64_t i = 0; i < 16; ++i)
        write_nibble(s.pool, ref_data_offset(g, block, st.layer, kv, head, entry, d0 + i),
                     i % 2 == 0 ? packed[i / 2] & 0xF : packed[i / 2] >> 4);
      s.scales[ref_scale_offset(g, block, st.layer, kv, head, entry, d0)] = sf;
    }
    return;
  }
  for (int64_t d = 0; d < D; ++d) {
    const int64_t off = ref_data_offset(g, block, st.layer, kv, head, entry, d);
    switch (g.dtype) {
      case CacheDtype::fp32:
      case CacheDtype::fp16:
      case CacheDtype::bf16: write_float(s.pool, g.dtype, off, x[d]); break;
      case CacheDtype::fp8_e4m3: s.pool[off] = codec::f32_to_e4m3(x[d] * scale, codec::Saturation::finite); break;
      case CacheDtype::fp8_e5m2: s.pool[off] = codec::f32_to_e5m2(x[d] * scale, codec::Saturation::finite); break;
      case CacheDtype::int8: s.pool[off] = static_cast<uint8_t>(codec::f32_to_int8(x[d] * scale)); break;
      default: FAIL("unexpected dtype");
    }
  }
}

void ref_zero_row(const Step& st, State& s, int64_t block, int64_t head, int64_t entry) {
  const PoolGeometry& g = st.g;
  for (int64_t d = 0; d < g.head_dim; ++d) {
    const int64_t off = ref_data_offset(g, block, st.layer, 1, head, entry, d);
    if (g.dtype == CacheDtype::nvfp4) {
      write_nibble(s.pool, off, 0);
      if (d % 16 == 0) s.scales[ref_scale_offset(g, block, st.layer, 1, head, entry, d)] = 0;
    } else {
      for (int64_t i = 0; i < ref_bytes(g.dtype); ++i) s.pool[off * ref_bytes(g.dtype) + i] = 0;
    }
  }
}

void reference(const Step& st, State& s) {
  const PoolGeometry& g = st.g;
  const int64_t H = g.kv_heads, D = g.head_dim, P = g.tokens_per_block, R = st.rotary_dim;
  int64_t row = 0;
  std::vector<float> x(D);
  for (size_t b = 0; b < st.seq_lens.size(); ++b) {
    const int64_t cache_len = st.cache_lens[b], past = cache_len - st.seq_lens[b];
    for (int64_t t = 0; t < st.seq_lens[b]; ++t, ++row) {
      const int64_t pos = past + t;
      const int64_t rot = pos + (st.offsets.empty() ? 0 : st.offsets[b]);
      for (int64_t h = 0; h < st.hq + 2 * H; ++h) {
        for (int64_t d = 0; d < D; ++d) {
          x[d] = read_float(st.qkv, st.in_dtype, row * st.row_stride + h * D + d);
          if (!st.bias.empty()) x[d] = x[d] + read_float(st.bias, st.in_dtype, h * D + d);
        }
        const bool is_q = h < st.hq, is_k = !is_q && h < st.hq + H;
        if ((is_q || is_k) && st.style != RopeStyle::none) ref_rope(x.data(), st.rope->cos_sin.data() + rot * R, static_cast<int32_t>(R), st.style);
        if (is_q) {
          for (int64_t d = 0; d < D; ++d) write_float(s.q, st.q_dtype, row * st.q_row_stride() + h * st.q_head_stride() + d, x[d]);
          continue;
        }
        if (!st.window.written(pos, cache_len)) continue;
        const int64_t slot = st.window.slot(pos);
        const int64_t block = st.table[b * st.max_blocks + slot / P];
        const int64_t kv = is_k ? 0 : 1, head = is_k ? h - st.hq : h - st.hq - H;
        ref_store_row(st, s, block, kv, head, slot % P, x);
      }
    }
    if (st.context && st.zero_tail && st.seq_lens[b] > 0) {
      // Rows after the highest occupied slot, to the end of its block.
      const int64_t last = st.window.occupied(cache_len) - 1;
      const int64_t block = st.table[b * st.max_blocks + last / P];
      for (int64_t e = last % P + 1; e < P; ++e)
        for (int64_t head = 0; head < H; ++head) ref_zero_row(st, s, block, head, e);
      // The bubble after the sinks, once the sequence is past them.
      if (st.window.W > 0 && cache_len > st.window.S)
        for (int64_t slot = st.window.S; slot < st.window.S + st.window.bubble(); ++slot)
          for (int64_t head = 0; head < H; ++head)
            ref_zero_row(st, s, st.table[b * st.max_blocks + slot / P], head, slot % P);
    }
  }
}

// ---------------------------------------------------------------- the backend side
QkvPreprocessOp make_op(const Step& st, void* qkv, void* bias, void* q_out, void* cos_sin) {
  QkvPreprocessOp op;
  op.layer = st.layer;
  op.num_q_heads = st.hq;
  const int64_t T = st.tokens();
  op.qkv = contiguous_view(qkv, st.in_dtype, {T, st.width()});
  op.qkv.stride[0] = st.row_stride;
  if (!st.bias.empty()) op.bias = contiguous_view(bias, st.in_dtype, {st.width()});
  op.q_out = contiguous_view(q_out, st.q_dtype, {T, st.hq, st.g.head_dim});
  op.q_out.stride[0] = st.q_row_stride();
  op.q_out.stride[1] = st.q_head_stride();
  op.rope_style = st.style;
  op.rotary_dim = st.rotary_dim;
  if (st.rope) op.cos_sin = contiguous_view(cos_sin, CacheDtype::fp32, {st.rope->max_position, st.rope->rotary_dim});
  op.seq_lens = st.seq_lens;
  op.cache_lens = st.cache_lens;
  op.position_offsets = st.offsets;
  op.block_table = st.table;
  op.max_blocks_per_seq = st.max_blocks;
  op.window = st.mapping();
  op.context_phase = st.context;
  op.zero_v_tail = st.zero_tail;
  for (int i = 0; i < 3; ++i) {
    op.scale_orig_quant[i] = st.scale_orig_quant[i];
    op.nvfp4_global_scale[i] = st.global_scale[i];
  }
  return op;
}

// A backend with pools and op buffers; pools keep their bytes across steps.
struct Harness {
  std::unique_ptr<Backend> be;
  KvPools pools;
  BackendBuffer qkv, bias, q, cos_sin;

  Harness(int threads, const PoolGeometry& g, uint8_t poison) : be(make_backend("cpu", {threads})) {
    pools = be->allocate_pools(g, poison);
  }
  // The CPU backend at one instruction set (its qkv item is a clone per ISA).
  Harness(CpuIsa isa, const PoolGeometry& g, uint8_t poison) : be(std::make_unique<CpuBackend>(1, isa)) {
    pools = be->allocate_pools(g, poison);
  }
  ~Harness() { be->release_pools(pools); }

  // Uploads the step's inputs, fills q_out with `q_poison`, builds the op.
  QkvPreprocessOp prepare(const Step& st, uint8_t q_poison = 0x5A) {
    qkv = BackendBuffer(*be, st.qkv.size());
    qkv.upload(st.qkv.data(), st.qkv.size());
    bias = BackendBuffer(*be, st.bias.size());
    if (!st.bias.empty()) bias.upload(st.bias.data(), st.bias.size());
    q = BackendBuffer(*be, static_cast<size_t>(st.q_bytes()));
    if (q.bytes()) be->fill(q.get(), q_poison, q.bytes());
    if (st.rope) {
      cos_sin = BackendBuffer(*be, st.rope->cos_sin.size() * sizeof(float));
      cos_sin.upload(st.rope->cos_sin.data(), cos_sin.bytes());
    }
    return make_op(st, qkv.get(), bias.get(), q.get(), st.rope ? cos_sin.get() : nullptr);
  }
  State state() const {
    const PoolGeometry& g = pools.geometry;
    State s;
    s.pool.resize(static_cast<size_t>(g.pool_bytes(PoolKind::primary)));
    be->to_host(s.pool.data(), pools.data[0], s.pool.size());
    if (g.has_scale_pool()) {
      s.scales.resize(static_cast<size_t>(scale_pool_bytes(g, PoolKind::primary)));
      be->to_host(s.scales.data(), pools.scales[0], s.scales.size());
    }
    s.q.resize(q.bytes());
    if (q.bytes()) q.download(s.q.data(), q.bytes());
    return s;
  }
  std::vector<uint8_t> secondary() const {
    std::vector<uint8_t> v(static_cast<size_t>(pools.geometry.pool_bytes(PoolKind::secondary)));
    if (!v.empty()) be->to_host(v.data(), pools.data[1], v.size());
    return v;
  }
};

std::string first_difference(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  if (got.size() != want.size()) return "sizes " + std::to_string(got.size()) + " vs " + std::to_string(want.size());
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i])
      return "byte " + std::to_string(i) + ": got " + std::to_string(got[i]) + ", want " + std::to_string(want[i]);
  return "equal";
}

void check_state(const State& got, const State& want, const std::string& what) {
  INFO(what);
  CHECK_MESSAGE(got.pool == want.pool, "pool: " << first_difference(got.pool, want.pool));
  CHECK_MESSAGE(got.scales == want.scales, "scales: " << first_difference(got.scales, want.scales));
  CHECK_MESSAGE(got.q == want.q, "q_out: " << first_difference(got.q, want.q));
}

// Fills the fused QKV (and bias) with values exact in the input dtype: mostly
// in [-3, 3], some large (saturation paths), some heads all zero (nvfp4 amax 0).
void fill_inputs(Step& st, Rng& rng, bool with_bias) {
  const int64_t T = st.tokens(), width = st.width(), D = st.g.head_dim;
  st.row_stride = width + 5;  // padded rows: the op must honour the stride
  const int64_t eb = ref_bytes(st.in_dtype);
  st.qkv.assign(static_cast<size_t>(T * st.row_stride * eb), 0x77);
  for (int64_t r = 0; r < T; ++r)
    for (int64_t h = 0; h < width / D; ++h) {
      const bool zero_head = rng.uniform(0, 40) == 0;
      for (int64_t d = 0; d < D; ++d) {
        float v = zero_head ? 0.0f : rng.real(-3.0f, 3.0f);
        if (!zero_head && rng.uniform(0, 60) == 0) v *= 80.0f;
        write_float(st.qkv, st.in_dtype, r * st.row_stride + h * D + d, v);
      }
    }
  st.bias.clear();
  if (with_bias) {
    st.bias.resize(static_cast<size_t>(width * eb));
    for (int64_t c = 0; c < width; ++c) write_float(st.bias, st.in_dtype, c, rng.real(-0.5f, 0.5f));
  }
}

CacheDtype input_dtype_for(CacheDtype cache, int variant) {
  if (cache == CacheDtype::fp32 || cache == CacheDtype::fp16 || cache == CacheDtype::bf16) return cache;
  constexpr CacheDtype inputs[] = {CacheDtype::bf16, CacheDtype::fp16, CacheDtype::fp32};
  return inputs[variant % 3];
}

// Pages each sequence writes in a step (own rules), for table construction.
std::vector<int64_t> written_pages(const Step& st, size_t b) {
  const int64_t P = st.g.tokens_per_block, cache_len = st.cache_lens[b];
  std::vector<int64_t> pages;
  for (int64_t pos = cache_len - st.seq_lens[b]; pos < cache_len; ++pos)
    if (st.window.written(pos, cache_len)) pages.push_back(st.window.slot(pos) / P);
  if (st.context && st.zero_tail && st.seq_lens[b] > 0) {
    pages.push_back((st.window.occupied(cache_len) - 1) / P);
    if (st.window.W > 0 && cache_len > st.window.S && st.window.bubble() > 0) pages.push_back(st.window.S / P);
  }
  std::sort(pages.begin(), pages.end());
  pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
  return pages;
}

// Distinct random blocks for every page a sequence occupies; pages this step
// does not write are sometimes BAD_PAGE (validation must not look at them).
// Returns the number of primary blocks the pool needs (with spares).
int64_t build_table(Step& st, Rng& rng, int64_t spare_blocks) {
  const int64_t P = st.g.tokens_per_block;
  std::vector<int64_t> pages_needed(st.seq_lens.size());
  int64_t total = 0, widest = 0;
  for (size_t b = 0; b < st.seq_lens.size(); ++b) {
    pages_needed[b] = (st.window.occupied(st.cache_lens[b]) + P - 1) / P;
    total += pages_needed[b];
    widest = std::max(widest, pages_needed[b]);
  }
  const int64_t blocks = total + spare_blocks;
  std::vector<int32_t> ids(static_cast<size_t>(blocks));
  std::iota(ids.begin(), ids.end(), 0);
  for (size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[rng.next() % i]);
  st.max_blocks = static_cast<int32_t>(widest + 1);
  st.table.assign(st.seq_lens.size() * st.max_blocks, kBadPage);
  size_t next = 0;
  for (size_t b = 0; b < st.seq_lens.size(); ++b) {
    const std::vector<int64_t> written = written_pages(st, b);
    for (int64_t p = 0; p < pages_needed[b]; ++p) {
      const int32_t id = ids[next++];
      const bool is_written = std::binary_search(written.begin(), written.end(), p);
      st.table[b * st.max_blocks + p] = (is_written || rng.uniform(0, 2) != 0) ? id : kBadPage;
    }
  }
  return blocks;
}

// Every page a sequence occupies gets a live block (multi-step tests write
// pages a single step would not); grows the pool for the blocks added.
void make_all_pages_live(Step& st) {
  const int64_t P = st.g.tokens_per_block;
  int32_t next_free = *std::max_element(st.table.begin(), st.table.end()) + 1;
  for (size_t b = 0; b < st.seq_lens.size(); ++b) {
    const int64_t pages = (st.window.occupied(st.cache_lens[b]) + P - 1) / P;
    for (int64_t p = 0; p < pages; ++p) {
      int32_t& e = st.table[b * st.max_blocks + p];
      if (e == kBadPage) e = next_free++;
    }
  }
  st.g.primary_blocks = std::max<int64_t>(st.g.primary_blocks, next_free);
}

std::vector<int> thread_counts() { return {1, 2, 3, 0}; }

// Runs a step on every thread count from the same poisoned pools and checks
// each against the reference.
void check_step_all_threads(const Step& st, uint8_t poison, const std::string& what) {
  State want;
  {
    Harness h(1, st.g, poison);
    h.prepare(st);
    want = h.state();
  }
  reference(st, want);
  for (int threads : thread_counts()) {
    Harness h(threads, st.g, poison);
    const std::vector<uint8_t> secondary_before = h.secondary();
    h.be->qkv_preprocess_write(h.pools, h.prepare(st));
    check_state(h.state(), want, what + " threads=" + std::to_string(threads));
    CHECK(h.secondary() == secondary_before);
  }
  // Every instruction set this CPU runs (the default above is the widest).
  for (CpuIsa isa : {CpuIsa::portable, CpuIsa::avx2, CpuIsa::avx512}) {
    if (!cpu_isa_supported(isa) || isa == best_cpu_isa()) continue;
    Harness h(isa, st.g, poison);
    h.be->qkv_preprocess_write(h.pools, h.prepare(st));
    check_state(h.state(), want, what + " isa=" + cpu_isa_name(isa));
  }
}

const RopeTable& rope_table(int32_t R) {
  static std::vector<std::unique_ptr<RopeTable>> tables(kQkvMaxHeadDim + 1);
  if (!tables[R]) tables[R] = std::make_unique<RopeTable>(build_rope_table(R, 512));
  return *tables[R];
}

std::string describe(const Step& st) {
  std::string s = geometry_summary(st.g) + " hq=" + std::to_string(st.hq) + " in=" + std::string(dtype_name(st.in_dtype)) +
                  " q=" + std::string(dtype_name(st.q_dtype)) + " rope=" +
                  (st.style == RopeStyle::none ? "none" : st.style == RopeStyle::neox ? "neox" : "gptj") + "/" +
                  std::to_string(st.rotary_dim) + " bias=" + (st.bias.empty() ? "no" : "yes") + " window=" +
                  std::to_string(st.window.W) + "/" + std::to_string(st.window.S) + (st.window.one_more ? "+1" : "") +
                  " context=" + (st.context ? "1" : "0") + " zero_tail=" + (st.zero_tail ? "1" : "0") + " seqs=";
  for (size_t b = 0; b < st.seq_lens.size(); ++b)
    s += std::to_string(st.seq_lens[b]) + "/" + std::to_string(st.cache_lens[b]) + " ";
  return s;
}

void set_rope(Step& st, RopeStyle style, int32_t R) {
  st.style = style;
  st.rotary_dim = style == RopeStyle::none ? 0 : R;
  st.rope = style == RopeStyle::none ? nullptr : &rope_table(R);
}

void set_quant_scales(Step& st) {
  st.scale_orig_quant[1] = st.g.dtype == CacheDtype::int8 ? 21.5f : 37.5f;  // K: some values saturate
  st.scale_orig_quant[2] = st.g.dtype == CacheDtype::int8 ? 9.25f : 150.0f;
  st.global_scale[1] = 0.0125f;
  st.global_scale[2] = 0.03f;
}

constexpr CacheDtype kCacheDtypes[] = {CacheDtype::bf16,     CacheDtype::fp16,     CacheDtype::fp32, CacheDtype::fp8_e4m3,
                                       CacheDtype::fp8_e5m2, CacheDtype::int8,     CacheDtype::nvfp4};
constexpr int32_t kPageSizes[] = {1, 3, 7, 17, 16};
constexpr int32_t kHeadDims[] = {64, 80, 96, 128, 256};

}  // namespace

// ---------------------------------------------------------------- the sweep
TEST_CASE("qkv_preprocess_write IsEquivalentToRef over layouts, placements, dtypes, page sizes") {
  Rng rng{0x5eed};
  int cases = 0;
  // Features the sweep must reach (checked at the end, so a change in the
  // generator cannot silently drop them).
  int wrapped = 0, bubble_zeroed = 0, tail_zeroed = 0, empty_sequence = 0, decode = 0, partial_rotary = 0, gqa8 = 0;
  for (BlockLayout layout : {BlockLayout::nhd, BlockLayout::hnd, BlockLayout::split_x})
    for (LayerPlacement placement : {LayerPlacement::in_block, LayerPlacement::per_layer})
      for (CacheDtype dtype : kCacheDtypes) {
        if (layout == BlockLayout::split_x && dtype == CacheDtype::nvfp4) continue;
        for (int pi = 0; pi < 5; ++pi) {
          const int variant = cases++;
          Step st;
          st.g.layers = 2 + variant % 2;
          st.g.kv_factor = 2;
          st.g.kv_heads = 1 + variant % 2;
          st.g.tokens_per_block = kPageSizes[pi];
          st.g.head_dim = kHeadDims[(pi + variant / 5) % 5];
          st.g.dtype = dtype;
          st.g.layout = layout;
          st.g.placement = placement;
          st.g.secondary_blocks = 2;
          st.layer = variant % st.g.layers == 0 ? 1 : st.g.layers - 1;
          constexpr int32_t groups[] = {1, 4, 8};
          st.hq = st.g.kv_heads * groups[variant % 3];
          st.in_dtype = input_dtype_for(dtype, variant);
          // q_out usually in the input dtype, sometimes wider or narrower.
          st.q_dtype = variant % 7 == 3 ? CacheDtype::fp32 : variant % 7 == 5 ? CacheDtype::bf16 : st.in_dtype;
          const RopeStyle style = variant % 5 == 4 ? RopeStyle::none : (variant % 2 ? RopeStyle::gptj : RopeStyle::neox);
          const int32_t D = st.g.head_dim;
          const int32_t rotary_choices[] = {D, D / 2 - (D / 2) % 2, 16, 2};
          set_rope(st, style, rotary_choices[(variant / 2) % 4]);
          set_quant_scales(st);
          // Window on every third case: sinks (bubble when S % P != 0), rings that wrap.
          if (variant % 3 == 2) {
            const int32_t P = st.g.tokens_per_block;
            st.window.P = P;
            st.window.S = P == 1 ? variant % 2 : (variant % 4 == 0 ? P : 1 + variant % (P - 1));
            st.window.W = st.window.S + 2 * P + 3;
            st.window.one_more = variant % 6 == 5;
          } else {
            st.window.P = st.g.tokens_per_block;
          }
          st.context = variant % 4 != 1;
          st.zero_tail = variant % 8 != 6;
          constexpr int batches[] = {1, 3, 5};
          const int batch = batches[variant % 3];
          for (int b = 0; b < batch; ++b) {
            // Ragged: empty sequences, decode-like single tokens, chunks after a past.
            const int32_t seq = st.context ? static_cast<int32_t>(rng.uniform(b == 1 ? 0 : 1, 12)) : static_cast<int32_t>(rng.uniform(1, 2));
            const int32_t past = static_cast<int32_t>(rng.uniform(0, 1) ? rng.uniform(0, 30) : 0);
            st.seq_lens.push_back(seq);
            st.cache_lens.push_back(seq + past);
          }
          if (variant % 2 == 0)
            for (int b = 0; b < batch; ++b) st.offsets.push_back(static_cast<int32_t>(rng.uniform(0, 40)));
          st.g.primary_blocks = build_table(st, rng, 3);
          fill_inputs(st, rng, variant % 3 != 1);
          for (size_t b = 0; b < st.seq_lens.size(); ++b) {
            const int64_t len = st.cache_lens[b];
            const bool zeroing = st.context && st.zero_tail && st.seq_lens[b] > 0;
            wrapped += st.window.W > 0 && len - st.window.S > st.window.cyclic();
            bubble_zeroed += zeroing && st.window.W > 0 && st.window.bubble() > 0 && len > st.window.S;
            tail_zeroed += zeroing && st.window.occupied(len) % st.g.tokens_per_block != 0;
            empty_sequence += st.seq_lens[b] == 0;
          }
          decode += !st.context;
          partial_rotary += st.rotary_dim > 0 && st.rotary_dim < st.g.head_dim;
          gqa8 += st.hq == 8 * st.g.kv_heads;
          check_step_all_threads(st, 0xA5, describe(st));
        }
      }
  CHECK(cases == 200);
  CHECK(wrapped > 0);
  CHECK(bubble_zeroed > 0);
  CHECK(tail_zeroed > 0);
  CHECK(empty_sequence > 0);
  CHECK(decode > 0);
  CHECK(partial_rotary > 0);
  CHECK(gqa8 > 0);
  MESSAGE("sweep cases: " << cases << "; sequences wrapping their ring: " << wrapped << ", bubbles zeroed: "
                          << bubble_zeroed << ", tails zeroed: " << tail_zeroed << ", empty sequences: " << empty_sequence
                          << "; decode steps: " << decode << ", partial rotary: " << partial_rotary
                          << ", GQA 8: " << gqa8);
}

// ---------------------------------------------------------------- chunked prefill
namespace {
// Tokens [begin[b], end[b]) of every sequence of a one-chunk step, as the
// chunk that ends at end[b] (cache_len = end[b]).
Step slice(const Step& whole, const std::vector<int32_t>& begin, const std::vector<int32_t>& end) {
  Step st = whole;
  st.seq_lens.clear();
  st.cache_lens.clear();
  const int64_t eb = ref_bytes(whole.in_dtype);
  st.qkv.clear();
  int64_t row0 = 0;
  for (size_t b = 0; b < whole.seq_lens.size(); ++b) {
    st.seq_lens.push_back(end[b] - begin[b]);
    st.cache_lens.push_back(end[b]);
    const auto first = whole.qkv.begin() + (row0 + begin[b]) * whole.row_stride * eb;
    st.qkv.insert(st.qkv.end(), first, first + (end[b] - begin[b]) * whole.row_stride * eb);
    row0 += whole.seq_lens[b];
  }
  return st;
}
}  // namespace

TEST_CASE("qkv_preprocess_write: two chunks give the same pool bytes and Q as one chunk") {
  Rng rng{0xc4c4};
  int checked = 0;
  for (CacheDtype dtype : {CacheDtype::bf16, CacheDtype::fp32, CacheDtype::fp8_e4m3, CacheDtype::int8, CacheDtype::nvfp4})
    for (int windowed = 0; windowed < 2; ++windowed)
      for (bool zero_tail : {true, false}) {
        Step whole;
        whole.g = PoolGeometry{2, 2, 2, 7, 64, dtype, checked % 2 ? BlockLayout::hnd : BlockLayout::nhd,
                               checked % 3 ? LayerPlacement::in_block : LayerPlacement::per_layer, 1, 0};
        whole.layer = 1;
        whole.hq = 8;
        whole.in_dtype = input_dtype_for(dtype, checked);
        whole.q_dtype = whole.in_dtype;
        set_rope(whole, checked % 2 ? RopeStyle::gptj : RopeStyle::neox, 48);
        set_quant_scales(whole);
        whole.window.P = 7;
        if (windowed) {
          whole.window.S = 3;
          whole.window.W = 17;  // bubble 4, cyclic 14: a 40-token prompt wraps twice
        }
        whole.seq_lens = {40, 9, 23};
        whole.cache_lens = whole.seq_lens;
        whole.offsets = {0, 5, 11};
        whole.zero_tail = zero_tail;
        whole.g.primary_blocks = build_table(whole, rng, 2);
        make_all_pages_live(whole);  // a chunk writes pages the whole prompt's last chunk does not
        fill_inputs(whole, rng, true);
        const uint8_t poison = 0xFF;  // NaN in every float dtype and in e4m3

        Harness one(2, whole.g, poison);
        one.be->qkv_preprocess_write(one.pools, one.prepare(whole));
        const State one_state = one.state();
        State want;
        {
          Harness fresh(1, whole.g, poison);
          fresh.prepare(whole);
          want = fresh.state();
        }
        reference(whole, want);
        check_state(one_state, want, "one chunk vs reference");

        for (const std::vector<int32_t>& split : {std::vector<int32_t>{13, 1, 22}, std::vector<int32_t>{26, 8, 7},
                                                  std::vector<int32_t>{1, 4, 14}}) {
          INFO("dtype " << dtype_name(dtype) << " windowed " << windowed << " zero_tail " << zero_tail << " split "
                        << split[0] << "," << split[1] << "," << split[2]);
          const std::vector<int32_t> zeros(3, 0);
          const Step first = slice(whole, zeros, split);
          const Step second = slice(whole, split, whole.seq_lens);
          Harness two(3, whole.g, poison);
          two.be->qkv_preprocess_write(two.pools, two.prepare(first));
          const std::vector<uint8_t> q_first = two.state().q;
          two.be->qkv_preprocess_write(two.pools, two.prepare(second));
          const State two_state = two.state();
          CHECK_MESSAGE(two_state.pool == one_state.pool, first_difference(two_state.pool, one_state.pool));
          CHECK(two_state.scales == one_state.scales);
          // Q rows: the one-chunk rows of each sequence are chunk-1 rows then chunk-2 rows.
          const int64_t row_bytes = whole.q_row_stride() * ref_bytes(whole.q_dtype);
          std::vector<uint8_t> q_joined;
          int64_t r1 = 0, r2 = 0;
          for (size_t b = 0; b < 3; ++b) {
            q_joined.insert(q_joined.end(), q_first.begin() + r1 * row_bytes, q_first.begin() + (r1 + first.seq_lens[b]) * row_bytes);
            q_joined.insert(q_joined.end(), two_state.q.begin() + r2 * row_bytes,
                            two_state.q.begin() + (r2 + second.seq_lens[b]) * row_bytes);
            r1 += first.seq_lens[b];
            r2 += second.seq_lens[b];
          }
          CHECK_MESSAGE(q_joined == one_state.q, first_difference(q_joined, one_state.q));
          ++checked;
        }
      }
  MESSAGE("chunk splits checked: " << checked);
}

// ---------------------------------------------------------------- window
TEST_CASE("qkv_preprocess_write: windowed mapping with sinks wraps tokens into the ring") {
  Rng rng{0x3141};
  for (bool one_more : {false, true})
    for (int32_t P : {4, 5}) {
      Step st =
          make_step(PoolGeometry{1, 2, 1, P, 64, CacheDtype::fp32, BlockLayout::nhd, LayerPlacement::in_block, 1, 0}, 0,
                    1, CacheDtype::fp32);
      set_rope(st, RopeStyle::neox, 64);
      st.window = RefWindow{10, 3, P, one_more};  // S = 3: bubble P - 3
      st.seq_lens = {25};
      st.cache_lens = {25};
      st.g.primary_blocks = build_table(st, rng, 1);
      fill_inputs(st, rng, false);
      check_step_all_threads(st, 0xA5, "window " + describe(st));

      // Spot check written independently of the reference's loops: the newest
      // token sits at its ring slot, the sinks at their own slots.
      Harness h(0, st.g, 0xA5);
      h.be->qkv_preprocess_write(h.pools, h.prepare(st));
      const State s = h.state();
      const int64_t cyclic = one_more ? 10 + P - 3 : 7, bubble = P - 3;
      const int64_t slot24 = 3 + bubble + (24 - 3) % cyclic;
      const int64_t block = st.table[slot24 / P];
      // V is not rotated and fp32 is stored exactly: V[24][0] must equal the input.
      const float v_in = read_float(st.qkv, CacheDtype::fp32, 24 * st.row_stride + 2 * 64);
      const float v_pool = read_float(s.pool, CacheDtype::fp32, ref_data_offset(st.g, block, 0, 1, 0, slot24 % P, 0));
      CHECK(std::memcmp(&v_in, &v_pool, 4) == 0);
      const float v_sink = read_float(s.pool, CacheDtype::fp32, ref_data_offset(st.g, st.table[2 / P], 0, 1, 0, 2 % P, 5));
      const float v_sink_in = read_float(st.qkv, CacheDtype::fp32, 2 * st.row_stride + 2 * 64 + 5);
      CHECK(std::memcmp(&v_sink, &v_sink_in, 4) == 0);
    }
}

TEST_CASE("qkv_preprocess_write: a window longer than every sequence writes what no window writes") {
  Rng rng{0x2718};
  Step st =
      make_step(PoolGeometry{2, 2, 2, 3, 80, CacheDtype::bf16, BlockLayout::split_x, LayerPlacement::per_layer, 1, 0},
                1, 8, CacheDtype::bf16);
  set_rope(st, RopeStyle::gptj, 40);
  st.seq_lens = {7, 20, 1};
  st.cache_lens = {7, 26, 13};
  st.window.P = 3;
  st.g.primary_blocks = build_table(st, rng, 2);
  fill_inputs(st, rng, true);
  Harness plain(2, st.g, 0xA5);
  plain.be->qkv_preprocess_write(plain.pools, plain.prepare(st));
  QkvPreprocessOp windowed_op;
  Harness windowed(2, st.g, 0xA5);
  windowed_op = windowed.prepare(st);
  windowed_op.window = WindowMapping::make(64, 0, 3, false);
  windowed.be->qkv_preprocess_write(windowed.pools, windowed_op);
  CHECK(plain.state() == windowed.state());
}

// ---------------------------------------------------------------- V tail
TEST_CASE("qkv_preprocess_write: V-tail zeroing against a NaN-poisoned pool") {
  Rng rng{0xdead};
  for (CacheDtype dtype : {CacheDtype::bf16, CacheDtype::fp16, CacheDtype::fp32, CacheDtype::fp8_e4m3, CacheDtype::nvfp4})
    for (BlockLayout layout : {BlockLayout::nhd, BlockLayout::hnd, BlockLayout::split_x})
      for (bool context : {true, false})
        for (bool zero_tail : {true, false}) {
          if (dtype == CacheDtype::nvfp4 && layout == BlockLayout::split_x) continue;
          Step st;
          st.g = PoolGeometry{2, 2, 2, 7, 64, dtype, layout, LayerPlacement::in_block, 1, 0};
          st.layer = 0;
          st.hq = 4;
          st.in_dtype = input_dtype_for(dtype, 0);
          st.q_dtype = st.in_dtype;
          set_quant_scales(st);
          st.seq_lens = {10, 3};
          st.cache_lens = {10, 17};  // tails: entries 3..6 of page 1 and 3..6 of page 2
          st.context = context;
          st.zero_tail = zero_tail;
          st.window.P = 7;
          st.g.primary_blocks = build_table(st, rng, 1);
          fill_inputs(st, rng, false);
          INFO(describe(st));
          check_step_all_threads(st, 0xFF, "tail");

          Harness h(0, st.g, 0xFF);
          h.be->qkv_preprocess_write(h.pools, h.prepare(st));
          const State s = h.state();
          const bool zeroed = context && zero_tail;
          for (size_t b = 0; b < 2; ++b) {
            const int64_t last = st.cache_lens[b] - 1;
            const int64_t block = st.table[b * st.max_blocks + last / 7];
            for (int64_t e = last % 7 + 1; e < 7; ++e)
              for (int64_t head = 0; head < 2; ++head)
                for (int64_t d = 0; d < 64; ++d) {
                  // V tail: +0.0 when zeroed, the NaN poison otherwise; K tail: always poison.
                  const int64_t v = ref_data_offset(st.g, block, 0, 1, head, e, d);
                  const int64_t k = ref_data_offset(st.g, block, 0, 0, head, e, d);
                  float v_value, k_value;
                  if (dtype == CacheDtype::nvfp4) {
                    const uint8_t nib = (s.pool[v / 2] >> (4 * (v % 2))) & 0xF;
                    const uint8_t sf = s.scales[ref_scale_offset(st.g, block, 0, 1, head, e, d)];
                    v_value = zeroed ? codec::nvfp4_decode(nib, sf, 1.0f) : std::numeric_limits<float>::quiet_NaN();
                    if (!zeroed) CHECK(((s.pool[v / 2] >> (4 * (v % 2))) & 0xF) == 0xF);
                    k_value = std::numeric_limits<float>::quiet_NaN();
                    CHECK(((s.pool[k / 2] >> (4 * (k % 2))) & 0xF) == 0xF);
                  } else if (dtype == CacheDtype::fp8_e4m3) {
                    v_value = codec::e4m3_to_f32(s.pool[v]);
                    k_value = codec::e4m3_to_f32(s.pool[k]);
                  } else {
                    v_value = read_float(s.pool, dtype, v);
                    k_value = read_float(s.pool, dtype, k);
                  }
                  if (zeroed) {
                    REQUIRE(v_value == 0.0f);
                    REQUIRE(!std::signbit(v_value));
                  } else {
                    REQUIRE(std::isnan(v_value));
                  }
                  REQUIRE(std::isnan(k_value));
                }
          }
        }
}

TEST_CASE("qkv_preprocess_write: after the ring wraps, the tail zeroed is past the ring's end, never live rows") {
  // P = 4, W = 9, S = 2: bubble 2, cyclic 7; sinks in slots 0, 1, ring in
  // slots 4..10, slot 11 (page 2, entry 3) is never live.
  Rng rng{0xbeef};
  Step st = make_step(PoolGeometry{1, 2, 1, 4, 64, CacheDtype::fp32, BlockLayout::nhd, LayerPlacement::in_block, 1, 0},
                      0, 2, CacheDtype::fp32);
  st.window = RefWindow{9, 2, 4, false};
  // Tokens 14..18 -> slots 9, 10, 4, 5, 6: the newest (18) is page 1, entry 2;
  // slot 7 (page 1, entry 3) holds token 12, still inside the window.
  st.seq_lens = {5};
  st.cache_lens = {19};
  st.g.primary_blocks = build_table(st, rng, 1);
  make_all_pages_live(st);
  fill_inputs(st, rng, false);
  check_step_all_threads(st, 0xFF, "wrapped tail " + describe(st));

  Step earlier = st;  // tokens 0..13: token 12 lands in slot 7
  earlier.seq_lens = {14};
  earlier.cache_lens = {14};
  earlier.zero_tail = false;
  fill_inputs(earlier, rng, false);
  Harness h(2, st.g, 0xFF);
  h.be->qkv_preprocess_write(h.pools, h.prepare(earlier));
  const State before = h.state();
  h.be->qkv_preprocess_write(h.pools, h.prepare(st));
  const State after = h.state();
  const int64_t page1 = st.table[1], page2 = st.table[2];
  for (int64_t d = 0; d < 64; ++d) {
    const int64_t live = ref_data_offset(st.g, page1, 0, 1, 0, 3, d);       // slot 7: token 12
    const int64_t past_ring = ref_data_offset(st.g, page2, 0, 1, 0, 3, d);  // slot 11
    CHECK(std::memcmp(after.pool.data() + live * 4, before.pool.data() + live * 4, 4) == 0);
    CHECK(!std::isnan(read_float(after.pool, CacheDtype::fp32, live)));
    CHECK(read_float(after.pool, CacheDtype::fp32, past_ring) == 0.0f);
  }
  State want = before;
  reference(st, want);
  want.q = after.q;  // q_out was re-poisoned by prepare(); Q is checked by the sweep
  CHECK(after.pool == want.pool);
}

// ---------------------------------------------------------------- thread counts
TEST_CASE("qkv_preprocess_write: results are identical for 1, 2, 3 and all threads on a larger step") {
  Rng rng{0x7777};
  Step st =
      make_step(PoolGeometry{2, 2, 4, 16, 128, CacheDtype::nvfp4, BlockLayout::hnd, LayerPlacement::per_layer, 1, 0}, 1,
                32, CacheDtype::bf16);
  set_rope(st, RopeStyle::neox, 128);
  set_quant_scales(st);
  st.window.P = 16;
  st.seq_lens = {97, 1, 64, 33, 0};
  st.cache_lens = {97, 50, 100, 33, 12};
  st.g.primary_blocks = build_table(st, rng, 2);
  fill_inputs(st, rng, true);
  std::vector<State> states;
  for (int threads : thread_counts()) {
    Harness h(threads, st.g, 0xA5);
    h.be->qkv_preprocess_write(h.pools, h.prepare(st));
    states.push_back(h.state());
  }
  for (size_t i = 1; i < states.size(); ++i) CHECK(states[i] == states[0]);
  State want;
  {
    Harness h(1, st.g, 0xA5);
    h.prepare(st);
    want = h.state();
  }
  reference(st, want);
  check_state(states[0], want, "large step");
}

// ---------------------------------------------------------------- work-item order
// Every output byte has one writer, so the work items commute: running core's
// work-item function in reverse and in shuffled order (schedules a thread pool
// may never produce on a small step) gives the reference bytes.
TEST_CASE("qkv_preprocess_write: core work items give the same bytes in any order") {
  Rng rng{0x0bad};
  for (int config = 0; config < 4; ++config) {
    Step st = make_step(PoolGeometry{2, 2, 2, config % 2 ? 5 : 4, 64, config < 2 ? CacheDtype::fp16 : CacheDtype::nvfp4,
                                     config % 2 ? BlockLayout::hnd : BlockLayout::nhd, LayerPlacement::in_block, 1, 0},
                        1, 4, CacheDtype::fp16);
    set_rope(st, RopeStyle::gptj, 64);
    set_quant_scales(st);
    st.window = RefWindow{config % 2 ? 13 : 11, 2, st.g.tokens_per_block, config == 3};  // rings that wrap in one chunk
    st.seq_lens = {30, 4, 19};
    st.cache_lens = {30, 26, 19};
    st.g.primary_blocks = build_table(st, rng, 1);
    fill_inputs(st, rng, true);
    State want;
    {
      Harness h(1, st.g, 0xFF);
      h.prepare(st);
      want = h.state();
    }
    reference(st, want);
    for (int order = 0; order < 2; ++order) {
      Harness h(1, st.g, 0xFF);
      const QkvPreprocessOp op = h.prepare(st);
      validate_qkv_preprocess(h.pools, op);
      const QkvPreprocessArgs args = make_qkv_preprocess_args(h.pools, op);
      struct Item {
        int32_t b, t;
        int64_t row;
        int32_t head;
      };
      std::vector<Item> items;
      int64_t row = 0;
      for (int32_t b = 0; b < 3; ++b)
        for (int32_t t = 0; t < st.seq_lens[b]; ++t, ++row)
          for (int32_t head = 0; head < st.g.kv_heads; ++head) items.push_back({b, t, row, head});
      if (order == 0) std::reverse(items.begin(), items.end());
      else
        for (size_t i = items.size(); i > 1; --i) std::swap(items[i - 1], items[rng.next() % i]);
      for (const Item& it : items) qkv_preprocess_token_head(h.pools, args, it.b, it.t, it.row, it.head);
      check_state(h.state(), want, std::string("order ") + (order == 0 ? "reversed" : "shuffled") + " config " +
                                       std::to_string(config));
    }
  }
}

// ---------------------------------------------------------------- rejections
namespace {
Step rejection_base(CacheDtype dtype, Rng& rng) {
  Step st;
  st.g = PoolGeometry{2, 2, 2, 4, 64, dtype, BlockLayout::nhd, LayerPlacement::in_block, 1, 1};
  st.layer = 1;
  st.hq = 4;
  st.in_dtype = st.q_dtype = input_dtype_for(dtype, 0);
  set_rope(st, RopeStyle::neox, 32);
  set_quant_scales(st);
  st.window.P = 4;
  st.seq_lens = {6, 3};
  st.cache_lens = {6, 9};
  st.g.primary_blocks = build_table(st, rng, 2);
  fill_inputs(st, rng, true);
  return st;
}

// Runs `mutate` on a valid op and expects `code` with every byte unchanged.
template <typename Mutate>
void expect_rejected(CacheDtype dtype, ErrorCode code, const char* what, Mutate mutate, const char* must_mention = nullptr) {
  INFO(std::string(what) << " (" << dtype_name(dtype) << ")");
  Rng rng{0x1234};
  Step st = rejection_base(dtype, rng);
  Harness h(2, st.g, 0xA5);
  QkvPreprocessOp op = h.prepare(st);
  KvPools pools = h.pools;
  // Keep mutated spans alive for the call.
  std::vector<int32_t> seq = st.seq_lens, cache = st.cache_lens, offsets, table = st.table;
  mutate(op, pools, seq, cache, offsets, table);
  const State before = h.state();
  const std::vector<uint8_t> secondary_before = h.secondary();
  try {
    h.be->qkv_preprocess_write(pools, op);
    FAIL("accepted: " << std::string(what));
  } catch (const ValidationError& e) {
    CHECK_MESSAGE(e.code() == code, "got " << e.name() << ": " << std::string(e.what()));
    if (must_mention) CHECK_MESSAGE(std::string(e.what()).find(must_mention) != std::string::npos, std::string(e.what()));
    MESSAGE(std::string(e.what()));
  }
  CHECK(h.state() == before);
  CHECK(h.secondary() == secondary_before);
}

}  // namespace

TEST_CASE("qkv_preprocess_write: every rejection path leaves every byte unchanged") {
  const CacheDtype bf = CacheDtype::bf16;
  // The valid base op runs (sanity: the mutations below are what fails).
  {
    Rng rng{0x1234};
    Step st = rejection_base(bf, rng);
    Harness h(2, st.g, 0xA5);
    CHECK_NOTHROW(h.be->qkv_preprocess_write(h.pools, h.prepare(st)));
  }
  expect_rejected(bf, ErrorCode::shape_mismatch, "qkv dtype int8", [](auto& op, auto&, auto&, auto&, auto&, auto&) {
    op.qkv.dtype = CacheDtype::int8;
  });
  expect_rejected(bf, ErrorCode::shape_mismatch, "qkv rank 3", [](auto& op, auto&, auto&, auto&, auto&, auto&) {
    op.qkv.rank = 3;
  });
  expect_rejected(bf, ErrorCode::shape_mismatch, "qkv width", [](auto& op, auto&, auto&, auto&, auto&, auto&) {
    op.qkv.shape[1] -= 64;
  });
  expect_rejected(bf, ErrorCode::shape_mismatch, "qkv rows != sum(seq_lens)", [](auto& op, auto&, auto&, auto&, auto&, auto&) {
    op.qkv.shape[0] += 1;
  });
  expect_rejected(bf, ErrorCode::shape_mismatch, "q_out heads", [](auto& op, auto&, auto&, auto&, auto&, auto&) {
    op.q_out.shape[1] = 2;
  });
  expect_rejected(bf, ErrorCode::shape_mismatch, "q_out dtype e4m3", [](auto& op, auto&, auto&, auto&, auto&, auto&) {
    op.q_out.dtype = CacheDtype::fp8_e4m3;
  });
  expect_rejected(bf, ErrorCode::shape_mismatch, "bias length", [](auto& op, auto&, auto&, auto&, auto&, auto&) {
    op.bias.shape[0] -= 1;
  });
  expect_rejected(bf, ErrorCode::shape_mismatch, "bias dtype", [](auto& op, auto&, auto&, auto&, auto&, auto&) {
    op.bias.dtype = CacheDtype::fp16;
  });
  expect_rejected(bf, ErrorCode::shape_mismatch, "bf16 cache with fp16 input", [](auto& op, auto&, auto&, auto&, auto&, auto&) {
    op.qkv.dtype = CacheDtype::fp16;
    op.bias.dtype = CacheDtype::fp16;
  });
  expect_rejected(bf, ErrorCode::shape_mismatch, "Hq % H != 0", [](auto& op, auto&, auto&, auto&, auto&, auto&) {
    op.num_q_heads = 3;
    op.qkv.shape[1] = (3 + 4) * 64;
    op.q_out.shape[1] = 3;
  });
  expect_rejected(bf, ErrorCode::bad_argument, "rotary_dim odd", [](auto& op, auto&, auto&, auto&, auto&, auto&) {
    op.rotary_dim = 31;
  });
  expect_rejected(bf, ErrorCode::bad_argument, "rotary_dim > D", [](auto& op, auto&, auto&, auto&, auto&, auto&) {
    op.rotary_dim = 66;
  });
  expect_rejected(bf, ErrorCode::bad_argument, "rotary_dim without style", [](auto& op, auto&, auto&, auto&, auto&, auto&) {
    op.rope_style = RopeStyle::none;
  });
  expect_rejected(bf, ErrorCode::shape_mismatch, "cos_sin width != rotary_dim", [](auto& op, auto&, auto&, auto&, auto&, auto&) {
    op.rotary_dim = 16;
  });
  expect_rejected(bf, ErrorCode::shape_mismatch, "cos_sin rows do not cover", [](auto& op, auto&, auto&, auto&, auto&, auto&) {
    op.cos_sin.shape[0] = 8;  // sequence 1 rotates positions 6..8
  });
  expect_rejected(bf, ErrorCode::shape_mismatch, "cos_sin rows do not cover the offset", [](auto& op, auto&, auto&, auto&, auto& offsets, auto&) {
    offsets = {0, 600};
    op.position_offsets = offsets;
  });
  expect_rejected(bf, ErrorCode::bad_argument, "negative rotary position", [](auto& op, auto&, auto&, auto&, auto& offsets, auto&) {
    offsets = {-1, 0};
    op.position_offsets = offsets;
  });
  expect_rejected(bf, ErrorCode::shape_mismatch, "position_offsets size", [](auto& op, auto&, auto&, auto&, auto& offsets, auto&) {
    offsets = {0};
    op.position_offsets = offsets;
  });
  expect_rejected(bf, ErrorCode::shape_mismatch, "cos_sin fp16", [](auto& op, auto&, auto&, auto&, auto&, auto&) {
    op.cos_sin.dtype = CacheDtype::fp16;
  });
  expect_rejected(bf, ErrorCode::position_beyond_sequence, "seq_len > cache_len", [](auto& op, auto&, auto& seq, auto& cache, auto&, auto&) {
    cache[0] = 5;
    op.cache_lens = cache;
    (void)seq;
  });
  expect_rejected(bf, ErrorCode::bad_argument, "negative seq_len", [](auto& op, auto&, auto& seq, auto&, auto&, auto&) {
    seq = {6, -1};
    op.seq_lens = seq;
  });
  expect_rejected(bf, ErrorCode::shape_mismatch, "cache_lens size", [](auto& op, auto&, auto&, auto& cache, auto&, auto&) {
    cache.push_back(1);
    op.cache_lens = cache;
  });
  expect_rejected(bf, ErrorCode::shape_mismatch, "block_table size", [](auto& op, auto&, auto&, auto&, auto&, auto& table) {
    table.pop_back();
    op.block_table = table;
  });
  expect_rejected(
      bf, ErrorCode::write_through_bad_page, "BAD_PAGE at a written slot",
      [](auto& op, auto&, auto&, auto&, auto&, auto& table) {
        table[op.max_blocks_per_seq + 1] = kBadPage;  // sequence 1, positions 6, 7 -> page 1
        op.block_table = table;
      },
      "token position 6");
  expect_rejected(
      bf, ErrorCode::write_through_bad_page, "BAD_PAGE at a page only the V tail writes",
      [](auto& op, auto&, auto& seq, auto& cache, auto&, auto& table) {
        // Window W = 9, S = 2, P = 4: ring slots 4..10. Sequence 1 writes token
        // 19 into slot 7 (page 1); its tail is slot 11 (page 2), now BAD_PAGE.
        op.window = WindowMapping::make(9, 2, 4, false);
        seq = {6, 1};
        cache = {6, 20};
        op.seq_lens = seq;
        op.cache_lens = cache;
        op.qkv.shape[0] = 7;
        op.q_out.shape[0] = 7;
        table[op.max_blocks_per_seq + 2] = kBadPage;
        op.block_table = table;
      },
      "V-tail zeroing");
  expect_rejected(bf, ErrorCode::secondary_not_onboarded, "secondary block", [](auto& op, auto&, auto&, auto&, auto&, auto& table) {
    table[0] = BlockRef::secondary(0).raw;
    op.block_table = table;
  });
  expect_rejected(bf, ErrorCode::block_out_of_range, "block id beyond the pool", [](auto& op, auto& pools, auto&, auto&, auto&, auto& table) {
    table[0] = static_cast<int32_t>(pools.geometry.primary_blocks);
    op.block_table = table;
  });
  expect_rejected(bf, ErrorCode::block_out_of_range, "negative block id other than BAD_PAGE", [](auto& op, auto&, auto&, auto&, auto&, auto& table) {
    table[1] = -7;  // top bit set: a secondary reference to a block far beyond the secondary pool
    op.block_table = table;
  });
  expect_rejected(bf, ErrorCode::shape_mismatch, "logical page beyond max_blocks_per_seq", [](auto& op, auto&, auto&, auto& cache, auto&, auto&) {
    cache = {6, 30};
    op.cache_lens = cache;
    op.cos_sin.shape[0] = 512;
  });
  expect_rejected(bf, ErrorCode::shared_block_write, "two sequences write one block", [](auto& op, auto&, auto&, auto&, auto&, auto& table) {
    table[op.max_blocks_per_seq + 2] = table[0];
    op.block_table = table;
  });
  expect_rejected(bf, ErrorCode::shared_block_write, "one sequence writes one block through two pages", [](auto& op, auto&, auto&, auto&, auto&, auto& table) {
    table[1] = table[0];
    op.block_table = table;
  });
  expect_rejected(bf, ErrorCode::bad_window, "sinks >= window", [](auto& op, auto&, auto&, auto&, auto&, auto&) {
    op.window = WindowMapping::make(4, 4, 4, false);
  });
  expect_rejected(bf, ErrorCode::bad_window, "window made for another page size", [](auto& op, auto&, auto&, auto&, auto&, auto&) {
    op.window = WindowMapping::make(8, 1, 8, false);
  });
  expect_rejected(bf, ErrorCode::bad_window, "window fields inconsistent", [](auto& op, auto&, auto&, auto&, auto&, auto&) {
    op.window = WindowMapping::make(8, 1, 4, false);
    op.window.cyclic_len = 3;
  });
  expect_rejected(bf, ErrorCode::bad_argument, "layer out of range", [](auto& op, auto&, auto&, auto&, auto&, auto&) {
    op.layer = 2;
  });
  expect_rejected(bf, ErrorCode::bad_argument, "negative layer", [](auto& op, auto&, auto&, auto&, auto&, auto&) {
    op.layer = -1;
  });
  expect_rejected(bf, ErrorCode::bad_geometry, "kv_factor 1", [](auto&, auto& pools, auto&, auto&, auto&, auto&) {
    pools.geometry.kv_factor = 1;
  });
  expect_rejected(bf, ErrorCode::unsupported_head_dim, "head_dim beyond the work item's register row", [](auto& op, auto& pools, auto&, auto&, auto&, auto&) {
    pools.geometry.head_dim = 1024;
    op.rope_style = RopeStyle::none;
    op.rotary_dim = 0;
  });
  expect_rejected(CacheDtype::nvfp4, ErrorCode::bad_global_scale, "nvfp4 K global scale 0", [](auto& op, auto&, auto&, auto&, auto&, auto&) {
    op.nvfp4_global_scale[1] = 0.0f;
  });
  expect_rejected(CacheDtype::nvfp4, ErrorCode::bad_global_scale, "nvfp4 V global scale negative", [](auto& op, auto&, auto&, auto&, auto&, auto&) {
    op.nvfp4_global_scale[2] = -1.0f;
  });
  expect_rejected(CacheDtype::nvfp4, ErrorCode::bad_global_scale, "nvfp4 V global scale NaN", [](auto& op, auto&, auto&, auto&, auto&, auto&) {
    op.nvfp4_global_scale[2] = std::numeric_limits<float>::quiet_NaN();
  });
  expect_rejected(CacheDtype::nvfp4, ErrorCode::bad_global_scale, "nvfp4 K global scale Inf", [](auto& op, auto&, auto&, auto&, auto&, auto&) {
    op.nvfp4_global_scale[1] = std::numeric_limits<float>::infinity();
  });
  expect_rejected(CacheDtype::nvfp4, ErrorCode::bad_strides, "nvfp4 odd token stride", [](auto&, auto& pools, auto&, auto&, auto&, auto&) {
    pools.strides[0].inner[1].token += 1;
  });
  expect_rejected(CacheDtype::fp8_e4m3, ErrorCode::bad_argument, "fp8 K scale Inf", [](auto& op, auto&, auto&, auto&, auto&, auto&) {
    op.scale_orig_quant[1] = std::numeric_limits<float>::infinity();
  });
  expect_rejected(CacheDtype::int8, ErrorCode::bad_argument, "int8 V scale 0", [](auto& op, auto&, auto&, auto&, auto&, auto&) {
    op.scale_orig_quant[2] = 0.0f;
  });
}
