// core on the device is core on the host: the same header-only functions,
// compiled by nvcc with -fmad=false, must give byte-identical results to the
// host build for every fp32 input of every codec, for every pool offset of a
// sweep of geometries, and for nvfp4 blocks and RoPE rotations. This is the
// first differential (CPU vs CUDA) test; it skips, saying so, without a GPU.
#include <doctest/doctest.h>

#include <cuda_runtime.h>
#include <tbb/parallel_for.h>
#include <tbb/blocked_range.h>
#include <tbb/enumerable_thread_specific.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <kvsim/validation.hpp>
#include <kvsim/core.hpp>
#include "tests/cuda/gpu_skip.hpp"

namespace {

using namespace kvsim;


#define CUDA_OK(expr) REQUIRE_MESSAGE((expr) == cudaSuccess, #expr << ": " << cudaGetErrorString(cudaGetLastError()))

// Codes of every codec for one input, packed so one comparison covers all.
struct Codes {
  uint8_t e4m3_sat, e4m3_nosat, e5m2_sat, e5m2_nosat, e2m1, int8;
  uint16_t bf16, f16;
};

KVSIM_HD Codes encode_all(uint32_t bits) {
  const float f = bits_float(bits);
  Codes c{};
  c.e4m3_sat = codec::f32_to_e4m3(f, codec::Saturation::finite);
  c.e4m3_nosat = codec::f32_to_e4m3(f, codec::Saturation::none);
  c.e5m2_sat = codec::f32_to_e5m2(f, codec::Saturation::finite);
  c.e5m2_nosat = codec::f32_to_e5m2(f, codec::Saturation::none);
  c.e2m1 = codec::f32_to_e2m1(f);
  c.int8 = static_cast<uint8_t>(codec::f32_to_int8(f));
  c.bf16 = codec::f32_to_bf16(f);
  c.f16 = codec::f32_to_f16(f);
  return c;
}

// f(bits) for every one of the 2^32 fp32 bit patterns, on the device by
// `Kernel` and on the host by f itself, chunk by chunk: the count of inputs
// whose results differ in any byte (the first named).
template <class Codes, Codes (*f)(uint32_t)>
__global__ void every_input_kernel(uint64_t begin, uint32_t count, Codes* out) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x)
    out[i] = f(static_cast<uint32_t>(begin + i));
}

template <class Codes, Codes (*f)(uint32_t)>
void check_every_fp32_input_on_device_and_host() {
  constexpr uint32_t kChunk = 1u << 26;
  Codes* d_out = nullptr;
  CUDA_OK(cudaMalloc(&d_out, sizeof(Codes) * kChunk));
  std::vector<Codes> h_out(kChunk);
  std::atomic<uint64_t> mismatches{0};
  std::atomic<uint64_t> first_bad{~0ull};
  for (uint64_t begin = 0; begin < (1ull << 32); begin += kChunk) {
    every_input_kernel<Codes, f><<<1024, 256>>>(begin, kChunk, d_out);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaMemcpy(h_out.data(), d_out, sizeof(Codes) * kChunk, cudaMemcpyDeviceToHost));
    tbb::parallel_for(tbb::blocked_range<uint32_t>(0, kChunk, 1u << 16), [&](const tbb::blocked_range<uint32_t>& r) {
      for (uint32_t i = r.begin(); i < r.end(); ++i) {
        const Codes host = f(static_cast<uint32_t>(begin + i));
        if (std::memcmp(&host, &h_out[i], sizeof(Codes)) != 0) {
          mismatches.fetch_add(1);
          uint64_t expected = ~0ull;
          first_bad.compare_exchange_strong(expected, begin + i);
        }
      }
    });
  }
  cudaFree(d_out);
  INFO("first mismatching fp32 input: 0x" << std::hex << first_bad.load());
  CHECK(mismatches.load() == 0);
}

// The attention kernels' per-score arithmetic: exp_f32 (its one-multiply
// path and the two steps) and the mma order's hi/lo split, whose device form
// is the conversion instructions and whose host form is the formula.
struct ScoreCodes {
  uint32_t exp;
  uint16_t bf16_hi, bf16_lo, f16_hi, f16_lo;
};

KVSIM_HD ScoreCodes score_codes(uint32_t bits) {
  const float f = bits_float(bits);
  const mma_order::SplitProbability b = mma_order::split_probability(mma::Operand::bf16, f);
  const mma_order::SplitProbability h = mma_order::split_probability(mma::Operand::fp16, f);
  return {float_bits(canon::exp_f32(f)), static_cast<uint16_t>(b.hi), static_cast<uint16_t>(b.lo),
          static_cast<uint16_t>(h.hi), static_cast<uint16_t>(h.lo)};
}

// The pair codec's two satfinite fp8 codes: on the device the conversion
// instruction (cvt.rn.satfinite.e4m3x2/e5m2x2.f32 and the NaN select), on the
// host the scalar codec. The high input is the low one with its halves
// swapped, so every fp32 input is tried in both bytes.
struct Fp8PairCodes {
  uint16_t e4m3, e5m2;
};

KVSIM_HD Fp8PairCodes fp8_pair_codes(uint32_t bits) {
  const float lo = bits_float(bits), hi = bits_float((bits << 16) | (bits >> 16));
  return {codec::f32x2_to_fp8x2_satfinite<false>(lo, hi), codec::f32x2_to_fp8x2_satfinite<true>(lo, hi)};
}

}  // namespace

TEST_CASE("Fp8PairInstructionIsTheCodec: satfinite e4m3x2 / e5m2x2 of every fp32 input in either byte") {
  SKIP_WITHOUT_GPU();
  check_every_fp32_input_on_device_and_host<Fp8PairCodes, fp8_pair_codes>();
}

TEST_CASE("every fp32 input encodes to the same bytes on device and host (all codecs)") {
  SKIP_WITHOUT_GPU();
  check_every_fp32_input_on_device_and_host<Codes, encode_all>();
}

TEST_CASE("SplitProbabilityInstructionsAreTheFormula: exp_f32 and the hi/lo split of every fp32 input on device and host") {
  SKIP_WITHOUT_GPU();
  check_every_fp32_input_on_device_and_host<ScoreCodes, score_codes>();
}

namespace {
__global__ void offsets_kernel(PoolStrides s, PoolGeometry g, int64_t* out) {
  const int64_t per_block = g.block_elements();
  const int64_t n = g.primary_blocks * per_block;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    // Decompose i as logical coordinates (block, layer, kv, head, token, dim).
    int64_t r = i;
    const int32_t dim = static_cast<int32_t>(r % g.head_dim); r /= g.head_dim;
    const int32_t token = static_cast<int32_t>(r % g.tokens_per_block); r /= g.tokens_per_block;
    const int32_t head = static_cast<int32_t>(r % g.kv_heads); r /= g.kv_heads;
    const int32_t kv = static_cast<int32_t>(r % g.kv_factor); r /= g.kv_factor;
    const int32_t layer = static_cast<int32_t>(r % g.layers); r /= g.layers;
    out[i] = element_offset(s, r, layer, kv, head, token, dim);
  }
}
}  // namespace

TEST_CASE("element_offset gives the same offsets on device and host across layouts, placements, odd sizes") {
  SKIP_WITHOUT_GPU();
  for (BlockLayout layout : {BlockLayout::nhd, BlockLayout::hnd, BlockLayout::split_x})
    for (LayerPlacement placement : {LayerPlacement::in_block, LayerPlacement::per_layer})
      for (int32_t page : {1, 3, 7, 16, 17}) {
        PoolGeometry g;
        g.layers = 3; g.kv_factor = 2; g.kv_heads = 3; g.tokens_per_block = page; g.head_dim = 48;
        g.dtype = CacheDtype::fp16; g.layout = layout; g.placement = placement; g.primary_blocks = 5;
        validate_geometry(g);
        const PoolStrides s = contiguous_strides(g);
        const int64_t n = g.pool_elements(PoolKind::primary);
        int64_t* d = nullptr;
        CUDA_OK(cudaMalloc(&d, sizeof(int64_t) * n));
        offsets_kernel<<<256, 256>>>(s, g, d);
        CUDA_OK(cudaGetLastError());
        std::vector<int64_t> dev(n);
        CUDA_OK(cudaMemcpy(dev.data(), d, sizeof(int64_t) * n, cudaMemcpyDeviceToHost));
        cudaFree(d);
        int64_t i = 0;
        int64_t bad = 0;
        for (int64_t b = 0; b < g.primary_blocks; ++b)
          for (int32_t l = 0; l < g.layers; ++l)
            for (int32_t kv = 0; kv < g.kv_factor; ++kv)
              for (int32_t h = 0; h < g.kv_heads; ++h)
                for (int32_t t = 0; t < g.tokens_per_block; ++t)
                  for (int32_t dd = 0; dd < g.head_dim; ++dd, ++i)
                    bad += dev[i] != element_offset(s, b, l, kv, h, t, dd);
        INFO(geometry_summary(g));
        CHECK(bad == 0);
      }
}

namespace {
__global__ void nvfp4_rope_kernel(const float* x, int nblocks, float g, uint8_t* packed, uint8_t* scales,
                                  float* decoded, float* rot, const float* cos_sin, int rotary_dim, int head_dim) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= nblocks) return;
  scales[b] = codec::nvfp4_quantize16(x + 16 * b, g, packed + 8 * b);
  for (int i = 0; i < 16; ++i) decoded[16 * b + i] = codec::nvfp4_decode(codec::nibble_at(packed + 8 * b, i), scales[b], g);
  // One head of head_dim per block index, rotated at position b (both styles).
  for (int i = 0; i < head_dim; ++i) rot[2 * head_dim * b + i] = x[(16 * b + i) % (16 * nblocks)];
  for (int i = 0; i < head_dim; ++i) rot[2 * head_dim * b + head_dim + i] = rot[2 * head_dim * b + i];
  rope_rotate(rot + 2 * head_dim * b, cos_sin + b * rotary_dim, rotary_dim, RopeStyle::neox);
  rope_rotate(rot + 2 * head_dim * b + head_dim, cos_sin + b * rotary_dim, rotary_dim, RopeStyle::gptj);
}
}  // namespace

TEST_CASE("nvfp4 block quantization and RoPE rotation are byte-identical on device and host") {
  SKIP_WITHOUT_GPU();
  constexpr int kBlocks = 4096, kHeadDim = 128, kRotary = 96;
  const float g = 0.37f;
  std::vector<float> x(16 * kBlocks);
  uint32_t state = 12345u;
  for (size_t i = 0; i < x.size(); ++i) {
    state = state * 1664525u + 1013904223u;
    // Mix magnitudes: a few outliers, zeros, negatives, tiny values.
    const float u = static_cast<float>(state >> 8) / 16777216.0f - 0.5f;
    x[i] = (i % 97 == 0) ? u * 4000.0f : (i % 31 == 0 ? 0.0f : u * ((i / 16) % 5 == 0 ? 1e-3f : 3.0f));
  }
  const RopeTable table = build_rope_table(kRotary, kBlocks);
  float *d_x, *d_dec, *d_rot, *d_cs;
  uint8_t *d_packed, *d_scales;
  CUDA_OK(cudaMalloc(&d_x, sizeof(float) * x.size()));
  CUDA_OK(cudaMalloc(&d_dec, sizeof(float) * x.size()));
  CUDA_OK(cudaMalloc(&d_rot, sizeof(float) * 2 * kHeadDim * kBlocks));
  CUDA_OK(cudaMalloc(&d_cs, sizeof(float) * table.cos_sin.size()));
  CUDA_OK(cudaMalloc(&d_packed, 8 * kBlocks));
  CUDA_OK(cudaMalloc(&d_scales, kBlocks));
  CUDA_OK(cudaMemcpy(d_x, x.data(), sizeof(float) * x.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_cs, table.cos_sin.data(), sizeof(float) * table.cos_sin.size(), cudaMemcpyHostToDevice));
  nvfp4_rope_kernel<<<(kBlocks + 127) / 128, 128>>>(d_x, kBlocks, g, d_packed, d_scales, d_dec, d_rot, d_cs, kRotary,
                                                   kHeadDim);
  CUDA_OK(cudaGetLastError());
  std::vector<uint8_t> packed(8 * kBlocks), scales(kBlocks);
  std::vector<float> dec(x.size()), rot(2 * kHeadDim * kBlocks);
  CUDA_OK(cudaMemcpy(packed.data(), d_packed, packed.size(), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(scales.data(), d_scales, scales.size(), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(dec.data(), d_dec, sizeof(float) * dec.size(), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(rot.data(), d_rot, sizeof(float) * rot.size(), cudaMemcpyDeviceToHost));
  for (void* p : {static_cast<void*>(d_x), static_cast<void*>(d_dec), static_cast<void*>(d_rot),
                  static_cast<void*>(d_cs), static_cast<void*>(d_packed), static_cast<void*>(d_scales)})
    cudaFree(p);

  int bad = 0;
  for (int b = 0; b < kBlocks; ++b) {
    uint8_t hp[8];
    const uint8_t hs = codec::nvfp4_quantize16(x.data() + 16 * b, g, hp);
    bad += hs != scales[b] || std::memcmp(hp, packed.data() + 8 * b, 8) != 0;
    for (int i = 0; i < 16; ++i)
      bad += float_bits(codec::nvfp4_decode(codec::nibble_at(hp, i), hs, g)) != float_bits(dec[16 * b + i]);
    std::vector<float> h(2 * kHeadDim);
    for (int i = 0; i < kHeadDim; ++i) h[i] = h[kHeadDim + i] = x[(16 * b + i) % (16 * kBlocks)];
    rope_rotate(h.data(), table.cos_sin.data() + b * kRotary, kRotary, RopeStyle::neox);
    rope_rotate(h.data() + kHeadDim, table.cos_sin.data() + b * kRotary, kRotary, RopeStyle::gptj);
    bad += std::memcmp(h.data(), rot.data() + 2 * kHeadDim * b, sizeof(float) * 2 * kHeadDim) != 0;
  }
  CHECK(bad == 0);
}
