// Decode-attention benchmark on the GPU (not a test): kernel time by CUDA
// events (median of many launches after warm-up), bytes of K/V read, GB/s,
// and the ratio to a device-to-device copy measured in the same run. Every
// configuration first checks its output: the first sequences byte for byte
// against the CPU oracle (reading the downloaded pool in place) and every
// output byte of the staged path against the general path.
//   attention_bench [batch context]   (default 64 8192)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backends/backend.hpp"
#include "backends/cuda/attention_kernels.hpp"
#include "backends/cuda/attention_plan.cuh"

using namespace kvsim;

namespace {

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::printf("CUDA error %s: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}

// Deterministic random codes of valid values in [-1, 1) (fp8: [-8, 8)).
__global__ void fill_codes(uint8_t* pool, int64_t elements, CacheDtype t, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < elements; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t h = (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    const float f = static_cast<float>(h >> 40) / 8388608.0f - 1.0f;
    if (t == CacheDtype::bf16) reinterpret_cast<uint16_t*>(pool)[i] = codec::f32_to_bf16(f);
    else if (t == CacheDtype::fp8_e4m3) pool[i] = codec::f32_to_e4m3(f * 8.0f);
  }
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class F>
float time_ms(F&& f, int warmup, int reps) {
  cudaEvent_t a, b;
  ok(cudaEventCreate(&a), "event");
  ok(cudaEventCreate(&b), "event");
  for (int i = 0; i < warmup; ++i) f();
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    ok(cudaEventRecord(a), "record");
    f();
    ok(cudaEventRecord(b), "record");
    ok(cudaEventSynchronize(b), "sync");
    float t = 0;
    ok(cudaEventElapsedTime(&t, a, b), "elapsed");
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median(ms);
}

double copy_bandwidth_gbs() {
  const size_t bytes = size_t(2) << 30;
  void *src = nullptr, *dst = nullptr;
  ok(cudaMalloc(&src, bytes), "malloc copy src");
  ok(cudaMalloc(&dst, bytes), "malloc copy dst");
  ok(cudaMemset(src, 1, bytes), "memset");
  const float ms = time_ms([&] { ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice), "copy"); }, 3, 21);
  cudaFree(src);
  cudaFree(dst);
  return 2.0 * bytes / (ms * 1e-3) / 1e9;  // bytes read + written
}

struct Row {
  const char* name;
  CacheDtype dtype;
  int page;
  bool force_general;
  int tile_keys;  // staged ring slot: 16 or 32 keys
};

void run_config(const Row& r, int batch, int context, double copy_gbs) {
  PoolGeometry g;
  g.layers = 1;
  g.kv_factor = 2;
  g.kv_heads = 8;
  g.tokens_per_block = r.page;
  g.head_dim = 128;
  g.dtype = r.dtype;
  g.layout = BlockLayout::hnd;
  g.placement = LayerPlacement::per_layer;
  const int group = 4;  // GQA 32:8
  const int max_blocks = (context + r.page - 1) / r.page;
  g.primary_blocks = int64_t(batch) * max_blocks + 7;
  validate_geometry(g);
  KvPools pools;
  pools.geometry = g;
  pools.strides[0] = contiguous_strides(g);
  const size_t pool_bytes = g.pool_bytes(PoolKind::primary);
  ok(cudaMalloc(&pools.data[0], pool_bytes), "malloc pool");
  const int64_t elements = g.pool_elements(PoolKind::primary);
  fill_codes<<<2048, 256>>>(static_cast<uint8_t*>(pools.data[0]), elements, g.dtype, 12345);
  ok(cudaGetLastError(), "fill");

  std::vector<int32_t> ids(g.primary_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937 rng(7);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> table(ids.begin(), ids.begin() + int64_t(batch) * max_blocks);
  std::vector<int32_t> seq_lens(batch, context);
  const int hq = g.kv_heads * group;
  std::vector<uint16_t> q_host(size_t(batch) * hq * g.head_dim);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  for (auto& x : q_host) x = codec::f32_to_bf16(uni(rng));
  void *q = nullptr, *out = nullptr, *out_general = nullptr;
  const size_t out_bytes = q_host.size() * 2;
  ok(cudaMalloc(&q, out_bytes), "malloc q");
  ok(cudaMalloc(&out, out_bytes), "malloc out");
  ok(cudaMalloc(&out_general, out_bytes), "malloc out");
  ok(cudaMemcpy(q, q_host.data(), out_bytes, cudaMemcpyHostToDevice), "upload q");

  DecodeAttentionOp op;
  op.q = contiguous_view(q, CacheDtype::bf16, {batch, hq, g.head_dim});
  op.out = contiguous_view(out, CacheDtype::bf16, {batch, hq, g.head_dim});
  op.seq_lens = seq_lens;
  op.block_table = table;
  op.max_blocks_per_seq = max_blocks;
  op.scales.sm_scale = 0.08838834764831845f;
  if (r.dtype == CacheDtype::fp8_e4m3) {
    op.scales.k_scale = 0.125f;
    op.scales.v_scale = 0.1f;
  }
  validate_decode_attention(pools, op);
  std::vector<int32_t> seq(batch), position(batch);
  for (int b = 0; b < batch; ++b) {
    seq[b] = b;
    position[b] = context - 1;
  }
  cuda::AttentionPlan plan = cuda::make_plan("bench", pools, 0, op.q, op.out, op.block_table, max_blocks, op.scales,
                                             op.window, seq, position, nullptr);
  if (r.force_general) plan.path = cuda::AttentionPath::general;
  plan.staged_tile_keys = r.tile_keys;

  // Correctness first: against the general path (every byte) and the oracle
  // (the first sequences, reading the downloaded pool in place).
  cuda::launch_plan(plan, nullptr);
  {
    cuda::AttentionPlan general = plan;
    general.args.out = contiguous_view(out_general, CacheDtype::bf16, {batch, hq, g.head_dim});
    general.path = cuda::AttentionPath::general;
    cuda::launch_plan(general, nullptr);
  }
  ok(cudaDeviceSynchronize(), "check run");
  std::vector<uint8_t> got(out_bytes), got_general(out_bytes);
  ok(cudaMemcpy(got.data(), out, out_bytes, cudaMemcpyDeviceToHost), "download");
  ok(cudaMemcpy(got_general.data(), out_general, out_bytes, cudaMemcpyDeviceToHost), "download");
  const bool same_paths = got == got_general;
  const int check_seqs = std::min(batch, 4);
  std::vector<uint8_t> pool_host(pool_bytes);
  ok(cudaMemcpy(pool_host.data(), pools.data[0], pool_bytes, cudaMemcpyDeviceToHost), "download pool");
  KvPools host_pools = pools;
  host_pools.data[0] = pool_host.data();
  std::vector<uint8_t> want(size_t(check_seqs) * hq * g.head_dim * 2, 0xFF);
  DecodeAttentionOp host_op = op;
  host_op.q = contiguous_view(q_host.data(), CacheDtype::bf16, {check_seqs, hq, g.head_dim});
  host_op.out = contiguous_view(want.data(), CacheDtype::bf16, {check_seqs, hq, g.head_dim});
  host_op.seq_lens = std::span<const int32_t>(seq_lens).first(check_seqs);
  host_op.block_table = std::span<const int32_t>(table).first(size_t(check_seqs) * max_blocks);
  make_backend("cpu")->decode_attention(host_pools, host_op);
  const bool same_oracle = std::memcmp(want.data(), got.data(), want.size()) == 0;

  const float kernel_ms = time_ms([&] { cuda::launch_plan(plan, nullptr); }, 10, 101);
  const float op_ms = time_ms([&] { cuda::decode_attention(pools, op, nullptr); }, 3, 31);
  const double kv_bytes = 2.0 * batch * g.kv_heads * double(context) * g.head_dim * (bits_per_element(g.dtype) / 8);
  const double gbs = kv_bytes / (kernel_ms * 1e-3) / 1e9;
  std::printf("%-22s P=%-3d batch=%-4d ctx=%-6d path=%-7s kernel %8.3f ms  op %8.3f ms  K/V %7.1f MB  %7.1f GB/s  %5.1f%% of copy  "
              "oracle(first %d seqs) %s  staged==general %s\n",
              r.name, r.page, batch, context, plan.path == cuda::AttentionPath::staged ? "staged" : "general", kernel_ms,
              op_ms, kv_bytes / 1e6, gbs, 100.0 * gbs / copy_gbs, check_seqs, same_oracle ? "equal" : "DIFFERENT",
              same_paths ? "equal" : "DIFFERENT");
  cuda::release_plan(plan, nullptr);
  ok(cudaDeviceSynchronize(), "release");
  cudaFree(pools.data[0]);
  cudaFree(q);
  cudaFree(out);
  cudaFree(out_general);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("SKIPPED (benchmark needs a GPU)\n");
    return 0;
  }
  const int batch = argc > 2 ? std::atoi(argv[1]) : 64;
  const int context = argc > 2 ? std::atoi(argv[2]) : 8192;
  cudaDeviceProp prop{};
  ok(cudaGetDeviceProperties(&prop, 0), "props");
  const double copy_gbs = copy_bandwidth_gbs();
  std::printf("device %s, %d SMs; device-to-device copy %.1f GB/s (read + write, 2 GiB, median of 21)\n", prop.name,
              prop.multiProcessorCount, copy_gbs);
  std::printf("decode_attention HND D=128 GQA 32:8, bf16 q/out; bytes = K+V of every attended token\n");
  const Row rows[] = {{"bf16 tile32", CacheDtype::bf16, 16, false, 32},
                      {"fp8_e4m3 tile32", CacheDtype::fp8_e4m3, 16, false, 32},
                      {"bf16 tile16", CacheDtype::bf16, 16, false, 16},
                      {"fp8_e4m3 tile16", CacheDtype::fp8_e4m3, 16, false, 16},
                      {"bf16 tile32", CacheDtype::bf16, 64, false, 32},
                      {"fp8_e4m3 tile32", CacheDtype::fp8_e4m3, 64, false, 32},
                      {"bf16 general kernel", CacheDtype::bf16, 16, true, 32}};
  for (const Row& r : rows) run_config(r, batch, context, copy_gbs);
  const double copy_after = copy_bandwidth_gbs();
  std::printf("device-to-device copy again: %.1f GB/s\n", copy_after);
  return 0;
}
