// trace schedule: see trace_schedule.hpp.
#include "kvsim/workload/trace_schedule.hpp"

#include <algorithm>

#include <kvsim/validation/errors.hpp>
#include <kvsim/sim/block_manager.hpp>
#include <kvsim/sim/scenario_file.hpp>
#include <kvsim/sim/scheduler.hpp>

namespace kvsim::workload {

ScheduleStats schedule_metadata(const sim::Scenario& s) {
  sim::check_scenario(s);
  sim::BlockManager bm(sim::BlockManagerConfig::from(s), nullptr);  // metadata only: no mover, no bytes
  std::vector<sim::RequestState> reqs = sim::make_requests(s);
  sim::Scheduler sched(s, bm, reqs);
  ScheduleStats st;
  st.requests = static_cast<int64_t>(s.requests.size());
  st.primary_blocks = s.cache.primary_blocks;
  // The same loop as the replay (sim/lib/replay_run.cpp), without the ops.
  for (int64_t step = 0; !sched.done(); ++step) {
    if (step >= s.scheduler.max_steps) {
      st.finished = false;
      break;
    }
    const sim::StepPlan plan = sched.schedule(step);
    if (plan.empty()) {
      const int64_t next = sched.next_arrival(step);
      if (next < 0) fail(ErrorCode::bad_scenario, "no request can be scheduled and none is still to arrive");
      step = next - 1;  // idle until the next arrival
      continue;
    }
    st.peak_blocks_in_use = std::max(st.peak_blocks_in_use, bm.counts(PoolKind::primary).referenced);
    sched.free_finished(sched.finish_step(plan));
    ++st.counters.steps;
  }
  st.counters.prefill_tokens = sched.prefill_tokens;
  st.counters.decode_tokens = sched.decode_tokens;
  st.counters.preemptions = sched.preemptions;
  st.counters.reuse_hit_tokens = bm.counters().reuse_hit_tokens;
  st.counters.partial_reuse_tokens = bm.counters().partial_reuse_tokens;
  st.counters.evicted_blocks = bm.counters().evicted_blocks;
  st.counters.offloaded_blocks = bm.counters().offloaded_blocks;
  st.counters.onboarded_blocks = bm.counters().onboarded_blocks;
  return st;
}

}  // namespace kvsim::workload
