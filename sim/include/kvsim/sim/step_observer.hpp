// Watching a replay step by step (kvsim run --report draws what it sees):
// ReplayOptions::observer is told the replay's start, every block move and
// prefix-tree event as it happens, and the state after every step. The
// observer only reads; the replay is the same with or without one, and only
// the scenario's own run is observed (not the comparison invariants' re-runs).
// What to keep, and how to keep it bounded, is the observer's business
// (report/ keeps per-step changes, not per-step copies).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "block_manager.hpp"
#include "scenario.hpp"
#include "scheduler.hpp"

namespace kvsim::sim {

// What one step did and left, read-only, valid during the call.
struct StepView {
  int64_t step = 0;
  const StepPlan* plan = nullptr;
  const BlockManager* blocks = nullptr;            // pools, tables, prefix tree after the step
  const std::vector<RequestState>* requests = nullptr;
  const std::vector<int32_t>* preempted = nullptr; // requests this step's scheduling preempted, in order
  std::string conservation;                        // "" = held after this step, else the violation
};

class StepObserver {
 public:
  virtual ~StepObserver() = default;
  // Before the first step: the block manager as the scenario configures it.
  virtual void start(const Scenario&, const BlockManager&, const std::vector<RequestState>&) {}
  // As it happens, during the step being formed or run.
  virtual void block_event(const BlockEvent&) {}
  // After the step's ops ran and finished requests were freed.
  virtual void step_done(const StepView&) {}
};

}  // namespace kvsim::sim
