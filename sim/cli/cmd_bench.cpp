// kvsim bench: throughput of the ops (SPEC §8) on a backend, with the copy
// bandwidth measured in the same run, and the scaling over oneTBB thread
// counts on the CPU. Speed is measured here, never asserted in tests.
//
// Bytes an op "must move" (the denominators of GB/s):
//   append_paged / reshape_and_cache : K+V input read + K+V cache written
//   gather_paged                     : cache read + fp32 output written
//   decode_attention                 : every K and V row of every attended key read
//   copy_blocks / partial_copy /
//   offload / onboard                : bytes copied, read + written
//   qkv_preprocess_write             : fused QKV read + Q written + K/V written
//   prefill_attention                : every sequence's K and V read once per chunk
//   append_mla / indexer_k_scatter   : input read + cache written
// copy bandwidth: a parallel memcpy of 256 MiB on the same backend thread count
// (bytes read + written), the ceiling the ratios are quoted against.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "backends/backend.hpp"
#include "commands.hpp"
#include "kvsim/sim/replay.hpp"
#include "kvsim/sim/scenario_file.hpp"
#include "numbers.hpp"

namespace kvsim::cli {
namespace {


struct BenchOptions {
  std::string backend = "cpu";
  std::vector<int> threads;
  int sequences = 16;
  int tokens = 1024;
  double min_seconds = 0.3;
  bool json = false;
};

// Median seconds per call of fn, repeated until min_seconds have passed (>= 3 calls).
double time_op(const std::function<void()>& fn, double min_seconds) {
  fn();  // warm-up
  std::vector<double> t;
  const auto start = std::chrono::steady_clock::now();
  while (t.size() < 3 || std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < min_seconds) {
    const auto a = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
    if (t.size() >= 50) break;
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double copy_bandwidth(int threads, double min_seconds) {
  const size_t bytes = 256u << 20;
  std::vector<uint8_t> src(bytes, 1), dst(bytes, 0);
  tbb::task_arena arena(threads);
  const double s = time_op(
      [&] {
        arena.execute([&] {
          tbb::parallel_for(tbb::blocked_range<size_t>(0, bytes, 1 << 20), [&](const tbb::blocked_range<size_t>& r) {
            std::memcpy(dst.data() + r.begin(), src.data() + r.begin(), r.size());
          });
        });
      },
      min_seconds);
  return 2.0 * bytes / s / 1e9;
}

struct Row {
  std::string op;
  int threads;
  double seconds;
  double bytes;
  double tokens;
};

// Replay throughput (issue 6): the whole simulator -- block manager,
// scheduler, synthetic model, every op of every layer -- on one built-in
// scenario (a mixed GQA batch with ragged lengths, chunked prefill and
// decode), without the comparison re-runs and the Eigen dense check, which
// are checks rather than replay. tokens = token-layers written; bytes = the
// K and V bytes those token-layers put into the pool.
Row bench_scenario_replay(Backend& be, int threads, const BenchOptions& o) {
  const sim::Scenario s = sim::load_scenario_file(sim::builtin_scenario_dir() + "/gqa_decode_batch_ragged.toml");
  sim::ReplayOptions ro;
  ro.comparison_invariants = false;
  ro.dense_check = false;
  int64_t token_layers = 0;
  const double seconds = time_op([&] { token_layers = sim::replay(s, be, ro).counters.token_layers; }, o.min_seconds);
  const PoolGeometry g = sim::pool_geometry(s);
  const double row_bytes = static_cast<double>(g.bytes_for(static_cast<int64_t>(g.kv_factor) * g.kv_heads * g.head_dim));
  return {"scenario_replay", threads, seconds, static_cast<double>(token_layers) * row_bytes,
          static_cast<double>(token_layers)};
}

std::vector<Row> bench_backend(Backend& be, int threads, const BenchOptions& o) {
  PoolGeometry g;
  g.layers = 1;
  g.kv_heads = 8;
  g.head_dim = 128;
  g.tokens_per_block = 16;
  g.dtype = CacheDtype::bf16;
  g.layout = BlockLayout::hnd;
  const int pages_per_seq = (o.tokens + g.tokens_per_block - 1) / g.tokens_per_block;
  g.primary_blocks = static_cast<int64_t>(o.sequences) * pages_per_seq + 16;
  g.secondary_blocks = g.primary_blocks / 2;
  KvPools pools = be.allocate_pools(g);
  const int64_t nnz = static_cast<int64_t>(o.sequences) * o.tokens;
  const int64_t row = static_cast<int64_t>(g.kv_heads) * g.head_dim;

  // Inputs: deterministic bf16 values.
  std::vector<uint16_t> kv_host(nnz * row);
  for (size_t i = 0; i < kv_host.size(); ++i) kv_host[i] = codec::f32_to_bf16(static_cast<float>(i % 251) / 251.0f - 0.5f);
  BackendBuffer kb(be, kv_host.size() * 2), vb(be, kv_host.size() * 2);
  kb.upload(kv_host.data(), kv_host.size() * 2);
  vb.upload(kv_host.data(), kv_host.size() * 2);

  std::vector<int32_t> indptr{0}, indices, last, batch, pos, lens, dense;
  std::vector<int64_t> slots;
  for (int b = 0; b < o.sequences; ++b) {
    for (int p = 0; p < pages_per_seq; ++p) {
      indices.push_back(b * pages_per_seq + p);
      dense.push_back(b * pages_per_seq + p);
    }
    indptr.push_back(indptr.back() + pages_per_seq);
    last.push_back(o.tokens - (pages_per_seq - 1) * g.tokens_per_block);
    lens.push_back(o.tokens);
    for (int t = 0; t < o.tokens; ++t) {
      batch.push_back(b);
      pos.push_back(t);
      slots.push_back(static_cast<int64_t>(b * pages_per_seq + t / g.tokens_per_block) * g.tokens_per_block +
                      t % g.tokens_per_block);
    }
  }
  std::vector<Row> rows;
  const double kv_bytes = 2.0 * nnz * row * 2;  // K and V, bf16

  AppendPagedOp ap;
  ap.k = contiguous_view(kb.get(), CacheDtype::bf16, {nnz, g.kv_heads, g.head_dim});
  ap.v = contiguous_view(vb.get(), CacheDtype::bf16, {nnz, g.kv_heads, g.head_dim});
  ap.batch_indices = batch;
  ap.positions = pos;
  ap.indptr = indptr;
  ap.indices = indices;
  ap.last_page_len = last;
  rows.push_back({"append_paged", threads, time_op([&] { be.append_paged(pools, ap); be.synchronize(); }, o.min_seconds),
                  2 * kv_bytes, static_cast<double>(nnz)});

  ReshapeAndCacheOp rc;
  rc.key = ap.k;
  rc.value = ap.v;
  rc.slot_mapping = slots;
  rows.push_back({"reshape_and_cache", threads,
                  time_op([&] { be.reshape_and_cache(pools, rc); be.synchronize(); }, o.min_seconds), 2 * kv_bytes,
                  static_cast<double>(nnz)});

  BackendBuffer gout(be, static_cast<size_t>(o.tokens) * row * 4);
  GatherPagedOp ga;
  ga.kv = 0;
  ga.block_ids = std::span<const int32_t>(dense.data(), pages_per_seq);
  ga.num_tokens = o.tokens;
  ga.out = contiguous_view(gout.get(), CacheDtype::fp32, {o.tokens, g.kv_heads, g.head_dim});
  rows.push_back({"gather_paged", threads, time_op([&] { be.gather_paged(pools, ga); be.synchronize(); }, o.min_seconds),
                  static_cast<double>(o.tokens) * row * (2 + 4), static_cast<double>(o.tokens)});

  const int hq = 4 * g.kv_heads;  // GQA 4
  std::vector<float> q_host(static_cast<size_t>(o.sequences) * hq * g.head_dim, 0.01f);
  BackendBuffer qb(be, q_host.size() * 4), ob(be, q_host.size() * 4);
  qb.upload(q_host.data(), q_host.size() * 4);
  DecodeAttentionOp da;
  da.q = contiguous_view(qb.get(), CacheDtype::fp32, {o.sequences, hq, g.head_dim});
  da.out = contiguous_view(ob.get(), CacheDtype::fp32, {o.sequences, hq, g.head_dim});
  da.seq_lens = lens;
  da.block_table = dense;
  da.max_blocks_per_seq = pages_per_seq;
  da.scales.sm_scale = 0.088f;
  rows.push_back({"decode_attention", threads,
                  time_op([&] { be.decode_attention(pools, da); be.synchronize(); }, o.min_seconds), kv_bytes,
                  static_cast<double>(o.sequences)});

  std::vector<std::pair<int32_t, int32_t>> pairs;
  for (int i = 0; i < o.sequences * pages_per_seq / 2; ++i) pairs.emplace_back(i, i + o.sequences * pages_per_seq / 2);
  CopyBlocksOp cb;
  cb.pairs = pairs;
  rows.push_back({"copy_blocks", threads, time_op([&] { be.copy_blocks(pools, cb); be.synchronize(); }, o.min_seconds),
                  2.0 * pairs.size() * g.block_bytes(), static_cast<double>(pairs.size())});
  // partial_copy: half of each of 64 blocks, one op per block (what a reuse hit costs).
  const int copies = std::min<int>(64, static_cast<int>(pairs.size()));
  rows.push_back({"partial_copy", threads,
                  time_op(
                      [&] {
                        for (int i = 0; i < copies; ++i)
                          be.partial_copy(pools, PartialCopyOp{pairs[i].first, pairs[i].second, g.tokens_per_block / 2});
                        be.synchronize();
                      },
                      o.min_seconds),
                  2.0 * copies * g.block_bytes() / 2, static_cast<double>(copies) * g.tokens_per_block / 2});

  // offload then onboard the first half of the secondary pool's worth of blocks.
  std::vector<int32_t> prim, sec;
  for (int64_t i = 0; i < g.secondary_blocks; ++i) {
    prim.push_back(static_cast<int32_t>(i));
    sec.push_back(static_cast<int32_t>(i));
  }
  MoveBlocksOp mv;
  mv.primary = prim;
  mv.secondary = sec;
  rows.push_back({"offload", threads, time_op([&] { be.offload(pools, mv); be.synchronize(); }, o.min_seconds),
                  2.0 * prim.size() * g.block_bytes(), static_cast<double>(prim.size())});
  rows.push_back({"onboard", threads, time_op([&] { be.onboard(pools, mv); be.synchronize(); }, o.min_seconds),
                  2.0 * prim.size() * g.block_bytes(), static_cast<double>(prim.size())});

  // qkv_preprocess_write: a context step over every token (Hq = 4H, NeoX RoPE
  // over the whole head, bf16): reads the fused QKV row, writes Q and K/V.
  const RopeTable rope = build_rope_table(g.head_dim, o.tokens);
  BackendBuffer cos_sin(be, rope.cos_sin.size() * 4);
  cos_sin.upload(rope.cos_sin.data(), rope.cos_sin.size() * 4);
  const int64_t fused = static_cast<int64_t>(hq + 2 * g.kv_heads) * g.head_dim;
  std::vector<uint16_t> qkv_host(nnz * fused);
  for (size_t i = 0; i < qkv_host.size(); ++i) qkv_host[i] = codec::f32_to_bf16(static_cast<float>(i % 241) / 241.0f - 0.5f);
  BackendBuffer qkv(be, qkv_host.size() * 2), qout(be, static_cast<size_t>(nnz) * hq * g.head_dim * 2);
  qkv.upload(qkv_host.data(), qkv_host.size() * 2);
  QkvPreprocessOp qp;
  qp.num_q_heads = hq;
  qp.qkv = contiguous_view(qkv.get(), CacheDtype::bf16, {nnz, fused});
  qp.q_out = contiguous_view(qout.get(), CacheDtype::bf16, {nnz, hq, g.head_dim});
  qp.rope_style = RopeStyle::neox;
  qp.rotary_dim = g.head_dim;
  qp.cos_sin = contiguous_view(cos_sin.get(), CacheDtype::fp32, {o.tokens, g.head_dim});
  qp.seq_lens = lens;
  qp.cache_lens = lens;
  qp.block_table = dense;
  qp.max_blocks_per_seq = pages_per_seq;
  rows.push_back({"qkv_preprocess_write", threads,
                  time_op([&] { be.qkv_preprocess_write(pools, qp); be.synchronize(); }, o.min_seconds),
                  static_cast<double>(nnz) * (fused + hq * g.head_dim + 2 * row) * 2, static_cast<double>(nnz)});

  // prefill_attention: the last `chunk` tokens of every sequence as one chunk
  // (causal over past + chunk). Bytes: every sequence's K and V read once.
  const int chunk = std::min(16, o.tokens);
  std::vector<int32_t> q_indptr{0};
  for (int b = 0; b < o.sequences; ++b) q_indptr.push_back(q_indptr.back() + chunk);
  const int64_t qrows = static_cast<int64_t>(o.sequences) * chunk;
  std::vector<float> pq_host(static_cast<size_t>(qrows) * hq * g.head_dim, 0.01f);
  BackendBuffer pq(be, pq_host.size() * 4), po(be, pq_host.size() * 4);
  pq.upload(pq_host.data(), pq_host.size() * 4);
  PrefillAttentionOp pa;
  pa.q = contiguous_view(pq.get(), CacheDtype::fp32, {qrows, hq, g.head_dim});
  pa.out = contiguous_view(po.get(), CacheDtype::fp32, {qrows, hq, g.head_dim});
  pa.q_indptr = q_indptr;
  pa.seq_lens = lens;
  pa.block_table = dense;
  pa.max_blocks_per_seq = pages_per_seq;
  pa.scales.sm_scale = 0.088f;
  rows.push_back({"prefill_attention", threads,
                  time_op([&] { be.prefill_attention(pools, pa); be.synchronize(); }, o.min_seconds), kv_bytes,
                  static_cast<double>(qrows)});
  be.release_pools(pools);

  // append_mla into a latent pool (F = 1, H = 1, D = 512 + 64, bf16).
  PoolGeometry lg = g;
  lg.kv_factor = 1;
  lg.kv_heads = 1;
  lg.head_dim = 512 + 64;
  lg.layout = BlockLayout::nhd;
  lg.secondary_blocks = 0;
  KvPools latent = be.allocate_pools(lg);
  std::vector<uint16_t> lat_host(nnz * lg.head_dim);
  for (size_t i = 0; i < lat_host.size(); ++i) lat_host[i] = codec::f32_to_bf16(static_cast<float>(i % 239) / 239.0f);
  BackendBuffer lat(be, lat_host.size() * 2);
  lat.upload(lat_host.data(), lat_host.size() * 2);
  AppendMlaOp ml;
  ml.ckv = contiguous_view(lat.get(), CacheDtype::bf16, {nnz, 512});
  ml.ckv.stride[0] = lg.head_dim;  // ckv and kpe sliced from one [nnz, 576] projection
  ml.kpe = contiguous_view(static_cast<uint16_t*>(lat.get()) + 512, CacheDtype::bf16, {nnz, 64});
  ml.kpe.stride[0] = lg.head_dim;
  ml.batch_indices = batch;
  ml.positions = pos;
  ml.indptr = indptr;
  ml.indices = indices;
  ml.last_page_len = last;
  rows.push_back({"append_mla", threads, time_op([&] { be.append_mla(latent, ml); be.synchronize(); }, o.min_seconds),
                  2.0 * nnz * lg.head_dim * 2, static_cast<double>(nnz)});
  be.release_pools(latent);

  // indexer_k_scatter: 128 fp8 bytes + 4 scale bytes per token into
  // [blocks, 64, 1, 132] (DeepSeek's per-token [data | scale] rows).
  const int64_t idx_block = 64, per_token = 132;
  const int64_t idx_blocks = (nnz + idx_block - 1) / idx_block;
  BackendBuffer kcache(be, static_cast<size_t>(idx_blocks * idx_block * per_token));
  BackendBuffer kfp8(be, static_cast<size_t>(nnz) * 128), kscale(be, static_cast<size_t>(nnz) * 4);
  be.fill(kfp8.get(), 0x3C, static_cast<size_t>(nnz) * 128);
  be.fill(kscale.get(), 0x01, static_cast<size_t>(nnz) * 4);
  std::vector<int64_t> slot_fp8(nnz), slot_scale(nnz);
  for (int64_t t = 0; t < nnz; ++t) {
    slot_fp8[t] = t * per_token;
    slot_scale[t] = t * per_token + 128;
  }
  IndexerKScatterOp ix;
  ix.k_fp8 = contiguous_view(kfp8.get(), CacheDtype::fp8_e4m3, {nnz, 128});
  ix.k_scale = contiguous_view(kscale.get(), CacheDtype::fp8_e4m3, {nnz, 4});
  ix.slot_mapping_fp8 = slot_fp8;
  ix.slot_mapping_scale = slot_scale;
  ix.cache = contiguous_view(kcache.get(), CacheDtype::fp8_e4m3, {idx_blocks, idx_block, 1, per_token});
  rows.push_back({"indexer_k_scatter", threads, time_op([&] { be.indexer_k_scatter(ix); be.synchronize(); }, o.min_seconds),
                  2.0 * nnz * per_token, static_cast<double>(nnz)});
  rows.push_back(bench_scenario_replay(be, threads, o));
  return rows;
}

// Bytes the largest step of bench_backend holds at once (pools, inputs and
// their host copies, outputs, the copy-bandwidth buffers), estimated from the
// same workload formulas, so sizes beyond memory fail before anything runs.
double bench_bytes_needed(const BenchOptions& o) {
  const double P = 16, row = 8 * 128, hq_row = 4 * row;  // kv_heads 8, head_dim 128, GQA 4
  const double nnz = static_cast<double>(o.sequences) * o.tokens;
  const double blocks = o.sequences * std::ceil(o.tokens / P) + 16;
  const double pools = 1.5 * blocks * 2 * P * row * 2;       // primary + secondary/2, K and V, bf16
  const double kv_inputs = 3 * nnz * row * 2;                // host copy + K and V buffers
  const double qkv = 2 * nnz * (hq_row + 2 * row) * 2 + nnz * hq_row * 2;  // host + device fused QKV, Q out
  const double latent = blocks * P * 576 * 2 + 2 * nnz * 576 * 2;
  const double indexer = nnz * (132 + 128 + 4 + 16);
  const double copy_buffers = 512.0 * (1 << 20);
  return pools + kv_inputs + qkv + latent + indexer + copy_buffers;
}

double available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (meminfo >> key >> kib)
    if (key == "MemAvailable:") return kib * 1024.0;
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
}

void run_bench(const BenchOptions& o) {
  std::vector<int> threads = o.threads;
  const int max_threads = machine_threads();
  const double needed = bench_bytes_needed(o), available = available_memory_bytes();
  if (needed > available) {
    char text[200];
    std::snprintf(text, sizeof text, "needs about %.0f bytes (%.1f GiB) but %.0f bytes (%.1f GiB) are available",
                  needed, needed / (1u << 30), available, available / (1u << 30));
    fail(ErrorCode::bad_argument, "--sequences " + std::to_string(o.sequences) + " x --tokens " +
                                      std::to_string(o.tokens) + ": the benchmark " + text);
  }
  if (threads.empty()) {
    for (int t = 1; t < max_threads; t *= 2) threads.push_back(t);
    threads.push_back(max_threads);
  }
  nlohmann::json out;
  out["backend"] = o.backend;
  out["workload"] = {{"sequences", o.sequences}, {"tokens_per_sequence", o.tokens}, {"kv_heads", 8},
                     {"head_dim", 128}, {"page_size", 16}, {"dtype", "bf16"}, {"layout", "hnd"}, {"gqa", 4}};
  out["results"] = nlohmann::json::array();
  make_backend(o.backend);  // fails here, before any output, when the backend is not available
  if (!o.json)
    std::cout << "op                    threads   ms/call  Mtok/s*      GB/s  %copy  copy GB/s\n";
  for (int t : threads) {
    const double copy = copy_bandwidth(t, o.min_seconds);
    auto be = make_backend(o.backend, BackendOptions{t});
    for (const Row& r : bench_backend(*be, t, o)) {
      const double gbs = r.bytes / r.seconds / 1e9;
      out["results"].push_back({{"op", r.op}, {"threads", t}, {"seconds", r.seconds}, {"bytes", r.bytes},
                                {"gb_per_s", gbs}, {"tokens_per_s", r.tokens / r.seconds},
                                {"copy_gb_per_s", copy}, {"fraction_of_copy", gbs / copy}});
      if (!o.json) {
        char line[160];
        std::snprintf(line, sizeof line, "%-21s %7d %9.3f %9.3g %9.3g %5.0f%% %9.2f\n", r.op.c_str(), t,
                      r.seconds * 1e3, r.tokens / r.seconds / 1e6, gbs, 100.0 * gbs / copy, copy);
        std::cout << line << std::flush;
      }
    }
  }
  if (o.json)
    std::cout << out.dump(2) << '\n';
  else
    std::cout << "* tokens: appended/scattered tokens for writes, query tokens for attention, tokens copied for\n"
                 "  gather/partial_copy, blocks for copy_blocks/offload/onboard, token-layers for scenario_replay\n";
}

}  // namespace

void register_bench(CLI::App& app) {
  auto opts = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure op throughput (GB/s, % of copy bandwidth) and thread scaling");
  cmd->add_option("--backend", opts->backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  // Numbers through numbers.hpp: thread counts 1..this machine's cores (oneTBB
  // cannot build an arena of millions of threads), a finite time >= 0.
  add_int_list_option(*cmd, "--threads", opts->threads,
                      "oneTBB thread counts to measure, 1.." + std::to_string(machine_threads()) +
                          " (default 1, 2, 4, ..., all)",
                      1, machine_threads());
  add_int_option(*cmd, "--sequences", opts->sequences, "sequences in the batch", 1, 4096);
  add_int_option(*cmd, "--tokens", opts->tokens, "tokens per sequence", 1, 1 << 20);
  add_float_option(*cmd, "--min-seconds", opts->min_seconds, "time spent per measurement, 0..3600", 0.0, 3600.0);
  cmd->add_flag("--json", opts->json, "print one JSON object");
  cmd->callback([opts] { run_bench(*opts); });  // BackendUnavailable: main's backend_unavailable, exit 2
}

}  // namespace kvsim::cli
