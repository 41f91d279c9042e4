// decode_attention / prefill_attention on the GPU (backends/cuda/attention*.cu)
// against the CPU oracle, byte for byte: every cache dtype, layout, placement,
// odd and even page sizes, GQA 1/4/8, head dims 64/80/128/256, ragged batches,
// windows with sinks, shuffled page tables, NaN-poisoned pools. The sweep
// samples the product deterministically (axis k of case i takes value
// (i * stride_k + k) mod |axis|, strides coprime to the axis length), so every
// value of every axis appears. Both kernel paths (staged and general) are
// checked where the staged one applies. Skips without a GPU.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kvsim/validation.hpp"
#include "backends/cuda/attention_kernels.hpp"
#include "backends/cuda/attention_plan.cuh"
#include "backends/cuda/mma_fragments.cuh"
#include "tests/cuda/attention_fixture.hpp"
#include "tests/cuda/gpu_skip.hpp"

using namespace kvsim;
using namespace kvsim::test;

namespace {


// First differing output element, for the failure message.
std::string first_difference(const AttentionProblem& p, const std::vector<uint8_t>& want,
                             const std::vector<uint8_t>& got) {
  const int bytes = bits_per_element(p.c.out_dtype) / 8;
  for (size_t i = 0; i < want.size(); i += bytes)
    if (std::memcmp(&want[i], &got[i], bytes) != 0) {
      const int64_t e = static_cast<int64_t>(i / bytes);
      const int64_t D = p.c.head_dim, hq = p.query_heads();
      char buf[256];
      std::snprintf(buf, sizeof buf, "row %lld head %lld dim %lld: cpu %.9g gpu %.9g", static_cast<long long>(e / (hq * D)),
                    static_cast<long long>(e / D % hq), static_cast<long long>(e % D),
                    static_cast<double>(load_float(want.data(), p.c.out_dtype, e)),
                    static_cast<double>(load_float(got.data(), p.c.out_dtype, e)));
      return buf;
    }
  return "none";
}

// Runs the problem on the GPU through the public entry points (the bulk path
// where it applies) and, when a faster path applies, again through the general
// kernel, the bulk kernel's other tile size and the staged kernel; each output
// must equal the oracle's bytes. Returns how many kernel runs were compared.
int check_against_oracle(Backend& cpu, const AttentionCase& c) {
  const AttentionProblem p = make_problem(c);
  const std::vector<uint8_t> want = oracle_output(cpu, p);
  DeviceProblem dev(p);
  const bool decode = c.chunk.empty();
  if (decode) {
    const DecodeAttentionOp op = decode_op(p, dev.placed);
    validate_decode_attention(dev.placed.pools, op);
    cuda::decode_attention(dev.placed.pools, op, nullptr);
  } else {
    const PrefillAttentionOp op = prefill_op(p, dev.placed);
    validate_prefill_attention(dev.placed.pools, op);
    cuda::prefill_attention(dev.placed.pools, op, nullptr);
  }
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const std::vector<uint8_t> got = dev.download_out(p);
  INFO(c.describe());
  INFO("path " << (c.order == AttentionOrder::mma ? "mma"
                   : cuda::choose_path(dev.placed.pools, q_view(p, dev.placed.q)) == cuda::AttentionPath::staged ? "staged"
                                                                                                                  : "general"));
  INFO("first difference: " << first_difference(p, want, got));
  CHECK(want == got);
  const cuda::AttentionPath chosen = cuda::choose_path(dev.placed.pools, q_view(p, dev.placed.q));
  if (chosen == cuda::AttentionPath::general && c.order == AttentionOrder::fp32) return 1;

  // The same op forced through the other kernels.
  std::vector<int32_t> seq, position;
  for (size_t b = 0; b < c.seq_lens.size(); ++b) {
    const int32_t n = decode ? 1 : c.chunk[b];
    for (int32_t i = 0; i < n; ++i) {
      seq.push_back(static_cast<int32_t>(b));
      position.push_back(c.seq_lens[b] - n + i);
    }
  }
  auto run_plan = [&](cuda::AttentionPath path, int tile_keys, int heads_per_item = 0) {
    dev.poison_out(p);
    cuda::AttentionPlan plan =
        cuda::make_plan("test", dev.placed.pools, 1, q_view(p, dev.placed.q), out_view(p, dev.placed.out), p.table,
                        p.max_blocks, p.attention_scales, p.window, seq, position, nullptr);
    cuda::set_order(plan, c.order);
    plan.path = path;
    plan.staged_tile_keys = tile_keys;
    plan.bulk_tile_keys = tile_keys;
    plan.bulk_heads_per_item = heads_per_item;
    cuda::launch_plan(plan, nullptr);
    cuda::release_plan(plan, nullptr);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    return dev.download_out(p);
  };
  int runs = 1;
  if (c.order == AttentionOrder::mma) {
    // The public entry took the ring kernel where it applies (a tiled
    // prefill kernel aside): the general mma kernel must give the same bytes.
    cuda::AttentionPlan probe =
        cuda::make_plan("test", dev.placed.pools, 1, q_view(p, dev.placed.q), out_view(p, dev.placed.out), p.table,
                        p.max_blocks, p.attention_scales, p.window, seq, position, nullptr);
    cuda::set_order(probe, AttentionOrder::mma);
    const bool ring = cuda::mma_ring_applies(probe);
    cuda::release_plan(probe, nullptr);
    if (!ring) return runs;
    const std::vector<uint8_t> general = run_plan(cuda::AttentionPath::general, 32);
    INFO("general mma kernel, first difference: " << first_difference(p, want, general));
    CHECK(want == general);
    const std::vector<uint8_t> ringed = run_plan(cuda::AttentionPath::mma, 32);
    INFO("mma ring kernel, first difference: " << first_difference(p, want, ringed));
    CHECK(want == ringed);
    return runs + 2;
  }
  const std::vector<uint8_t> general = run_plan(cuda::AttentionPath::general, 32);
  INFO("general path, first difference: " << first_difference(p, want, general));
  CHECK(want == general);
  ++runs;
  if (c.group != 1) {
    // The bulk path's other ring shape (16- or 32-key tiles).
    const int other_tile = cuda::default_bulk_tile_keys() == 16 ? 32 : 16;
    const std::vector<uint8_t> other = run_plan(cuda::AttentionPath::bulk, other_tile);
    INFO("bulk path with " << other_tile << "-key tiles, first difference: " << first_difference(p, want, other));
    CHECK(want == other);
    ++runs;
    // The bulk path's items of the whole group and of parts of it (one head;
    // four of a group of eight), whichever heads_per_item would choose.
    const cuda::AttentionPath bulk_or_not = cuda::choose_path(dev.placed.pools, q_view(p, dev.placed.q));
    if (bulk_or_not == cuda::AttentionPath::bulk)
      for (int heads : c.group == 8 ? std::vector<int>{8, 4, 1} : std::vector<int>{c.group, 1}) {
        const std::vector<uint8_t> split = run_plan(cuda::AttentionPath::bulk, cuda::default_bulk_tile_keys(), heads);
        INFO("bulk path with " << heads << " heads per item, first difference: " << first_difference(p, want, split));
        CHECK(want == split);
        ++runs;
      }
  }
  if (cuda::staged_applies(dev.placed.pools, q_view(p, dev.placed.q))) {
    const std::vector<uint8_t> staged = run_plan(cuda::AttentionPath::staged, cuda::default_staged_tile_keys(c.dtype));
    INFO("staged path, first difference: " << first_difference(p, want, staged));
    CHECK(want == staged);
    ++runs;
  }
  return runs;
}

constexpr CacheDtype kDtypes[] = {CacheDtype::fp32,     CacheDtype::fp16,     CacheDtype::bf16, CacheDtype::fp8_e4m3,
                                  CacheDtype::fp8_e5m2, CacheDtype::int8,     CacheDtype::nvfp4};
constexpr BlockLayout kLayouts[] = {BlockLayout::nhd, BlockLayout::hnd, BlockLayout::split_x};
constexpr LayerPlacement kPlacements[] = {LayerPlacement::in_block, LayerPlacement::per_layer};
constexpr int32_t kPages[] = {1, 3, 7, 16, 17, 64, 1024, 5};
constexpr int32_t kGroups[] = {1, 4, 8};
constexpr int32_t kHeadDims[] = {64, 80, 128, 256};
constexpr CacheDtype kFloats[] = {CacheDtype::fp32, CacheDtype::bf16, CacheDtype::fp16};
struct WindowChoice {
  int32_t window, sinks;
  bool one_more;
};
constexpr WindowChoice kWindows[] = {{0, 0, false}, {200, 4, false}, {300, 0, true}, {97, 13, false}, {0, 0, false}};

template <class T, size_t N>
const T& pick(const T (&axis)[N], int i, int stride, int offset) {
  return axis[(static_cast<size_t>(i) * stride + offset) % N];
}

// Case i of a path sweep: every 5th a window of 300 with 3 sinks, else every
// 7th (from 3) one of 517 with 16 sinks and one more block than needed.
void set_sweep_window(AttentionCase& c, int i) {
  if (i % 5 == 4) {
    c.window = 300;
    c.sinks = 3;
  } else if (i % 7 == 3) {
    c.window = 517;
    c.sinks = 16;
    c.one_more_block = true;
  }
}

// Case i of the sampled product. Lengths are ragged, odd batch sizes mostly,
// long enough for several 256-key partitions.
AttentionCase sampled_case(int i, bool prefill) {
  AttentionCase c;
  c.dtype = pick(kDtypes, i, 3, 0);
  c.layout = pick(kLayouts, i, 2, 1);
  if (c.dtype == CacheDtype::nvfp4 && c.layout == BlockLayout::split_x) c.layout = BlockLayout::hnd;
  c.placement = pick(kPlacements, i, 1, i / 2);
  c.page = pick(kPages, i, 3, 2);
  c.group = pick(kGroups, i, 2, 0);
  c.head_dim = pick(kHeadDims, i, 3, 1);
  c.kv_heads = 1 + i % 3;
  const WindowChoice w = pick(kWindows, i, 2, 3);
  c.window = w.window;
  c.sinks = w.sinks;
  c.one_more_block = w.one_more;
  c.q_dtype = pick(kFloats, i, 1, 0);
  c.out_dtype = pick(kFloats, i, 2, 1);
  c.nan_tail = i % 4 == 3 && c.out_dtype != CacheDtype::fp32;
  c.seed = 1000 + i;
  const int batch = 1 + 2 * (i % 4);  // 1, 3, 5, 7
  uint32_t h = 2654435761u * (i + 1);
  for (int b = 0; b < batch; ++b) {
    h = h * 1664525u + 1013904223u;
    c.seq_lens.push_back(1 + static_cast<int32_t>(h >> 8) % 1100);
  }
  if (prefill)
    for (int32_t len : c.seq_lens) {
      h = h * 1664525u + 1013904223u;
      c.chunk.push_back(std::min<int32_t>(len, 1 + static_cast<int32_t>(h >> 8) % 37));
    }
  return c;
}

}  // namespace

TEST_CASE("DecodeAttentionIsEquivalentToRef over a sampled product of every axis") {
  SKIP_WITHOUT_GPU();
  auto cpu = make_backend("cpu");
  int runs = 0;
  for (int i = 0; i < 56; ++i) runs += check_against_oracle(*cpu, sampled_case(i, false));
  MESSAGE("decode: 56 cases, " << runs << " kernel runs compared");
}

TEST_CASE("PrefillAttentionIsEquivalentToRef over a sampled product of every axis") {
  SKIP_WITHOUT_GPU();
  auto cpu = make_backend("cpu");
  int runs = 0;
  for (int i = 0; i < 28; ++i) runs += check_against_oracle(*cpu, sampled_case(i, true));
  MESSAGE("prefill: 28 cases, " << runs << " kernel runs compared");
}

// The bulk (and staged) paths' every instantiation family: 8/16/32-bit codes,
// D 64/128/256, G 1/4/8, NHD and HND, pages 16 and 64 and odd ones (1, 3, 7,
// 17), long contexts, windows with sinks.
TEST_CASE("DecodeAttentionStagedPathIsEquivalentToRef") {
  SKIP_WITHOUT_GPU();
  auto cpu = make_backend("cpu");
  int i = 0;
  for (CacheDtype dtype : {CacheDtype::bf16, CacheDtype::fp16, CacheDtype::fp8_e4m3, CacheDtype::fp8_e5m2,
                           CacheDtype::int8, CacheDtype::fp32})
    for (int32_t D : {64, 128, 256})
      for (int32_t G : {1, 4, 8}) {
        AttentionCase c;
        c.dtype = dtype;
        c.head_dim = D;
        c.group = G;
        c.layout = i % 2 ? BlockLayout::hnd : BlockLayout::nhd;
        c.placement = i % 3 ? LayerPlacement::in_block : LayerPlacement::per_layer;
        constexpr int32_t kStagedPages[] = {64, 16, 7, 1, 3, 17};
        c.page = kStagedPages[i % 6];
        c.kv_heads = 1 + i % 2;
        c.q_dtype = i % 2 ? CacheDtype::bf16 : CacheDtype::fp32;
        c.out_dtype = i % 3 ? CacheDtype::bf16 : CacheDtype::fp32;
        c.seq_lens = {1, 1900 + i, 257, 33 + i, 512};
        set_sweep_window(c, i);
        c.seed = 77 + i;
        check_against_oracle(*cpu, c);
        ++i;
      }
}

TEST_CASE("DecodeAttentionNanTailIsEquivalentToRef: a NaN in the last page's V tail poisons the output as in the oracle") {
  SKIP_WITHOUT_GPU();
  auto cpu = make_backend("cpu");
  for (CacheDtype dtype : {CacheDtype::bf16, CacheDtype::fp8_e4m3, CacheDtype::nvfp4, CacheDtype::fp16}) {
    AttentionCase c;
    c.dtype = dtype;
    c.page = 16;
    c.seq_lens = {5, 16, 300, 33};  // 16: a full last page has no tail
    c.out_dtype = CacheDtype::bf16;
    c.nan_tail = true;
    const AttentionProblem p = make_problem(c);
    const std::vector<uint8_t> want = oracle_output(*cpu, p);
    // The oracle itself: sequences with a tail are NaN, the full one is not.
    const int64_t per_row = p.query_heads() * c.head_dim;
    CHECK(std::isnan(load_float(want.data(), CacheDtype::bf16, 0)));
    CHECK_FALSE(std::isnan(load_float(want.data(), CacheDtype::bf16, per_row)));
    check_against_oracle(*cpu, c);
  }
}

TEST_CASE("OneTokenPrefillIsEquivalentToDecodeOnTheGpu (both orders)") {
  SKIP_WITHOUT_GPU();
  for (AttentionOrder order : {AttentionOrder::fp32, AttentionOrder::mma}) {
    AttentionCase c;
    c.order = order;
    c.dtype = CacheDtype::bf16;
    c.layout = BlockLayout::hnd;
    c.seq_lens = {700, 3, 1025};
    c.out_dtype = CacheDtype::fp32;
    const AttentionProblem decode = make_problem(c);
    c.chunk = {1, 1, 1};
    const AttentionProblem prefill = make_problem(c);
    REQUIRE(decode.q == prefill.q);
    DeviceProblem d1(decode), d2(prefill);
    cuda::decode_attention(d1.placed.pools, decode_op(decode, d1.placed), nullptr);
    cuda::prefill_attention(d2.placed.pools, prefill_op(prefill, d2.placed), nullptr);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    INFO("order " << attention_order_name(order));
    CHECK(d1.download_out(decode) == d2.download_out(prefill));
  }
}

// Inf and NaN codes inside attended K and V rows (not only the V tail): the
// bulk path's arithmetic-only decoders must give the oracle's bytes (NaN and
// Inf outputs included), for every float cache dtype, GQA 32:8 and 64:8.
TEST_CASE("DecodeAttentionInfNanCodesAreEquivalentToRef") {
  SKIP_WITHOUT_GPU();
  auto cpu = make_backend("cpu");
  int i = 0;
  for (CacheDtype dtype : {CacheDtype::bf16, CacheDtype::fp8_e4m3, CacheDtype::fp8_e5m2, CacheDtype::fp16, CacheDtype::fp32})
    for (int32_t G : {4, 8})
      for (int32_t every : {60000, 200000}) {
        AttentionCase c;
        c.dtype = dtype;
        c.layout = i % 2 ? BlockLayout::hnd : BlockLayout::nhd;
        c.page = i % 3 == 0 ? 16 : (i % 3 == 1 ? 17 : 3);
        c.group = G;
        c.kv_heads = 3;
        c.head_dim = 128;
        c.seq_lens = {40, 300, 1, 700, 257};
        c.out_dtype = i % 2 ? CacheDtype::fp32 : CacheDtype::bf16;
        c.special_every = every;
        c.seed = 500 + i;
        check_against_oracle(*cpu, c);
        ++i;
      }
}

// A small problem per main instantiation, for compute-sanitizer (memcheck,
// racecheck): bf16 and fp8 e4m3, GQA 4 and 8, both tile sizes, a partial last
// tile, a one-key sequence and a window with sinks.
TEST_CASE("DecodeAttentionBulkSmall") {
  SKIP_WITHOUT_GPU();
  auto cpu = make_backend("cpu");
  for (CacheDtype dtype : {CacheDtype::bf16, CacheDtype::fp8_e4m3})
    for (int32_t G : {4, 8}) {
      AttentionCase c;
      c.dtype = dtype;
      c.layout = BlockLayout::hnd;
      c.group = G;
      c.page = 16;
      c.seq_lens = {300, 1, 45};
      c.seed = 9 + G;
      check_against_oracle(*cpu, c);
      c.window = 100;
      c.sinks = 4;
      c.seq_lens = {333, 7};
      check_against_oracle(*cpu, c);
    }
}

namespace {
// Every code of the packed decoders in every position of its word, with
// neighbours that are finite and Inf/NaN codes alike.
__global__ void packed_decode_kernel(const uint32_t* words, int64_t n, float* e4m3, float* e5m2, float* f16) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    canon::decode_e4m3x4(words[i], e4m3 + 4 * i);
    canon::decode_e5m2x4(words[i], e5m2 + 4 * i);
    canon::decode_f16x2(words[i], f16 + 2 * i);
  }
}
// The arithmetic-only decoders: [n][4] e4m3, [n][4] e5m2, [n][2] f16,
// [n][2] e4m3 pairs, [n][2] e5m2 pairs (low half of each word).
__global__ void arith_decode_kernel(const uint32_t* words, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    canon::decode_e4m3x4_arith(words[i], out + 4 * i);
    canon::decode_e5m2x4_arith(words[i], out + 4 * n + 4 * i);
    canon::decode_f16x2_arith(words[i], out + 8 * n + 2 * i);
    canon::decode_e4m3x2_arith(static_cast<uint16_t>(words[i]), out + 10 * n + 2 * i);
    canon::decode_e5m2x2_arith(static_cast<uint16_t>(words[i]), out + 12 * n + 2 * i);
  }
}
// Equal bits, or both NaN (the arithmetic-only contract).
bool same_or_both_nan(float got, float want) {
  return float_bits(got) == float_bits(want) || (std::isnan(got) && std::isnan(want));
}
}  // namespace

TEST_CASE("PackedDecodersAreEquivalentToCoreCodecsForEveryCode (device and host)") {
  SKIP_WITHOUT_GPU();
  std::vector<uint32_t> words;
  for (uint32_t a = 0; a < 256; ++a)
    for (uint32_t b = 0; b < 256; ++b) {
      words.push_back(a | b << 8 | a << 16 | b << 24);
      words.push_back(b | a << 8 | (a ^ 0x5A) << 16 | (b ^ 0xC3) << 24);
    }
  for (uint32_t h = 0; h < 65536; ++h) words.push_back(h | (h ^ 0x7C01u) << 16);
  const int64_t n = static_cast<int64_t>(words.size());
  uint32_t* d_words = nullptr;
  float* d_out = nullptr;
  REQUIRE(cudaMalloc(&d_words, n * 4) == cudaSuccess);
  REQUIRE(cudaMalloc(&d_out, n * 14 * 4) == cudaSuccess);
  REQUIRE(cudaMemcpy(d_words, words.data(), n * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  packed_decode_kernel<<<256, 256>>>(d_words, n, d_out, d_out + 4 * n, d_out + 8 * n);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  std::vector<float> dev(n * 10);
  REQUIRE(cudaMemcpy(dev.data(), d_out, n * 40, cudaMemcpyDeviceToHost) == cudaSuccess);
  std::vector<float> arith(n * 14);
  arith_decode_kernel<<<256, 256>>>(d_words, n, d_out);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(cudaMemcpy(arith.data(), d_out, n * 14 * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  cudaFree(d_words);
  cudaFree(d_out);
  int64_t arith_differ = 0, arith_exact_nonnan = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t w = words[i];
    for (int k = 0; k < 4; ++k) {
      const float e4 = codec::e4m3_to_f32(static_cast<uint8_t>(w >> (8 * k)));
      const float e5 = codec::e5m2_to_f32(static_cast<uint8_t>(w >> (8 * k)));
      arith_differ += !same_or_both_nan(arith[4 * i + k], e4);
      arith_differ += !same_or_both_nan(arith[4 * n + 4 * i + k], e5);
      arith_exact_nonnan += !std::isnan(e4) && float_bits(arith[4 * i + k]) == float_bits(e4);
    }
    for (int k = 0; k < 2; ++k) {
      arith_differ += !same_or_both_nan(arith[8 * n + 2 * i + k], codec::f16_to_f32(static_cast<uint16_t>(w >> (16 * k))));
      arith_differ += !same_or_both_nan(arith[10 * n + 2 * i + k], codec::e4m3_to_f32(static_cast<uint8_t>(w >> (8 * k))));
      arith_differ += !same_or_both_nan(arith[12 * n + 2 * i + k], codec::e5m2_to_f32(static_cast<uint8_t>(w >> (8 * k))));
    }
  }
  CHECK(arith_differ == 0);
  CHECK(arith_exact_nonnan > 0);
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    float host[10];
    canon::decode_e4m3x4(words[i], host);
    canon::decode_e5m2x4(words[i], host + 4);
    canon::decode_f16x2(words[i], host + 8);
    for (int k = 0; k < 4; ++k) {
      const uint32_t w = words[i];
      differ += float_bits(host[k]) != float_bits(codec::e4m3_to_f32(static_cast<uint8_t>(w >> (8 * k))));
      differ += float_bits(host[4 + k]) != float_bits(codec::e5m2_to_f32(static_cast<uint8_t>(w >> (8 * k))));
      differ += float_bits(dev[4 * i + k]) != float_bits(host[k]);
      differ += float_bits(dev[4 * n + 4 * i + k]) != float_bits(host[4 + k]);
    }
    for (int k = 0; k < 2; ++k) {
      differ += float_bits(host[8 + k]) != float_bits(codec::f16_to_f32(static_cast<uint16_t>(words[i] >> (16 * k))));
      differ += float_bits(dev[8 * n + 2 * i + k]) != float_bits(host[8 + k]);
    }
  }
  CHECK(differ == 0);
}

namespace {
// Case i of a tiled prefill kernel's sweep: whole prompts (prefix 0), a chunk
// after a cached prefix, a one-token chunk, partition and tile edges (256,
// 257, 64, 65), a long chunk; layouts, placements, q/out dtypes, NaN tails
// and Inf/NaN codes rotate with i.
AttentionCase tiled_prefill_case(int i, AttentionOrder order, CacheDtype dtype, int32_t G, int32_t page) {
  AttentionCase c;
  c.order = order;
  c.dtype = dtype;
  c.group = G;
  c.page = page;
  c.kv_heads = 1 + i % 2;
  c.layout = i % 2 ? BlockLayout::hnd : BlockLayout::nhd;
  c.placement = i % 3 ? LayerPlacement::in_block : LayerPlacement::per_layer;
  c.q_dtype = kFloats[i % 3];
  c.out_dtype = kFloats[(i / 3) % 3];
  c.seq_lens = {300 + i, 257, 1, 600, 64 + i % 3, 1023};
  c.chunk = {300 + i, 1, 1, 256 + i % 5, 64 + i % 3, 700};
  c.nan_tail = i % 4 == 1;
  c.special_every = i % 5 == 2 ? 997 : 0;
  c.seed = (order == AttentionOrder::mma ? 5151 : 4242) + i;
  return c;
}

// One tiled prefill kernel's sweep against the oracle (every case must take
// that kernel), then its resources on this device (docs/benchmarks.md quotes
// them).
template <class Keep, class Applies, class Info>
void check_tiled_prefill_sweep(AttentionOrder order, std::initializer_list<CacheDtype> dtypes,
                               std::initializer_list<int32_t> groups, Keep keep, Applies applies, Info info_of) {
  auto cpu = make_backend("cpu");
  int i = 0;
  for (CacheDtype dtype : dtypes)
    for (int32_t G : groups)
      for (int32_t page : {1, 3, 16, 17}) {
        if (!keep(G, page)) continue;
        const AttentionCase c = tiled_prefill_case(i, order, dtype, G, page);
        const AttentionProblem p = make_problem(c);
        DeviceProblem dev(p);
        INFO(c.describe());
        CHECK(applies(dev.placed.pools, q_view(p, dev.placed.q), p.window));
        check_against_oracle(*cpu, c);
        ++i;
      }
  MESSAGE(std::string(attention_order_name(order)) << " order tiled prefill: " << i << " cases compared");
  AttentionCase c;
  c.order = order;
  c.dtype = CacheDtype::bf16;
  c.seq_lens = {64};
  c.chunk = {64};
  const AttentionProblem p = make_problem(c);
  DeviceProblem dev(p);
  cuda::KernelInfo info;
  REQUIRE(info_of(dev.placed.pools, q_view(p, dev.placed.q), info));
  CHECK(info.registers > 0);
  CHECK(info.ctas_per_sm >= 1);
  MESSAGE(std::string(attention_order_name(order)) << " order tiled prefill kernel (bf16, G 4): " << info.registers
                                      << " registers, " << info.smem_per_cta << " bytes of shared memory, "
                                      << info.ctas_per_sm << " CTA(s) per SM, " << info.warps_per_cta << " warps");
}
}  // namespace

// The tiled prefill kernel (attention_prefill.cu): blocks of consecutive rows
// sharing tiles, two passes, causal skipping. Every dtype and GQA group it
// instantiates, pages 1/3/16/17, chunks that start and end on and off 64-key
// tiles and 256-key partitions, a prefix already in the cache, ragged batches,
// NaN-poisoned V tails, Inf/NaN codes in live K/V, bf16/fp16/fp32 q and out.
TEST_CASE("PrefillTiledIsEquivalentToRef") {
  SKIP_WITHOUT_GPU();
  check_tiled_prefill_sweep(AttentionOrder::fp32, {CacheDtype::bf16, CacheDtype::fp16, CacheDtype::fp32}, {1, 2, 4, 8},
                            [](int32_t, int32_t) { return true; }, cuda::prefill_tiled_applies, cuda::prefill_tiled_info);
}

TEST_CASE("PrefillTiledNanTailAndSpecialsAreTheOracles: NaN and Inf codes reach the same output bytes") {
  SKIP_WITHOUT_GPU();
  auto cpu = make_backend("cpu");
  for (CacheDtype dtype : {CacheDtype::bf16, CacheDtype::fp16, CacheDtype::fp32}) {
    AttentionCase c;
    c.dtype = dtype;
    c.group = 4;
    c.page = 16;
    c.seq_lens = {261, 520, 16};
    c.chunk = {261, 300, 16};
    c.out_dtype = CacheDtype::fp32;
    c.nan_tail = true;
    c.special_every = 211;
    c.seed = 99;
    const AttentionProblem p = make_problem(c);
    const std::vector<uint8_t> want = oracle_output(*cpu, p);
    int nans = 0;
    for (int64_t e = 0; e < static_cast<int64_t>(want.size() / 4); ++e) nans += std::isnan(load_float(want.data(), CacheDtype::fp32, e));
    CHECK(nans > 0);  // the specials do reach the output
    check_against_oracle(*cpu, c);
  }
}

// Pass 1 of the tiled prefill kernel finds each row's max from tensor-core
// bounds and the canonical scores of the candidates only. Near-tie keys put
// many keys inside one bound of each other (spread 0: every key the same, so
// every tile falls back to all its scores; 1e-3: most; 0.02 and 0.3: a few
// per tile), a negative or zero k_scale turns the bounds off, and tiny and huge q
// scales leave the bound's range. The max shows in the LSE (M + log L) and,
// through the merge weights, in the output: both are compared byte for byte.
TEST_CASE("PrefillTiledBoundedMaxIsTheOracles: near-tie keys, scales off the bound's range, LSE bytes") {
  SKIP_WITHOUT_GPU();
  auto cpu = make_backend("cpu");
  int i = 0;
  for (CacheDtype dtype : {CacheDtype::bf16, CacheDtype::fp16, CacheDtype::fp32})
    for (float spread : {0.0f, 1e-3f, 0.02f, 0.3f})
      for (float scale : {1.0f, -0.5f, 0.0f, 1e-20f, 1e16f}) {
        if ((scale != 1.0f) && spread != 0.02f) continue;
        AttentionCase c;
        c.dtype = dtype;
        c.group = i % 2 ? 4 : 8;
        c.kv_heads = 2;
        c.page = i % 3 ? 16 : 7;
        c.layout = i % 2 ? BlockLayout::hnd : BlockLayout::nhd;
        c.q_dtype = kFloats[i % 3];
        c.seq_lens = {700 + i, 300, 1100};
        c.chunk = {700 + i, 64, 600};
        c.key_spread = spread;
        c.seed = 777 + i;
        AttentionProblem p = make_problem(c);
        if (scale == -0.5f || scale == 0.0f) p.attention_scales.k_scale = scale;
        if (scale == 1e-20f || scale == 1e16f) {  // q itself out of [2^-60, 2^50]: every key a candidate
          for (int64_t e = 0; e < p.rows * p.query_heads() * c.head_dim; ++e)
            store_float(p.q.data(), c.q_dtype, e, load_float(p.q.data(), c.q_dtype, e) * scale);
          p.attention_scales.sm_scale = 1.0f / scale;
        }
        INFO(c.describe() << " scale case " << scale);
        const int64_t lse_count = p.rows * p.query_heads();
        // The oracle, with its LSE.
        PlacedProblem host;
        host.pools = cpu->allocate_pools(p.geometry, 0xFF);
        cpu->to_backend(host.pools.data[0], p.pool.data(), p.pool.size());
        BackendBuffer q(*cpu, p.q.size()), out(*cpu, p.out_bytes()), lse(*cpu, lse_count * 4);
        q.upload(p.q.data(), p.q.size());
        host.q = q.get();
        host.out = out.get();
        PrefillAttentionOp op = prefill_op(p, host);
        op.lse = contiguous_view(lse.get(), CacheDtype::fp32, {p.rows, p.query_heads()});
        cpu->prefill_attention(host.pools, op);
        std::vector<uint8_t> want_out(p.out_bytes()), want_lse(lse_count * 4);
        out.download(want_out.data(), want_out.size());
        lse.download(want_lse.data(), want_lse.size());
        cpu->release_pools(host.pools);
        // The GPU's.
        DeviceProblem dev(p);
        REQUIRE(cuda::prefill_tiled_applies(dev.placed.pools, q_view(p, dev.placed.q), p.window));
        void* dev_lse = nullptr;
        REQUIRE(cudaMalloc(&dev_lse, lse_count * 4) == cudaSuccess);
        REQUIRE(cudaMemset(dev_lse, 0xFF, lse_count * 4) == cudaSuccess);
        PrefillAttentionOp dop = prefill_op(p, dev.placed);
        dop.lse = contiguous_view(dev_lse, CacheDtype::fp32, {p.rows, p.query_heads()});
        validate_prefill_attention(dev.placed.pools, dop);
        cuda::prefill_attention(dev.placed.pools, dop, nullptr);
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        std::vector<uint8_t> got_lse(lse_count * 4);
        REQUIRE(cudaMemcpy(got_lse.data(), dev_lse, got_lse.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
        cudaFree(dev_lse);
        const std::vector<uint8_t> got_out = dev.download_out(p);
        INFO("first difference: " << first_difference(p, want_out, got_out));
        CHECK(want_out == got_out);
        int64_t lse_differ = 0;
        for (size_t b = 0; b < want_lse.size(); b += 4) lse_differ += std::memcmp(&want_lse[b], &got_lse[b], 4) != 0;
        CHECK(lse_differ == 0);
        ++i;
      }
  MESSAGE("bounded pass 1: " << i << " cases, output and LSE compared");
  CHECK(i == 3 * (4 + 4));
}

// ---------------------------------------------------------------- the mma order
// attention_mma.cu's tensor-core kernel against core's attend_query_mma (the
// mma.sync model) on the CPU, byte for byte: the sampled product of every
// axis with the cache dtypes the order is offered for, GQA beyond 16 heads
// per KV head (blocks of 16 rows), NaN tails and Inf/NaN codes.
namespace {
constexpr CacheDtype kMmaDtypes[] = {CacheDtype::bf16, CacheDtype::fp16, CacheDtype::fp8_e4m3, CacheDtype::fp8_e5m2,
                                     CacheDtype::int8};
AttentionCase mma_case(int i, bool prefill) {
  AttentionCase c = sampled_case(i, prefill);
  c.order = AttentionOrder::mma;
  c.dtype = pick(kMmaDtypes, i, 2, 0);
  return c;
}
}  // namespace

TEST_CASE("MmaOrderDecodeAttentionIsEquivalentToRef over a sampled product of every axis") {
  SKIP_WITHOUT_GPU();
  auto cpu = make_backend("cpu");
  for (int i = 0; i < 32; ++i) check_against_oracle(*cpu, mma_case(i, false));
}

namespace {
template <bool kE5m2>
__global__ void fp8_pairs_to_bf16(uint32_t* out) {
  const uint32_t pair = blockIdx.x * blockDim.x + threadIdx.x;
  if (pair < 65536u) out[pair] = cuda::fp8x2_to_bf16x2<kE5m2>(pair);
}
bool bf16_is_nan(uint32_t code) { return (code & 0x7F80u) == 0x7F80u && (code & 0x7Fu) != 0u; }
}  // namespace

// The ring kernel's fp8 -> bf16 pair conversion (pinned cvt instructions)
// against core's cache_operand_code, every one of the 65,536 pairs of each
// format: the same code, or NaN for NaN (the instruction ignores payloads).
TEST_CASE("Fp8PairsBecomeTheOraclesBf16Codes for every pair of codes") {
  SKIP_WITHOUT_GPU();
  for (CacheDtype t : {CacheDtype::fp8_e4m3, CacheDtype::fp8_e5m2}) {
    uint32_t* dev = nullptr;
    REQUIRE(cudaMalloc(&dev, 65536 * sizeof(uint32_t)) == cudaSuccess);
    if (t == CacheDtype::fp8_e5m2) fp8_pairs_to_bf16<true><<<256, 256>>>(dev);
    else fp8_pairs_to_bf16<false><<<256, 256>>>(dev);
    std::vector<uint32_t> got(65536);
    REQUIRE(cudaMemcpy(got.data(), dev, got.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost) == cudaSuccess);
    cudaFree(dev);
    int wrong = 0, nans = 0;
    for (uint32_t pair = 0; pair < 65536u; ++pair)
      for (int half = 0; half < 2; ++half) {
        const uint32_t want = mma_order::cache_operand_code(t, (pair >> (8 * half)) & 0xFFu);
        const uint32_t code = (got[pair] >> (16 * half)) & 0xFFFFu;
        const bool same = bf16_is_nan(want) ? bf16_is_nan(code) : code == want;
        nans += bf16_is_nan(want);
        if (!same && wrong++ < 4)
          MESSAGE(std::string(dtype_name(t)) << " pair " << pair << " half " << half << ": want " << want << ", got " << code);
      }
    CHECK(wrong == 0);
    CHECK(nans > 0);
  }
}

// attention_mma_ring.cu's every instantiation (bf16/fp16/fp8 e4m3/e5m2, D
// 64/128/256) and group size 1..8 (odd ones included: absent heads are zero columns), NHD and
// HND, odd and large pages, lengths around the 16-key tiles and 256-key
// partitions, windows with sinks, NaN tails and Inf/NaN codes, decode and
// prefill: the public entry, the general mma kernel and the ring kernel each
// give the oracle's bytes.
TEST_CASE("MmaOrderRingKernelIsEquivalentToRef") {
  SKIP_WITHOUT_GPU();
  auto cpu = make_backend("cpu");
  int i = 0, runs = 0;
  for (CacheDtype dtype : {CacheDtype::bf16, CacheDtype::fp16, CacheDtype::fp8_e4m3, CacheDtype::fp8_e5m2})
    for (int32_t D : {64, 128, 256})
      for (int32_t G : {1, 2, 3, 4, 5, 8}) {
        // fp8: the groups of each score-row instantiation, fewer of them (the oracle's model is slow).
        if (is_fp8(dtype) && G != 1 && G != 3 && G != 8) continue;
        AttentionCase c;
        c.order = AttentionOrder::mma;
        c.dtype = dtype;
        c.head_dim = D;
        c.group = G;
        c.layout = i % 2 ? BlockLayout::hnd : BlockLayout::nhd;
        c.placement = i % 3 ? LayerPlacement::in_block : LayerPlacement::per_layer;
        constexpr int32_t kRingPages[] = {16, 7, 1, 64, 3, 17, 1024};
        c.page = kRingPages[i % 7];
        c.kv_heads = 1 + i % 3;
        c.q_dtype = i % 2 ? CacheDtype::bf16 : CacheDtype::fp32;
        c.out_dtype = i % 3 ? CacheDtype::bf16 : CacheDtype::fp32;
        c.seq_lens = {1, 16, 17, 256, 257, 1900 + i, 33 + i};
        set_sweep_window(c, i);
        c.nan_tail = i % 4 == 1 && c.out_dtype != CacheDtype::fp32;
        c.special_every = i % 6 == 5 ? 997 : 0;
        if (i % 3 == 2)
          for (int32_t len : c.seq_lens) c.chunk.push_back(std::min<int32_t>(len, 1 + (len * 7 + i) % 40));
        c.seed = 3131 + i;
        runs += check_against_oracle(*cpu, c);
        ++i;
      }
  MESSAGE("mma ring: " << i << " cases, " << runs << " kernel runs compared");
  CHECK(runs == 3 * i);  // every case took the ring kernel and the general one
}

TEST_CASE("MmaOrderPrefillAttentionIsEquivalentToRef over a sampled product of every axis") {
  SKIP_WITHOUT_GPU();
  auto cpu = make_backend("cpu");
  for (int i = 0; i < 12; ++i) check_against_oracle(*cpu, mma_case(i, true));
}

TEST_CASE("MmaOrderWideGroupsNanTailAndSpecialsAreEquivalentToRef") {
  SKIP_WITHOUT_GPU();
  auto cpu = make_backend("cpu");
  int i = 0;
  for (CacheDtype dtype : kMmaDtypes)
    for (int32_t G : {8, 20, 32}) {
      AttentionCase c;
      c.order = AttentionOrder::mma;
      c.dtype = dtype;
      c.group = G;
      c.kv_heads = 1 + i % 2;
      c.head_dim = i % 3 == 0 ? 80 : 128;
      c.page = i % 2 ? 16 : 7;
      c.layout = i % 2 ? BlockLayout::hnd : BlockLayout::nhd;
      c.seq_lens = {1, 300, 17, 530};
      c.out_dtype = i % 2 ? CacheDtype::bf16 : CacheDtype::fp32;
      c.q_dtype = i % 3 == 1 ? CacheDtype::bf16 : CacheDtype::fp32;
      c.nan_tail = i % 4 == 1;
      c.special_every = i % 4 == 2 ? 20000 : 0;
      c.seed = 900 + i;
      check_against_oracle(*cpu, c);
      if (i % 3 == 0) {
        c.chunk = {1, 37, 17, 5};
        check_against_oracle(*cpu, c);
      }
      ++i;
    }
}

// The mma order's tiled prefill kernel (attention_prefill_mma.cu): bf16 and
// fp16 caches, GQA groups that fill the 16-row tiles exactly (1, 2, 4, 8) and
// one that does not (20: tiles span rows and a CTA's last units are idle),
// pages 1/3/16/17 (key lists of one tile ending in different pages: the
// per-cut P.V), chunks on and off 64-key tiles and 256-key partitions, a
// cached prefix, NaN-poisoned V tails past some lists, Inf/NaN codes in live
// K/V, bf16/fp16/fp32 q and out.
TEST_CASE("MmaOrderPrefillTiledIsEquivalentToRef") {
  SKIP_WITHOUT_GPU();
  // The oracle's model is slow: fewer cases for the wide groups.
  check_tiled_prefill_sweep(AttentionOrder::mma, {CacheDtype::bf16, CacheDtype::fp16}, {1, 2, 4, 8, 20},
                            [](int32_t G, int32_t page) { return G <= 4 || page == 1 || page == 17; },
                            cuda::prefill_mma_applies, cuda::prefill_mma_info);
}
