// Block manager (sim/include/kvsim/sim/block_manager.hpp): conservation after
// every operation, LRU order, full and partial reuse with the last prompt
// token recomputed, offload / onboard, both sliding-window modes, failure
// without side effects when the pool runs out, same-step shared prefixes.
// Scheduler (scheduler.hpp) driven without a backend: budget, chunks,
// preemption order. Synthetic model determinism and spread.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "kvsim/sim/block_manager.hpp"
#include "kvsim/sim/scheduler.hpp"
#include "kvsim/sim/synthetic_model.hpp"

#include "../support/rng.hpp"

using namespace kvsim;
using namespace kvsim::sim;

namespace {

struct Move {
  std::string op;
  int32_t a, b, n;
  int32_t pool = 0;
  bool operator==(const Move&) const = default;
};

struct RecordingMover final : BlockMover {
  std::vector<Move> moves;
  void partial_copy(int32_t pool, int32_t s, int32_t d, int32_t n) override {
    moves.push_back({"partial_copy", s, d, n, pool});
  }
  void offload(int32_t pool, int32_t p, int32_t s) override { moves.push_back({"offload", p, s, 0, pool}); }
  void onboard(int32_t pool, int32_t s, int32_t p) override { moves.push_back({"onboard", s, p, 0, pool}); }
};

std::vector<int32_t> iota_tokens(int32_t n, int32_t first = 100) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

void conserved(const BlockManager& bm) {
  const std::string err = bm.check_conservation();
  CHECK_MESSAGE(err.empty(), err);
  for (PoolKind k : {PoolKind::primary, PoolKind::secondary}) {
    const PoolCounts c = bm.counts(k);
    CHECK(c.free + c.referenced + c.cached == c.size);
  }
}

BlockManagerConfig reuse_config(int32_t P, int64_t primary, int64_t secondary = 0) {
  BlockManagerConfig c{.primary_blocks = primary, .secondary_blocks = secondary, .page_size = P, .reuse = true};
  return c;
}

}  // namespace

TEST_CASE("block manager: conservation after every operation, page sizes 1, 3, 7, 17") {
  for (int32_t P : {1, 3, 7, 17}) {
    INFO("P = " << P);
    RecordingMover mover;
    BlockManagerConfig cfg = reuse_config(P, 23, 5);
    cfg.partial_reuse = true;
    cfg.offload = true;
    BlockManager bm(cfg, &mover);
    conserved(bm);
    const auto shared = iota_tokens(2 * P + 1);
    // Odd number of sequences, odd lengths, each sharing a prefix; admitted,
    // grown, committed and freed in an interleaved order.
    for (int32_t round = 0; round < 5; ++round) {
      std::vector<int32_t> prompt = shared;
      for (int32_t i = 0; i < round * 2 + 1; ++i) prompt.push_back(1000 * (round + 1) + i);
      const BlockManager::SeqId id = round;
      const MatchResult m = bm.add_sequence(id, prompt);
      conserved(bm);
      CHECK(m.tokens() <= static_cast<int64_t>(prompt.size()) - 1);
      const bool fits = bm.ensure_capacity(id, static_cast<int64_t>(prompt.size()));
      conserved(bm);
      if (!fits) {
        bm.free_sequence(id);
        conserved(bm);
        continue;
      }
      bm.commit(id, prompt, static_cast<int64_t>(prompt.size()));
      conserved(bm);
      if (round % 2 == 1) {
        bm.free_sequence(id - 1);
        conserved(bm);
      }
    }
    for (int32_t id = 0; id < 5; ++id) bm.free_sequence(id);
    conserved(bm);
    CHECK(bm.counts(PoolKind::primary).referenced == 0);
  }
}

TEST_CASE("block manager: the last prompt token is always recomputed, full blocks are hit") {
  const int32_t P = 4;
  BlockManager bm(reuse_config(P, 16), nullptr);
  const auto a = iota_tokens(12);  // exactly three blocks
  REQUIRE(bm.add_sequence(0, a).tokens() == 0);
  REQUIRE(bm.ensure_capacity(0, 12));
  bm.commit(0, a, 12);
  // The same prompt: its third block holds the last token, so only two blocks are hit.
  const MatchResult m = bm.add_sequence(1, a);
  CHECK(m.full_tokens == 8);
  CHECK(m.partial_tokens == 0);
  CHECK(bm.table(1)[0] == bm.table(0)[0]);
  CHECK(bm.table(1)[1] == bm.table(0)[1]);
  CHECK(bm.ref_count(bm.table(0)[0]) == 2);
  // One token longer: three blocks are hit.
  auto longer = a;
  longer.push_back(7);
  CHECK(bm.add_sequence(2, longer).full_tokens == 12);
  conserved(bm);
}

TEST_CASE("block manager: same-step shared prefixes never produce duplicate blocks") {
  const int32_t P = 3;
  BlockManager bm(reuse_config(P, 20), nullptr);
  auto a = iota_tokens(10);
  auto b = iota_tokens(10);
  b.back() = 9999;
  // Both scheduled in one step: A is committed at scheduling time, so B hits A's blocks.
  bm.add_sequence(0, a);
  REQUIRE(bm.ensure_capacity(0, 10));
  bm.commit(0, a, 10);
  const MatchResult m = bm.add_sequence(1, b);
  CHECK(m.full_tokens == 9);
  REQUIRE(bm.ensure_capacity(1, 10));
  bm.commit(1, b, 10);
  CHECK(bm.counters().duplicate_blocks == 0);
  std::set<int32_t> distinct(bm.table(0).begin(), bm.table(0).end());
  distinct.insert(bm.table(1).begin(), bm.table(1).end());
  CHECK(distinct.size() == 4 + 1);  // A's four blocks, and B's own last block
  conserved(bm);
}

TEST_CASE("block manager: LRU evicts the least recently released cached block, a prefix's tail first") {
  const int32_t P = 2;
  BlockManager bm(reuse_config(P, 6), nullptr);
  const auto a = iota_tokens(6, 10);
  REQUIRE(bm.add_sequence(0, a).tokens() == 0);
  REQUIRE(bm.ensure_capacity(0, 6));
  bm.commit(0, a, 6);
  const std::vector<int32_t> a_blocks = bm.table(0);
  bm.free_sequence(0);
  // Released tail first: the LRU order is A's blocks from last to first.
  CHECK(bm.lru_order() == std::vector<int32_t>{a_blocks[2], a_blocks[1], a_blocks[0]});
  conserved(bm);
  // A new unrelated sequence of 5 blocks takes the 3 free blocks, then evicts A's tail, then its middle.
  const auto c = iota_tokens(10, 500);
  bm.add_sequence(1, c);
  REQUIRE(bm.ensure_capacity(1, 10));
  CHECK(bm.counters().evicted_blocks == 2);
  CHECK(bm.lru_order() == std::vector<int32_t>{a_blocks[0]});
  conserved(bm);
  // A's head is still cached: a prompt starting with it hits one block.
  bm.free_sequence(1);
  CHECK(bm.add_sequence(2, a).full_tokens == 2);
  conserved(bm);
}

TEST_CASE("block manager: partial reuse copies the matching head of a cached block") {
  const int32_t P = 7;
  RecordingMover mover;
  BlockManagerConfig cfg = reuse_config(P, 10);
  cfg.partial_reuse = true;
  BlockManager bm(cfg, &mover);
  const auto a = iota_tokens(15);  // two full blocks + 1
  bm.add_sequence(0, a);
  REQUIRE(bm.ensure_capacity(0, 15));
  bm.commit(0, a, 15);
  bm.mark_step_written();  // the step that fills A's blocks has run: they may be copied from
  // B shares block 0 and the first 4 tokens of block 1.
  auto b = iota_tokens(11);
  b.push_back(-5);
  b.push_back(-6);
  b.push_back(-7);
  const MatchResult m = bm.add_sequence(1, b);
  CHECK(m.full_tokens == 7);
  CHECK(m.partial_tokens == 4);
  REQUIRE(mover.moves.size() == 1);
  CHECK(mover.moves[0].op == "partial_copy");
  CHECK(mover.moves[0].a == bm.table(0)[1]);
  CHECK(mover.moves[0].b == bm.table(1)[1]);
  CHECK(mover.moves[0].n == 4);
  CHECK(bm.table(1)[1] != bm.table(0)[1]);  // a private copy, never the cached block itself
  CHECK(bm.counters().reuse_hit_tokens == 11);
  CHECK(bm.counters().partial_reuse_tokens == 4);
  conserved(bm);
  // A partial match is capped so the last prompt token is recomputed.
  auto c = iota_tokens(10);
  const MatchResult mc = bm.add_sequence(2, c);
  CHECK(mc.tokens() == 9);
  conserved(bm);
}

TEST_CASE("block manager: offload on eviction, onboard on a later hit") {
  const int32_t P = 3;
  RecordingMover mover;
  BlockManagerConfig cfg = reuse_config(P, 4, 2);
  cfg.offload = true;
  BlockManager bm(cfg, &mover);
  const auto a = iota_tokens(7);  // 3 blocks, 2 full + 1
  bm.add_sequence(0, a);
  REQUIRE(bm.ensure_capacity(0, 7));
  bm.commit(0, a, 7);
  const auto a_blocks = bm.table(0);
  bm.free_sequence(0);
  conserved(bm);
  // A 4-block sequence: 1 free block, then evicts both cached blocks of A (tail first) to the secondary pool.
  const auto c = iota_tokens(12, 900);
  bm.add_sequence(1, c);
  REQUIRE(bm.ensure_capacity(1, 12));
  CHECK(bm.counters().offloaded_blocks == 2);
  CHECK(bm.secondary_cached() == 2);
  REQUIRE(mover.moves.size() == 2);
  CHECK(mover.moves[0].op == "offload");
  CHECK(mover.moves[0].a == a_blocks[1]);
  CHECK(mover.moves[1].a == a_blocks[0]);
  conserved(bm);
  bm.free_sequence(1);
  // A hit on A's prefix onboards both blocks.
  const MatchResult m = bm.add_sequence(2, a);
  CHECK(m.full_tokens == 6);
  CHECK(bm.counters().onboarded_blocks == 2);
  CHECK(mover.moves[2].op == "onboard");
  CHECK(mover.moves[3].op == "onboard");
  CHECK(bm.secondary_cached() == 0);
  conserved(bm);
}

TEST_CASE("block manager: running out of blocks fails without side effects") {
  BlockManager bm(reuse_config(5, 3), nullptr);
  bm.add_sequence(0, iota_tokens(9));
  REQUIRE(bm.ensure_capacity(0, 9));
  bm.add_sequence(1, iota_tokens(9, 700));
  const auto before = bm.counts(PoolKind::primary);
  CHECK(bm.blocks_needed(1, 9) == 2);
  CHECK_FALSE(bm.ensure_capacity(1, 9));
  CHECK(bm.table(1).empty());
  CHECK(bm.counts(PoolKind::primary).free == before.free);
  conserved(bm);
  // Preemption frees the victim's blocks; then the sequence fits.
  bm.free_sequence(0);
  CHECK(bm.ensure_capacity(1, 9));
  conserved(bm);
}

TEST_CASE("block manager: cyclic window (TensorRT-LLM) stops growing at the ring; release window (vLLM) returns blocks") {
  SUBCASE("cyclic: sinks 3, P 4 (bubble 1), W 11, one more block") {
    BlockManagerConfig cfg{.primary_blocks = 12, .page_size = 4, .window_mode = WindowMode::cyclic, .window = 11,
                           .sinks = 3, .one_more_block = true};
    BlockManager bm(cfg, nullptr);
    // Ring: cyclic_len = 11 + 4 - 3 = 12 slots after 3 sinks + 1 bubble = 16 slots = 4 pages.
    CHECK(bm.window_mapping().bubble == 1);
    CHECK(bm.window_mapping().cyclic_len == 12);
    bm.add_sequence(0, {});
    for (int64_t len = 1; len <= 40; ++len) {
      REQUIRE(bm.ensure_capacity(0, len));
      CHECK(static_cast<int64_t>(bm.table(0).size()) == (bm.window_mapping().cache_length(len) + 3) / 4);
      conserved(bm);
    }
    CHECK(bm.table(0).size() == 4);
    CHECK(bm.counts(PoolKind::primary).referenced == 4);
  }
  SUBCASE("release: sinks 2, W 9, P 3, one more block: blocks wholly out of the window go back to the free list") {
    BlockManagerConfig cfg{.primary_blocks = 10, .page_size = 3, .window_mode = WindowMode::release, .window = 9,
                           .sinks = 2, .one_more_block = true};
    BlockManager bm(cfg, nullptr);
    CHECK(bm.counts(PoolKind::primary).referenced == 1);  // the reserved null block
    const WindowMapping& w = bm.window_mapping();
    bm.add_sequence(0, {});
    int64_t max_live = 0;
    for (int64_t len = 1; len <= 45; ++len) {
      REQUIRE(bm.ensure_capacity(0, len));
      // The page of the token just written is live.
      CHECK(bm.table(0)[w.cache_token(len - 1) / 3] != BlockManager::kNullBlock);
      bm.release_out_of_window(0, len);
      conserved(bm);
      // Independently: a released page holds no token the next query (at len) attends.
      const int64_t window_start = std::max<int64_t>(2, len + 1 - 7);
      int64_t live = 0;
      for (size_t pg = 0; pg < bm.table(0).size(); ++pg) {
        if (bm.table(0)[pg] != BlockManager::kNullBlock) {
          ++live;
          continue;
        }
        for (int64_t t = 0; t < len; ++t) {
          const int64_t slot = w.cache_token(t);
          bool newest = true;  // t is the newest token in its slot
          for (int64_t u = t + 1; u < len; ++u) newest = newest && w.cache_token(u) != slot;
          if (newest && slot / 3 == static_cast<int64_t>(pg)) CHECK((t >= 2 && t < window_start));
        }
      }
      max_live = std::max(max_live, live);
      CHECK(live + bm.counts(PoolKind::primary).free + 1 == 10);
    }
    CHECK(bm.counters().released_window_blocks > 3);
    CHECK(max_live <= static_cast<int64_t>(bm.table(0).size()));
    bm.free_sequence(0);
    CHECK(bm.counts(PoolKind::primary).free == 9);
    conserved(bm);
  }
}

TEST_CASE("block manager: the reused_block_mismatch fault serves blocks holding other tokens") {
  BlockManagerConfig cfg = reuse_config(4, 10);
  cfg.fault_serve_wrong_blocks = true;
  BlockManager bm(cfg, nullptr);
  const auto a = iota_tokens(13);
  bm.add_sequence(0, a);
  REQUIRE(bm.ensure_capacity(0, 13));
  bm.commit(0, a, 13);
  const std::vector<int32_t> a_blocks = bm.table(0);
  // Three hit blocks, served rotated: every reused page holds another page's tokens.
  CHECK(bm.add_sequence(1, a).full_tokens == 12);
  CHECK(bm.table(1) == std::vector<int32_t>{a_blocks[1], a_blocks[2], a_blocks[0]});
  conserved(bm);
  // A single hit is served another cached block.
  bm.free_sequence(0);
  bm.free_sequence(1);
  const std::vector<int32_t> short_prompt(a.begin(), a.begin() + 5);
  CHECK(bm.add_sequence(2, short_prompt).full_tokens == 4);
  CHECK(bm.table(2)[0] != a_blocks[0]);
  conserved(bm);
}

TEST_CASE("synthetic model: equal prefixes give equal inputs; a different earlier token changes them") {
  ModelSpec spec;
  spec.seed = 7;
  SyntheticModel m(spec);
  const std::vector<int32_t> a{1, 2, 3, 4}, b{1, 2, 3, 5}, c{9, 2, 3, 4};
  const auto ha = SyntheticModel::prefix_hashes(a), hb = SyntheticModel::prefix_hashes(b),
             hc = SyntheticModel::prefix_hashes(c);
  CHECK(ha[2] == hb[2]);
  CHECK(ha[3] != hb[3]);
  CHECK(ha[1] != hc[1]);
  CHECK(m.value(ModelTensor::k, 1, 0, 5, 2, ha[2]) == m.value(ModelTensor::k, 1, 0, 5, 2, hb[2]));
  CHECK(m.value(ModelTensor::k, 1, 0, 5, 3, ha[3]) != m.value(ModelTensor::k, 1, 0, 5, 3, hb[3]));
  // Spread: sigma close to value_scale, bounded, outliers when asked for.
  double sum2 = 0, maxabs = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const double x = m.value(ModelTensor::v, 0, 0, i % 64, i, ha[3]);
    sum2 += x * x;
    maxabs = std::max(maxabs, std::abs(x));
  }
  CHECK(std::sqrt(sum2 / n) == doctest::Approx(1.0).epsilon(0.05));
  CHECK(maxabs < 3.5);
  spec.outlier_rate = 0.01f;
  SyntheticModel mo(spec);
  int outliers = 0;
  for (int i = 0; i < n; ++i) outliers += std::abs(mo.value(ModelTensor::v, 0, 0, i % 64, i, ha[3])) > 4.0f;
  CHECK(outliers > n / 200);
  CHECK(outliers < n / 50);
}

TEST_CASE("synthetic model: row_from_seeds is value() element by element, bit for bit, at every CPU ISA, with outliers, NaN and Inf") {
  ModelSpec spec;
  spec.seed = 11;
  spec.value_scale = 0.75f;
  for (const float rate : {0.0f, 0.05f}) {
    spec.outlier_rate = rate;
    spec.nan_rate = rate;
    spec.inf_rate = rate;
    SyntheticModel m(spec);
    int specials = 0;
    for (const ModelTensor t : {ModelTensor::q, ModelTensor::k, ModelTensor::v, ModelTensor::ckv, ModelTensor::kpe,
                                ModelTensor::indexer_k})
      for (const int32_t n : {1, 7, 128, 576}) {
        const int32_t layer = n % 5, head = n % 3;
        const int64_t position = 1000 + n;
        const uint64_t prefix_hash = SyntheticModel::extend_hash(SyntheticModel::kEmptyHash, n);
        std::vector<uint64_t> seeds(static_cast<size_t>(n));
        for (int32_t d = 0; d < n; ++d) seeds[static_cast<size_t>(d)] = m.dim_seed(t, layer, head, d);
        std::vector<float> row(static_cast<size_t>(n));
        // The default dispatch, then every ISA this CPU runs.
        for (int which = -1; which < 3; ++which) {
          const CpuIsa isa = static_cast<CpuIsa>(which < 0 ? 0 : which);
          if (which >= 0 && !cpu_isa_supported(isa)) continue;
          if (which < 0) m.row_from_seeds(t, seeds.data(), n, position, prefix_hash, row.data());
          else m.row_from_seeds(t, seeds.data(), n, position, prefix_hash, row.data(), isa);
          for (int32_t d = 0; d < n; ++d) {
            const float want = m.value(t, layer, head, d, position, prefix_hash);
            const float got = row[static_cast<size_t>(d)];
            INFO("tensor " << static_cast<int>(t) << " n " << n << " dim " << d << " isa " << which);
            CHECK(std::memcmp(&want, &got, sizeof want) == 0);
            specials += which < 0 && !std::isfinite(want);
          }
        }
      }
    CHECK((rate > 0.0f) == (specials > 0));  // the special branches are taken where asked for
  }
}

// ---------------------------------------------------------------- scheduler (sim/include/kvsim/sim/scheduler.hpp)

namespace {
RequestSpec req(const std::string& id, int32_t generated, int32_t decode, int32_t arrival = 0) {
  RequestSpec r;
  r.id = id;
  r.generated = generated;
  r.decode_tokens = decode;
  r.arrival_step = arrival;
  return r;
}

// Drives the scheduler without a backend; checks budget, chunking and
// in-order progress every step, and conservation after every step.
struct Drive {
  int64_t steps = 0;
  std::vector<std::vector<int32_t>> batches;  // request indices per step, batch order
};
Drive drive(const Scenario& s, BlockManager& bm, Scheduler& sched, std::vector<RequestState>& reqs) {
  Drive d;
  std::vector<int64_t> done(reqs.size(), 0);
  for (int64_t step = 0; !sched.done() && step < 10000; ++step) {
    const StepPlan plan = sched.schedule(step);
    int64_t tokens = 0;
    std::vector<int32_t> batch;
    for (const auto* list : {&plan.prefill, &plan.decode})
      for (const ScheduledEntry& e : *list) {
        tokens += e.n;
        batch.push_back(e.request);
        if (!e.decode && s.scheduler.chunk_size > 0) CHECK(e.n <= s.scheduler.chunk_size);
        if (e.decode) CHECK(e.n == 1);
        CHECK(bm.table(e.request).size() >= static_cast<size_t>(bm.pages_for(e.start + e.n)));
      }
    CHECK(tokens <= s.scheduler.token_budget);
    d.batches.push_back(batch);
    const auto finished = sched.finish_step(plan);
    sched.free_finished(finished);
    const std::string err = bm.check_conservation();
    CHECK_MESSAGE(err.empty(), err);
    if (!plan.empty()) ++d.steps;
  }
  CHECK(sched.done());
  for (const RequestState& r : reqs) CHECK(r.computed == r.final_len);
  return d;
}
}  // namespace

TEST_CASE("scheduler: token budget, chunk size, decode after prefill, odd batch") {
  Scenario s;
  s.cache.page_size = 7;
  s.scheduler.token_budget = 13;
  s.scheduler.chunk_size = 5;
  s.requests = {req("a", 23, 3), req("b", 9, 5), req("c", 17, 1, 2)};
  auto reqs = make_requests(s);
  BlockManager bm(BlockManagerConfig::from(s), nullptr);
  Scheduler sched(s, bm, reqs);
  drive(s, bm, sched, reqs);
  CHECK(sched.prefill_tokens == 23 + 9 + 17);
  CHECK(sched.decode_tokens == 3 + 5 + 1);
  CHECK(sched.preemptions == 0);
}

TEST_CASE("scheduler: whole_prompts admits a prefill only whole, in steps no larger than one_chunk_budget") {
  Scenario s;
  s.cache.page_size = 7;
  s.scheduler.token_budget = 13;
  s.scheduler.chunk_size = 5;
  s.requests = {req("a", 23, 3), req("b", 9, 5), req("c", 17, 1, 2), req("d", 4, 2)};
  CHECK(one_chunk_budget(s) == 26);  // a: 23 prompt + 3 decode tokens, longer than the budget 13
  s.scheduler.chunk_size = 0;
  s.scheduler.whole_prompts = true;
  s.scheduler.token_budget = one_chunk_budget(s);
  auto reqs = make_requests(s);
  BlockManager bm(BlockManagerConfig::from(s), nullptr);
  Scheduler sched(s, bm, reqs);
  int64_t max_step = 0;
  for (int64_t step = 0; !sched.done() && step < 1000; ++step) {
    const StepPlan plan = sched.schedule(step);
    int64_t tokens = 0;
    for (const auto* list : {&plan.prefill, &plan.decode})
      for (const ScheduledEntry& e : *list) tokens += e.n;
    for (const ScheduledEntry& e : plan.prefill) {
      CHECK_FALSE(e.continuation);  // one chunk per prefill
      CHECK(e.start + e.n == reqs[e.request].prefill_target);
    }
    max_step = std::max(max_step, tokens);
    sched.free_finished(sched.finish_step(plan));
  }
  CHECK(sched.done());
  CHECK(max_step <= 26);
  CHECK(max_step >= 23);  // a's prompt did run in one step
  CHECK(sched.prefill_tokens == 23 + 9 + 17 + 4);
  // Without the rule, the same budget cuts b's prompt to what a leaves of it.
  s.scheduler.whole_prompts = false;
  s.scheduler.token_budget = 30;
  auto reqs2 = make_requests(s);
  BlockManager bm2(BlockManagerConfig::from(s), nullptr);
  Scheduler sched2(s, bm2, reqs2);
  const StepPlan first = sched2.schedule(0);
  REQUIRE(first.prefill.size() >= 2);
  CHECK(first.prefill[1].n < reqs2[first.prefill[1].request].prefill_target);
}

TEST_CASE("scheduler: the most recently admitted request is preempted, then recomputed") {
  Scenario s;
  s.cache.page_size = 4;
  s.cache.primary_blocks = 9;  // 36 tokens: three requests growing to 20 tokens each cannot all stay
  s.scheduler.token_budget = 64;
  s.requests = {req("a", 8, 12), req("b", 8, 12), req("c", 8, 12)};
  auto reqs = make_requests(s);
  BlockManager bm(BlockManagerConfig::from(s), nullptr);
  Scheduler sched(s, bm, reqs);
  const Drive d = drive(s, bm, sched, reqs);
  CHECK(sched.preemptions > 0);
  // The first step that lost a request dropped the last admitted one ("c"), never "a".
  for (size_t i = 1; i < d.batches.size(); ++i)
    if (d.batches[i].size() < d.batches[i - 1].size()) {
      CHECK(std::find(d.batches[i].begin(), d.batches[i].end(), 0) != d.batches[i].end());
      CHECK(std::find(d.batches[i].begin(), d.batches[i].end(), 2) == d.batches[i].end());
      break;
    }
  CHECK(sched.prefill_tokens > 24);  // recomputed tokens count again
  CHECK(sched.decode_tokens == 36);
}

namespace {
// Two groups in one pool (vLLM hybrid): group 0 sliding W, group 1 full.
BlockManagerConfig hybrid_config(int32_t P, int64_t blocks, int32_t W) {
  BlockManagerConfig c = reuse_config(P, blocks);
  c.groups = {{WindowMode::sliding, W, 0, false, 0}, {WindowMode::none, 0, 0, false, 0}};
  return c;
}
// Runs a sequence through its prompt in one step, then frees it (its full blocks stay cached).
void run_and_free(BlockManager& bm, int32_t seq, const std::vector<int32_t>& tokens) {
  const MatchResult m = bm.add_sequence(seq, tokens);
  REQUIRE(bm.ensure_capacity(seq, static_cast<int64_t>(tokens.size())));
  bm.commit(seq, tokens, static_cast<int64_t>(tokens.size()));
  bm.mark_step_written();
  bm.release_out_of_window(seq, static_cast<int64_t>(tokens.size()));
  (void)m;
  conserved(bm);
  bm.free_sequence(seq);
  conserved(bm);
}
}  // namespace

TEST_CASE("hybrid groups: a sliding group releases pages that left the window to the cache, null in its table") {
  BlockManager bm(hybrid_config(4, 40, 8), nullptr);
  const auto tokens = iota_tokens(22);
  bm.add_sequence(0, tokens);
  REQUIRE(bm.ensure_capacity(0, 22));
  CHECK(bm.table(0, 0).size() == 6);
  CHECK(bm.table(0, 1).size() == 6);
  bm.commit(0, tokens, 22);
  bm.release_out_of_window(0, 22);  // the next query (22) attends 15..22: pages 0..2 (tokens 0..11) left
  for (int pg = 0; pg < 3; ++pg) CHECK(bm.table(0, 0)[pg] == BlockManager::kNullBlock);
  CHECK(bm.table(0, 0)[3] != BlockManager::kNullBlock);
  for (int32_t b : bm.table(0, 1)) CHECK(b != BlockManager::kNullBlock);  // the full group keeps everything
  CHECK(bm.counters().released_window_blocks == 3);
  CHECK(bm.counts(PoolKind::primary).cached == 3);  // registered full blocks stay in the prefix cache
  // Groups share the pool: no block id is in both tables.
  std::set<int32_t> ids(bm.table(0, 1).begin(), bm.table(0, 1).end());
  for (int32_t b : bm.table(0, 0))
    if (b != BlockManager::kNullBlock) CHECK(ids.count(b) == 0);
  conserved(bm);
}

TEST_CASE("hybrid hit rule (vLLM): the longest prefix every group serves; a sliding group needs cdiv(W - 1, P) blocks") {
  // P = 4, W = 8: the sliding group needs the 2 blocks before the hit point.
  BlockManager bm(hybrid_config(4, 64, 8), nullptr);
  const auto prompt = iota_tokens(29);  // limit 28 tokens = 7 full blocks
  run_and_free(bm, 0, prompt);
  const MatchResult m = bm.add_sequence(1, prompt);
  CHECK(m.full_tokens == 28);
  // The sliding table: null up to the window's 2 blocks, which are the cached ones.
  const std::vector<int32_t>& sliding = bm.table(1, 0);
  REQUIRE(sliding.size() == 7);
  for (int i = 0; i < 5; ++i) CHECK(sliding[i] == BlockManager::kNullBlock);
  CHECK(sliding[5] != BlockManager::kNullBlock);
  CHECK(sliding[6] != BlockManager::kNullBlock);
  CHECK(bm.table(1, 1).size() == 7);
  for (int32_t b : bm.table(1, 1)) CHECK(b != BlockManager::kNullBlock);
  conserved(bm);
  bm.free_sequence(1);

  // Without the sliding group's last cached blocks the hit falls back to where it has 2 in a row.
  BlockManager partial(hybrid_config(4, 64, 8), nullptr);
  const auto short_prompt = iota_tokens(17);  // caches blocks 0..3 (16 tokens) in both groups
  run_and_free(partial, 0, short_prompt);
  const MatchResult m2 = partial.add_sequence(1, prompt);  // the full group has blocks 0..3 only
  CHECK(m2.full_tokens == 16);
  CHECK(partial.table(1, 0)[1] == BlockManager::kNullBlock);
  CHECK(partial.table(1, 0)[2] != BlockManager::kNullBlock);
  conserved(partial);
}

TEST_CASE("hybrid groups key their blocks in their own chains: equal tokens, separate cache entries") {
  BlockManagerConfig c = reuse_config(4, 64);
  c.groups = {{WindowMode::none, 0, 0, false, 0}, {WindowMode::sliding, 8, 0, false, 0}};
  BlockManager bm(c, nullptr);
  const auto prompt = iota_tokens(29);
  run_and_free(bm, 0, prompt);
  CHECK(bm.add_sequence(1, prompt).full_tokens == 28);  // both chains are cached: a full hit
  CHECK(bm.table(1, 0)[5] != bm.table(1, 1)[5]);       // each group's own block for the same tokens
  conserved(bm);
}

TEST_CASE("VSWA pools: each window size has its own block ids and free list; all or nothing across pools") {
  BlockManagerConfig c = reuse_config(4, 6);
  c.groups = {{WindowMode::sliding, 8, 0, false, 0}, {WindowMode::none, 0, 0, false, 1}};
  BlockManager bm(c, nullptr);
  bm.add_sequence(0, iota_tokens(20));
  REQUIRE(bm.ensure_capacity(0, 20));  // 5 pages in each pool (pool 0 also holds its null block)
  // Block ids are per pool: both tables can start with the same id.
  CHECK(bm.table(0, 0)[0] == bm.table(0, 1)[0] + 1);  // pool 0's block 0 is its null block
  CHECK(bm.counts(PoolKind::primary).size == 12);
  CHECK(bm.counts(PoolKind::primary).free == 12 - 5 - 5 - 1);
  // The full pool has one block left, the window pool none: 2 more pages cannot be had; nothing changes.
  bm.release_out_of_window(0, 20);  // sliding pages 0..2 leave the window (tokens 0..11 < 13)
  CHECK(bm.ensure_capacity(0, 24));  // one page more in each pool: pool 0 reuses a released block
  CHECK_FALSE(bm.ensure_capacity(0, 28));  // the full pool is out of blocks
  CHECK(bm.table(0, 1).size() == 6);
  conserved(bm);
}

TEST_CASE("VSWA offload: each pool offloads into its own secondary pool; a hit onboards into its group's pool") {
  // P = 4, W = 8: group 0 sliding in pool 0 (block 0 its null block), group 1 full in pool 1.
  BlockManagerConfig c = reuse_config(4, 8, 8);
  c.groups = {{WindowMode::sliding, 8, 0, false, 0}, {WindowMode::none, 0, 0, false, 1}};
  c.offload = true;
  RecordingMover mover;
  BlockManager bm(c, &mover);
  const auto prompt = iota_tokens(17);  // 4 full blocks cached in each chain
  run_and_free(bm, 0, prompt);
  // An unrelated 7-page sequence: pool 0 (7 usable blocks, 4 cached) evicts all 4, pool 1 (4 free) evicts 3.
  bm.add_sequence(1, iota_tokens(28, 900));
  REQUIRE(bm.ensure_capacity(1, 28));
  int offloads[2] = {0, 0};
  for (const Move& m : mover.moves)
    if (m.op == "offload") ++offloads[m.pool];
  CHECK(offloads[0] == 4);
  CHECK(offloads[1] == 3);
  CHECK(bm.secondary_cached() == 7);
  CHECK(bm.counts(PoolKind::secondary).size == 16);  // 8 per pool
  conserved(bm);
  bm.free_sequence(1);
  // The prompt again: 16 tokens hit. The full group needs blocks 0..3 (block 0 still in pool 1, three
  // onboarded), the sliding group the cdiv(7, 4) = 2 blocks before the hit point (both onboarded).
  mover.moves.clear();
  const MatchResult m = bm.add_sequence(2, prompt);
  CHECK(m.full_tokens == 16);
  int onboards[2] = {0, 0};
  for (const Move& mv : mover.moves) {
    CHECK(mv.op == "onboard");
    ++onboards[mv.pool];
  }
  CHECK(onboards[0] == 2);
  CHECK(onboards[1] == 3);
  CHECK(bm.counters().onboarded_blocks == 5);
  CHECK(bm.table(2, 0)[0] == BlockManager::kNullBlock);
  CHECK(bm.table(2, 0)[1] == BlockManager::kNullBlock);
  for (int i = 2; i < 4; ++i) CHECK(bm.block_use(0, bm.table(2, 0)[i]) == BlockUse::referenced);
  for (int32_t b : bm.table(2, 1)) CHECK(bm.block_use(1, b) == BlockUse::referenced);
  conserved(bm);
}

TEST_CASE("hybrid partial reuse: every group copies the same head of its own cached block") {
  BlockManagerConfig c = hybrid_config(4, 64, 8);
  c.partial_reuse = true;
  RecordingMover mover;
  BlockManager bm(c, &mover);
  const auto a = iota_tokens(24);  // 6 full blocks in each chain
  run_and_free(bm, 0, a);
  std::vector<int32_t> b(a.begin(), a.begin() + 22);  // 5 full blocks and 2 tokens of block 5, then others
  for (int32_t t = 0; t < 8; ++t) b.push_back(5000 + t);
  const MatchResult m = bm.add_sequence(1, b);
  CHECK(m.full_tokens == 20);
  CHECK(m.partial_tokens == 2);
  CHECK(bm.counters().partial_reuse_tokens == 2);
  REQUIRE(mover.moves.size() == 2);  // one copy per group, each from its own chain's block
  for (int g = 0; g < 2; ++g) {
    CHECK(mover.moves[g].op == "partial_copy");
    CHECK(mover.moves[g].n == 2);
    CHECK(mover.moves[g].b == bm.table(1, g)[5]);
    CHECK(bm.table(1, g).size() == 6);
  }
  CHECK(mover.moves[0].a != mover.moves[1].a);
  REQUIRE(bm.ensure_capacity(1, 30));
  conserved(bm);
}

TEST_CASE("groups with offload and partial reuse: conservation after every operation (hybrid and VSWA, odd pages)") {
  for (const bool vswa : {false, true})
    for (const int32_t P : {1, 3, 5}) {
      INFO(std::string(vswa ? "vswa" : "hybrid") << " P " << P);
      BlockManagerConfig c = reuse_config(P, 40, 12);
      c.groups = {{WindowMode::sliding, 2 * P + 1, 0, false, 0}, {WindowMode::none, 0, 0, false, vswa ? 1 : 0}};
      c.offload = c.partial_reuse = true;
      RecordingMover mover;
      BlockManager bm(c, &mover);
      testing::Rng rng(0x5157 + P + (vswa ? 100 : 0));
      const std::vector<int32_t> shared = iota_tokens(6 * P + 2);
      std::vector<int32_t> live;
      std::map<int32_t, std::vector<int32_t>> prompts;
      for (int32_t seq = 0; seq < 60; ++seq) {
        // A prompt sharing some head of `shared`, then its own tokens.
        std::vector<int32_t> prompt(shared.begin(), shared.begin() + rng.uniform(0, static_cast<int64_t>(shared.size())));
        for (int64_t i = rng.uniform(1, 3 * P); i > 0; --i) prompt.push_back(static_cast<int32_t>(10000 + rng.below(4)));
        const MatchResult m = bm.add_sequence(seq, prompt);
        conserved(bm);
        const int64_t len = static_cast<int64_t>(prompt.size());
        if (!bm.ensure_capacity(seq, len)) {
          bm.cancel_sequence(seq, m);
          conserved(bm);
        } else {
          bm.commit(seq, prompt, len);
          bm.mark_step_written();
          bm.release_out_of_window(seq, len);
          live.push_back(seq);
          prompts[seq] = prompt;
          conserved(bm);
        }
        while (live.size() > 3 || (!live.empty() && rng.below(3) == 0)) {  // finish some, oldest first
          bm.free_sequence(live.front());
          live.erase(live.begin());
          conserved(bm);
        }
      }
      CHECK(bm.counters().reuse_hit_tokens > 0);
      CHECK(bm.counters().offloaded_blocks > 0);
      CHECK(bm.counters().onboarded_blocks > 0);
      if (P > 1) CHECK(bm.counters().partial_reuse_tokens > 0);  // a 1-token block matches whole or not at all
      for (const Move& mv : mover.moves) CHECK((vswa || mv.pool == 0));
    }
}

TEST_CASE("block order: lowest first (default), highest first, or a seeded shuffle of every block") {
  auto first_blocks = [](BlockOrder order, uint64_t seed) {
    BlockManagerConfig c{.primary_blocks = 10, .page_size = 4, .block_order = order, .order_seed = seed};
    BlockManager bm(c, nullptr);
    bm.add_sequence(0, iota_tokens(40));
    REQUIRE(bm.ensure_capacity(0, 40));
    conserved(bm);
    return bm.table(0);
  };
  CHECK(first_blocks(BlockOrder::lowest, 1) == std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  CHECK(first_blocks(BlockOrder::highest, 1) == std::vector<int32_t>{9, 8, 7, 6, 5, 4, 3, 2, 1, 0});
  const std::vector<int32_t> shuffled = first_blocks(BlockOrder::shuffled, 7);
  CHECK(shuffled == first_blocks(BlockOrder::shuffled, 7));  // deterministic
  CHECK(shuffled != first_blocks(BlockOrder::shuffled, 8));  // and seeded
  std::vector<int32_t> sorted = shuffled;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == first_blocks(BlockOrder::lowest, 1));  // a permutation of every block
}

TEST_CASE("synthetic model: NaN and Inf rates replace that share of K/V inputs, never Q") {
  ModelSpec spec;
  spec.nan_rate = 0.1f;
  spec.inf_rate = 0.05f;
  const SyntheticModel m(spec);
  int nan = 0, inf = 0, q_nonfinite = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const float k = m.value(ModelTensor::k, 0, 0, i % 64, i / 64, 5);
    nan += std::isnan(k);
    inf += std::isinf(k);
    q_nonfinite += !std::isfinite(m.value(ModelTensor::q, 0, 0, i % 64, i / 64, 5));
  }
  CHECK(nan > n * 0.08);
  CHECK(nan < n * 0.12);
  CHECK(inf > n * 0.035);
  CHECK(inf < n * 0.065);
  CHECK(q_nonfinite == 0);
}
