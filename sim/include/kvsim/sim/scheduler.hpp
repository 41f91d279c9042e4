// The scheduler (contract §6), modelled on vLLM v1's scheduler: each step has a
// token budget; running requests are served first (a decode token each, or
// their next prefill chunk), then waiting requests are admitted in arrival
// order while budget, batch slots and blocks last (first come, first served:
// a request that does not fit stops admission). Prefill is cut into chunks
// of at most chunk_size tokens. When a running request needs a block and the
// pool has none, the most recently admitted request not yet served this
// step is preempted by recompute (its blocks are released; it goes back to
// the front of the waiting queue and later prefills every token it had
// computed, reusing cached blocks where it can); if it is the request itself,
// it is preempted.
//
// With TensorRT-LLM's cyclic window, a prefill chunk is also capped so that
// no token written by the chunk overwrites a ring slot an earlier query of
// the same chunk still attends (the reason for TensorRT-LLM's "one more
// block": without it, a wrapped ring admits one token per chunk).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "block_manager.hpp"
#include "scenario.hpp"

namespace kvsim::sim {

struct RequestState {
  enum class Phase : uint8_t { pending, waiting, running, finished };
  int32_t index = 0;  // position in Scenario::requests; also the block manager's sequence id
  std::string id;
  uint64_t seed = 0;
  int32_t arrival_step = 0;
  std::vector<int32_t> tokens;   // prompt, then sampled tokens as they become known
  std::vector<uint64_t> hashes;  // hashes[p] = hash of tokens[0..p]
  int64_t prompt_len = 0;
  int64_t final_len = 0;        // prompt + decode tokens
  int64_t computed = 0;         // tokens whose K/V are in the cache
  int64_t prefill_target = 0;   // tokens to prefill (the prompt; after a preemption, everything computed)
  int64_t prefill_begin = 0;    // first token of the current prefill (after prefix hits)
  Phase phase = Phase::pending;

  void append_token(int32_t t);
};

// Builds the request states of a scenario (prompts, seeds, lengths).
std::vector<RequestState> make_requests(const Scenario& s);

// The token budget of the chunking invariant's one-chunk run (whole_prompts):
// the scenario's budget, or the longest request (prompt and decode tokens, all
// of which a recompute after preemption prefills) where that is longer, so
// that every prefill fits one step.
int32_t one_chunk_budget(const Scenario& s);

struct ScheduledEntry {
  int32_t request = 0;
  int64_t start = 0;  // position of the first token of the chunk (= tokens in the cache before it)
  int32_t n = 0;      // tokens in the chunk
  bool decode = false;
  bool continuation = false;  // a prefill chunk after the first one of this prefill
};

struct StepPlan {
  int64_t step = 0;
  std::vector<ScheduledEntry> prefill;  // batch order: prefill entries, then decode entries
  std::vector<ScheduledEntry> decode;
  bool empty() const { return prefill.empty() && decode.empty(); }
};

class Scheduler {
 public:
  Scheduler(const Scenario& s, BlockManager& bm, std::vector<RequestState>& requests);

  bool done() const;
  // The next arrival step after `step` among requests not yet arrived (or -1).
  int64_t next_arrival(int64_t step) const;
  // Forms step `step`: admits arrivals, allocates blocks (preempting when the
  // pool runs out) and commits the blocks the step fills to the prefix tree.
  // Throws ValidationError(bad_scenario) when a request cannot fit even in an
  // otherwise empty pool.
  StepPlan schedule(int64_t step);
  // After the step's ops ran: advances the requests, samples next tokens,
  // releases window blocks; returns the requests that finished (still holding
  // their blocks, so the caller can read them back before free_finished()).
  std::vector<int32_t> finish_step(const StepPlan& plan);
  void free_finished(const std::vector<int32_t>& finished);

  int64_t preemptions = 0;
  std::vector<int32_t> preempted_in_step;  // requests the last schedule() preempted, in order (replay observers)
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;

 private:
  int32_t chunk_for(const RequestState& r, int64_t budget) const;
  void preempt(int32_t index);

  const Scenario& s_;
  BlockManager& bm_;
  std::vector<RequestState>& reqs_;
  std::vector<int32_t> running_;
  std::deque<int32_t> waiting_;
};

// The step indices a replay of `s` runs through (its last step + 1, idle
// steps waiting for an arrival included; capped at scheduler.max_steps): the
// scheduler and block manager alone, no backend, block moves not performed,
// the same loop as Runner::run. Exact wherever only the scheduler decides
// (replay_test holds it to every built-in scenario's replay); with recurrent
// layers and reuse, whose hits stop at snapshots the run makes, an estimate.
// For kvsim run's progress line ("step k of n").
int64_t planned_steps(const Scenario& s);

}  // namespace kvsim::sim
