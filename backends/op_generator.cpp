#include "backends/op_generator.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <sstream>

#include "kvsim/validation/geometry.hpp"
#include "kvsim/validation/rope.hpp"

namespace kvsim {

namespace {

using Rng = std::mt19937_64;

int32_t uniform(Rng& rng, int32_t lo, int32_t hi) {  // inclusive
  return std::uniform_int_distribution<int32_t>(lo, hi)(rng);
}
float uniform_float(Rng& rng, float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng); }
bool coin(Rng& rng, double p = 0.5) { return std::bernoulli_distribution(p)(rng); }
template <class T, size_t N>
T pick(Rng& rng, const T (&values)[N]) {
  return values[uniform(rng, 0, static_cast<int32_t>(N) - 1)];
}

// Mostly ordinary values; 1 in 64 a special (NaN with a payload, +-Inf, huge,
// tiny, -0), or with `specials` off a finite edge value.
float random_value(Rng& rng, bool specials) {
  if (uniform(rng, 0, 63) == 0) {
    if (!specials) {
      // Small enough that no sum or product of them overflows fp16 to Inf
      // (Inf - Inf would bring NaN back).
      const float edges[] = {448.0f, -448.0f, 1.0e-40f, -0.0f, 0.0f, 6.0f};
      return pick(rng, edges);
    }
    const float nan_inf[] = {bits_float(0x7FC01234u), bits_float(0xFF800001u), INFINITY, -INFINITY, 3.0e38f,
                             -7.0e5f, 1.0e-40f, -0.0f};
    return pick(rng, nan_inf);
  }
  return uniform_float(rng, -4.0f, 4.0f);
}

// Is a byte code of an 8-bit float dtype NaN or Inf?
bool special_code(CacheDtype t, uint8_t c) {
  if (t == CacheDtype::fp8_e4m3) return (c & 0x7F) == 0x7F;
  if (t == CacheDtype::fp8_e5m2) return (c & 0x7C) == 0x7C;
  return false;
}

// Random element bytes of a dtype (float dtypes: random_value() rounded).
void random_elements(Rng& rng, CacheDtype t, uint8_t* out, int64_t elements, bool specials) {
  for (int64_t i = 0; i < elements; ++i) {
    switch (t) {
      case CacheDtype::fp32: {
        const float f = random_value(rng, specials);
        std::memcpy(out + 4 * i, &f, 4);
        break;
      }
      case CacheDtype::fp16:
      case CacheDtype::bf16: {
        const float f = random_value(rng, specials);
        const uint16_t h = t == CacheDtype::fp16 ? codec::f32_to_f16(f) : codec::f32_to_bf16(f);
        std::memcpy(out + 2 * i, &h, 2);
        break;
      }
      default:
        if (t == CacheDtype::nvfp4 && (i & 1)) break;  // two nibbles per byte: one random byte
        uint8_t c = static_cast<uint8_t>(rng());
        while (!specials && special_code(t, c)) c = static_cast<uint8_t>(rng());
        out[t == CacheDtype::nvfp4 ? i / 2 : i] = c;
    }
  }
}

constexpr CacheDtype kFloatInputs[] = {CacheDtype::fp32, CacheDtype::fp16, CacheDtype::bf16};

// Distinct block ids in a shuffled (non-contiguous) order.
std::vector<int32_t> shuffled_blocks(Rng& rng, int64_t blocks) {
  std::vector<int32_t> ids(static_cast<size_t>(blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  return ids;
}

// Ragged lengths for `batch` sequences whose pages (of P) fit in `blocks`.
std::vector<int32_t> ragged_lengths(Rng& rng, int32_t batch, int32_t P, int64_t blocks, int32_t max_len, int32_t min_len) {
  std::vector<int32_t> len(static_cast<size_t>(batch));
  int64_t pages_left = blocks;
  for (int32_t b = 0; b < batch; ++b) {
    const int64_t seqs_left = batch - b;
    const int64_t fair = std::max<int64_t>(0, pages_left / seqs_left);
    const int32_t cap = static_cast<int32_t>(std::min<int64_t>(max_len, fair * P));
    len[b] = cap < min_len ? std::min(cap, min_len) : uniform(rng, min_len, cap);
    pages_left -= (len[b] + P - 1) / P;
  }
  return len;
}

// Shortens the longest sequences until the pages their cache slots occupy
// (a window's bubble can add one) fit in `blocks`.
void fit_lengths(std::vector<int32_t>& len, const WindowMapping& w, int32_t P, int64_t blocks, int32_t min_len) {
  auto pages = [&] {
    int64_t n = 0;
    for (int32_t l : len) n += (w.cache_length(l) + P - 1) / P;
    return n;
  };
  while (pages() > blocks) {
    auto longest = std::max_element(len.begin(), len.end());
    if (*longest <= min_len) break;  // cannot shrink further (tiny pools; validation will say so)
    --*longest;
  }
}

WindowMapping random_window(Rng& rng, int32_t P, int32_t want) {
  if (want == 0 || (want < 0 && coin(rng))) return WindowMapping{};
  const int32_t W = uniform(rng, 2, 3 * P + 8);
  const int32_t S = uniform(rng, 0, std::min(W - 1, P + 3));
  return WindowMapping::make(W, S, P, coin(rng));
}

// Dense table for sequences occupying `slots[b]` cache slots each, distinct
// shuffled blocks, extra -1 columns.
std::vector<int32_t> dense_table(Rng& rng, const std::vector<int64_t>& slots, int32_t P, int64_t blocks,
                                 int32_t& max_blocks) {
  int64_t most = 0;
  for (int64_t s : slots) most = std::max<int64_t>(most, (s + P - 1) / P);
  max_blocks = static_cast<int32_t>(most) + uniform(rng, 0, 2);
  std::vector<int32_t> table(slots.size() * static_cast<size_t>(max_blocks), kBadPage);
  const std::vector<int32_t> ids = shuffled_blocks(rng, blocks);
  size_t next = 0;
  for (size_t b = 0; b < slots.size(); ++b)
    for (int64_t p = 0; p < (slots[b] + P - 1) / P; ++p) table[b * max_blocks + p] = ids.at(next++);
  return table;
}

}  // namespace

bool op_supports_geometry(GeneratedOp op, const PoolGeometry& g) {
  switch (op) {
    case GeneratedOp::append_mla: return g.kv_factor == 1 && g.kv_heads == 1 && g.layout != BlockLayout::split_x;
    case GeneratedOp::indexer_k_scatter: return true;  // no pool
    case GeneratedOp::gather_paged:
    case GeneratedOp::partial_copy:
    case GeneratedOp::copy_blocks: return g.primary_blocks >= 2;
    case GeneratedOp::offload:
    case GeneratedOp::onboard: return g.secondary_blocks > 0;
    case GeneratedOp::reshape_and_cache: return g.kv_factor == 2 && g.dtype != CacheDtype::nvfp4;
    case GeneratedOp::decode_attention:
    case GeneratedOp::prefill_attention: return g.kv_factor == 2 && g.head_dim <= 256;
    default: return g.kv_factor == 2;
  }
}

PoolGeometry OpGenerator::random_geometry(GeneratedOp op, Rng& rng) {
  const CacheDtype dtypes[] = {CacheDtype::fp32,     CacheDtype::fp16, CacheDtype::bf16, CacheDtype::fp8_e4m3,
                               CacheDtype::fp8_e5m2, CacheDtype::int8, CacheDtype::nvfp4};
  const int32_t page_sizes[] = {1, 2, 3, 4, 7, 8, 16, 17, 33};
  const int32_t head_dims[] = {16, 32, 48, 64, 80, 128, 256};
  PoolGeometry g;
  g.dtype = pick(rng, dtypes);
  if (op == GeneratedOp::reshape_and_cache && g.dtype == CacheDtype::nvfp4) g.dtype = CacheDtype::fp8_e4m3;
  g.layers = uniform(rng, 1, 3);
  g.kv_factor = op == GeneratedOp::append_mla ? 1 : 2;
  g.kv_heads = op == GeneratedOp::append_mla ? 1 : uniform(rng, 1, 4);
  g.tokens_per_block = pick(rng, page_sizes);
  g.head_dim = pick(rng, head_dims);
  // An nvfp4 latent row needs 16 ckv nibbles and 8 kpe bytes at least.
  if (op == GeneratedOp::append_mla && g.dtype == CacheDtype::nvfp4 && g.head_dim < 32) g.head_dim = 32;
  const BlockLayout layouts[] = {BlockLayout::nhd, BlockLayout::hnd, BlockLayout::split_x};
  g.layout = pick(rng, layouts);
  if (g.layout == BlockLayout::split_x && (g.dtype == CacheDtype::nvfp4 || op == GeneratedOp::append_mla))
    g.layout = BlockLayout::hnd;
  g.placement = coin(rng) ? LayerPlacement::in_block : LayerPlacement::per_layer;
  g.primary_blocks = uniform(rng, 8, 40);
  g.secondary_blocks = uniform(rng, 0, 6) == 0 ? 0 : uniform(rng, 2, 12);
  if (op == GeneratedOp::offload || op == GeneratedOp::onboard) g.secondary_blocks = std::max<int64_t>(g.secondary_blocks, 2);
  return g;
}

OpGenerator::OpGenerator(Backend& backend, uint64_t seed, bool special_values)
    : backend_(backend), rng_(seed), special_values_(special_values) {}
OpGenerator::~OpGenerator() { release_pools(); }

void OpGenerator::release_pools() {
  buffers_.clear();
  if (have_pools_) backend_.release_pools(pools_);
  have_pools_ = false;
}

void OpGenerator::set_geometry(const PoolGeometry& g) {
  release_pools();
  pools_ = backend_.allocate_pools(g, 0);
  have_pools_ = true;
  poison();
}

void OpGenerator::poison() {
  const PoolGeometry& g = pools_.geometry;
  for (PoolKind k : {PoolKind::primary, PoolKind::secondary}) {
    const int i = static_cast<int>(k);
    if (pools_.data[i]) {
      std::vector<uint8_t> bytes(static_cast<size_t>(g.pool_bytes(k)));
      random_elements(rng_, g.dtype, bytes.data(), g.pool_elements(k), special_values_);
      backend_.to_backend(pools_.data[i], bytes.data(), bytes.size());
    }
    if (pools_.scales[i]) {
      const PoolGeometry sg = g.scale_geometry();
      std::vector<uint8_t> bytes(static_cast<size_t>(sg.pool_bytes(k)));
      for (uint8_t& b : bytes) b = static_cast<uint8_t>(uniform(rng_, 0x20, 0x48));  // moderate e4m3 scales
      backend_.to_backend(pools_.scales[i], bytes.data(), bytes.size());
    }
  }
}

// A tensor of random elements; `padded` gives rank >= 2 tensors a larger
// leading stride (a slice of a wider fused tensor), as engines pass them.
TensorView OpGenerator::tensor(CacheDtype dtype, std::vector<int64_t> shape, bool padded) {
  TensorView t;
  t.dtype = dtype;
  t.rank = static_cast<int32_t>(shape.size());
  int64_t stride = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.shape[d] = shape[d];
    t.stride[d] = stride;
    stride *= shape[d];
    if (d == t.rank - 1 && padded && t.rank >= 2) stride += uniform(rng_, 1, 3) * 2;  // row padding
  }
  const int64_t elements = t.numel() == 0 ? 1 : t.span_elements();
  std::vector<uint8_t> host(static_cast<size_t>((elements * bits_per_element(dtype) + 7) / 8));
  random_elements(rng_, dtype, host.data(), elements, special_values_);
  buffers_.emplace_back(backend_, host.size());
  buffers_.back().upload(host.data(), host.size());
  t.data = buffers_.back().get();
  return t;
}

TensorView OpGenerator::nan_output(int64_t rows, int64_t cols) {
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(rows * cols, 1)) * sizeof(float);
  buffers_.emplace_back(backend_, bytes);
  backend_.fill(buffers_.back().get(), 0xFF, bytes);
  return contiguous_view(buffers_.back().get(), CacheDtype::fp32, {rows, cols});
}

std::string OpGenerator::run(GeneratedOp op, const OpKnobs& knobs) {
  buffers_.clear();
  const PoolGeometry& g = pools_.geometry;
  const int32_t P = g.tokens_per_block, H = g.kv_heads, D = g.head_dim;
  const int32_t batch = knobs.batch > 0 ? knobs.batch : uniform(rng_, 1, 5);
  const int32_t group = knobs.group > 0 ? knobs.group : pick(rng_, {1, 2, 4, 8});
  const CacheDtype float_input = knobs.input_dtype ? *knobs.input_dtype : pick(rng_, kFloatInputs);
  const int32_t layer = uniform(rng_, 0, g.layers - 1);
  std::ostringstream what;
  what << generated_op_name(op) << ": " << geometry_summary(g) << ", layer " << layer;

  switch (op) {
    case GeneratedOp::append_paged:
    case GeneratedOp::append_mla: {
      // Past and appended tokens per sequence; the CSR table covers both.
      const std::vector<int32_t> len = ragged_lengths(rng_, batch, P, g.primary_blocks, 3 * P + 5, 0);
      std::vector<int32_t> indptr{0}, indices, last_page_len, batch_indices, positions;
      const std::vector<int32_t> ids = shuffled_blocks(rng_, g.primary_blocks);
      for (int32_t b = 0; b < batch; ++b) {
        const int32_t pages = (len[b] + P - 1) / P;
        for (int32_t p = 0; p < pages; ++p) indices.push_back(ids.at(indices.size()));
        indptr.push_back(static_cast<int32_t>(indices.size()));
        last_page_len.push_back(pages ? len[b] - (pages - 1) * P : 0);
        const int32_t appended = len[b] ? uniform(rng_, 0, len[b]) : 0;
        for (int32_t pos = len[b] - appended; pos < len[b]; ++pos) {
          batch_indices.push_back(b);
          positions.push_back(pos);
        }
      }
      const int64_t nnz = static_cast<int64_t>(positions.size());
      what << ", batch " << batch << ", nnz " << nnz;
      if (op == GeneratedOp::append_paged) {
        AppendPagedOp o;
        o.layer = layer;
        const CacheDtype in = g.dtype == CacheDtype::nvfp4 ? float_input : g.dtype;
        o.k = tensor(in, {nnz, H, D}, coin(rng_));
        o.v = tensor(in, {nnz, H, D}, coin(rng_));
        o.coordinates() = {batch_indices, positions, indptr, indices, last_page_len};
        o.k_global_scale = uniform_float(rng_, 0.01f, 2.0f);
        o.v_global_scale = uniform_float(rng_, 0.01f, 2.0f);
        backend_.append_paged(pools_, o);
      } else {
        AppendMlaOp o;
        o.layer = layer;
        int32_t d_ckv, d_kpe;
        CacheDtype ckv_dtype = g.dtype, kpe_dtype = g.dtype;
        if (g.dtype == CacheDtype::nvfp4) {
          d_kpe = 8 * uniform(rng_, 1, std::max(1, (D - 16) / 16));
          d_ckv = D - 2 * d_kpe;
          ckv_dtype = float_input;
          kpe_dtype = coin(rng_) ? CacheDtype::fp8_e4m3 : pick(rng_, kFloatInputs);
        } else {
          d_kpe = uniform(rng_, 1, D - 1);
          d_ckv = D - d_kpe;
        }
        o.ckv = tensor(ckv_dtype, {nnz, d_ckv}, coin(rng_));
        o.kpe = tensor(kpe_dtype, {nnz, d_kpe}, coin(rng_));
        o.coordinates() = {batch_indices, positions, indptr, indices, last_page_len};
        o.ckv_global_scale = uniform_float(rng_, 0.01f, 2.0f);
        o.kpe_scale = uniform_float(rng_, 0.1f, 4.0f);
        what << ", d_ckv " << d_ckv << ", d_kpe " << d_kpe;
        backend_.append_mla(pools_, o);
      }
      break;
    }
    case GeneratedOp::reshape_and_cache: {
      const int64_t slots_total = g.primary_blocks * P;
      const int32_t T = static_cast<int32_t>(std::min<int64_t>(slots_total, uniform(rng_, 0, 4 * batch + 6)));
      std::vector<int64_t> slots;
      if (coin(rng_)) {  // a prefill's slots: runs of consecutive entries, each page once, in a shuffled order
        std::vector<int64_t> pages(static_cast<size_t>(g.primary_blocks));
        std::iota(pages.begin(), pages.end(), 0);
        std::shuffle(pages.begin(), pages.end(), rng_);
        for (size_t k = 0; k < pages.size() && static_cast<int32_t>(slots.size()) < T; ++k) {
          const int32_t first = coin(rng_, 0.25) ? uniform(rng_, 0, P - 1) : 0;  // now and then mid-page
          for (int32_t e = first; e < P && static_cast<int32_t>(slots.size()) < T; ++e) slots.push_back(pages[k] * P + e);
        }
      } else {  // a decode batch's: any distinct slots
        std::vector<int64_t> all(static_cast<size_t>(slots_total));
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng_);
        slots.assign(all.begin(), all.begin() + T);
      }
      for (int64_t& s : slots)
        if (uniform(rng_, 0, 7) == 0) s = -1;  // skipped token
      const bool fp8 = is_fp8(g.dtype);
      ReshapeAndCacheOp o;
      o.layer = layer;
      // One draw per statement: a call's arguments are evaluated in an unspecified order (g++ took
      // the last one first, clang the first), so two draws in one call gave other sequences per compiler.
      for (TensorView* input : {&o.key, &o.value}) {
        const bool padded = coin(rng_);
        const CacheDtype dtype = fp8 && coin(rng_) ? float_input : g.dtype;
        *input = tensor(dtype, {T, H, D}, padded);
      }
      o.slot_mapping = slots;
      o.k_scale = uniform_float(rng_, 0.05f, 4.0f);
      o.v_scale = uniform_float(rng_, 0.05f, 4.0f);
      what << ", tokens " << T;
      backend_.reshape_and_cache(pools_, o);
      break;
    }
    case GeneratedOp::qkv_preprocess_write: {
      QkvPreprocessOp o;
      o.layer = layer;
      o.num_q_heads = H * group;
      const CacheDtype in = is_float_input(g.dtype) ? g.dtype : float_input;
      o.window = random_window(rng_, P, knobs.window);
      // Cache lengths whose occupied slots fit the pool; chunks of them are new.
      std::vector<int32_t> len = ragged_lengths(rng_, batch, P, g.primary_blocks, 4 * P + 9, 0);
      fit_lengths(len, o.window, P, g.primary_blocks, 0);
      std::vector<int32_t> seq_lens(len.size());
      std::vector<int64_t> slots(len.size());
      int64_t tokens = 0;
      for (size_t b = 0; b < len.size(); ++b) {
        seq_lens[b] = len[b] ? uniform(rng_, 0, len[b]) : 0;
        slots[b] = o.window.cache_length(len[b]);
        tokens += seq_lens[b];
      }
      std::vector<int32_t> table = dense_table(rng_, slots, P, g.primary_blocks, o.max_blocks_per_seq);
      std::vector<int32_t> offsets;
      if (coin(rng_))
        for (size_t b = 0; b < len.size(); ++b) offsets.push_back(uniform(rng_, 0, 5));
      const int64_t width = static_cast<int64_t>(o.num_q_heads + 2 * H) * D;
      o.qkv = tensor(in, {tokens, width}, coin(rng_));
      if (coin(rng_)) o.bias = tensor(in, {width}, false);
      const bool q_out_padded = coin(rng_);  // drawn before the dtype, as g++ evaluated the call (above)
      o.q_out = tensor(coin(rng_) ? in : pick(rng_, kFloatInputs), {tokens, o.num_q_heads, D}, q_out_padded);
      const RopeStyle styles[] = {RopeStyle::none, RopeStyle::neox, RopeStyle::gptj};
      o.rope_style = pick(rng_, styles);
      if (o.rope_style != RopeStyle::none) {
        o.rotary_dim = 2 * uniform(rng_, 1, D / 2);
        if (coin(rng_)) o.rotary_dim = D - D % 2;
        int64_t max_position = 1;
        for (size_t b = 0; b < len.size(); ++b) max_position = std::max<int64_t>(max_position, len[b] + 6);
        const RopeTable rope = build_rope_table(o.rotary_dim, max_position);
        o.cos_sin = tensor(CacheDtype::fp32, {max_position, o.rotary_dim}, false);
        backend_.to_backend(o.cos_sin.data, rope.cos_sin.data(), rope.cos_sin.size() * sizeof(float));
      }
      o.seq_lens = seq_lens;
      o.cache_lens = len;
      o.position_offsets = offsets;
      o.block_table = table;
      o.context_phase = coin(rng_, 0.7);
      o.zero_v_tail = coin(rng_, 0.8);
      for (int i = 0; i < 3; ++i) {
        o.scale_orig_quant[i] = uniform_float(rng_, 0.1f, 8.0f);
        o.nvfp4_global_scale[i] = uniform_float(rng_, 0.01f, 2.0f);
      }
      what << ", batch " << batch << ", tokens " << tokens << ", Hq " << o.num_q_heads << ", window "
           << o.window.window << "/" << o.window.sinks << ", rope " << static_cast<int>(o.rope_style) << "/"
           << o.rotary_dim;
      backend_.qkv_preprocess_write(pools_, o);
      break;
    }
    case GeneratedOp::indexer_k_scatter: {
      // DeepSeek's indexer block: bs tokens' D data bytes, then their 4-byte scales.
      const int32_t blocks = uniform(rng_, 1, 6), bs = pick(rng_, {1, 3, 16, 17, 64});
      const int32_t dk = pick(rng_, {16, 64, 128});
      const int64_t bytes_per_token = dk + kIndexerScaleBytes;
      TensorView cache = tensor(CacheDtype::fp8_e4m3, {blocks, bs, 1, bytes_per_token}, false);
      if (coin(rng_)) {  // a strided cache: rows padded
        buffers_.pop_back();
        cache = tensor(CacheDtype::fp8_e4m3, {blocks, bs, 1, bytes_per_token}, true);
        cache.stride[1] = cache.stride[2];
      }
      const int32_t T = std::min(blocks * bs, uniform(rng_, 0, 3 * batch + 4));
      std::vector<int32_t> where(static_cast<size_t>(blocks) * bs);
      std::iota(where.begin(), where.end(), 0);
      std::shuffle(where.begin(), where.end(), rng_);
      std::vector<int64_t> data_slots, scale_slots;
      for (int32_t t = 0; t < T; ++t) {
        const int64_t blk = where[t] / bs, s = where[t] % bs;
        const int64_t base = blk * bs * bytes_per_token;
        const bool skip = uniform(rng_, 0, 9) == 0;
        data_slots.push_back(skip ? -1 : base + s * dk);
        scale_slots.push_back(base + static_cast<int64_t>(bs) * dk + s * kIndexerScaleBytes);
      }
      IndexerKScatterOp o;
      o.k_fp8 = tensor(CacheDtype::fp8_e4m3, {T, dk}, coin(rng_));
      o.k_scale = tensor(CacheDtype::fp8_e4m3, {T, kIndexerScaleBytes}, false);
      o.slot_mapping_fp8 = data_slots;
      o.slot_mapping_scale = scale_slots;
      o.cache = cache;
      what << " (indexer: blocks " << blocks << ", block_size " << bs << ", D " << dk << ", tokens " << T << ")";
      backend_.indexer_k_scatter(o);
      break;
    }
    case GeneratedOp::gather_paged: {
      const int32_t pages = uniform(rng_, 1, static_cast<int32_t>(std::min<int64_t>(g.primary_blocks, 6)));
      std::vector<int32_t> ids = shuffled_blocks(rng_, g.primary_blocks);
      ids.resize(static_cast<size_t>(pages));
      for (int32_t& id : ids)
        if (uniform(rng_, 0, 5) == 0) id = kBadPage;  // reads as zeros
      GatherPagedOp o;
      o.layer = layer;
      o.kv = uniform(rng_, 0, g.kv_factor - 1);
      o.block_ids = ids;
      o.num_tokens = uniform(rng_, 0, pages * P);
      if (o.num_tokens > 0) o.out = tensor(CacheDtype::fp32, {o.num_tokens, H, D}, coin(rng_));
      o.scale = uniform_float(rng_, 0.05f, 4.0f);
      o.global_scale = uniform_float(rng_, 0.01f, 2.0f);
      what << ", kv " << o.kv << ", tokens " << o.num_tokens;
      backend_.gather_paged(pools_, o);
      break;
    }
    case GeneratedOp::decode_attention:
    case GeneratedOp::prefill_attention: {
      const WindowMapping window = random_window(rng_, P, knobs.window);
      std::vector<int32_t> len = ragged_lengths(rng_, batch, P, g.primary_blocks, 5 * P + 40, 1);
      for (int32_t& l : len) l = std::max(l, 1);
      fit_lengths(len, window, P, g.primary_blocks, 1);
      std::vector<int64_t> slots(len.size());
      for (size_t b = 0; b < len.size(); ++b) slots[b] = window.cache_length(len[b]);
      int32_t max_blocks = 0;
      std::vector<int32_t> table = dense_table(rng_, slots, P, g.primary_blocks, max_blocks);
      AttentionScales sc;
      sc.sm_scale = 1.0f / std::sqrt(static_cast<float>(D));
      sc.k_scale = uniform_float(rng_, 0.25f, 2.0f);
      sc.v_scale = uniform_float(rng_, 0.25f, 2.0f);
      sc.k_global_scale = uniform_float(rng_, 0.01f, 1.0f);
      sc.v_global_scale = uniform_float(rng_, 0.01f, 1.0f);
      const int32_t Hq = H * group;
      const CacheDtype out_dtype = pick(rng_, kFloatInputs);
      const AttentionOrder order = mma_order::offered_for(g.dtype) ? knobs.order : AttentionOrder::fp32;
      what << ", batch " << batch << ", Hq " << Hq << ", window " << window.window << "/" << window.sinks;
      if (order != AttentionOrder::fp32) what << ", order " << attention_order_name(order);
      const bool with_lse = attention_ops_++ % 2 == 1;
      if (with_lse) what << ", lse";
      // The fields both ops share, q, out and lse drawn in this order.
      const auto query = [&](int64_t rows) {
        PagedAttentionQuery a{.layer = layer};
        a.q = tensor(float_input, {rows, Hq, D}, coin(rng_));
        a.out = tensor(out_dtype, {rows, Hq, D}, coin(rng_));
        a.seq_lens = len;
        a.block_table = table;
        a.max_blocks_per_seq = max_blocks;
        a.scales = sc;
        a.window = window;
        a.order = order;
        if (with_lse) a.lse = nan_output(rows, Hq);
        return a;
      };
      if (op == GeneratedOp::decode_attention) {
        DecodeAttentionOp o;
        o.query() = query(batch);
        backend_.decode_attention(pools_, o);
      } else {
        std::vector<int32_t> q_indptr{0};
        for (int32_t l : len)  // the first sequence has >= 1 query, so q/out are never empty
          q_indptr.push_back(q_indptr.back() + uniform(rng_, q_indptr.size() == 1 ? 1 : 0, std::min(l, 6)));
        const int64_t rows = q_indptr.back();
        PrefillAttentionOp o;
        o.query() = query(rows);
        o.q_indptr = q_indptr;
        what << ", queries " << rows;
        backend_.prefill_attention(pools_, o);
      }
      break;
    }
    case GeneratedOp::partial_copy: {
      const std::vector<int32_t> ids = shuffled_blocks(rng_, g.primary_blocks);
      PartialCopyOp o;
      o.src_block = ids[0];
      o.dst_block = ids[1];
      o.num_tokens = uniform(rng_, -1, P);
      what << ", " << o.src_block << " -> " << o.dst_block << ", tokens " << o.num_tokens;
      backend_.partial_copy(pools_, o);
      break;
    }
    case GeneratedOp::copy_blocks: {
      const std::vector<int32_t> ids = shuffled_blocks(rng_, g.primary_blocks);
      // Sources from the first half (a fork may repeat one), destinations from the second.
      const int32_t half = static_cast<int32_t>(ids.size() / 2);
      const int32_t n = uniform(rng_, 1, std::min(half, 6));
      std::vector<std::pair<int32_t, int32_t>> pairs;
      for (int32_t i = 0; i < n; ++i) pairs.emplace_back(ids[uniform(rng_, 0, half - 1)], ids[half + i]);
      CopyBlocksOp o;
      o.pairs = pairs;
      what << ", pairs " << n;
      backend_.copy_blocks(pools_, o);
      break;
    }
    case GeneratedOp::offload:
    case GeneratedOp::onboard: {
      const int64_t n = uniform(rng_, 1, static_cast<int32_t>(std::min(g.primary_blocks, g.secondary_blocks)));
      std::vector<int32_t> primary = shuffled_blocks(rng_, g.primary_blocks), secondary = shuffled_blocks(rng_, g.secondary_blocks);
      primary.resize(static_cast<size_t>(n));
      secondary.resize(static_cast<size_t>(n));
      MoveBlocksOp o;
      o.primary = primary;
      o.secondary = secondary;
      what << ", blocks " << n;
      if (op == GeneratedOp::offload)
        backend_.offload(pools_, o);
      else
        backend_.onboard(pools_, o);
      break;
    }
    case GeneratedOp::mla_attention:  // not drawn (its traits): tests/support/mla_attention_fixture.hpp
      fail(ErrorCode::bad_argument, "op generator: mla_attention is not generated");
  }
  return what.str();
}

int64_t run_generated_sequences(Backend& backend, int sequences, uint64_t seed, int ops_per_sequence,
                                const std::function<void(const std::string&)>& before_op, bool special_values) {
  int64_t ops = 0;
  Rng rng(seed);
  for (int s = 0; s < sequences; ++s) {
    OpGenerator gen(backend, rng(), special_values);
    // One pool geometry for the K/V ops, one latent pool for append_mla.
    const PoolGeometry g = OpGenerator::random_geometry(GeneratedOp::offload, rng);
    const PoolGeometry latent = OpGenerator::random_geometry(GeneratedOp::append_mla, rng);
    std::vector<GeneratedOp> order;
    while (static_cast<int>(order.size()) < ops_per_sequence)
      for (GeneratedOp op : kGeneratedOps)
        if (op != GeneratedOp::append_mla && op_supports_geometry(op, g)) order.push_back(op);
    order.resize(static_cast<size_t>(ops_per_sequence));
    std::shuffle(order.begin(), order.end(), rng);
    gen.set_geometry(g);
    for (GeneratedOp op : order) {
      if (before_op) before_op("sequence " + std::to_string(s) + " op " + std::to_string(ops) + " " +
                               std::string(generated_op_name(op)));
      gen.run(op);
      ++ops;
    }
    gen.set_geometry(latent);
    if (before_op) before_op("sequence " + std::to_string(s) + " op " + std::to_string(ops) + " append_mla");
    gen.run(GeneratedOp::append_mla);
    ++ops;
  }
  return ops;
}

}  // namespace kvsim
