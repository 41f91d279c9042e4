// Memory and work estimates of a replay (estimate.hpp), from the scenario
// alone. The sizes follow what the runner allocates (replay_run.cpp): pools
// and their scale pools (or FlashInfer's shared allocations, one spare page
// per layer), indexer caches, a step's write inputs, Q and attention output
// on the backend and on the host, the dense check's two fp32 gathers of one
// sequence's K/V, the content hash's chunks, and the records' digests.
#include "kvsim/sim/estimate.hpp"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "kvsim/sim/replay_run.hpp"
#include "kvsim/sim/scheduler.hpp"

namespace kvsim::sim {
namespace {

// RecordedOutput: key (request id, layer, kind, position), digest, length,
// production order, spill offset.
constexpr int64_t kRecordRowBytes = 80;
static_assert(sizeof(RecordedOutput) == kRecordRowBytes);
constexpr int64_t kIndexerRowBytes = 128 + 4;

struct RunWork {
  double token_layers = 0, attention_flops = 0;
};

RunWork work_of(const Scenario& s, const std::vector<RequestState>& reqs, size_t first, size_t last) {
  RunWork w;
  const double per_key = s.mla.enabled ? 0.0 : 4.0 * s.model.q_heads * s.model.head_dim;
  for (size_t i = first; i < last; ++i) {
    const int64_t L = reqs[i].final_len;
    w.token_layers += static_cast<double>(L) * s.model.layers;
    double keys = 0;  // sum over positions p of the keys attended: p + 1, at most W with a window
    if (s.window.mode == WindowMode::none) {
      keys = static_cast<double>(L) * (L + 1) / 2;
    } else {
      const int64_t W = s.window.window, full = std::min<int64_t>(L, W);
      keys = static_cast<double>(full) * (full + 1) / 2 + static_cast<double>(L - full) * W;
    }
    w.attention_flops += keys * per_key * s.model.layers;
  }
  return w;
}

}  // namespace

ReplayEstimate estimate_replay(const Scenario& s, const std::optional<std::set<Invariant>>& invariants,
                               bool comparisons) {
  ReplayEstimate e;
  const PoolGeometry g = pool_geometry(s);
  const std::vector<RequestState> reqs = make_requests(s);
  // Pools.
  if (s.cache.shared_kv_allocation) {
    const int64_t per_page = 2 * g.inner_elements();
    e.pool_bytes = g.bytes_for(g.layers * (g.primary_blocks + 1) * per_page) +
                   g.bytes_for(g.layers * g.secondary_blocks * per_page);
    if (g.has_scale_pool()) {
      const PoolGeometry sg = g.scale_geometry();
      e.pool_bytes += sg.bytes_for(sg.layers * (g.primary_blocks + 1 + g.secondary_blocks) * 2 * sg.inner_elements());
    }
  } else {
    e.pool_bytes = g.pool_bytes(PoolKind::primary) + g.pool_bytes(PoolKind::secondary) +
                   scale_pool_bytes(g, PoolKind::primary) + scale_pool_bytes(g, PoolKind::secondary);
  }
  if (s.indexer_k_scatter) e.pool_bytes += g.layers * g.primary_blocks * g.tokens_per_block * kIndexerRowBytes;
  // One step: at most token_budget tokens (and never more than the scenario has).
  int64_t total_tokens = 0, longest = 1;
  for (const RequestState& r : reqs) {
    total_tokens += r.final_len;
    longest = std::max(longest, r.final_len);
  }
  // The chunking invariant's one-chunk run takes up to one_chunk_budget a step.
  const bool one_chunk_run = comparisons && s.scheduler.chunk_size > 0 && InvariantSelection(s, invariants).wanted(Invariant::chunking);
  const int64_t nnz = std::min<int64_t>(one_chunk_run ? one_chunk_budget(s) : s.scheduler.token_budget, total_tokens);
  const int64_t Hq = s.model.q_heads, H = g.kv_heads, D = g.head_dim;
  const int64_t in_b = std::max<int64_t>(1, bits_per_element(s.model.input_dtype) / 8);
  const int64_t write_in = nnz * (Hq + 2 * H) * D * in_b, q = nnz * Hq * D * in_b, out = nnz * Hq * D * 4;
  const int64_t slots = s.window.mode == WindowMode::none ? longest : std::min<int64_t>(longest, s.window.window + g.tokens_per_block);
  const int64_t gather = slots * H * D * 4;  // one fp32 gather of one sequence's K (or V)
  e.step_backend_bytes = write_in + q + out + gather + longest * 8 * static_cast<int64_t>(s.model.rotary_dim > 0 ? s.model.rotary_dim : D);
  // Host: the step's inputs and outputs, Q as floats for the dense check, two
  // gathers in fp32, and 6 gathers' worth more: what the dense check once held
  // in double, now an allowance covering its tiles and the content hash's
  // chunks (at most 32 MiB, never more than it hashes).
  e.step_host_bytes = write_in + q + out + nnz * Hq * D * 4 + 2 * gather + 3 * 2 * gather;
  // Runs, and the rows each run records.
  std::vector<RunWork> runs{work_of(s, reqs, 0, reqs.size())};
  const RunWork whole = runs.front();
  if (comparisons) {
    const InvariantSelection selection(s, invariants);
    auto wanted = [&](Invariant inv) { return selection.wanted(inv); };
    if (wanted(Invariant::chunking)) runs.push_back(whole);
    if (s.reuse.enabled && wanted(Invariant::reuse)) runs.push_back(whole);
    // The window invariant's re-runs: per-layer windows against full attention in every layer,
    // a window against none (replay.cpp).
    const bool window_runs = (s.layers.enabled || s.window.mode != WindowMode::none) && wanted(Invariant::window);
    if (s.layers.enabled && wanted(Invariant::window)) runs.push_back(whole);
    if (s.window.mode != WindowMode::none && wanted(Invariant::window)) {
      Scenario no_window = s;
      no_window.window = WindowSpec{};
      runs.push_back(work_of(no_window, reqs, 0, reqs.size()));
    }
    if (wanted(Invariant::layout)) {
      runs.push_back(whole);
      if (s.cache.dtype != CacheDtype::nvfp4) runs.push_back(whole);
    }
    const bool quantization = is_quantized(s.cache.dtype) && !s.mla.enabled && wanted(Invariant::quantization);
    if (quantization) {
      runs.push_back(whole);
      e.spill_disk_bytes = 2 * total_tokens * g.layers * Hq * D * 4;
    }
    if (wanted(Invariant::batch) && reqs.size() >= 2) {
      runs.push_back(whole);
      runs.push_back(work_of(s, reqs, 0, 1));
    }
    if (runs.size() > 1) {
      const int64_t rows = total_tokens * g.layers * (1 + g.kv_factor);  // attention rows and read-back K/V rows
      // The main run's record and one comparison run's, each its rows plus what RecordRows
      // holds beyond them while it grows: its first chunk's doubling, or one partly filled chunk.
      const int64_t slack = std::min<int64_t>(2 * rows, static_cast<int64_t>(RecordRows::kRowsPerChunk));
      e.record_bytes = 2 * (rows + slack) * kRecordRowBytes;
      // A re-run without the windows holds every token: one pool of that size at a time.
      if (window_runs) {
        int64_t blocks = 1;
        for (const RequestState& r : reqs) blocks += (r.final_len + g.tokens_per_block - 1) / g.tokens_per_block;
        e.pool_bytes = std::max(e.pool_bytes, e.pool_bytes / std::max<int64_t>(1, g.primary_blocks) *
                                                  std::max<int64_t>(g.primary_blocks, blocks));
      }
    }
  }
  e.runs = static_cast<int64_t>(runs.size());
  if (e.runs > 1 && e.record_bytes > 0) {
    // At once, every run holds its pools, its step's buffers and its record until the judging.
    const int64_t per_record = e.record_bytes / 2;
    const int64_t together = e.runs * (e.pool_bytes + e.step_backend_bytes + e.step_host_bytes + per_record);
    if (together <= ReplayEstimate::kConcurrentRunsBytes) {
      e.concurrent_runs = e.runs;
      e.record_bytes = e.runs * per_record;
    }
  }
  for (const RunWork& w : runs) {
    e.token_layers += w.token_layers;
    e.attention_flops += w.attention_flops;
  }
  return e;
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double x = static_cast<double>(bytes);
  int u = 0;
  while (x >= 1024.0 && u < 4) {
    x /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, x < 10 ? "%.2f %s" : x < 100 ? "%.1f %s" : "%.0f %s", x, units[u]);
  return buf;
}

void check_fits(const Scenario& s, const ReplayEstimate& e, const Backend& backend) {
  const Backend::MemoryInfo m = backend.memory_info();
  const std::string knobs = "the pools are " + format_bytes(e.pool_bytes) +
                            " (shrink cache.primary_blocks, cache.secondary_blocks or model.layers), a step's buffers " +
                            format_bytes(e.step_backend_bytes + e.step_host_bytes) +
                            " (shrink scheduler.token_budget), the comparison records " + format_bytes(e.record_bytes) +
                            " (--invariants none keeps none)";
  auto refuse = [&](const char* where, int64_t needed, int64_t free) {
    fail(ErrorCode::insufficient_memory, s.name + ": the replay needs about " + format_bytes(needed) + " of " + where +
                                             " memory, " + format_bytes(free) + " is free: " + knobs);
  };
  if (m.backend_is_host) {
    if (e.backend_peak() + e.host_peak() > m.host_free) refuse("host", e.backend_peak() + e.host_peak(), m.host_free);
    return;
  }
  if (e.backend_peak() > m.backend_free) refuse(std::string(backend.name()).c_str(), e.backend_peak(), m.backend_free);
  if (e.host_peak() > m.host_free) refuse("host", e.host_peak(), m.host_free);
}

}  // namespace kvsim::sim
