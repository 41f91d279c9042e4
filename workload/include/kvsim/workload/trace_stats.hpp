// `kvsim trace stats`: the hit rate a trace sees against cache capacity
// (the Mooncake paper's Figure 9), under kvsim's own reuse rules. Requests
// are replayed one at a time in arrival order through sim::BlockManager in
// a metadata-only mode (no KV bytes, no mover: tables, reference counts,
// the prefix tree and its LRU only): each request matches its longest cached
// prefix (full blocks only, the last prompt token always recomputed), takes
// blocks for the rest of its prompt (evicting the least recently used cached
// blocks when the free list is empty), registers its full blocks, and is
// freed tail first. Output tokens are not cached: the trace says nothing of
// their content.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "trace.hpp"

namespace kvsim::workload {

struct CapacityStats {
  int64_t capacity_tokens = 0;  // as asked
  int64_t blocks = 0;           // primary pool: capacity_tokens / block_size
  int64_t hit_tokens = 0;       // prompt tokens served from the cache
  int64_t evicted_blocks = 0;
  int64_t unfit_requests = 0;   // prompts longer than the whole pool: replayed with no hit, nothing cached
  double hit_rate = 0.0;        // hit_tokens / prompt tokens
  double fraction_of_max = 0.0; // hit_tokens / the unbounded pool's hit_tokens
};

struct TraceStats {
  int64_t requests = 0;
  int64_t prompt_tokens = 0;
  int32_t block_size = 0;       // cache page size used
  CapacityStats unbounded;      // a pool that holds every block of the trace: the maximum
  std::vector<CapacityStats> capacities;
};

// The replay of one capacity (blocks >= 1). Exposed for tests.
CapacityStats replay_capacity(const Trace& t, int32_t block_size, int64_t blocks);

// Every capacity (tokens; each must give >= 1 block of block_size) plus the
// unbounded maximum. block_size 1..1024 (kvsim's page sizes).
TraceStats trace_stats(const Trace& t, int32_t block_size, std::span<const int64_t> capacity_tokens);

}  // namespace kvsim::workload
