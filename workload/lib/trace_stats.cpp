// trace stats: see trace_stats.hpp.
#include "kvsim/workload/trace_stats.hpp"

#include <string>

#include <kvsim/validation/errors.hpp>
#include <kvsim/sim/block_manager.hpp>

namespace kvsim::workload {

CapacityStats replay_capacity(const Trace& t, int32_t block_size, int64_t blocks) {
  sim::BlockManagerConfig cfg;
  cfg.primary_blocks = blocks;
  cfg.page_size = block_size;
  cfg.reuse = true;
  sim::BlockManager bm(cfg, nullptr);  // metadata only: no mover, no bytes
  CapacityStats st;
  st.blocks = blocks;
  st.capacity_tokens = blocks * block_size;
  std::vector<int32_t> prompt;
  constexpr sim::BlockManager::SeqId kSeq = 0;
  for (const TraceRequest& r : t.requests) {
    prompt_tokens_into(r, t.block_tokens, r.input_length, prompt);
    const sim::MatchResult m = bm.add_sequence(kSeq, prompt);
    if (!bm.ensure_capacity(kSeq, r.input_length)) {
      bm.cancel_sequence(kSeq, m);
      ++st.unfit_requests;
      continue;
    }
    // No partial reuse here, so no mark_step_written(): the written flag only
    // gates partial_copy sources.
    bm.commit(kSeq, prompt, r.input_length);
    bm.free_sequence(kSeq);
  }
  st.hit_tokens = bm.counters().reuse_hit_tokens;
  st.evicted_blocks = bm.counters().evicted_blocks;
  const int64_t prompt_total = t.prompt_tokens();
  st.hit_rate = prompt_total > 0 ? static_cast<double>(st.hit_tokens) / static_cast<double>(prompt_total) : 0.0;
  return st;
}

TraceStats trace_stats(const Trace& t, int32_t block_size, std::span<const int64_t> capacity_tokens) {
  if (block_size < 1 || block_size > 1024)
    fail(ErrorCode::bad_argument, "--block-size = " + std::to_string(block_size) + ": expected 1..1024 tokens per cache block");
  for (int64_t c : capacity_tokens)
    if (c < block_size)
      fail(ErrorCode::bad_argument, "--capacity-tokens: " + std::to_string(c) + " tokens hold no block of " +
                                        std::to_string(block_size) + " tokens (expected >= " + std::to_string(block_size) + ")");
  TraceStats s;
  s.requests = static_cast<int64_t>(t.requests.size());
  s.prompt_tokens = t.prompt_tokens();
  s.block_size = block_size;
  // A pool with a block for every block any prompt takes never evicts.
  int64_t every_block = 1;
  for (const TraceRequest& r : t.requests) every_block += (r.input_length + block_size - 1) / block_size;
  s.unbounded = replay_capacity(t, block_size, every_block);
  s.unbounded.fraction_of_max = s.unbounded.hit_tokens > 0 ? 1.0 : 0.0;
  for (int64_t c : capacity_tokens) {
    CapacityStats st = replay_capacity(t, block_size, c / block_size);
    st.capacity_tokens = c;
    st.fraction_of_max =
        s.unbounded.hit_tokens > 0 ? static_cast<double>(st.hit_tokens) / static_cast<double>(s.unbounded.hit_tokens) : 0.0;
    s.capacities.push_back(st);
  }
  return s;
}

}  // namespace kvsim::workload
