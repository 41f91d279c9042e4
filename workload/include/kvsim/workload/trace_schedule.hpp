// `kvsim trace schedule`: a whole trace (or a window) through kvsim's
// scheduler and block manager in a metadata-only mode: the scenario
// `kvsim trace import` would write, stepped by sim::Scheduler with no
// backend and no KV bytes, so traces far larger than a replay with contents
// can hold report their scheduler statistics. The counters are the ones
// `kvsim run` reports for the same scenario (tests hold them equal).
#pragma once

#include <cstdint>

#include <kvsim/sim/replay.hpp>
#include <kvsim/sim/scenario.hpp>

#include "trace.hpp"
#include "trace_import.hpp"

namespace kvsim::workload {

struct ScheduleStats {
  int64_t requests = 0;
  int64_t primary_blocks = 0;
  sim::ReplayCounters counters;  // kvsim run's counters (no ops, so ops and token_layers stay 0)
  int64_t peak_blocks_in_use = 0;  // most primary blocks referenced after any step's scheduling
  bool finished = true;            // every request finished within scheduler.max_steps
};

// The same scenario trace_scenario_toml describes, built directly (every
// prompt as explicit tokens): no text, no parse, for whole traces.
sim::Scenario trace_scenario(const Trace& t, const TraceImportOptions& o);

ScheduleStats schedule_metadata(const sim::Scenario& s);

}  // namespace kvsim::workload
