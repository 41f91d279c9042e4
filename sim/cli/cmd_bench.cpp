// kvsim bench: throughput of the ops (SPEC §8) on a backend, with the copy
// bandwidth measured in the same run, and the scaling over oneTBB thread
// counts on the CPU. Speed is measured here, never asserted in tests.
//
// Bytes an op "must move" (the denominators of GB/s):
//   append_paged / reshape_and_cache : K+V input read + K+V cache written
//   gather_paged                     : cache read + fp32 output written
//   decode_attention                 : every K and V row of every attended key read
//   copy_blocks                      : block bytes read + written
// copy bandwidth: a parallel memcpy of 256 MiB on the same backend thread count
// (bytes read + written), the ceiling the ratios are quoted against.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <iostream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "backends/backend.hpp"
#include "commands.hpp"

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
  be.release_pools(pools);
  return rows;
}

void run_bench(const BenchOptions& o) {
  std::vector<int> threads = o.threads;
  const int max_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
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
    std::cout << "op                  threads   ms/call    Mtok/s      GB/s  %copy  copy GB/s\n";
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
        std::snprintf(line, sizeof line, "%-19s %7d %9.3f %9.2f %9.2f %5.0f%% %9.2f\n", r.op.c_str(), t,
                      r.seconds * 1e3, r.tokens / r.seconds / 1e6, gbs, 100.0 * gbs / copy, copy);
        std::cout << line << std::flush;
      }
    }
  }
  if (o.json) std::cout << out.dump(2) << '\n';
}

}  // namespace

void register_bench(CLI::App& app) {
  auto opts = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure op throughput (GB/s, % of copy bandwidth) and thread scaling");
  cmd->add_option("--backend", opts->backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--threads", opts->threads, "oneTBB thread counts to measure (default 1, 2, 4, ..., all)");
  cmd->add_option("--sequences", opts->sequences, "sequences in the batch")->check(CLI::Range(1, 4096));
  cmd->add_option("--tokens", opts->tokens, "tokens per sequence")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--min-seconds", opts->min_seconds, "time spent per measurement");
  cmd->add_flag("--json", opts->json, "print one JSON object");
  cmd->callback([opts] {
    try {
      run_bench(*opts);
    } catch (const BackendUnavailable& e) {
      std::cerr << "kvsim: error: " << e.what() << '\n';
      throw ExitStatus{kExitUsage};
    }
  });
}

}  // namespace kvsim::cli
