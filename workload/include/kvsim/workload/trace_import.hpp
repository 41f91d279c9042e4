// A window of a trace as a scenario (docs/traces.md, "From a trace to a
// scenario"): `kvsim trace import` writes it, `kvsim run --trace` replays it
// with KV contents and every invariant.
//
// Mapping:
//  * lengths: every length is multiplied by `scale`, which must turn the
//    trace's block of B tokens into a whole number Bs >= 1 of tokens; a
//    prompt of L tokens becomes ceil(L * Bs / B), so it keeps its number of
//    trace blocks, and an output of O tokens ceil(O * Bs / B);
//  * content: each distinct trace block of the window becomes a [[prefix]]
//    of Bs explicit tokens (prompt_tokens: block id * Bs + offset), and a
//    request's prompt is its blocks' prefixes in chain order, the last
//    partial block as its own tokens: equal hash-id prefixes are equal token
//    blocks. The cache's page_size is independent of Bs: a prefix shared over
//    k trace blocks can be reused over floor(k * Bs / page_size) full pages
//    (kvsim reuses full pages only), so page_size dividing Bs keeps the
//    trace's reuse granularity;
//  * clock: arrival_step = floor((arrival - first arrival of the window) /
//    step_ms), one modelled step lasting step_ms milliseconds whatever it
//    holds;
//  * cache: reuse on, page_size, primary_blocks (0 = every block of every
//    request of the window at once: no eviction), the scheduler's token budget;
//    optionally a cache dtype, a secondary (offload) tier, NaN-poisoned fresh
//    pages and per-layer sliding windows ([layers], vLLM's hybrid manager),
//    so that every invariant applies to some imported window (docs/traces.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trace.hpp"

namespace kvsim::workload {

struct TraceImportOptions {
  std::string requests;      // "A:B" request indices (arrival order), "" = all
  std::string time;          // "A:B" arrival ms, "" = all
  double scale = 1.0;        // length factor; trace block tokens * scale must be a whole number >= 1
  double step_ms = 50.0;     // modelled step time
  int32_t page_size = 16;
  int64_t primary_blocks = 0;  // 0 = enough for the whole window at once
  int32_t token_budget = 2048;
  std::string model_toml;    // text of a [model] table to use instead of the synthetic default ("" = default)
  std::string model_source;  // where model_toml came from, for messages
  std::string dtype;         // cache.dtype ("" = the scenario default, bf16)
  int64_t secondary_blocks = 0;  // > 0: a secondary tier of this many blocks, reuse.offload on
  bool poison_nan = false;   // cache.poison_nan and zero_v_tail: fresh pages hold NaN (the no_nan invariant)
  std::vector<int32_t> layer_windows;  // non-empty: [layers] windows (0 = full), allocation hybrid
};

// The scenario file's text. Checks the options (bad_argument); the caller
// parses the text with sim::parse_scenario, which checks the rest.
std::string trace_scenario_toml(const Trace& t, const TraceImportOptions& o);

// The name a scenario imported from `t` with these options gets:
// "<trace stem>_r<first>-<last>".
std::string trace_scenario_name(const Trace& t, const TraceImportOptions& o);

}  // namespace kvsim::workload
