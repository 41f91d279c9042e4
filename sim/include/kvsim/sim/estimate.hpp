// What a replay will need before it allocates anything (`kvsim validate`
// prints it, `kvsim run` refuses a scenario that does not fit the backend
// with insufficient_memory): peak host and device memory and the work of the
// replay with the comparison invariants it will run. Computed from the
// scenario alone, as upper bounds (prefix hits and preemptions are not
// predicted: a hit only saves work, a recompute is at most one more prefill
// of the request). docs/run.md, "Memory and work estimates".
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "backends/backend.hpp"
#include "scenario.hpp"

namespace kvsim::sim {

struct ReplayEstimate {
  int64_t pool_bytes = 0;         // pools, scale pools, shared allocations, indexer caches (backend memory)
  int64_t step_backend_bytes = 0; // one step's op buffers on the backend (inputs, Q, outputs, gathers)
  int64_t step_host_bytes = 0;    // the same step's host copies, the dense check's K/V of one sequence, the content hash's chunks
  int64_t record_bytes = 0;       // digests of the records held at once (80 bytes per output row)
  int64_t spill_disk_bytes = 0;   // the quantization invariant's attention rows on disk ($TMPDIR)
  int64_t runs = 1;               // replays: the scenario's own and one per comparison re-run
  // Runs made at once: all of them where together they fit kConcurrentRunsBytes
  // (a host backend then runs each on its own thread and backend instance,
  // replay.cpp), else 1. The pools and step buffers count once per run at once.
  int64_t concurrent_runs = 1;
  static constexpr int64_t kConcurrentRunsBytes = int64_t{64} << 20;
  double token_layers = 0;        // tokens written x layers, over every run
  double attention_flops = 0;     // 4 * Hq * D per (query row, key) (Q.K and P.V, multiply and add), every run
  int64_t backend_peak() const { return concurrent_runs * (pool_bytes + step_backend_bytes); }
  int64_t host_peak() const { return concurrent_runs * step_host_bytes + record_bytes; }
};

// `invariants`: those selected (ReplayOptions::invariants; nullopt = all);
// `comparisons` false: no comparison re-runs at all (kvsim diff).
ReplayEstimate estimate_replay(const Scenario& s, const std::optional<std::set<Invariant>>& invariants = std::nullopt,
                               bool comparisons = true);

// "1.50 GiB", "512 MiB", "64 KiB", "100 B": sizes the way people read them.
std::string format_bytes(int64_t bytes);

// Throws insufficient_memory when the estimate does not fit `backend`'s free
// memory (its device memory and the host's; on the cpu backend both are the
// host's), saying how much is needed, how much is free, and which knob
// shrinks it. Called by kvsim run before the scenario allocates anything.
void check_fits(const Scenario& s, const ReplayEstimate& e, const Backend& backend);

}  // namespace kvsim::sim
