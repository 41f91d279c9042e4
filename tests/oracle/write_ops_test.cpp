// Oracle tests of the write ops (contract §5.1 append_paged, §5.2
// reshape_and_cache, §5.4 append_mla, §5.5 indexer_k_scatter) on the CPU
// backend. Each op is checked against a reference written here: scalar loops
// over logical coordinates, with pool offsets computed from the layout
// definitions written out below (not from core's element_offset). Only core's
// number codecs are shared. Pools are poisoned (0xA5) first; every byte of
// every pool (primary, secondary, scales) must equal the reference, so bytes
// the op must not touch are checked too. Every case runs at 1, 2, 3 and all
// threads. Every rejection path checks its error code and that no byte moved.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kvsim/validation.hpp"
#include "backends/backend.hpp"
#include "backends/cpu/cpu_backend.hpp"
#include "tests/support/rng.hpp"

using namespace kvsim;

namespace {

constexpr uint8_t kPoison = 0xA5;
constexpr int32_t kPageSizes[] = {1, 3, 7, 17, 16};
constexpr int32_t kHeadDims[] = {64, 80, 96, 128, 256};
constexpr int32_t kBatches[] = {1, 3, 5};

// ---------------------------------------------------------------- deterministic random
using testing::Rng;

// ---------------------------------------------------------------- dtypes, written out
// Indexed by the enum's order (fp32, fp16, bf16, fp8_e4m3, fp8_e5m2, int8, nvfp4): a
// second statement of the widths, independent of core's bits_per_element.
int reference_bits(CacheDtype t) {
  constexpr int kBits[] = {32, 16, 16, 8, 8, 8, 4};
  return kBits[static_cast<int>(t)];
}
int element_size(CacheDtype t) { return reference_bits(t) / 8; }
int64_t reference_split_x(CacheDtype t) { return 128 / reference_bits(t); }  // elements per 16 bytes

// ---------------------------------------------------------------- pool layout, written out
// Block-inner order per contract §2; `pad` extra elements after every block (a
// caller-strided pool). Offsets in elements (nibbles for nvfp4).
struct RefLayout {
  PoolGeometry g;
  int64_t pad = 0;

  int64_t sub() const { return static_cast<int64_t>(g.kv_heads) * g.tokens_per_block * g.head_dim; }
  int64_t block_stride() const {
    return (g.placement == LayerPlacement::in_block ? g.layers * g.kv_factor * sub() : g.kv_factor * sub()) + pad;
  }
  int64_t primary_elements() const {
    return g.placement == LayerPlacement::in_block ? g.primary_blocks * block_stride()
                                                   : g.layers * g.primary_blocks * block_stride();
  }
  int64_t inner(int32_t kv, int32_t head, int32_t token, int32_t dim) const {
    const int64_t H = g.kv_heads, P = g.tokens_per_block, D = g.head_dim;
    switch (g.layout) {
      case BlockLayout::nhd: return (token * H + head) * D + dim;
      case BlockLayout::hnd: return (head * P + token) * D + dim;
      case BlockLayout::split_x: {
        if (kv == 1) return (head * D + dim) * P + token;  // V [head][dim][token]
        const int64_t x = reference_split_x(g.dtype);
        return ((head * (D / x) + dim / x) * P + token) * x + dim % x;  // K [head][dim/x][token][x]
      }
    }
    return -1;
  }
  int64_t offset(int64_t block, int32_t layer, int32_t kv, int32_t head, int32_t token, int32_t dim) const {
    const int64_t in = inner(kv, head, token, dim);
    if (g.placement == LayerPlacement::in_block)  // [block][layer][kv][inner]
      return block * block_stride() + (static_cast<int64_t>(layer) * g.kv_factor + kv) * sub() + in;
    // [layer][block][kv][inner]
    return static_cast<int64_t>(layer) * g.primary_blocks * block_stride() + block * block_stride() + kv * sub() + in;
  }
  // The nvfp4 scale pool: one byte per 16 elements, same order, never padded.
  RefLayout scales() const {
    RefLayout s;
    s.g = g;
    s.g.head_dim = g.head_dim / 16;
    s.g.dtype = CacheDtype::fp8_e4m3;
    return s;
  }
};

// The reference's own bounds check: an offset outside the pool is a bug in the layout under test.
void require_inside(bool inside, int64_t elem) {
  if (!inside) FAIL("reference offset " << elem << " lies outside the pool");
}
void put_bytes(std::vector<uint8_t>& pool, int64_t elem, const uint8_t* src, int size) {
  require_inside(elem >= 0 && static_cast<size_t>((elem + 1) * size) <= pool.size(), elem);
  std::memcpy(pool.data() + elem * size, src, static_cast<size_t>(size));
}
void put_nibble(std::vector<uint8_t>& pool, int64_t elem, uint8_t nibble) {
  require_inside(elem >= 0 && static_cast<size_t>(elem / 2) < pool.size(), elem);
  uint8_t& b = pool[static_cast<size_t>(elem / 2)];
  b = (elem % 2 == 0) ? static_cast<uint8_t>((b & 0xF0) | (nibble & 0xF)) : static_cast<uint8_t>((b & 0x0F) | (nibble << 4));
}

// ---------------------------------------------------------------- backends at 1, 2, 3 and all threads
// The CPU backend at its best ISA, then at 2 threads for every other ISA the
// machine runs (its write items are per-ISA clones: write_ops.cpp).
struct ThreadedBackend {
  int threads;
  std::string isa;
  std::unique_ptr<Backend> backend;
};
std::vector<ThreadedBackend>& thread_backends() {
  static std::vector<ThreadedBackend> all = [] {
    std::vector<ThreadedBackend> v;
    const int max_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    for (int t : {1, 2, 3, max_threads})
      v.push_back({t, cpu_isa_name(best_cpu_isa()), make_backend("cpu", BackendOptions{t})});
    for (CpuIsa isa : {CpuIsa::portable, CpuIsa::avx2, CpuIsa::avx512})
      if (cpu_isa_supported(isa) && isa != best_cpu_isa())
        v.push_back({2, cpu_isa_name(isa), std::make_unique<CpuBackend>(2, isa)});
    return v;
  }();
  return all;
}

// ---------------------------------------------------------------- pools under test
struct PoolImage {
  std::vector<uint8_t> data[2], scales[2];
  bool operator==(const PoolImage&) const = default;
};

// Pools of a backend, poisoned; with ref.pad > 0 the primary data pool gets
// caller strides (padded blocks).
class TestPools {
 public:
  TestPools(Backend& b, const RefLayout& ref) : backend_(&b) {
    const PoolGeometry& g = ref.g;
    pools = b.allocate_pools(g, kPoison);
    for (PoolKind k : {PoolKind::primary, PoolKind::secondary}) {
      data_bytes_[static_cast<int>(k)] = static_cast<size_t>(g.pool_bytes(k));
      scale_bytes_[static_cast<int>(k)] = static_cast<size_t>(scale_pool_bytes(g, k));
    }
    if (ref.pad > 0) {
      b.release(pools.data[0]);
      data_bytes_[0] = static_cast<size_t>((ref.primary_elements() * reference_bits(g.dtype) + 7) / 8);
      pools.data[0] = b.allocate(data_bytes_[0]);
      b.fill(pools.data[0], kPoison, data_bytes_[0]);
      PoolStrides& s = pools.strides[0];
      s.block = ref.block_stride();
      if (g.placement == LayerPlacement::per_layer) s.layer = g.primary_blocks * s.block;
      pools.allocation_elements[0] = ref.primary_elements();  // strides are checked against the allocation
    }
  }
  ~TestPools() { backend_->release_pools(pools); }
  TestPools(const TestPools&) = delete;
  TestPools& operator=(const TestPools&) = delete;

  PoolImage image() const {
    PoolImage im;
    for (int k = 0; k < 2; ++k) {
      im.data[k].resize(data_bytes_[k]);
      if (data_bytes_[k]) backend_->to_host(im.data[k].data(), pools.data[k], data_bytes_[k]);
      im.scales[k].resize(scale_bytes_[k]);
      if (scale_bytes_[k]) backend_->to_host(im.scales[k].data(), pools.scales[k], scale_bytes_[k]);
    }
    return im;
  }
  PoolImage poisoned() const {
    PoolImage im;
    for (int k = 0; k < 2; ++k) {
      im.data[k].assign(data_bytes_[k], kPoison);
      im.scales[k].assign(scale_bytes_[k], kPoison);
    }
    return im;
  }

  KvPools pools;

 private:
  Backend* backend_;
  size_t data_bytes_[2] = {};
  size_t scale_bytes_[2] = {};
};

std::string hex(uint8_t b) {
  const char* digits = "0123456789ABCDEF";
  return std::string("0x") + digits[b >> 4] + digits[b & 0xF];
}

// "" when equal, else where the first byte differs.
std::string first_difference(const PoolImage& got, const PoolImage& want) {
  const char* names[] = {"primary data", "secondary data", "primary scales", "secondary scales"};
  const std::vector<uint8_t>* g[] = {&got.data[0], &got.data[1], &got.scales[0], &got.scales[1]};
  const std::vector<uint8_t>* w[] = {&want.data[0], &want.data[1], &want.scales[0], &want.scales[1]};
  for (int i = 0; i < 4; ++i) {
    if (g[i]->size() != w[i]->size())
      return std::string(names[i]) + ": size " + std::to_string(g[i]->size()) + " != " + std::to_string(w[i]->size());
    for (size_t j = 0; j < g[i]->size(); ++j)
      if ((*g[i])[j] != (*w[i])[j])
        return std::string(names[i]) + " byte " + std::to_string(j) + ": got " + hex((*g[i])[j]) + ", want " +
               hex((*w[i])[j]);
  }
  return "";
}

// ---------------------------------------------------------------- host input tensors
struct HostBuffer {
  CacheDtype dtype = CacheDtype::fp32;
  std::vector<uint8_t> bytes;

  HostBuffer() = default;
  HostBuffer(CacheDtype t, int64_t elements) : dtype(t), bytes(static_cast<size_t>(elements * element_size(t))) {}
  int64_t elements() const { return static_cast<int64_t>(bytes.size()) / element_size(dtype); }
  const uint8_t* element(int64_t e) const { return bytes.data() + e * element_size(dtype); }
  float value(int64_t e) const {  // exact fp32 value of a float element
    uint32_t u32 = 0;
    uint16_t u16 = 0;
    switch (dtype) {
      case CacheDtype::fp32: std::memcpy(&u32, element(e), 4); return bits_float(u32);
      case CacheDtype::fp16: std::memcpy(&u16, element(e), 2); return codec::f16_to_f32(u16);
      case CacheDtype::bf16: std::memcpy(&u16, element(e), 2); return codec::bf16_to_f32(u16);
      default: FAIL("not a float buffer"); return 0.0f;
    }
  }
  void set_value(int64_t e, float v) {
    switch (dtype) {
      case CacheDtype::fp32: std::memcpy(bytes.data() + e * 4, &v, 4); break;
      case CacheDtype::fp16: {
        const uint16_t h = codec::f32_to_f16(v);
        std::memcpy(bytes.data() + e * 2, &h, 2);
        break;
      }
      case CacheDtype::bf16: {
        const uint16_t h = codec::f32_to_bf16(v);
        std::memcpy(bytes.data() + e * 2, &h, 2);
        break;
      }
      default: FAIL("not a float buffer");
    }
  }
  // A strided view starting at element `base`.
  TensorView view(int64_t base, std::initializer_list<int64_t> shape, std::initializer_list<int64_t> strides) {
    TensorView t;
    t.data = bytes.data() + base * element_size(dtype);
    t.dtype = dtype;
    t.rank = static_cast<int32_t>(shape.size());
    int i = 0;
    for (int64_t s : shape) t.shape[i++] = s;
    i = 0;
    for (int64_t s : strides) t.stride[i++] = s;
    return t;
  }
};

// Any bit pattern: copies must keep every one, NaN payloads included.
void fill_random_bits(HostBuffer& b, Rng& r) {
  for (uint8_t& x : b.bytes) x = static_cast<uint8_t>(r.next());
}

// Values for quantizing paths: a magnitude per 16 elements between 2^-6 and
// 2^6, and now and then a special (NaN, +-Inf, +-0, huge, subnormal).
float special_or(Rng& r, float v) {
  switch (r.below(48)) {
    case 0: return bits_float(0x7FC00000u | static_cast<uint32_t>(r.next() & 0x3FFFFFu));
    case 1: return std::numeric_limits<float>::infinity();
    case 2: return -std::numeric_limits<float>::infinity();
    case 3: return -0.0f;
    case 4: return 0.0f;
    case 5: return -3.0e38f;
    case 6: return 1.0e-40f;
    default: return v;
  }
}
void fill_values(HostBuffer& b, Rng& r) {
  float magnitude = 1.0f;
  for (int64_t e = 0; e < b.elements(); ++e) {
    if (e % 16 == 0) magnitude = std::ldexp(1.0f, static_cast<int>(r.below(13)) - 6);
    b.set_value(e, special_or(r, (r.unit() * 2.0f - 1.0f) * magnitude));
  }
}

// Runs `run` on every thread count and compares every pool byte with `want`.
void check_on_all_thread_counts(const RefLayout& ref, const std::function<PoolImage(const TestPools&)>& expected,
                                const std::function<void(Backend&, const KvPools&)>& run, const std::string& what) {
  for (ThreadedBackend& tb : thread_backends()) {
    TestPools tp(*tb.backend, ref);
    const PoolImage want = expected(tp);
    run(*tb.backend, tp.pools);
    const std::string diff = first_difference(tp.image(), want);
    CHECK_MESSAGE(diff.empty(), what << " threads=" << tb.threads << " isa=" << tb.isa << ": " << diff);
  }
}

std::string describe(const PoolGeometry& g) {
  return geometry_summary(g) + " blocks=" + std::to_string(g.primary_blocks);
}

// ---------------------------------------------------------------- ragged batches with CSR tables
struct RaggedBatch {
  int32_t page_size = 1;
  std::vector<std::vector<int32_t>> pages;  // [sequence][logical page] -> physical block
  std::vector<int32_t> indptr, indices, last_page_len;
  std::vector<int32_t> batch_indices, positions;  // one entry per appended token
  int64_t primary_blocks = 0;

  int64_t nnz() const { return static_cast<int64_t>(positions.size()); }
  int64_t block_of(int64_t i) const { return pages[batch_indices[i]][positions[i] / page_size]; }
  int32_t entry_of(int64_t i) const { return positions[i] % page_size; }
};

// Sequences with a random past and a random number of appended tokens (some
// 0, some spanning pages; possibly an empty sequence), distinct shuffled
// blocks, a few spare blocks that must stay untouched, tokens optionally in
// shuffled order.
RaggedBatch make_ragged_batch(Rng& r, int32_t batch, int32_t P, bool shuffle_tokens) {
  RaggedBatch rb;
  rb.page_size = P;
  std::vector<int64_t> past(batch), appended(batch);
  int64_t total_appended = 0;
  for (int32_t b = 0; b < batch; ++b) {
    past[b] = r.below(2 * P + 2);
    appended[b] = r.below(P + 4);
    total_appended += appended[b];
  }
  if (total_appended == 0) appended[batch - 1] = 1;
  int64_t total_pages = 0;
  for (int32_t b = 0; b < batch; ++b) total_pages += (past[b] + appended[b] + P - 1) / P;
  rb.primary_blocks = total_pages + 3;
  std::vector<int32_t> free_blocks(static_cast<size_t>(rb.primary_blocks));
  for (size_t i = 0; i < free_blocks.size(); ++i) free_blocks[i] = static_cast<int32_t>(i);
  r.shuffle(free_blocks);
  size_t next_block = 0;
  rb.indptr.push_back(0);
  rb.pages.resize(batch);
  for (int32_t b = 0; b < batch; ++b) {
    const int64_t length = past[b] + appended[b];
    const int64_t n_pages = (length + P - 1) / P;
    for (int64_t p = 0; p < n_pages; ++p) {
      rb.pages[b].push_back(free_blocks[next_block++]);
      rb.indices.push_back(rb.pages[b].back());
    }
    rb.indptr.push_back(static_cast<int32_t>(rb.indices.size()));
    rb.last_page_len.push_back(n_pages == 0 ? 0 : static_cast<int32_t>(length - (n_pages - 1) * P));
    for (int64_t pos = past[b]; pos < length; ++pos) {
      rb.batch_indices.push_back(b);
      rb.positions.push_back(static_cast<int32_t>(pos));
    }
  }
  if (shuffle_tokens) {
    std::vector<size_t> order(rb.positions.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    r.shuffle(order);
    std::vector<int32_t> bi(order.size()), pos(order.size());
    for (size_t i = 0; i < order.size(); ++i) {
      bi[i] = rb.batch_indices[order[i]];
      pos[i] = rb.positions[order[i]];
    }
    rb.batch_indices = bi;
    rb.positions = pos;
  }
  return rb;
}

// K and V rows of [n, H, D] inputs live in one buffer: element (kv, i, h, d)
// at base[kv] + i * token_stride + h * head_stride + d. Three arrangements:
// 0 fused QKV [n, Hq + 2H, D], 1 separate contiguous K then V, 2 head-major
// [2][H][n][D].
struct KvInput {
  HostBuffer buffer;
  int64_t base[2] = {0, 0};
  int64_t token_stride = 0, head_stride = 0;
  int64_t n = 0, H = 0, D = 0;

  KvInput(CacheDtype t, int64_t n_, int64_t H_, int64_t D_, int arrangement) : n(n_), H(H_), D(D_) {
    const int64_t Hq = 3;
    switch (arrangement) {
      case 0:
        buffer = HostBuffer(t, n * (Hq + 2 * H) * D);
        token_stride = (Hq + 2 * H) * D;
        head_stride = D;
        base[0] = Hq * D;
        base[1] = (Hq + H) * D;
        break;
      case 1:
        buffer = HostBuffer(t, 2 * n * H * D);
        token_stride = H * D;
        head_stride = D;
        base[1] = n * H * D;
        break;
      default:
        buffer = HostBuffer(t, 2 * n * H * D);
        token_stride = D;
        head_stride = n * D;
        base[1] = H * n * D;
        break;
    }
  }
  int64_t element(int kv, int64_t i, int64_t h, int64_t d) const {
    return base[kv] + i * token_stride + h * head_stride + d;
  }
  TensorView view(int kv) { return buffer.view(base[kv], {n, H, D}, {token_stride, head_stride, 1}); }
};

// Reference write of one head row of K or V, copy or nvfp4.
void reference_row(PoolImage& want, const RefLayout& ref, const KvInput& in, int kv, int64_t i, int32_t h,
                   int64_t block, int32_t layer, int32_t entry, float global_scale) {
  const PoolGeometry& g = ref.g;
  if (g.dtype == CacheDtype::nvfp4) {
    const RefLayout sref = ref.scales();
    for (int32_t group = 0; group < g.head_dim / 16; ++group) {
      float x[16];
      for (int e = 0; e < 16; ++e) x[e] = in.buffer.value(in.element(kv, i, h, group * 16 + e));
      uint8_t packed[8];
      const uint8_t scale = codec::nvfp4_quantize16(x, global_scale, packed);
      for (int e = 0; e < 16; ++e)
        put_nibble(want.data[0], ref.offset(block, layer, kv, h, entry, group * 16 + e),
                   static_cast<uint8_t>((packed[e / 2] >> (4 * (e % 2))) & 0xF));
      put_bytes(want.scales[0], sref.offset(block, layer, kv, h, entry, group), &scale, 1);
    }
    return;
  }
  const int size = element_size(g.dtype);
  for (int32_t d = 0; d < g.head_dim; ++d)
    put_bytes(want.data[0], ref.offset(block, layer, kv, h, entry, d), in.buffer.element(in.element(kv, i, h, d)), size);
}

// ---------------------------------------------------------------- rejection helper
// The op must throw ValidationError with `code` and leave every byte as it was.
void expect_rejected(ErrorCode code, TestPools& tp, const std::function<void()>& run, const char* message_part = "") {
  const PoolImage before = tp.image();
  bool threw = false;
  std::string message;
  ErrorCode got = ErrorCode::bad_argument;
  try {
    run();
  } catch (const ValidationError& e) {
    threw = true;
    got = e.code();
    message = e.what();
  }
  REQUIRE_MESSAGE(threw, "expected " << std::string(error_name(code)) << " but the op was accepted");
  CHECK_MESSAGE(std::string(error_name(got)) == std::string(error_name(code)), message);
  CHECK_MESSAGE(message.find(message_part) != std::string::npos, "message lacks '" << message_part << "': " << message);
  CHECK_MESSAGE(first_difference(tp.image(), before).empty(), "a rejected op changed the pools: " << message);
}

Backend& single_backend() { return *thread_backends().front().backend; }

}  // namespace

// ======================================================================== append_paged

TEST_CASE("append_paged IsEquivalentToRef: layouts x placements x dtypes x page sizes x head dims x batches") {
  struct Variant {
    CacheDtype cache, input;
  };
  const Variant variants[] = {{CacheDtype::fp32, CacheDtype::fp32},         {CacheDtype::fp16, CacheDtype::fp16},
                              {CacheDtype::bf16, CacheDtype::bf16},         {CacheDtype::fp8_e4m3, CacheDtype::fp8_e4m3},
                              {CacheDtype::fp8_e5m2, CacheDtype::fp8_e5m2}, {CacheDtype::int8, CacheDtype::int8},
                              {CacheDtype::nvfp4, CacheDtype::fp32},        {CacheDtype::nvfp4, CacheDtype::fp16},
                              {CacheDtype::nvfp4, CacheDtype::bf16}};
  int cases = 0;
  int combo = 0;
  for (BlockLayout layout : {BlockLayout::nhd, BlockLayout::hnd, BlockLayout::split_x})
    for (LayerPlacement placement : {LayerPlacement::in_block, LayerPlacement::per_layer})
      for (const Variant& var : variants) {
        if (var.cache == CacheDtype::nvfp4 && layout == BlockLayout::split_x) continue;  // not a supported geometry
        ++combo;
        for (int p = 0; p < 5; ++p) {
          const int seed = combo * 16 + p;
          Rng r(0xA11E4D00u + static_cast<uint64_t>(seed));
          const int32_t P = kPageSizes[p];
          const int32_t batch = kBatches[seed % 3];
          RaggedBatch rb = make_ragged_batch(r, batch, P, /*shuffle_tokens=*/seed % 2 == 1);
          RefLayout ref;
          ref.g.layers = 2;
          ref.g.kv_factor = 2;
          ref.g.kv_heads = 1 + seed % 3;
          ref.g.tokens_per_block = P;
          ref.g.head_dim = kHeadDims[(p + combo) % 5];
          ref.g.dtype = var.cache;
          ref.g.layout = layout;
          ref.g.placement = placement;
          ref.g.primary_blocks = rb.primary_blocks;
          ref.g.secondary_blocks = 2;
          ref.pad = (seed % 4 == 3) ? 6 : 0;
          const int32_t layer = 1;
          KvInput in(var.input, rb.nnz(), ref.g.kv_heads, ref.g.head_dim, seed % 3);
          if (var.cache == CacheDtype::nvfp4)
            fill_values(in.buffer, r);
          else
            fill_random_bits(in.buffer, r);
          const float k_gs = 0.021f, v_gs = 0.37f;

          AppendPagedOp op;
          op.layer = layer;
          op.k = in.view(0);
          op.v = in.view(1);
          op.coordinates() = {rb.batch_indices, rb.positions, rb.indptr, rb.indices, rb.last_page_len};
          op.k_global_scale = k_gs;
          op.v_global_scale = v_gs;

          auto expected = [&](const TestPools& tp) {
            PoolImage want = tp.poisoned();
            for (int64_t i = 0; i < rb.nnz(); ++i)
              for (int32_t h = 0; h < ref.g.kv_heads; ++h)
                for (int kv = 0; kv < 2; ++kv)
                  reference_row(want, ref, in, kv, i, h, rb.block_of(i), layer, rb.entry_of(i), kv == 0 ? k_gs : v_gs);
            return want;
          };
          check_on_all_thread_counts(
              ref, expected, [&](Backend& b, const KvPools& pools) { b.append_paged(pools, op); },
              "append_paged " + describe(ref.g) + " input " + std::string(dtype_name(var.input)) + " batch " +
                  std::to_string(batch) + " nnz " + std::to_string(rb.nnz()) + " pad " + std::to_string(ref.pad));
          ++cases;
        }
      }
  MESSAGE("append_paged cases: " << cases);
  CHECK(cases == 240);
}

TEST_CASE("append_paged nvfp4 writes the contract §4 codes for a hand-computed group") {
  // 16 elements of 1.0 with g = 1: amax 1, sf = 1/6 -> e4m3 0x23 (0.171875);
  // 1.0 / 0.171875 = 5.818 -> e2m1 6.0 (code 7): every byte 0x77.
  RefLayout ref;
  ref.g = PoolGeometry{1, 2, 1, 1, 16, CacheDtype::nvfp4, BlockLayout::nhd, LayerPlacement::in_block, 1, 0};
  TestPools tp(single_backend(), ref);
  HostBuffer k(CacheDtype::fp32, 16), v(CacheDtype::fp32, 16);
  for (int e = 0; e < 16; ++e) {
    k.set_value(e, 1.0f);
    v.set_value(e, e == 3 ? -12.0f : 0.0f);  // amax 12, g = 2: sf = 1 -> 0x38; -12 * 1/2 = -6 -> 0xF
  }
  const std::vector<int32_t> bi{0}, pos{0}, indptr{0, 1}, indices{0}, last{1};
  AppendPagedOp op;
  op.k = k.view(0, {1, 1, 16}, {16, 16, 1});
  op.v = v.view(0, {1, 1, 16}, {16, 16, 1});
  op.coordinates() = {bi, pos, indptr, indices, last};
  op.k_global_scale = 1.0f;
  op.v_global_scale = 2.0f;
  single_backend().append_paged(tp.pools, op);
  const PoolImage im = tp.image();
  REQUIRE(im.data[0].size() == 16);
  for (int i = 0; i < 8; ++i) CHECK(im.data[0][i] == 0x77);
  for (int i = 8; i < 16; ++i) CHECK(im.data[0][i] == (i == 9 ? 0xF0 : 0x00));  // element 3 = high nibble of byte 1
  REQUIRE(im.scales[0].size() == 2);
  CHECK(im.scales[0][0] == 0x23);
  CHECK(im.scales[0][1] == 0x38);
}

TEST_CASE("append_paged rejects invalid inputs before any byte moves") {
  // Two sequences, P = 4: sequence 0 has 7 tokens on blocks {0, 1} and
  // appends positions 5, 6 (page 1 only); sequence 1 has 3 tokens on block
  // {2}, all appended.
  RefLayout ref;
  ref.g = PoolGeometry{2, 2, 2, 4, 64, CacheDtype::bf16, BlockLayout::nhd, LayerPlacement::in_block, 8, 2};
  TestPools tp(single_backend(), ref);
  Rng r(7);
  KvInput in(CacheDtype::bf16, 5, 2, 64, 0);
  fill_random_bits(in.buffer, r);
  std::vector<int32_t> bi{0, 0, 1, 1, 1}, pos{5, 6, 0, 1, 2}, indptr{0, 2, 3}, indices{0, 1, 2}, last{3, 3};
  AppendPagedOp op;
  op.layer = 1;
  op.k = in.view(0);
  op.v = in.view(1);
  op.coordinates() = {bi, pos, indptr, indices, last};
  Backend& b = single_backend();
  auto run = [&] { b.append_paged(tp.pools, op); };

  SUBCASE("a BAD_PAGE in a page nobody writes is accepted") {
    indices[0] = kBadPage;
    CHECK_NOTHROW(run());
  }
  SUBCASE("position == length") {
    pos[1] = 7;
    expect_rejected(ErrorCode::position_beyond_sequence, tp, run, "sequence 0");
  }
  SUBCASE("negative position") {
    pos[2] = -1;
    expect_rejected(ErrorCode::position_beyond_sequence, tp, run, "positions[2] = -1");
  }
  SUBCASE("write through BAD_PAGE") {
    indices[1] = kBadPage;
    expect_rejected(ErrorCode::write_through_bad_page, tp, run, "indices[1]");
  }
  SUBCASE("secondary reference") {
    indices[2] = BlockRef::secondary(1).raw;
    expect_rejected(ErrorCode::secondary_not_onboarded, tp, run, "secondary:1");
  }
  SUBCASE("block id == primary_blocks") {
    indices[2] = 8;
    expect_rejected(ErrorCode::block_out_of_range, tp, run, "indices[2]");
  }
  SUBCASE("negative block id other than BAD_PAGE") {
    indices[2] = -5;
    expect_rejected(ErrorCode::block_out_of_range, tp, run);
  }
  SUBCASE("two sequences write one block") {
    indices[2] = 1;
    expect_rejected(ErrorCode::shared_block_write, tp, run, "block 1");
  }
  SUBCASE("two tokens write one slot") {
    pos[3] = 0;
    expect_rejected(ErrorCode::bad_argument, tp, run, "one writer");
  }
  SUBCASE("batch index out of range") {
    bi[4] = 2;
    expect_rejected(ErrorCode::bad_argument, tp, run, "batch_indices[4] = 2");
  }
  SUBCASE("layer out of range") {
    op.layer = 2;
    expect_rejected(ErrorCode::bad_argument, tp, run, "layer = 2");
    op.layer = -1;
    expect_rejected(ErrorCode::bad_argument, tp, run, "layer = -1");
  }
  SUBCASE("wrong head count, head dim, rank, token count") {
    op.k.shape[1] = 3;
    expect_rejected(ErrorCode::shape_mismatch, tp, run, "k has shape");
    op.k = in.view(0);
    op.v.shape[2] = 32;
    expect_rejected(ErrorCode::shape_mismatch, tp, run, "v has shape");
    op.v = in.view(1);
    op.k.rank = 2;
    expect_rejected(ErrorCode::shape_mismatch, tp, run);
    op.k = in.view(0);
    op.positions = std::span<const int32_t>(pos.data(), 4);
    expect_rejected(ErrorCode::shape_mismatch, tp, run, "positions");
  }
  SUBCASE("input dtype differs from the cache dtype") {
    op.k.dtype = CacheDtype::fp16;
    expect_rejected(ErrorCode::shape_mismatch, tp, run, "dtype fp16");
  }
  SUBCASE("CSR structure") {
    indptr[0] = 1;
    expect_rejected(ErrorCode::indptr_bad_start, tp, run);
    indptr = {0, 3, 2};
    op.indptr = indptr;
    expect_rejected(ErrorCode::non_monotone_indptr, tp, run);
    indptr = {0, 2, 4};
    op.indptr = indptr;
    expect_rejected(ErrorCode::indices_size_mismatch, tp, run);
    indptr = {0, 2, 3};
    op.indptr = indptr;
    last[1] = 5;
    expect_rejected(ErrorCode::last_page_len_out_of_range, tp, run, "last_page_len[1] = 5");
    last[1] = 0;
    expect_rejected(ErrorCode::last_page_len_out_of_range, tp, run);
  }
  SUBCASE("kv_factor 1 pool") {
    RefLayout mla = ref;
    mla.g.kv_factor = 1;
    TestPools latent(b, mla);
    expect_rejected(ErrorCode::bad_geometry, latent, [&] { b.append_paged(latent.pools, op); }, "kv_factor");
  }
  SUBCASE("fp32 input into an fp8 cache") {
    RefLayout fp8 = ref;
    fp8.g.dtype = CacheDtype::fp8_e4m3;
    TestPools cache(b, fp8);
    KvInput f32(CacheDtype::fp32, 5, 2, 64, 1);
    op.k = f32.view(0);
    op.v = f32.view(1);
    expect_rejected(ErrorCode::shape_mismatch, cache, [&] { b.append_paged(cache.pools, op); }, "fp8_e4m3");
  }
  SUBCASE("nvfp4: bad global scales, byte-sharing strides, non-float input") {
    RefLayout fp4 = ref;
    fp4.g.dtype = CacheDtype::nvfp4;
    TestPools cache(b, fp4);
    KvInput f32(CacheDtype::fp32, 5, 2, 64, 2);
    fill_values(f32.buffer, r);
    op.k = f32.view(0);
    op.v = f32.view(1);
    auto run4 = [&] { b.append_paged(cache.pools, op); };
    const float bad[] = {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()};
    for (float s : bad) {
      op.k_global_scale = s;
      expect_rejected(ErrorCode::bad_global_scale, cache, run4, "k_global_scale");
      op.k_global_scale = 1.0f;
      op.v_global_scale = s;
      expect_rejected(ErrorCode::bad_global_scale, cache, run4, "v_global_scale");
      op.v_global_scale = 1.0f;
    }
    KvPools odd = cache.pools;
    odd.strides[0].inner[1].head += 1;
    expect_rejected(ErrorCode::bad_strides, cache, [&] { b.append_paged(odd, op); });
    KvInput fp8(CacheDtype::fp8_e4m3, 5, 2, 64, 0);
    op.k = fp8.view(0);
    expect_rejected(ErrorCode::shape_mismatch, cache, run4, "nvfp4");
    op.k = f32.view(0);
    CHECK_NOTHROW(run4());  // the same op with valid arguments runs
  }
}

// ======================================================================== reshape_and_cache

TEST_CASE("reshape_and_cache IsEquivalentToRef: layouts (split-x too) x placements x dtype pairs x page sizes") {
  struct Variant {
    CacheDtype cache, input;
  };
  const Variant variants[] = {
      {CacheDtype::fp32, CacheDtype::fp32},         {CacheDtype::fp16, CacheDtype::fp16},
      {CacheDtype::bf16, CacheDtype::bf16},         {CacheDtype::fp8_e4m3, CacheDtype::fp8_e4m3},
      {CacheDtype::int8, CacheDtype::int8},         {CacheDtype::fp8_e4m3, CacheDtype::fp32},
      {CacheDtype::fp8_e4m3, CacheDtype::fp16},     {CacheDtype::fp8_e4m3, CacheDtype::bf16},
      {CacheDtype::fp8_e5m2, CacheDtype::fp32},     {CacheDtype::fp8_e5m2, CacheDtype::fp16},
      {CacheDtype::fp8_e5m2, CacheDtype::bf16},     {CacheDtype::fp8_e5m2, CacheDtype::fp8_e5m2}};
  const int64_t kTokenCounts[] = {1, 3, 5, 17};
  int cases = 0, combo = 0;
  for (BlockLayout layout : {BlockLayout::nhd, BlockLayout::hnd, BlockLayout::split_x})
    for (LayerPlacement placement : {LayerPlacement::in_block, LayerPlacement::per_layer})
      for (const Variant& var : variants) {
        ++combo;
        for (int p = 0; p < 5; ++p) {
          const int seed = combo * 16 + p;
          Rng r(0x5E5A9E00u + static_cast<uint64_t>(seed));
          const int32_t P = kPageSizes[p];
          RefLayout ref;
          ref.g.layers = 2;
          ref.g.kv_factor = 2;
          ref.g.kv_heads = 1 + seed % 3;
          ref.g.tokens_per_block = P;
          ref.g.head_dim = kHeadDims[(p + combo) % 5];
          ref.g.dtype = var.cache;
          ref.g.layout = layout;
          ref.g.placement = placement;
          ref.g.secondary_blocks = 1;
          const int64_t T = kTokenCounts[seed % 4];
          ref.g.primary_blocks = (T + P - 1) / P + 2;
          ref.pad = (seed % 4 == 1) ? 6 : 0;
          // Distinct slots, about one in five skipped with a negative slot.
          std::vector<int64_t> all_slots(static_cast<size_t>(ref.g.primary_blocks * P));
          for (size_t i = 0; i < all_slots.size(); ++i) all_slots[i] = static_cast<int64_t>(i);
          r.shuffle(all_slots);
          std::vector<int64_t> slots(all_slots.begin(), all_slots.begin() + T);
          for (int64_t& s : slots)
            if (r.below(5) == 0) s = r.below(2) ? -1 : -1 - r.below(1000);
          const int32_t layer = 1;
          KvInput in(var.input, T, ref.g.kv_heads, ref.g.head_dim, seed % 3);
          const bool quantize = var.cache != var.input;
          if (quantize)
            fill_values(in.buffer, r);
          else
            fill_random_bits(in.buffer, r);
          const float k_scale = 0.37f, v_scale = 2.5f;  // not powers of two: x / scale rounds

          ReshapeAndCacheOp op;
          op.layer = layer;
          op.key = in.view(0);
          op.value = in.view(1);
          op.slot_mapping = slots;
          op.k_scale = k_scale;
          op.v_scale = v_scale;

          auto expected = [&](const TestPools& tp) {
            PoolImage want = tp.poisoned();
            for (int64_t t = 0; t < T; ++t) {
              if (slots[t] < 0) continue;
              const int64_t block = slots[t] / P;
              const int32_t entry = static_cast<int32_t>(slots[t] % P);
              for (int32_t h = 0; h < ref.g.kv_heads; ++h)
                for (int kv = 0; kv < 2; ++kv)
                  for (int32_t d = 0; d < ref.g.head_dim; ++d) {
                    const int64_t src = in.element(kv, t, h, d);
                    const int64_t dst = ref.offset(block, layer, kv, h, entry, d);
                    if (!quantize) {
                      put_bytes(want.data[0], dst, in.buffer.element(src), element_size(var.cache));
                      continue;
                    }
                    const float x = in.buffer.value(src) / (kv == 0 ? k_scale : v_scale);
                    const uint8_t code = var.cache == CacheDtype::fp8_e4m3
                                             ? codec::f32_to_e4m3(x, codec::Saturation::finite)
                                             : codec::f32_to_e5m2(x, codec::Saturation::finite);
                    put_bytes(want.data[0], dst, &code, 1);
                  }
            }
            return want;
          };
          check_on_all_thread_counts(
              ref, expected, [&](Backend& b, const KvPools& pools) { b.reshape_and_cache(pools, op); },
              "reshape_and_cache " + describe(ref.g) + " input " + std::string(dtype_name(var.input)) + " tokens " +
                  std::to_string(T) + " pad " + std::to_string(ref.pad));
          ++cases;
        }
      }
  MESSAGE("reshape_and_cache cases: " << cases);
  CHECK(cases == 360);
}

TEST_CASE("reshape_and_cache fp8 saturates: x / scale beyond the fp8 range stores +-max") {
  RefLayout ref;
  ref.g = PoolGeometry{1, 2, 1, 1, 16, CacheDtype::fp8_e4m3, BlockLayout::nhd, LayerPlacement::in_block, 1, 0};
  TestPools tp(single_backend(), ref);
  HostBuffer kv(CacheDtype::fp32, 32);
  const float values[] = {1000.0f, -1000.0f, std::numeric_limits<float>::infinity(), 464.0f * 0.5f, 1.0f, -0.0f};
  for (int e = 0; e < 32; ++e) kv.set_value(e, e < 6 ? values[e] : 0.0f);
  const std::vector<int64_t> slot{0};
  ReshapeAndCacheOp op;
  op.key = kv.view(0, {1, 1, 16}, {16, 16, 1});
  op.value = kv.view(16, {1, 1, 16}, {16, 16, 1});
  op.slot_mapping = slot;
  op.k_scale = 0.5f;
  single_backend().reshape_and_cache(tp.pools, op);
  const PoolImage im = tp.image();
  CHECK(im.data[0][0] == 0x7E);  // 2000 -> 448
  CHECK(im.data[0][1] == 0xFE);  // -2000 -> -448
  CHECK(im.data[0][2] == 0x7E);  // +Inf -> 448 (satfinite)
  CHECK(im.data[0][3] == 0x7E);  // 464 ties to even -> 448
  CHECK(im.data[0][4] == 0x40);  // 2.0
  CHECK(im.data[0][5] == 0x80);  // -0 keeps its sign
}

TEST_CASE("reshape_and_cache rejects invalid inputs before any byte moves") {
  RefLayout ref;
  ref.g = PoolGeometry{2, 2, 2, 3, 64, CacheDtype::bf16, BlockLayout::split_x, LayerPlacement::per_layer, 4, 1};
  Backend& b = single_backend();
  TestPools tp(b, ref);
  Rng r(11);
  KvInput in(CacheDtype::bf16, 3, 2, 64, 0);
  fill_random_bits(in.buffer, r);
  std::vector<int64_t> slots{0, 5, 11};
  ReshapeAndCacheOp op;
  op.layer = 1;
  op.key = in.view(0);
  op.value = in.view(1);
  op.slot_mapping = slots;
  auto run = [&] { b.reshape_and_cache(tp.pools, op); };

  SUBCASE("valid op runs") { CHECK_NOTHROW(run()); }
  SUBCASE("slot beyond the pool") {
    slots[2] = 12;
    expect_rejected(ErrorCode::slot_beyond_pool, tp, run, "slot_mapping[2] = 12");
  }
  SUBCASE("two tokens, one slot") {
    slots[2] = 0;
    expect_rejected(ErrorCode::bad_argument, tp, run, "slot 0");
  }
  SUBCASE("layer out of range") {
    op.layer = 2;
    expect_rejected(ErrorCode::bad_argument, tp, run, "layer = 2");
  }
  SUBCASE("shapes") {
    op.key.shape[0] = 2;
    expect_rejected(ErrorCode::shape_mismatch, tp, run, "key has shape");
    op.key = in.view(0);
    op.value.shape[1] = 1;
    expect_rejected(ErrorCode::shape_mismatch, tp, run, "value has shape");
  }
  SUBCASE("dtype mismatch") {
    op.value.dtype = CacheDtype::fp16;
    expect_rejected(ErrorCode::shape_mismatch, tp, run, "value has dtype fp16");
  }
  SUBCASE("kv_factor 1") {
    RefLayout mla = ref;
    mla.g.kv_factor = 1;
    mla.g.layout = BlockLayout::nhd;
    TestPools latent(b, mla);
    expect_rejected(ErrorCode::bad_geometry, latent, [&] { b.reshape_and_cache(latent.pools, op); });
  }
  SUBCASE("nvfp4 cache") {
    RefLayout fp4 = ref;
    fp4.g.dtype = CacheDtype::nvfp4;
    fp4.g.layout = BlockLayout::hnd;
    TestPools cache(b, fp4);
    expect_rejected(ErrorCode::bad_argument, cache, [&] { b.reshape_and_cache(cache.pools, op); }, "nvfp4");
  }
  SUBCASE("fp32 input into an int8 cache") {
    RefLayout i8 = ref;
    i8.g.dtype = CacheDtype::int8;
    TestPools cache(b, i8);
    KvInput f32(CacheDtype::fp32, 3, 2, 64, 1);
    op.key = f32.view(0);
    op.value = f32.view(1);
    expect_rejected(ErrorCode::shape_mismatch, cache, [&] { b.reshape_and_cache(cache.pools, op); }, "int8");
  }
  SUBCASE("fp8 quantization with a bad scale") {
    RefLayout fp8 = ref;
    fp8.g.dtype = CacheDtype::fp8_e5m2;
    TestPools cache(b, fp8);
    KvInput f32(CacheDtype::fp32, 3, 2, 64, 2);
    fill_values(f32.buffer, r);
    op.key = f32.view(0);
    op.value = f32.view(1);
    auto run8 = [&] { b.reshape_and_cache(cache.pools, op); };
    const float bad[] = {0.0f, -2.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()};
    for (float s : bad) {
      op.k_scale = s;
      expect_rejected(ErrorCode::bad_argument, cache, run8, "k_scale");
      op.k_scale = 1.0f;
      op.v_scale = s;
      expect_rejected(ErrorCode::bad_argument, cache, run8, "v_scale");
      op.v_scale = 1.0f;
    }
    CHECK_NOTHROW(run8());
  }
}

// ======================================================================== append_mla

TEST_CASE("append_mla IsEquivalentToRef: dtypes (nvfp4 ckv + fp8 kpe mix) x layouts x placements x page sizes") {
  struct Variant {
    CacheDtype cache, ckv, kpe;
  };
  const Variant variants[] = {
      {CacheDtype::fp32, CacheDtype::fp32, CacheDtype::fp32},
      {CacheDtype::fp16, CacheDtype::fp16, CacheDtype::fp16},
      {CacheDtype::bf16, CacheDtype::bf16, CacheDtype::bf16},
      {CacheDtype::fp8_e4m3, CacheDtype::fp8_e4m3, CacheDtype::fp8_e4m3},
      {CacheDtype::fp8_e5m2, CacheDtype::fp8_e5m2, CacheDtype::fp8_e5m2},
      {CacheDtype::int8, CacheDtype::int8, CacheDtype::int8},
      {CacheDtype::nvfp4, CacheDtype::fp32, CacheDtype::fp8_e4m3},
      {CacheDtype::nvfp4, CacheDtype::fp16, CacheDtype::fp8_e4m3},
      {CacheDtype::nvfp4, CacheDtype::bf16, CacheDtype::fp8_e4m3},
      {CacheDtype::nvfp4, CacheDtype::fp32, CacheDtype::fp32},
      {CacheDtype::nvfp4, CacheDtype::fp16, CacheDtype::fp16},
      {CacheDtype::nvfp4, CacheDtype::bf16, CacheDtype::bf16},
  };
  const int32_t kDims[][2] = {{64, 16}, {80, 16}, {96, 32}, {128, 64}, {512, 64}};  // (d_ckv, d_kpe)
  int cases = 0, combo = 0;
  for (BlockLayout layout : {BlockLayout::nhd, BlockLayout::hnd, BlockLayout::split_x})
    for (LayerPlacement placement : {LayerPlacement::in_block, LayerPlacement::per_layer})
      for (const Variant& var : variants) {
        const bool fp4 = var.cache == CacheDtype::nvfp4;
        if (fp4 && layout == BlockLayout::split_x) continue;
        ++combo;
        for (int p = 0; p < 5; ++p) {
          const int seed = combo * 16 + p;
          Rng r(0x3A1A0000u + static_cast<uint64_t>(seed));
          const int32_t P = kPageSizes[p];
          const int32_t batch = kBatches[seed % 3];
          RaggedBatch rb = make_ragged_batch(r, batch, P, seed % 2 == 0);
          const int32_t d_ckv = kDims[(p + combo) % 5][0], d_kpe = kDims[(p + combo) % 5][1];
          RefLayout ref;
          ref.g.layers = 2;
          ref.g.kv_factor = 1;
          ref.g.kv_heads = 1;
          ref.g.tokens_per_block = P;
          ref.g.head_dim = fp4 ? d_ckv + 2 * d_kpe : d_ckv + d_kpe;
          ref.g.dtype = var.cache;
          ref.g.layout = layout;
          ref.g.placement = placement;
          ref.g.primary_blocks = rb.primary_blocks;
          ref.g.secondary_blocks = 1;
          ref.pad = (seed % 4 == 2) ? 6 : 0;
          const int32_t layer = 1;
          const int64_t n = rb.nnz();
          // ckv and kpe: sliced from one [n, d_ckv + d_kpe] projection output
          // when they share a dtype (DeepSeek's kv_a_proj split), else separate.
          const bool fused = var.ckv == var.kpe && seed % 2 == 1;
          HostBuffer ckv_buf(var.ckv, fused ? n * (d_ckv + d_kpe) : n * d_ckv);
          HostBuffer kpe_sep(var.kpe, fused ? 0 : n * d_kpe);
          HostBuffer& kpe_buf = fused ? ckv_buf : kpe_sep;
          const int64_t ckv_row = fused ? d_ckv + d_kpe : d_ckv, kpe_row = fused ? d_ckv + d_kpe : d_kpe;
          const int64_t kpe_base = fused ? d_ckv : 0;
          for (HostBuffer* hb : {&ckv_buf, &kpe_sep}) {
            if (is_float_input(hb->dtype) && fp4)
              fill_values(*hb, r);
            else
              fill_random_bits(*hb, r);
          }
          const float ckv_gs = 0.013f, kpe_scale = 0.11f;

          AppendMlaOp op;
          op.layer = layer;
          op.ckv = ckv_buf.view(0, {n, d_ckv}, {ckv_row, 1});
          op.kpe = kpe_buf.view(kpe_base, {n, d_kpe}, {kpe_row, 1});
          op.coordinates() = {rb.batch_indices, rb.positions, rb.indptr, rb.indices, rb.last_page_len};
          op.ckv_global_scale = ckv_gs;
          op.kpe_scale = kpe_scale;

          auto expected = [&](const TestPools& tp) {
            PoolImage want = tp.poisoned();
            const RefLayout sref = ref.scales();
            for (int64_t i = 0; i < n; ++i) {
              const int64_t block = rb.block_of(i);
              const int32_t entry = rb.entry_of(i);
              const int64_t ckv0 = i * ckv_row, kpe0 = kpe_base + i * kpe_row;
              if (!fp4) {
                const int size = element_size(var.cache);
                for (int32_t d = 0; d < d_ckv; ++d)
                  put_bytes(want.data[0], ref.offset(block, layer, 0, 0, entry, d), ckv_buf.element(ckv0 + d), size);
                for (int32_t d = 0; d < d_kpe; ++d)
                  put_bytes(want.data[0], ref.offset(block, layer, 0, 0, entry, d_ckv + d), kpe_buf.element(kpe0 + d),
                            size);
                continue;
              }
              for (int32_t group = 0; group < d_ckv / 16; ++group) {
                float x[16];
                for (int e = 0; e < 16; ++e) x[e] = ckv_buf.value(ckv0 + group * 16 + e);
                uint8_t packed[8];
                const uint8_t scale = codec::nvfp4_quantize16(x, ckv_gs, packed);
                for (int e = 0; e < 16; ++e)
                  put_nibble(want.data[0], ref.offset(block, layer, 0, 0, entry, group * 16 + e),
                             static_cast<uint8_t>((packed[e / 2] >> (4 * (e % 2))) & 0xF));
                put_bytes(want.scales[0], sref.offset(block, layer, 0, 0, entry, group), &scale, 1);
              }
              for (int32_t j = 0; j < d_kpe; ++j) {
                const uint8_t code = var.kpe == CacheDtype::fp8_e4m3
                                         ? *kpe_buf.element(kpe0 + j)
                                         : codec::f32_to_e4m3(kpe_buf.value(kpe0 + j) / kpe_scale,
                                                              codec::Saturation::finite);
                put_nibble(want.data[0], ref.offset(block, layer, 0, 0, entry, d_ckv + 2 * j), code & 0xF);
                put_nibble(want.data[0], ref.offset(block, layer, 0, 0, entry, d_ckv + 2 * j + 1), code >> 4);
              }
            }
            return want;
          };
          check_on_all_thread_counts(
              ref, expected, [&](Backend& b, const KvPools& pools) { b.append_mla(pools, op); },
              "append_mla " + describe(ref.g) + " ckv " + std::string(dtype_name(var.ckv)) + " kpe " +
                  std::string(dtype_name(var.kpe)) + " d_ckv " + std::to_string(d_ckv) + " d_kpe " +
                  std::to_string(d_kpe) + " nnz " + std::to_string(n) + " pad " + std::to_string(ref.pad));
          ++cases;
        }
      }
  MESSAGE("append_mla cases: " << cases);
  CHECK(cases == 300);
}

TEST_CASE("append_mla nvfp4 row layout: ckv nibbles, then kpe fp8 bytes, scales for ckv groups only") {
  // d_ckv 16, d_kpe 8: head_dim 32 nibbles = 16 bytes per row, 2 scale bytes.
  RefLayout ref;
  ref.g = PoolGeometry{1, 1, 1, 2, 32, CacheDtype::nvfp4, BlockLayout::nhd, LayerPlacement::in_block, 1, 0};
  TestPools tp(single_backend(), ref);
  HostBuffer ckv(CacheDtype::fp32, 16), kpe(CacheDtype::fp32, 8);
  for (int e = 0; e < 16; ++e) ckv.set_value(e, 1.0f);
  for (int j = 0; j < 8; ++j) kpe.set_value(j, j == 0 ? 1.0f : -0.5f * static_cast<float>(j));
  const std::vector<int32_t> bi{0}, pos{1}, indptr{0, 1}, indices{0}, last{2};
  AppendMlaOp op;
  op.ckv = ckv.view(0, {1, 16}, {16, 1});
  op.kpe = kpe.view(0, {1, 8}, {8, 1});
  op.coordinates() = {bi, pos, indptr, indices, last};
  op.ckv_global_scale = 1.0f;
  op.kpe_scale = 0.5f;
  single_backend().append_mla(tp.pools, op);
  const PoolImage im = tp.image();
  REQUIRE(im.data[0].size() == 32);
  for (int i = 0; i < 16; ++i) CHECK(im.data[0][i] == kPoison);  // entry 0 untouched
  for (int i = 16; i < 24; ++i) CHECK(im.data[0][i] == 0x77);    // ckv: 1.0 -> e2m1 6 with sf 0x23
  for (int j = 0; j < 8; ++j)
    CHECK(im.data[0][24 + j] == codec::f32_to_e4m3((j == 0 ? 1.0f : -0.5f * static_cast<float>(j)) / 0.5f, codec::Saturation::finite));
  CHECK(im.data[0][24] == 0x40);  // 1.0 / 0.5 = 2.0 in e4m3
  REQUIRE(im.scales[0].size() == 4);
  CHECK(im.scales[0][0] == kPoison);
  CHECK(im.scales[0][1] == kPoison);
  CHECK(im.scales[0][2] == 0x23);     // the ckv group's scale
  CHECK(im.scales[0][3] == kPoison);  // covers kpe nibbles: never written
}

TEST_CASE("append_mla rejects invalid inputs before any byte moves") {
  RefLayout ref;
  ref.g = PoolGeometry{2, 1, 1, 4, 96, CacheDtype::nvfp4, BlockLayout::nhd, LayerPlacement::per_layer, 6, 2};
  Backend& b = single_backend();
  TestPools tp(b, ref);
  Rng r(13);
  // d_ckv 64 + 2 * d_kpe 16 = 96 nibbles; sequence 0: 6 tokens on {3, 1}, appends 4, 5.
  HostBuffer ckv(CacheDtype::bf16, 2 * 64), kpe(CacheDtype::fp8_e4m3, 2 * 16);
  fill_values(ckv, r);
  fill_random_bits(kpe, r);
  std::vector<int32_t> bi{0, 0}, pos{4, 5}, indptr{0, 2}, indices{3, 1}, last{2};
  AppendMlaOp op;
  op.layer = 0;
  op.ckv = ckv.view(0, {2, 64}, {64, 1});
  op.kpe = kpe.view(0, {2, 16}, {16, 1});
  op.coordinates() = {bi, pos, indptr, indices, last};
  op.ckv_global_scale = 0.5f;
  auto run = [&] { b.append_mla(tp.pools, op); };

  SUBCASE("valid op runs") { CHECK_NOTHROW(run()); }
  SUBCASE("bad ckv global scale") {
    op.ckv_global_scale = -0.0f;
    expect_rejected(ErrorCode::bad_global_scale, tp, run, "ckv_global_scale");
    op.ckv_global_scale = std::numeric_limits<float>::infinity();
    expect_rejected(ErrorCode::bad_global_scale, tp, run);
  }
  SUBCASE("float kpe with a bad kpe_scale") {
    HostBuffer kpe32(CacheDtype::fp32, 2 * 16);
    op.kpe = kpe32.view(0, {2, 16}, {16, 1});
    op.kpe_scale = 0.0f;
    expect_rejected(ErrorCode::bad_argument, tp, run, "kpe_scale");
  }
  SUBCASE("kpe e5m2 or ckv fp8 in an nvfp4 pool") {
    op.kpe.dtype = CacheDtype::fp8_e5m2;
    expect_rejected(ErrorCode::shape_mismatch, tp, run, "kpe");
    op.kpe.dtype = CacheDtype::fp8_e4m3;
    HostBuffer ckv8(CacheDtype::fp8_e4m3, 2 * 64);
    op.ckv = ckv8.view(0, {2, 64}, {64, 1});
    expect_rejected(ErrorCode::shape_mismatch, tp, run, "ckv");
  }
  SUBCASE("row width does not match head_dim") {
    op.kpe = kpe.view(0, {2, 8}, {16, 1});
    expect_rejected(ErrorCode::shape_mismatch, tp, run, "d_ckv + 2 * d_kpe");
  }
  SUBCASE("nvfp4 d_ckv not a multiple of 16") {
    HostBuffer ckv24(CacheDtype::fp32, 2 * 24), kpe36(CacheDtype::fp8_e4m3, 2 * 36);
    op.ckv = ckv24.view(0, {2, 24}, {24, 1});
    op.kpe = kpe36.view(0, {2, 36}, {36, 1});
    expect_rejected(ErrorCode::unsupported_head_dim, tp, run, "d_ckv = 24");
  }
  SUBCASE("page table: position, BAD_PAGE, secondary, shared block, duplicate slot") {
    pos[1] = 8;
    expect_rejected(ErrorCode::position_beyond_sequence, tp, run, "sequence 0");
    pos[1] = 5;
    indices[1] = kBadPage;
    expect_rejected(ErrorCode::write_through_bad_page, tp, run);
    indices[1] = BlockRef::secondary(0).raw;
    expect_rejected(ErrorCode::secondary_not_onboarded, tp, run);
    indices[1] = 1;
    pos[0] = 5;
    expect_rejected(ErrorCode::bad_argument, tp, run, "one writer");
  }
  SUBCASE("two sequences, one block") {
    std::vector<int32_t> bi2{0, 1}, pos2{4, 0}, indptr2{0, 2, 3}, indices2{3, 1, 1}, last2{2, 1};
    op.coordinates() = {bi2, pos2, indptr2, indices2, last2};
    expect_rejected(ErrorCode::shared_block_write, tp, run);
  }
  SUBCASE("layer out of range") {
    op.layer = 2;
    expect_rejected(ErrorCode::bad_argument, tp, run, "layer = 2");
  }
  SUBCASE("kv_factor 2 or kv_heads 2") {
    RefLayout two = ref;
    two.g.kv_factor = 2;
    TestPools kv2(b, two);
    expect_rejected(ErrorCode::bad_geometry, kv2, [&] { b.append_mla(kv2.pools, op); }, "kv_factor");
    two.g.kv_factor = 1;
    two.g.kv_heads = 2;
    TestPools h2(b, two);
    expect_rejected(ErrorCode::bad_geometry, h2, [&] { b.append_mla(h2.pools, op); }, "kv_heads");
  }
  SUBCASE("non-nvfp4 pool: dtype mismatch and width") {
    RefLayout bf = ref;
    bf.g.dtype = CacheDtype::bf16;
    bf.g.head_dim = 80;
    TestPools cache(b, bf);
    auto runb = [&] { b.append_mla(cache.pools, op); };
    expect_rejected(ErrorCode::shape_mismatch, cache, runb, "kpe has dtype fp8_e4m3");
    HostBuffer kpe16(CacheDtype::bf16, 2 * 16);
    op.kpe = kpe16.view(0, {2, 16}, {16, 1});
    CHECK_NOTHROW(runb());
    op.kpe = kpe16.view(0, {2, 8}, {16, 1});
    expect_rejected(ErrorCode::shape_mismatch, cache, runb, "d_ckv + d_kpe");
  }
}

// ======================================================================== indexer_k_scatter

namespace {

// The reference flat -> memory offset: divide by the trailing extents.
int64_t reference_indexer_offset(const int64_t shape[4], const int64_t stride[4], int64_t flat) {
  const int64_t per0 = shape[1] * shape[2] * shape[3], per1 = shape[2] * shape[3], per2 = shape[3];
  const int64_t i0 = flat / per0, i1 = (flat % per0) / per1, i2 = (flat % per1) / per2, i3 = flat % per2;
  return i0 * stride[0] + i1 * stride[1] + i2 * stride[2] + i3 * stride[3];
}

struct IndexerCache {
  int64_t shape[4] = {};
  int64_t stride[4] = {};
  std::vector<uint8_t> memory;
  TensorView view() {
    TensorView t;
    t.data = memory.data();
    t.dtype = CacheDtype::fp8_e4m3;
    t.rank = 4;
    for (int i = 0; i < 4; ++i) {
      t.shape[i] = shape[i];
      t.stride[i] = stride[i];
    }
    return t;
  }
};

// [blocks, block_size, 1, D + 4] with optional padding between rows and
// blocks and an inner byte stride (s3 = 2 interleaves two caches).
IndexerCache make_indexer_cache(int64_t blocks, int64_t block_size, int64_t D, int64_t row_pad, int64_t block_pad,
                                int64_t byte_stride) {
  IndexerCache c;
  c.shape[0] = blocks;
  c.shape[1] = block_size;
  c.shape[2] = 1;
  c.shape[3] = D + 4;
  c.stride[3] = byte_stride;
  c.stride[2] = 977;  // extent 1: never multiplied by a non-zero index
  c.stride[1] = (D + 4) * byte_stride + row_pad;
  c.stride[0] = block_size * c.stride[1] + block_pad;
  const int64_t bytes = (blocks - 1) * c.stride[0] + (block_size - 1) * c.stride[1] + (D + 3) * byte_stride + 1;
  c.memory.assign(static_cast<size_t>(bytes), kPoison);
  return c;
}

}  // namespace

TEST_CASE("indexer_k_scatter IsEquivalentToRef: block sizes x head dims x slot arrangements x strides") {
  const int64_t kBlockSizes[] = {1, 3, 7, 17, 64};
  const int64_t kDimsBytes[] = {128, 64, 7};
  const int64_t kTokens[] = {1, 3, 5, 17};
  int cases = 0;
  for (int64_t block_size : kBlockSizes)
    for (int64_t D : kDimsBytes)
      for (int arrangement = 0; arrangement < 2; ++arrangement)
        for (int strides = 0; strides < 3; ++strides) {
          const int seed = cases;
          Rng r(0x1DE7u + static_cast<uint64_t>(seed));
          const int64_t T = kTokens[seed % 4];
          const int64_t blocks = (T + block_size - 1) / block_size + 1;
          const int64_t row_pad = strides == 1 ? 5 : 0, block_pad = strides == 1 ? 9 : 0;
          const int64_t byte_stride = strides == 2 ? 2 : 1;
          IndexerCache base = make_indexer_cache(blocks, block_size, D, row_pad, block_pad, byte_stride);
          // Distinct token slots (block, token-in-block), some skipped.
          std::vector<int64_t> token_slots(static_cast<size_t>(blocks * block_size));
          for (size_t i = 0; i < token_slots.size(); ++i) token_slots[i] = static_cast<int64_t>(i);
          r.shuffle(token_slots);
          std::vector<int64_t> slot_fp8(T), slot_scale(T);
          const int64_t row = D + 4;
          for (int64_t t = 0; t < T; ++t) {
            const int64_t blk = token_slots[t] / block_size, tok = token_slots[t] % block_size;
            if (arrangement == 0) {  // DeepSeek V3.2: per block, all tokens' data, then all tokens' scales
              slot_fp8[t] = blk * block_size * row + tok * D;
              slot_scale[t] = blk * block_size * row + block_size * D + tok * 4;
            } else {  // per token row: [data | scale]
              slot_fp8[t] = (blk * block_size + tok) * row;
              slot_scale[t] = slot_fp8[t] + D;
            }
            const int64_t skip = r.below(6);
            if (skip == 0) slot_fp8[t] = -1;
            if (skip == 1) slot_scale[t] = -1;
          }
          HostBuffer data(CacheDtype::fp8_e4m3, T * D), scales(CacheDtype::int8, T * 4);
          fill_random_bits(data, r);
          fill_random_bits(scales, r);

          std::vector<uint8_t> want = base.memory;
          for (int64_t t = 0; t < T; ++t) {
            if (slot_fp8[t] < 0 || slot_scale[t] < 0) continue;
            for (int64_t j = 0; j < D; ++j)
              want[static_cast<size_t>(reference_indexer_offset(base.shape, base.stride, slot_fp8[t] + j))] =
                  data.bytes[static_cast<size_t>(t * D + j)];
            for (int64_t j = 0; j < 4; ++j)
              want[static_cast<size_t>(reference_indexer_offset(base.shape, base.stride, slot_scale[t] + j))] =
                  scales.bytes[static_cast<size_t>(t * 4 + j)];
          }
          for (ThreadedBackend& tb : thread_backends()) {
            IndexerCache cache = base;
            IndexerKScatterOp op;
            op.k_fp8 = data.view(0, {T, D}, {D, 1});
            op.k_scale = scales.view(0, {T, 4}, {4, 1});
            op.slot_mapping_fp8 = slot_fp8;
            op.slot_mapping_scale = slot_scale;
            op.cache = cache.view();
            tb.backend->indexer_k_scatter(op);
            size_t diff = 0;
            while (diff < want.size() && cache.memory[diff] == want[diff]) ++diff;
            CHECK_MESSAGE(diff == want.size(), "indexer block_size " << block_size << " D " << D << " arrangement "
                                                                     << arrangement << " strides " << strides
                                                                     << " threads " << tb.threads << ": byte " << diff);
          }
          ++cases;
        }
  MESSAGE("indexer_k_scatter cases: " << cases);
  CHECK(cases == 90);
}

TEST_CASE("indexer_k_scatter rejects invalid inputs before any byte moves") {
  const int64_t D = 16, block_size = 4, blocks = 2;
  IndexerCache cache = make_indexer_cache(blocks, block_size, D, 0, 0, 1);  // 2 * 4 * 20 = 160 bytes
  const std::vector<uint8_t> before = cache.memory;
  Rng r(17);
  HostBuffer data(CacheDtype::fp8_e4m3, 2 * D), scales(CacheDtype::int8, 2 * 4);
  fill_random_bits(data, r);
  fill_random_bits(scales, r);
  std::vector<int64_t> slot_fp8{0, 20}, slot_scale{16, 36};
  IndexerKScatterOp op;
  op.k_fp8 = data.view(0, {2, D}, {D, 1});
  op.k_scale = scales.view(0, {2, 4}, {4, 1});
  op.slot_mapping_fp8 = slot_fp8;
  op.slot_mapping_scale = slot_scale;
  op.cache = cache.view();
  Backend& b = single_backend();
  auto rejected = [&](ErrorCode code, const char* part = "") {
    bool threw = false;
    try {
      b.indexer_k_scatter(op);
    } catch (const ValidationError& e) {
      threw = true;
      CHECK_MESSAGE(std::string(error_name(e.code())) == std::string(error_name(code)), e.what());
      CHECK_MESSAGE(std::string(e.what()).find(part) != std::string::npos, e.what());
    }
    CHECK_MESSAGE(threw, "expected " << std::string(error_name(code)));
    CHECK(cache.memory == before);
  };

  SUBCASE("valid op runs and skips a token with a negative slot") {
    slot_scale[1] = -1;
    CHECK_NOTHROW(b.indexer_k_scatter(op));
    CHECK(std::equal(cache.memory.begin() + 20, cache.memory.end(), before.begin() + 20));
  }
  SUBCASE("data beyond the cache") {
    slot_fp8[1] = 160 - D + 1;
    rejected(ErrorCode::slot_beyond_pool, "slot_mapping_fp8[1]");
  }
  SUBCASE("scale beyond the cache") {
    slot_scale[1] = 157;
    rejected(ErrorCode::slot_beyond_pool, "slot_mapping_scale[1]");
  }
  SUBCASE("two tokens' data overlap") {
    slot_fp8[1] = 8;
    rejected(ErrorCode::bad_argument, "written twice");
    rejected(ErrorCode::bad_argument, "(tokens 0 and 1)");  // names both writers
    rejected(ErrorCode::bad_argument, "at offset 8 ");      // the first byte written twice
  }
  SUBCASE("overlapping runs across a bitmap word and a d3 row name the first shared byte") {
    slot_fp8[0] = 70;  // bytes 70..85
    slot_fp8[1] = 60;  // bytes 60..75: two 64-bit words of the bitmap; 70 is inside the second
    rejected(ErrorCode::bad_argument, "at offset 70 is written twice (tokens 0 and 1)");
  }
  SUBCASE("a token's scale overlaps another's data") {
    slot_scale[1] = 12;
    rejected(ErrorCode::bad_argument, "written twice");
  }
  SUBCASE("aliasing strides map distinct indices to one byte") {
    op.cache.stride[1] = 0;
    rejected(ErrorCode::bad_argument, "written twice");
  }
  SUBCASE("negative stride") {
    op.cache.stride[0] = -80;
    rejected(ErrorCode::bad_strides, "stride[0]");
  }
  SUBCASE("cache rank and dtype") {
    op.cache.rank = 3;
    rejected(ErrorCode::shape_mismatch, "rank 3");
    op.cache.rank = 4;
    op.cache.dtype = CacheDtype::fp16;
    rejected(ErrorCode::shape_mismatch, "byte tensor");
  }
  SUBCASE("input shapes") {
    op.k_scale = scales.view(0, {2, 3}, {4, 1});
    rejected(ErrorCode::shape_mismatch, "k_scale");
    op.k_scale = scales.view(0, {2, 4}, {4, 1});
    op.slot_mapping_scale = std::span<const int64_t>(slot_scale.data(), 1);
    rejected(ErrorCode::shape_mismatch, "slot_mapping_scale");
    op.slot_mapping_scale = slot_scale;
    op.k_fp8 = data.view(0, {1, D}, {D, 1});
    rejected(ErrorCode::shape_mismatch, "k_fp8");
  }
}
