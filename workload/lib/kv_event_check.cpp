// KV-event streams: the invariants and the replay through the block manager
// (see kv_events.hpp and docs/traces.md).
#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include <kvsim/validation/errors.hpp>
#include <kvsim/sim/block_manager.hpp>

#include "kvsim/workload/kv_events.hpp"

namespace kvsim::workload {

std::string_view event_invariant_name(EventInvariant i) {
  switch (i) {
    case EventInvariant::sequence_contiguous: return "sequence_contiguous";
    case EventInvariant::removed_is_live: return "removed_is_live";
    case EventInvariant::parent_is_live: return "parent_is_live";
    case EventInvariant::no_duplicate_store: return "no_duplicate_store";
    case EventInvariant::one_block_size_per_group: return "one_block_size_per_group";
    case EventInvariant::full_blocks: return "full_blocks";
    case EventInvariant::cleared_means_empty: return "cleared_means_empty";
    case EventInvariant::cache_levels_exist: return "cache_levels_exist";
  }
  return "?";
}

bool EventCheckReport::ok() const {
  for (const EventCheck& c : checks)
    if (c.violations > 0) return false;
  return true;
}

namespace {

// A block's identity in the engine: (rank, group, medium, hash).
using BlockKey = std::tuple<int64_t, int64_t, std::string, std::string>;
// Live in any medium, for parent links: (rank, group, hash).
using ChainKey = std::tuple<int64_t, int64_t, std::string>;

struct Checker {
  EventCheckReport r;
  std::map<BlockKey, int64_t> live;       // -> cache level (TRT-LLM), 0 otherwise
  std::map<ChainKey, int> live_any;       // mediums holding it
  std::set<ChainKey> cleared;             // live at a clear, not stored since
  std::map<std::pair<int64_t, int64_t>, int64_t> block_size;  // (rank, group) -> tokens per block
  std::map<std::pair<int64_t, int64_t>, int64_t> levels;      // (rank, window) -> cache levels announced
  std::map<int64_t, std::pair<uint64_t, int64_t>> last_seq;   // rank -> (seq, batch)
  bool saw_seq = false, saw_trt = false;

  Checker() {
    for (int i = 0; i < kEventInvariants; ++i) r.checks.push_back({static_cast<EventInvariant>(i)});
  }
  void violate(EventInvariant i, const std::string& where, const std::string& what) {
    EventCheck& c = r.checks[static_cast<size_t>(i)];
    if (c.violations++ == 0) c.first = where + ": " + what;
  }

  void sequence(const KvEvent& e) {
    if (!e.seq) return;
    saw_seq = true;
    auto it = last_seq.find(e.rank);
    if (it == last_seq.end()) {
      last_seq[e.rank] = {*e.seq, e.batch};
      return;
    }
    auto& [seq, batch] = it->second;
    if (batch == e.batch) return;  // another event of the same batch
    if (*e.seq <= seq) {
      violate(EventInvariant::sequence_contiguous, e.where,
              "sequence number " + std::to_string(*e.seq) + " after " + std::to_string(seq) + " (not increasing)");
    } else if (*e.seq != seq + 1) {
      r.lost_batches += static_cast<int64_t>(*e.seq - seq - 1);
      violate(EventInvariant::sequence_contiguous, e.where,
              "sequence number " + std::to_string(*e.seq) + " after " + std::to_string(seq) + ": " +
                  std::to_string(*e.seq - seq - 1) + " batch(es) lost");
    }
    seq = *e.seq;
    batch = e.batch;
  }

  // A reference (removal or parent link) to a hash that is not live: a clear explains some.
  void dead_reference(EventInvariant plain, const KvEvent& e, const ChainKey& k, const std::string& subject) {
    if (cleared.count(k))
      violate(EventInvariant::cleared_means_empty, e.where, subject + " was live before AllBlocksCleared and not stored since");
    else
      violate(plain, e.where, subject + " is not live");
  }

  void store(const KvEvent& e) {
    std::optional<std::string> parent = e.parent;
    for (size_t i = 0; i < e.blocks.size(); ++i) {
      const StoredBlock& b = e.blocks[i];
      const ChainKey ck{e.rank, e.group, b.hash};
      if (parent && !live_any.count({e.rank, e.group, *parent}))
        dead_reference(EventInvariant::parent_is_live, e, {e.rank, e.group, *parent},
                       "parent " + *parent + " of stored block " + b.hash);
      const int64_t level = i < e.cache_levels.size() ? e.cache_levels[i] : 0;
      const BlockKey key{e.rank, e.group, e.medium, b.hash};
      if (live.count(key))
        violate(EventInvariant::no_duplicate_store, e.where, "block " + b.hash + " stored again while live");
      else
        ++live_any[ck];
      live[key] = level;
      cleared.erase(ck);
      if (saw_trt) check_level(e, level, "stored block " + b.hash);
      // Tokens per block: vLLM/SGLang publish block_size; TensorRT-LLM's is its blocks' token count.
      const int64_t size = e.block_size > 0 ? e.block_size : static_cast<int64_t>(b.tokens.size());
      auto [bs, fresh] = block_size.try_emplace({e.rank, e.group}, size);
      if (!fresh && bs->second != size)
        violate(EventInvariant::one_block_size_per_group, e.where,
                "group " + std::to_string(e.group) + " stores a block of " + std::to_string(size) + " tokens, earlier " +
                    std::to_string(bs->second));
      if (!e.token_count_free && static_cast<int64_t>(b.tokens.size()) != bs->second)
        violate(EventInvariant::full_blocks, e.where,
                "block " + b.hash + " holds " + std::to_string(b.tokens.size()) + " tokens, the block size is " +
                    std::to_string(bs->second));
      ++r.stored_blocks;
      parent = b.hash;
    }
  }

  void check_level(const KvEvent& e, int64_t level, const std::string& what) {
    auto it = levels.find({e.rank, e.group});
    if (it == levels.end()) return;  // no `created` event for this window: levels unknown
    if (level < 0 || level >= it->second)
      violate(EventInvariant::cache_levels_exist, e.where,
              what + " at cache level " + std::to_string(level) + ", but `created` announced " +
                  std::to_string(it->second) + " level(s)");
  }

  void remove(const KvEvent& e) {
    for (const std::string& h : e.removed) {
      const BlockKey key{e.rank, e.group, e.medium, h};
      const ChainKey ck{e.rank, e.group, h};
      ++r.removed_blocks;
      auto it = live.find(key);
      if (it == live.end()) {
        dead_reference(EventInvariant::removed_is_live, e, ck, "removed block " + h);
        continue;
      }
      live.erase(it);
      if (--live_any[ck] == 0) live_any.erase(ck);
    }
  }

  void clear(const KvEvent& e) {
    ++r.clears;
    for (auto it = live.begin(); it != live.end();) {
      if (std::get<0>(it->first) == e.rank) {
        cleared.insert({std::get<0>(it->first), std::get<1>(it->first), std::get<3>(it->first)});
        it = live.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = live_any.begin(); it != live_any.end();) it = std::get<0>(it->first) == e.rank ? live_any.erase(it) : std::next(it);
  }

  void update(const KvEvent& e) {
    if (!e.level_change) return;
    const auto [from, to] = *e.level_change;
    check_level(e, from, "update of " + e.updated_hash + " from");
    check_level(e, to, "update of " + e.updated_hash + " to");
    auto it = live.find({e.rank, e.group, e.medium, e.updated_hash});
    if (it == live.end()) {
      dead_reference(EventInvariant::removed_is_live, e, {e.rank, e.group, e.updated_hash},
                     "updated block " + e.updated_hash);
      return;
    }
    if (it->second != from)
      violate(EventInvariant::cache_levels_exist, e.where,
              "update of " + e.updated_hash + " from cache level " + std::to_string(from) + ", but it is at level " +
                  std::to_string(it->second));
    it->second = to;
  }
};

}  // namespace

EventCheckReport check_event_stream(const EventStream& s) {
  Checker c;
  c.saw_trt = s.engine == "trtllm";
  for (const KvEvent& e : s.events) {
    ++c.r.events;
    c.sequence(e);
    switch (e.kind) {
      case EventKind::stored: c.store(e); break;
      case EventKind::removed: c.remove(e); break;
      case EventKind::cleared: c.clear(e); break;
      case EventKind::created: c.levels[{e.rank, e.group}] = static_cast<int64_t>(e.blocks_per_level.size()); break;
      case EventKind::updated: c.update(e); break;
    }
  }
  c.r.checks[static_cast<size_t>(EventInvariant::sequence_contiguous)].applicable = c.saw_seq;
  c.r.checks[static_cast<size_t>(EventInvariant::cache_levels_exist)].applicable = c.saw_trt && !c.levels.empty();
  return c.r;
}

namespace {

// The primary tier: vLLM's GPU medium (or none given), TensorRT-LLM's cache level 0.
bool primary_tier(const KvEvent& e, size_t block) {
  if (!e.medium.empty() && e.medium != "GPU") return false;
  return block >= e.cache_levels.size() || e.cache_levels[block] == 0;
}

std::string tier_name(const KvEvent& e, size_t block) {
  if (!e.medium.empty() && e.medium != "GPU") return e.medium;
  return "cache_level " + std::to_string(block < e.cache_levels.size() ? e.cache_levels[block] : 0);
}

// One (rank, group)'s replay: its content tree, kvsim's block manager, the engine's live sets.
class StreamReplay {
 public:
  StreamReplay(int64_t rank, int64_t group, int64_t block_size, int64_t capacity_blocks)
      : bm_(config(block_size, capacity_blocks), nullptr) {
    r_.rank = rank;
    r_.group = group;
    r_.block_size = block_size;
  }

  int64_t event = 0;  // index of the event being replayed, for the first divergence

  void cleared() {
    engine_live_.clear();
    for (auto& [name, m] : media_) m.live.clear();
  }

  void removed(const KvEvent& e) {
    for (const std::string& h : e.removed) {
      if (!e.medium.empty() && e.medium != "GPU") {
        Medium& m = medium(e.medium);
        ++m.report.removed_blocks;
        m.live.erase(h);
        continue;
      }
      if (engine_live_.erase(h) == 0) continue;  // not live: events check names that, the replay ignores it
      ++r_.engine_removals;
      if (kvsim_live_.count(h)) {
        ++r_.engine_removed_kvsim_kept;
        diverge(e.where, "the engine removed " + h + ", kvsim's LRU still holds it");
      }
    }
  }

  // TensorRT-LLM `updated`: a block moved between cache levels. Leaving level
  // 0 takes it out of the primary tier (as a removal would); arriving at 0
  // brings it back (an onboard: live again, with no store to replay).
  void updated(const KvEvent& e) {
    if (!e.level_change) return;
    const auto [from, to] = *e.level_change;
    if (from == to) return;
    const std::string& h = e.updated_hash;
    if (from == 0) {
      KvEvent as_removal = e;
      as_removal.removed = {h};
      removed(as_removal);
    } else {
      medium("cache_level " + std::to_string(from)).live.erase(h);
    }
    if (to == 0) {
      engine_live_.insert(h);
      ++medium("cache_level " + std::to_string(from)).report.restored_blocks;
    } else {
      Medium& m = medium("cache_level " + std::to_string(to));
      ++m.report.stored_blocks;
      m.live.insert(h);
    }
  }

  void stored(const KvEvent& e) {
    bool primary = true;
    std::optional<std::string> parent = e.parent;
    for (size_t i = 0; i < e.blocks.size(); ++i) {
      const StoredBlock& b = e.blocks[i];
      Node& n = tree_[b.hash];
      n.parent = parent;
      n.tokens.assign(b.tokens.begin(), b.tokens.end());
      parent = b.hash;
      if (primary_tier(e, i)) {
        for (auto& [name, m] : media_)
          if (m.live.count(b.hash)) ++m.report.restored_blocks;
      } else {
        primary = false;
        Medium& m = medium(tier_name(e, i));
        ++m.report.stored_blocks;
        m.live.insert(b.hash);
      }
    }
    if (!primary) {
      ++r_.other_medium_stores;
      return;
    }
    replay_primary(e);
  }

  EventReplayStream report() const { return r_; }
  std::vector<EventMediumReport> media() const {
    std::vector<EventMediumReport> out;
    for (const auto& [name, m] : media_) {
      EventMediumReport x = m.report;
      x.live_at_end = static_cast<int64_t>(m.live.size());
      out.push_back(x);
    }
    return out;
  }

 private:
  struct Node {
    std::optional<std::string> parent;
    std::vector<int32_t> tokens;
  };
  struct Medium {
    EventMediumReport report;
    std::set<std::string> live;
  };

  static sim::BlockManagerConfig config(int64_t block_size, int64_t capacity_blocks) {
    sim::BlockManagerConfig cfg;
    cfg.primary_blocks = capacity_blocks;
    cfg.page_size = static_cast<int32_t>(block_size);
    cfg.reuse = true;
    return cfg;
  }

  Medium& medium(const std::string& name) {
    auto [it, fresh] = media_.try_emplace(name);
    if (fresh) {
      it->second.report.rank = r_.rank;
      it->second.report.group = r_.group;
      it->second.report.medium = name;
    }
    return it->second;
  }

  void diverge(const std::string& where, const std::string& what) {
    if (!r_.first_divergence.empty()) return;
    r_.first_divergence = where + ": " + what;
    r_.first_divergence_event = event;
  }

  void replay_primary(const KvEvent& e) {
    // The chain from the root to the last stored block.
    std::vector<std::string> chain;
    std::optional<std::string> at = e.blocks.empty() ? std::nullopt : std::optional<std::string>(e.blocks.back().hash);
    bool rooted = true;
    while (at) {
      auto it = tree_.find(*at);
      if (it == tree_.end() || static_cast<int64_t>(it->second.tokens.size()) != r_.block_size ||
          chain.size() > tree_.size()) {
        rooted = false;
        break;
      }
      chain.push_back(*at);
      at = it->second.parent;
    }
    if (!rooted || chain.empty()) {
      ++r_.unrooted_stores;
      return;
    }
    std::reverse(chain.begin(), chain.end());
    std::vector<int32_t> prompt;
    for (const std::string& h : chain) prompt.insert(prompt.end(), tree_[h].tokens.begin(), tree_[h].tokens.end());
    const int64_t length = static_cast<int64_t>(prompt.size());
    prompt.push_back(0);  // one more token: every block of the chain may be matched
    const sim::MatchResult m = bm_.add_sequence(0, prompt);
    // ensure_capacity takes the free list first, then the LRU's front: the
    // blocks it evicts are the first ones of this order.
    const std::vector<int32_t> lru_before = bm_.lru_order();
    const int64_t evicted_before = bm_.counters().evicted_blocks;
    if (!bm_.ensure_capacity(0, length)) {
      bm_.cancel_sequence(0, m);
      ++r_.unfit_stores;
      return;
    }
    const int64_t evicted = bm_.counters().evicted_blocks - evicted_before;
    for (int64_t k = 0; k < evicted; ++k) {
      const int32_t victim = lru_before[static_cast<size_t>(k)];
      const std::string h = block_hash_[victim];
      block_hash_.erase(victim);
      kvsim_live_.erase(h);
      ++r_.kvsim_evictions;
      if (engine_live_.count(h)) {
        ++r_.kvsim_evicted_engine_kept;
        diverge(e.where, "kvsim's LRU evicted " + h + " to store " + e.blocks.back().hash + ", the engine still holds it");
      }
    }
    bm_.commit(0, prompt, length);
    const std::vector<int32_t>& table = bm_.table(0);
    const size_t matched = static_cast<size_t>(m.full_tokens / r_.block_size);
    for (size_t j = matched; j < chain.size(); ++j) {
      // A block computed while an equal one is cached (an orphan whose parent
      // was evicted) stays private and is freed: the cached one is tracked.
      if (kvsim_live_.count(chain[j])) continue;
      block_hash_[table[j]] = chain[j];
      kvsim_live_.insert(chain[j]);
    }
    int64_t stored_tokens = 0;
    for (const StoredBlock& b : e.blocks) stored_tokens += static_cast<int64_t>(b.tokens.size());
    r_.engine_hit_tokens += length - stored_tokens;
    for (const StoredBlock& b : e.blocks) engine_live_.insert(b.hash);
    r_.chain_tokens += length;
    r_.hit_tokens += m.full_tokens;
    bm_.free_sequence(0);
    ++r_.replayed_stores;
  }

  EventReplayStream r_;
  sim::BlockManager bm_;
  std::unordered_map<std::string, Node> tree_;       // hash -> (parent hash, tokens), every medium
  std::unordered_map<int32_t, std::string> block_hash_;  // kvsim block -> the hash it caches
  std::set<std::string> engine_live_, kvsim_live_;   // primary tier
  std::map<std::string, Medium> media_;              // the other tiers, by name
};

void add_into(EventReplayStream& total, const EventReplayStream& s) {
  total.replayed_stores += s.replayed_stores;
  total.unrooted_stores += s.unrooted_stores;
  total.other_medium_stores += s.other_medium_stores;
  total.unfit_stores += s.unfit_stores;
  total.kvsim_evictions += s.kvsim_evictions;
  total.engine_removals += s.engine_removals;
  total.kvsim_evicted_engine_kept += s.kvsim_evicted_engine_kept;
  total.engine_removed_kvsim_kept += s.engine_removed_kvsim_kept;
  total.chain_tokens += s.chain_tokens;
  total.hit_tokens += s.hit_tokens;
  total.engine_hit_tokens += s.engine_hit_tokens;
}

}  // namespace

EventReplayReport replay_event_stream(const EventStream& s, int64_t capacity_blocks) {
  if (capacity_blocks < 1) fail(ErrorCode::bad_argument, "--capacity-blocks: expected >= 1");
  using StreamKey = std::pair<int64_t, int64_t>;  // (rank, group)
  // Each stream's block size: its stored blocks' largest token count (every
  // medium: a block is the same size in every tier).
  std::map<StreamKey, int64_t> block_size;
  for (const KvEvent& e : s.events)
    if (e.kind == EventKind::stored)
      for (const StoredBlock& b : e.blocks) {
        int64_t& bs = block_size[{e.rank, e.group}];
        bs = std::max<int64_t>(bs, static_cast<int64_t>(b.tokens.size()));
      }
  if (block_size.empty())
    fail(ErrorCode::bad_argument, s.source + ": events replay needs at least one stored block, the stream stores none");
  std::map<StreamKey, StreamReplay> streams;
  for (const auto& [key, bs] : block_size) {
    if (bs < 1 || bs > 1024)
      fail(ErrorCode::bad_argument, s.source + ": events replay needs stored blocks of 1..1024 tokens, rank " +
                                        std::to_string(key.first) + " group " + std::to_string(key.second) + " stores " +
                                        std::to_string(bs));
    streams.try_emplace(key, key.first, key.second, bs, capacity_blocks);
  }
  for (size_t index = 0; index < s.events.size(); ++index) {
    const KvEvent& e = s.events[index];
    if (e.kind == EventKind::cleared) {
      // One publisher per rank: a clear empties every group of its rank.
      for (auto& [key, st] : streams)
        if (key.first == e.rank) st.cleared();
      continue;
    }
    auto it = streams.find({e.rank, e.group});
    if (it == streams.end()) continue;  // a group that never stores: its removals refer to nothing
    it->second.event = static_cast<int64_t>(index);
    if (e.kind == EventKind::removed) it->second.removed(e);
    if (e.kind == EventKind::stored) it->second.stored(e);
    if (e.kind == EventKind::updated) it->second.updated(e);
  }
  EventReplayReport r;
  for (const auto& [key, st] : streams) {
    r.streams.push_back(st.report());
    add_into(r, r.streams.back());
    for (const EventMediumReport& m : st.media()) r.other_media.push_back(m);
    const EventReplayStream& x = r.streams.back();
    if (x.first_divergence_event >= 0 && (r.first_divergence_event < 0 || x.first_divergence_event < r.first_divergence_event)) {
      r.first_divergence_event = x.first_divergence_event;
      r.first_divergence = "rank " + std::to_string(key.first) + " group " + std::to_string(key.second) + ": " + x.first_divergence;
    }
  }
  if (r.streams.size() == 1) {
    r.rank = r.streams[0].rank;
    r.group = r.streams[0].group;
    r.block_size = r.streams[0].block_size;
    r.first_divergence = r.streams[0].first_divergence;
  } else {
    r.rank = r.group = -1;
    r.block_size = 0;
  }
  return r;
}

}  // namespace kvsim::workload
