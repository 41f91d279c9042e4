// The scheduler: see scheduler.hpp for the engine behaviour it models.
#include "kvsim/sim/scheduler.hpp"

#include <algorithm>
#include <limits>

#include "kvsim/sim/block_manager.hpp"
#include "kvsim/sim/synthetic_model.hpp"

namespace kvsim::sim {

void RequestState::append_token(int32_t t) {
  hashes.push_back(SyntheticModel::extend_hash(hashes.empty() ? SyntheticModel::kEmptyHash : hashes.back(), t));
  tokens.push_back(t);
}

std::vector<RequestState> make_requests(const Scenario& s) {
  std::vector<RequestState> out;
  for (size_t i = 0; i < s.requests.size(); ++i) {
    const RequestSpec& spec = s.requests[i];
    RequestState r;
    r.index = static_cast<int32_t>(i);
    r.id = spec.id;
    r.seed = SyntheticModel::request_seed(spec);
    r.arrival_step = spec.arrival_step;
    r.tokens = build_prompt(s, spec);
    if (r.tokens.empty()) fail(ErrorCode::bad_scenario, "request " + spec.id + ": empty prompt");
    if (spec.decode_tokens < 0) fail(ErrorCode::bad_scenario, "request " + spec.id + ": decode_tokens < 0");
    r.hashes = SyntheticModel::prefix_hashes(r.tokens);
    r.prompt_len = static_cast<int64_t>(r.tokens.size());
    r.final_len = r.prompt_len + spec.decode_tokens;
    r.prefill_target = r.prompt_len;
    out.push_back(std::move(r));
  }
  return out;
}

Scheduler::Scheduler(const Scenario& s, BlockManager& bm, std::vector<RequestState>& requests)
    : s_(s), bm_(bm), reqs_(requests) {
  if (s.scheduler.token_budget < 1) fail(ErrorCode::bad_scenario, "scheduler.token_budget must be >= 1");
  if (s.scheduler.chunk_size < 0) fail(ErrorCode::bad_scenario, "scheduler.chunk_size must be >= 0");
  if (s.scheduler.max_batch < 1) fail(ErrorCode::bad_scenario, "scheduler.max_batch must be >= 1");
}

bool Scheduler::done() const {
  for (const RequestState& r : reqs_)
    if (r.phase != RequestState::Phase::finished) return false;
  return true;
}

int64_t Scheduler::next_arrival(int64_t step) const {
  int64_t next = -1;
  for (const RequestState& r : reqs_)
    if (r.phase == RequestState::Phase::pending && r.arrival_step > step && (next < 0 || r.arrival_step < next))
      next = r.arrival_step;
  return next;
}

int32_t one_chunk_budget(const Scenario& s) {
  int64_t budget = s.scheduler.token_budget;
  for (const RequestState& r : make_requests(s)) budget = std::max(budget, r.final_len);
  return static_cast<int32_t>(std::min<int64_t>(budget, std::numeric_limits<int32_t>::max()));
}

int32_t Scheduler::chunk_for(const RequestState& r, int64_t budget) const {
  int64_t n = std::min(r.prefill_target - r.computed, budget);
  if (s_.scheduler.chunk_size > 0) n = std::min<int64_t>(n, s_.scheduler.chunk_size);
  for (int32_t g = 0; g < bm_.group_count(); ++g) {  // cyclic and release windows address a ring
    const WindowMapping& w = bm_.window_mapping(g);
    if (!w.enabled() || w.linear) continue;
    // Tokens [S, c + n - cyclic_len) leave the ring during the chunk; the
    // chunk's first query (at c) attends from max(S, c - (W - S) + 1).
    const int64_t c = r.computed;
    const int64_t first_attended = std::max<int64_t>(w.sinks, c - (w.window - w.sinks) + 1);
    n = std::min<int64_t>(n, w.cyclic_len + first_attended - c);
  }
  return static_cast<int32_t>(std::max<int64_t>(n, 1));
}

void Scheduler::preempt(int32_t index) {
  RequestState& r = reqs_[index];
  bm_.free_sequence(index);
  r.prefill_target = std::max(r.prefill_target, r.computed);
  r.computed = 0;
  r.phase = RequestState::Phase::waiting;
  waiting_.push_front(index);
  ++preemptions;
  preempted_in_step.push_back(index);
}

StepPlan Scheduler::schedule(int64_t step) {
  preempted_in_step.clear();
  StepPlan plan;
  plan.step = step;
  for (RequestState& r : reqs_)
    if (r.phase == RequestState::Phase::pending && r.arrival_step <= step) {
      r.phase = RequestState::Phase::waiting;
      waiting_.push_back(r.index);
    }
  int64_t budget = s_.scheduler.token_budget;
  auto add_entry = [&](RequestState& r, int32_t n) {
    ScheduledEntry e;
    e.request = r.index;
    e.start = r.computed;
    e.n = n;
    e.decode = r.computed >= r.prefill_target;
    e.continuation = !e.decode && r.computed > r.prefill_begin;
    (e.decode ? plan.decode : plan.prefill).push_back(e);
    bm_.commit(r.index, r.tokens, r.computed + n);
    budget -= n;
  };

  // Running requests first, in admission order.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    RequestState& r = reqs_[running_[i]];
    const bool decode = r.computed >= r.prefill_target;
    const int32_t n = decode ? 1 : chunk_for(r, budget);
    bool self_preempted = false;
    while (!bm_.ensure_capacity(r.index, r.computed + n)) {
      if (running_.size() > i + 1) {  // the most recently admitted request not served yet
        preempt(running_.back());
        running_.pop_back();
        continue;
      }
      if (running_.size() == 1)
        fail(ErrorCode::bad_scenario, "request " + r.id + " needs " + std::to_string(bm_.pages_for(r.computed + n)) +
                                          " blocks for " + std::to_string(r.computed + n) +
                                          " tokens but the primary pool has " +
                                          std::to_string(bm_.config().primary_blocks) + " blocks");
      preempt(running_[i]);
      running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
      self_preempted = true;
      break;
    }
    if (self_preempted) continue;
    add_entry(r, n);
    ++i;
  }

  // Then waiting requests, first come first served.
  while (!waiting_.empty() && budget > 0 && static_cast<int32_t>(running_.size()) < s_.scheduler.max_batch) {
    RequestState& r = reqs_[waiting_.front()];
    const MatchResult m = bm_.add_sequence(r.index, std::span<const int32_t>(r.tokens).first(
                                                        static_cast<size_t>(r.prefill_target)));
    r.computed = m.tokens();
    r.prefill_begin = r.computed;
    if (s_.scheduler.whole_prompts && r.prefill_target - r.computed > budget) {  // waits for a step it fits
      bm_.cancel_sequence(r.index, m);
      r.computed = 0;
      break;
    }
    const int32_t n = chunk_for(r, budget);
    if (!bm_.ensure_capacity(r.index, r.computed + n)) {
      bm_.cancel_sequence(r.index, m);
      r.computed = 0;
      if (running_.empty())
        fail(ErrorCode::bad_scenario, "request " + r.id + " needs " + std::to_string(bm_.pages_for(n)) +
                                          " blocks for its first chunk but the primary pool has " +
                                          std::to_string(bm_.config().primary_blocks) + " blocks");
      break;
    }
    waiting_.pop_front();
    r.phase = RequestState::Phase::running;
    running_.push_back(r.index);
    add_entry(r, n);
  }
  return plan;
}

std::vector<int32_t> Scheduler::finish_step(const StepPlan& plan) {
  bm_.mark_step_written();
  std::vector<int32_t> finished;
  for (const auto* list : {&plan.prefill, &plan.decode})
    for (const ScheduledEntry& e : *list) {
      RequestState& r = reqs_[e.request];
      r.computed = e.start + e.n;
      (e.decode ? decode_tokens : prefill_tokens) += e.n;
      if (r.computed == static_cast<int64_t>(r.tokens.size()) && r.computed < r.final_len)
        r.append_token(SyntheticModel::next_token(r.seed, r.computed));
      bm_.release_out_of_window(r.index, r.computed);
      if (r.computed == r.final_len) {
        r.phase = RequestState::Phase::finished;
        running_.erase(std::find(running_.begin(), running_.end(), r.index));
        finished.push_back(r.index);
      }
    }
  return finished;
}

void Scheduler::free_finished(const std::vector<int32_t>& finished) {
  for (int32_t i : finished) bm_.free_sequence(i);
}

namespace {
// Block moves the dry run of planned_steps() does not perform.
struct NoMoves final : BlockMover {
  void partial_copy(int32_t, int32_t, int32_t, int32_t) override {}
  void offload(int32_t, int32_t, int32_t) override {}
  void onboard(int32_t, int32_t, int32_t) override {}
};
}  // namespace

int64_t planned_steps(const Scenario& s) {
  NoMoves moves;
  BlockManager bm(BlockManagerConfig::from(s), &moves);
  std::vector<RequestState> reqs = make_requests(s);
  Scheduler sched(s, bm, reqs);
  int64_t step = 0;
  for (; !sched.done() && step < s.scheduler.max_steps; ++step) {
    const StepPlan plan = sched.schedule(step);
    if (plan.empty()) {
      const int64_t next = sched.next_arrival(step);
      if (next < 0) break;
      step = next - 1;
      continue;
    }
    sched.free_finished(sched.finish_step(plan));
  }
  return step;
}

}  // namespace kvsim::sim
