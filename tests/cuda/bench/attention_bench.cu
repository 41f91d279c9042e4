// Decode-attention benchmark on the GPU (not a test): kernel time by CUDA
// events (median of many launches after warm-up), bytes of K/V read, GB/s,
// and the ratio to a device-to-device copy measured in the same run. Every
// configuration first checks its output: the first sequences byte for byte
// against the CPU oracle (reading the downloaded pool in place) and every
// output byte against the general path.
//   attention_bench [quick | heads | only N]   (quick: the batch 64 x 8K rows only;
//   heads: the bulk path's query heads per work item, each shape at the
//   whole group and at the default choice, side by side; only N: row N alone,
//   few launches -- for a profiler)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kvsim/validation.hpp"
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
  for (int i = 0; i < warmup; ++i) f(i);
  ok(cudaDeviceSynchronize(), "warm-up");
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    ok(cudaEventRecord(a), "record");
    f(i);
    ok(cudaEventRecord(b), "record");
    ok(cudaEventSynchronize(b), "sync");
    float t = 0;
    ok(cudaEventElapsedTime(&t, a, b), "elapsed");
    ms.push_back(t);
  }
  ok(cudaGetLastError(), "timed launches");
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
  const float ms = time_ms([&](int) { ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice), "copy"); }, 3, 21);
  cudaFree(src);
  cudaFree(dst);
  return 2.0 * bytes / (ms * 1e-3) / 1e9;  // bytes read + written
}

struct Row {
  std::string name;
  CacheDtype dtype;
  int page;
  int batch, context, group;
  cuda::AttentionPath path;
  int tile_keys;  // bulk: 16 or 32 keys per ring slot; staged: 16 or 32
  int slots = 0;  // bulk: ring slots, 0 = the kernel's default
  int heads = 0;  // bulk: query heads per work item, 0 = bulk::heads_per_item's choice
};

struct Result {
  Row row;
  float kernel_ms = 0, plan_ms = 0, op_ms = 0;
  double gbs = 0, pct = 0;
  bool oracle = false, general = false;
  cuda::KernelInfo info;
};

int g_warmup = 10, g_reps = 101;

Result run_config(const Row& r, double copy_gbs) {
  PoolGeometry g;
  g.layers = 1;
  g.kv_factor = 2;
  g.kv_heads = 8;
  g.tokens_per_block = r.page;
  g.head_dim = 128;
  g.dtype = r.dtype;
  g.layout = BlockLayout::hnd;
  g.placement = LayerPlacement::per_layer;
  const int batch = r.batch, context = r.context, group = r.group;
  const int max_blocks = (context + r.page - 1) / r.page;
  // Small problems rotate over several copies so the timing is not of L2.
  const int64_t kv_bytes_one = 2LL * batch * g.kv_heads * context * g.head_dim * (bits_per_element(g.dtype) / 8);
  const int copies = kv_bytes_one < (int64_t(512) << 20) ? int(std::min<int64_t>(32, (int64_t(512) << 20) / kv_bytes_one)) : 1;
  g.primary_blocks = int64_t(batch) * max_blocks * copies + 7;
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
  std::vector<std::vector<int32_t>> tables(copies);
  for (int c = 0; c < copies; ++c)
    tables[c].assign(ids.begin() + int64_t(c) * batch * max_blocks, ids.begin() + int64_t(c + 1) * batch * max_blocks);
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
  ok(cudaMemset(out, 0xFF, out_bytes), "poison out");

  DecodeAttentionOp op;
  op.q = contiguous_view(q, CacheDtype::bf16, {batch, hq, g.head_dim});
  op.out = contiguous_view(out, CacheDtype::bf16, {batch, hq, g.head_dim});
  op.seq_lens = seq_lens;
  op.block_table = tables[0];
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
  std::vector<cuda::AttentionPlan> plans;
  for (int c = 0; c < copies; ++c) {
    plans.push_back(cuda::make_plan("bench", pools, 0, op.q, op.out, tables[c], max_blocks, op.scales, op.window, seq,
                                    position, nullptr));
    plans.back().path = r.path;
    plans.back().staged_tile_keys = r.tile_keys;
    plans.back().bulk_tile_keys = r.tile_keys;
    plans.back().bulk_slots = r.slots;
    plans.back().bulk_heads_per_item = r.heads;
  }
  Result res;
  res.row = r;
  if (r.path == cuda::AttentionPath::bulk) cuda::launch_bulk_wide(plans[0], nullptr, &res.info) || cuda::launch_bulk_byte(plans[0], nullptr, &res.info);

  // Correctness first: against the general path (every byte) and the oracle
  // (the first sequences, reading the downloaded pool in place).
  cuda::launch_plan(plans[0], nullptr);
  {
    cuda::AttentionPlan general = plans[0];
    general.args.out = contiguous_view(out_general, CacheDtype::bf16, {batch, hq, g.head_dim});
    general.path = cuda::AttentionPath::general;
    cuda::launch_plan(general, nullptr);
  }
  ok(cudaDeviceSynchronize(), "check run");
  std::vector<uint8_t> got(out_bytes), got_general(out_bytes);
  ok(cudaMemcpy(got.data(), out, out_bytes, cudaMemcpyDeviceToHost), "download");
  ok(cudaMemcpy(got_general.data(), out_general, out_bytes, cudaMemcpyDeviceToHost), "download");
  res.general = got == got_general;
  const int check_seqs = std::min(batch, 2);
  std::vector<uint8_t> pool_host(pool_bytes);
  ok(cudaMemcpy(pool_host.data(), pools.data[0], pool_bytes, cudaMemcpyDeviceToHost), "download pool");
  KvPools host_pools = pools;
  host_pools.data[0] = pool_host.data();
  std::vector<uint8_t> want(size_t(check_seqs) * hq * g.head_dim * 2, 0xFF);
  DecodeAttentionOp host_op = op;
  host_op.q = contiguous_view(q_host.data(), CacheDtype::bf16, {check_seqs, hq, g.head_dim});
  host_op.out = contiguous_view(want.data(), CacheDtype::bf16, {check_seqs, hq, g.head_dim});
  host_op.seq_lens = std::span<const int32_t>(seq_lens).first(check_seqs);
  host_op.block_table = std::span<const int32_t>(tables[0]).first(size_t(check_seqs) * max_blocks);
  make_backend("cpu")->decode_attention(host_pools, host_op);
  res.oracle = std::memcmp(want.data(), got.data(), want.size()) == 0;

  for (auto& p : plans) p.merge = false;
  res.kernel_ms = time_ms([&](int i) { cuda::launch_plan(plans[i % copies], nullptr); }, g_warmup, g_reps);
  for (auto& p : plans) p.merge = true;
  res.plan_ms = time_ms([&](int i) { cuda::launch_plan(plans[i % copies], nullptr); }, g_warmup, g_reps);
  if (r.path == cuda::choose_path(pools, op.q) && r.tile_keys == cuda::default_bulk_tile_keys() && r.slots == 0 &&
      r.heads == 0)
    res.op_ms = time_ms([&](int) { cuda::decode_attention(pools, op, nullptr); }, 3, 31);
  const double kv_bytes = double(kv_bytes_one);
  res.gbs = kv_bytes / (res.plan_ms * 1e-3) / 1e9;
  res.pct = 100.0 * res.gbs / copy_gbs;
  const char* path = r.path == cuda::AttentionPath::bulk ? "bulk" : (r.path == cuda::AttentionPath::staged ? "staged" : "general");
  std::printf("%-26s %-8s P=%-3d %4dx%-6d G=%d T=%-2d | kernel %7.3f ms  +merge %7.3f ms  op %7.3f ms | %7.1f GB/s %5.1f%% of copy"
              " | regs %3d smem/CTA %6d warps/SM %2d slots %d | oracle %s general %s%s\n",
              r.name.c_str(), path, r.page, batch, context, group, r.tile_keys, res.kernel_ms, res.plan_ms, res.op_ms,
              res.gbs, res.pct, res.info.registers, res.info.smem_per_cta, res.info.ctas_per_sm * res.info.warps_per_cta, res.info.slots,
              res.oracle ? "equal" : "DIFFERENT", res.general ? "equal" : "DIFFERENT",
              copies > 1 ? (" (rotating " + std::to_string(copies) + " copies)").c_str() : "");
  for (auto& p : plans) cuda::release_plan(p, nullptr);
  ok(cudaDeviceSynchronize(), "release");
  cudaFree(pools.data[0]);
  cudaFree(q);
  cudaFree(out);
  cudaFree(out_general);
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("SKIPPED (benchmark needs a GPU)\n");
    return 0;
  }
  const bool quick = argc > 1 && std::string(argv[1]) == "quick";
  const bool heads = argc > 1 && std::string(argv[1]) == "heads";
  const int only = argc > 2 && std::string(argv[1]) == "only" ? std::atoi(argv[2]) : -1;
  cudaDeviceProp prop{};
  ok(cudaGetDeviceProperties(&prop, 0), "props");
  const double copy_gbs = copy_bandwidth_gbs();
  std::printf("device %s, %d SMs; device-to-device copy %.1f GB/s (read + write, 2 GiB, median of 21)\n", prop.name,
              prop.multiProcessorCount, copy_gbs);
  std::printf("decode_attention HND D=128, 8 KV heads, bf16 q/out; bytes = K+V of every attended token; times: median of 101 "
              "launches after 10 warm-ups (CUDA events); GB/s and %% over kernel+merge\n");
  using P = cuda::AttentionPath;
  const auto bf = CacheDtype::bf16;
  const auto f8 = CacheDtype::fp8_e4m3;
  std::vector<Row> rows = {
      {"bf16 32:8", bf, 16, 64, 8192, 4, P::bulk, 16},       {"fp8 32:8", f8, 16, 64, 8192, 4, P::bulk, 16},
      {"bf16 32:8 2 slots", bf, 16, 64, 8192, 4, P::bulk, 16, 2}, {"fp8 32:8 4 slots", f8, 16, 64, 8192, 4, P::bulk, 16, 4},
      {"bf16 32:8", bf, 16, 64, 8192, 4, P::bulk, 32},       {"fp8 32:8", f8, 16, 64, 8192, 4, P::bulk, 32},
      {"fp8 32:8 2 slots", f8, 16, 64, 8192, 4, P::bulk, 32, 2},
      {"bf16 32:8 old staged", bf, 16, 64, 8192, 4, P::staged, 32},
      {"fp8 32:8 old staged", f8, 16, 64, 8192, 4, P::staged, 16},
  };
  if (heads)  // whole groups (the kernel before heads_per_item) against the default choice
    rows = {{"bf16 32:8 G4", bf, 16, 1, 8192, 4, P::bulk, 16, 0, 4},   {"bf16 32:8", bf, 16, 1, 8192, 4, P::bulk, 16},
            {"bf16 32:8 G4", bf, 16, 1, 1024, 4, P::bulk, 16, 0, 4},   {"bf16 32:8", bf, 16, 1, 1024, 4, P::bulk, 16},
            {"bf16 32:8 G4", bf, 16, 16, 1024, 4, P::bulk, 16, 0, 4},  {"bf16 32:8", bf, 16, 16, 1024, 4, P::bulk, 16},
            {"bf16 32:8 G4", bf, 16, 1, 32768, 4, P::bulk, 16, 0, 4},  {"bf16 32:8", bf, 16, 1, 32768, 4, P::bulk, 16},
            {"bf16 64:8 G8", bf, 16, 64, 8192, 8, P::bulk, 16, 0, 8},  {"bf16 64:8", bf, 16, 64, 8192, 8, P::bulk, 16},
            {"fp8 64:8 G8", f8, 16, 64, 8192, 8, P::bulk, 16, 0, 8},   {"fp8 64:8", f8, 16, 64, 8192, 8, P::bulk, 16},
            {"bf16 64:8 G8", bf, 16, 16, 32768, 8, P::bulk, 16, 0, 8}, {"bf16 64:8", bf, 16, 16, 32768, 8, P::bulk, 16}};
  if ((!quick && !heads) || only >= 0) {
    const std::vector<Row> more = {
        {"bf16 32:8", bf, 16, 16, 32768, 4, P::bulk, 16},  {"fp8 32:8", f8, 16, 16, 32768, 4, P::bulk, 16},
        {"bf16 32:8", bf, 16, 256, 1024, 4, P::bulk, 16},  {"fp8 32:8", f8, 16, 256, 1024, 4, P::bulk, 16},
        {"bf16 32:8", bf, 16, 1, 8192, 4, P::bulk, 16},    {"fp8 32:8", f8, 16, 1, 8192, 4, P::bulk, 16},
        {"bf16 32:8", bf, 64, 64, 8192, 4, P::bulk, 16},   {"fp8 32:8", f8, 64, 64, 8192, 4, P::bulk, 16},
        {"bf16 64:8", bf, 16, 64, 8192, 8, P::bulk, 16},   {"fp8 64:8", f8, 16, 64, 8192, 8, P::bulk, 16},
        {"bf16 64:8", bf, 16, 64, 8192, 8, P::bulk, 32},   {"fp8 64:8", f8, 16, 64, 8192, 8, P::bulk, 32},
    };
    rows.insert(rows.end(), more.begin(), more.end());
  }
  std::vector<Result> results;
  if (only >= 0) {
    g_warmup = 1;
    g_reps = 1;
    results.push_back(run_config(rows.at(only), copy_gbs));
    return 0;
  }
  for (const Row& r : rows) results.push_back(run_config(r, copy_gbs));
  const double copy_after = copy_bandwidth_gbs();
  std::printf("device-to-device copy again: %.1f GB/s\n\n", copy_after);
  std::printf("| config | path | page | batch x ctx | keys/slots | kernel+merge ms | partition kernel ms | GB/s | %% of copy | fp8 speed-up | checks |\n");
  std::printf("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|\n");
  for (const Result& r : results) {
    // fp8: speed-up over the bf16 row of the same shape with the default settings.
    std::string ratio = "";
    if (r.row.dtype == f8)
      for (const Result& b : results)
        if (b.row.dtype == bf && b.row.page == r.row.page && b.row.batch == r.row.batch && b.row.context == r.row.context &&
            b.row.group == r.row.group && b.row.path == P::bulk && b.row.tile_keys == 16 && b.row.slots == 0) {
          char buf[32];
          std::snprintf(buf, sizeof buf, "%.2fx", b.plan_ms / r.plan_ms);
          ratio = buf;
        }
    std::printf("| %s | %s | %d | %d x %d | %d/%d | %.3f | %.3f | %.0f | %.1f%% | %s | %s |\n", r.row.name.c_str(),
                r.row.path == P::bulk ? "bulk" : "staged", r.row.page, r.row.batch, r.row.context, r.row.tile_keys, r.info.slots,
                r.plan_ms, r.kernel_ms, r.gbs, r.pct, ratio.c_str(), r.oracle && r.general ? "equal" : "DIFFERENT");
  }
  std::printf("copy GB/s before %.1f, after %.1f\n", copy_gbs, copy_after);
  return 0;
}
