// The block manager: see block_manager.hpp for the engines it models.
#include "kvsim/sim/block_manager.hpp"

#include <kvsim/core/splitmix64.hpp>

#include <algorithm>
#include <limits>

namespace kvsim::sim {

namespace {
constexpr uint64_t kRootKey = BlockManager::kTreeRoot;

uint64_t mix(uint64_t h, uint64_t v) {  // splitmix64 of the running key and one value
  return splitmix64_mix(h ^ (v + kSplitmix64Gamma + (h << 6) + (h >> 2)));
}
}  // namespace

std::string_view block_event_name(BlockEvent::Kind k) {
  switch (k) {
    case BlockEvent::Kind::hit: return "hit";
    case BlockEvent::Kind::partial_copy: return "partial_copy";
    case BlockEvent::Kind::evict: return "evict";
    case BlockEvent::Kind::offload: return "offload";
    case BlockEvent::Kind::onboard: return "onboard";
    case BlockEvent::Kind::drop_secondary: return "drop_secondary";
    case BlockEvent::Kind::release: return "release";
    case BlockEvent::Kind::cancel: return "cancel";
  }
  return "?";
}

BlockManagerConfig BlockManagerConfig::from(const Scenario& s) {
  BlockManagerConfig c;
  c.primary_blocks = s.cache.primary_blocks;
  c.secondary_blocks = s.cache.secondary_blocks;
  c.page_size = s.cache.page_size;
  c.reuse = s.reuse.enabled;
  c.partial_reuse = s.reuse.enabled && s.reuse.partial;
  c.offload = s.reuse.enabled && s.reuse.offload && s.cache.secondary_blocks > 0;
  c.window_mode = s.window.mode;
  c.window = s.window.window;
  c.sinks = s.window.sinks;
  c.one_more_block = s.window.one_more_block;
  for (Fault f : s.faults)
    if (f == Fault::reused_block_mismatch) c.fault_serve_wrong_blocks = true;
  c.block_order = s.cache.block_order;
  c.order_seed = s.model.seed;
  if (s.layers.enabled)
    for (const KvGroup& g : kv_groups(s)) c.groups.push_back({g.mode, g.window, g.sinks, g.one_more_block, g.pool});
  return c;
}

BlockManager::BlockManager(const BlockManagerConfig& config, BlockMover* mover) : config_(config), mover_(mover) {
  if (config_.primary_blocks < 1 || config_.page_size < 1 || config_.secondary_blocks < 0)
    fail(ErrorCode::bad_scenario, "block manager: primary_blocks >= 1, page_size >= 1 and secondary_blocks >= 0");
  if (config_.groups.empty())
    config_.groups.push_back({config_.window_mode, config_.window, config_.sinks, config_.one_more_block, 0});
  int32_t pools = 0;
  for (size_t i = 0; i < config_.groups.size(); ++i) {
    const GroupConfig& gc = config_.groups[i];
    if (gc.pool < 0 || gc.pool > static_cast<int32_t>(i) || gc.pool > pools)
      fail(ErrorCode::bad_scenario, "block manager: group " + std::to_string(i) + " names pool " +
                                        std::to_string(gc.pool) + ": rule: pools are numbered in order of first use");
    if ((gc.mode == WindowMode::cyclic || gc.mode == WindowMode::release) && config_.reuse)
      fail(ErrorCode::bad_scenario,
           "block manager: prefix reuse with a ring window is not modelled (TensorRT-LLM disables block reuse "
           "for cyclic windows; kvsim's release ring reuses pages for other tokens)");
    Group g;
    g.config = gc;
    if (gc.mode == WindowMode::sliding) {
      g.mapping = WindowMapping::make_linear(gc.window, gc.sinks, config_.page_size);
      validate_window(g.mapping);
    } else if (gc.mode != WindowMode::none) {
      g.mapping = WindowMapping::make(gc.window, gc.sinks, config_.page_size, gc.one_more_block);
      validate_window(g.mapping);
    }
    g.root = i == 0 ? kRootKey : mix(kRootKey, 0x6700 + i);
    groups_.push_back(g);
    pools = std::max(pools, gc.pool + 1);
  }
  pools_.resize(static_cast<size_t>(pools));
  for (int32_t p = 0; p < pools; ++p) {
    Pool& pool = pools_[p];
    pool.blocks.resize(static_cast<size_t>(config_.primary_blocks));
    // The free list is a stack: the block handed out first is at the back.
    for (int64_t b = config_.primary_blocks - 1; b >= 0; --b) pool.free.push_back(static_cast<int32_t>(b));
    if (config_.block_order == BlockOrder::highest) std::reverse(pool.free.begin(), pool.free.end());
    if (config_.block_order == BlockOrder::shuffled) {  // Fisher-Yates over splitmix64 of the seed
      uint64_t state = mix(config_.order_seed, 0x0bd3 + static_cast<uint64_t>(p));
      for (size_t i = pool.free.size(); i > 1; --i) {
        state = mix(state, i);
        std::swap(pool.free[i - 1], pool.free[state % i]);
      }
    }
    for (int64_t b = config_.secondary_blocks - 1; b >= 0; --b) pool.free_secondary.push_back(static_cast<int32_t>(b));
    bool null_block = false;
    for (const Group& g : groups_)
      null_block = null_block || (g.config.pool == p && (g.config.mode == WindowMode::release ||
                                                         g.config.mode == WindowMode::sliding));
    if (!null_block) continue;
    if (config_.primary_blocks < 2)
      fail(ErrorCode::bad_scenario,
           "block manager: release and sliding windows reserve block 0 as the null block: primary_blocks >= 2");
    pool.blocks[kNullBlock].reserved = true;
    pool.free.erase(std::find(pool.free.begin(), pool.free.end(), kNullBlock));
  }
}

bool BlockManager::single_legacy_group() const {
  return groups_.size() == 1 && groups_[0].config.mode != WindowMode::sliding;
}

uint64_t BlockManager::block_key(uint64_t parent, std::span<const int32_t> tokens) const {
  uint64_t h = mix(parent, 0x5eed);
  for (int32_t t : tokens) h = mix(h, static_cast<uint32_t>(t));
  return h;
}

const BlockManager::Node* BlockManager::find_node(uint64_t parent, std::span<const int32_t> tokens) const {
  auto it = nodes_.find(block_key(parent, tokens));
  if (it == nodes_.end()) return nullptr;
  const Node& n = it->second;
  // A key collision must never serve other tokens: compare what the key stands for.
  if (n.parent != parent || !std::equal(n.tokens.begin(), n.tokens.end(), tokens.begin(), tokens.end())) return nullptr;
  return &n;
}

void BlockManager::touch_lru(int32_t pool, int32_t block) {
  Pool& p = pools_[pool];
  p.lru.push_back(block);
  p.lru_pos[block] = std::prev(p.lru.end());
}

void BlockManager::ref(int32_t pool, int32_t block) {
  Pool& p = pools_[pool];
  PrimaryBlock& b = p.blocks[block];
  if (b.refs == 0 && b.node) {
    auto it = p.lru_pos.find(block);
    p.lru.erase(it->second);
    p.lru_pos.erase(it);
  }
  ++b.refs;
}

void BlockManager::unref(int32_t pool, int32_t block) {
  Pool& p = pools_[pool];
  PrimaryBlock& b = p.blocks[block];
  if (--b.refs > 0) return;
  if (b.node)
    touch_lru(pool, block);
  else
    p.free.push_back(block);
}

void BlockManager::evict(int32_t pool, int32_t block) {
  Pool& p = pools_[pool];
  PrimaryBlock& b = p.blocks[block];
  auto pos = p.lru_pos.find(block);
  p.lru.erase(pos->second);
  p.lru_pos.erase(pos);
  const uint64_t key = *b.node;
  b.node.reset();
  ++counters_.evicted_blocks;
  tell({BlockEvent::Kind::evict, -1, block, -1, -1, 0, pool});
  Node& node = nodes_.at(key);
  // Offloaded into the pool's secondary pool, unless that has neither a free
  // block nor an offloaded one to drop (all held by a hit being onboarded).
  if (config_.offload && config_.secondary_blocks > 0 && (!p.free_secondary.empty() || !p.secondary_lru.empty())) {
    if (p.free_secondary.empty()) {  // the secondary pool is full: drop its least recently offloaded block
      const uint64_t oldest = p.secondary_lru.front();
      p.secondary_lru.pop_front();
      p.free_secondary.push_back(nodes_.at(oldest).block);
      tell({BlockEvent::Kind::drop_secondary, -1, -1, nodes_.at(oldest).block, -1, 0, pool, nodes_.at(oldest).group});
      forget_node(oldest);
    }
    const int32_t sec = p.free_secondary.back();
    p.free_secondary.pop_back();
    if (mover_) mover_->offload(pool, block, sec);
    tell({BlockEvent::Kind::offload, -1, block, sec, -1, 0, pool, node.group});
    node.pool = PoolKind::secondary;
    node.block = sec;
    p.secondary_lru.push_back(key);
    ++counters_.offloaded_blocks;
    return;
  }
  forget_node(key);
}

void BlockManager::detach_secondary(int32_t pool, uint64_t key) {
  std::list<uint64_t>& lru = pools_[pool].secondary_lru;
  lru.erase(std::find(lru.begin(), lru.end(), key));
}

void BlockManager::onboard_node(SeqId seq, int32_t pool, uint64_t key) {
  Pool& p = pools_[pool];
  Node& node = nodes_.at(key);
  const int32_t dst = *take_block(pool);  // may evict (and offload) another block: this one is detached
  if (mover_) mover_->onboard(pool, node.block, dst);
  tell({BlockEvent::Kind::onboard, seq, dst, node.block, -1, 0, pool, node.group});
  p.free_secondary.push_back(node.block);  // freed only now that its bytes have moved
  node.pool = PoolKind::primary;
  node.block = dst;
  p.blocks[dst].node = key;
  p.blocks[dst].refs = 1;
  ++counters_.onboarded_blocks;
}

std::pair<int64_t, int32_t> BlockManager::partial_source(uint64_t parent, std::span<const int32_t> tokens,
                                                         int64_t room) const {
  int64_t best = 0;
  int32_t src = -1;
  auto range = children_.equal_range(parent);
  for (auto it = range.first; it != range.second; ++it) {
    const Node& c = nodes_.at(it->second);
    if (c.pool != PoolKind::primary || !c.written) continue;
    int64_t n = 0;
    while (n < room && c.tokens[n] == tokens[n]) ++n;
    if (n > best || (n == best && n > 0 && c.block < src)) {
      best = n;
      src = c.block;
    }
  }
  return {best, src};
}

void BlockManager::forget_node(uint64_t key) {
  auto range = children_.equal_range(nodes_.at(key).parent);
  for (auto it = range.first; it != range.second; ++it)
    if (it->second == key) {
      children_.erase(it);
      break;
    }
  nodes_.erase(key);
}

std::optional<int32_t> BlockManager::take_block(int32_t pool) {
  Pool& p = pools_[pool];
  if (!p.free.empty()) {
    const int32_t b = p.free.back();
    p.free.pop_back();
    return b;
  }
  if (p.lru.empty()) return std::nullopt;
  const int32_t b = p.lru.front();
  evict(pool, b);
  return b;
}

int64_t BlockManager::available_blocks(int32_t pool) const {
  return static_cast<int64_t>(pools_[pool].free.size() + pools_[pool].lru.size());
}

bool BlockManager::pools_can_give(const std::vector<int64_t>& takes, const std::vector<int64_t>& pinned) const {
  for (int32_t p = 0; p < static_cast<int32_t>(pools_.size()); ++p)
    if (takes[p] > available_blocks(p) - pinned[p]) return false;
  return true;
}

int64_t BlockManager::available_blocks() const {
  int64_t n = 0;
  for (int32_t p = 0; p < static_cast<int32_t>(pools_.size()); ++p) n += available_blocks(p);
  return n;
}

int64_t BlockManager::pages_for(int64_t length, int32_t group) const {
  const int64_t slots = groups_[group].mapping.cache_length(length);
  return (slots + config_.page_size - 1) / config_.page_size;
}

MatchResult BlockManager::add_sequence(SeqId seq, std::span<const int32_t> prompt) {
  if (seqs_.count(seq)) fail(ErrorCode::bad_argument, "block manager: sequence " + std::to_string(seq) + " exists");
  Sequence& s = seqs_[seq];
  s.tables.resize(groups_.size());
  MatchResult m;
  if (!config_.reuse || prompt.empty()) return m;
  if (!single_legacy_group()) {
    m = match_groups(seq, s, prompt);
    counters_.reuse_hit_tokens += m.tokens();
    counters_.partial_reuse_tokens += m.partial_tokens;
    return m;
  }
  Table& tb = s.tables[0];
  const int64_t P = config_.page_size;
  const int64_t limit = static_cast<int64_t>(prompt.size()) - 1;  // the last prompt token is always recomputed
  uint64_t parent = kRootKey;
  int64_t stop = limit;
  if (hit_filter_) {  // the deepest cached block boundary the filter allows, found without touching anything
    int64_t reach = 0;
    for (uint64_t key = kRootKey; reach + P <= limit; reach += P) {
      const Node* found = find_node(key, prompt.subspan(static_cast<size_t>(reach), static_cast<size_t>(P)));
      if (!found) break;
      key = found->key;
    }
    while (reach > 0 && !hit_filter_(seq, reach)) reach -= P;
    stop = reach;
  }
  while (m.full_tokens + P <= stop) {
    const auto block_tokens = prompt.subspan(static_cast<size_t>(m.full_tokens), static_cast<size_t>(P));
    const Node* found = find_node(parent, block_tokens);
    if (!found) break;
    Node& node = nodes_.at(found->key);
    if (node.pool == PoolKind::secondary) {  // onboard the hit into a primary block
      if (available_blocks(0) == 0) break;
      detach_secondary(0, node.key);
      onboard_node(seq, 0, node.key);
    } else {
      ref(0, node.block);
    }
    tb.blocks.push_back(node.block);
    tb.keys.push_back(node.key);
    parent = node.key;
    m.full_tokens += P;
  }
  tb.registered_blocks = static_cast<int64_t>(tb.keys.size());
  if (config_.fault_serve_wrong_blocks && !tb.blocks.empty()) {
    if (tb.blocks.size() >= 2) {
      std::rotate(tb.blocks.begin(), tb.blocks.begin() + 1, tb.blocks.end());
    } else {
      for (int32_t other : pools_[0].lru)  // any other cached block will do
        if (other != tb.blocks[0]) {
          unref(0, tb.blocks[0]);
          ref(0, other);
          tb.blocks[0] = other;
          break;
        }
    }
  }
  for (int32_t b : tb.blocks) tell({BlockEvent::Kind::hit, seq, b, -1, -1, static_cast<int32_t>(P)});
  if (config_.partial_reuse) m.partial_tokens = match_partial(seq, s, prompt, m.full_tokens / P);
  counters_.reuse_hit_tokens += m.tokens();
  counters_.partial_reuse_tokens += m.partial_tokens;
  return m;
}

// vLLM's hybrid hit rule. Per group, found[i] says whether block i of the
// prompt is cached in that group's chain (in the primary pool or, with
// offload, in the secondary one). A full group serves a hit of e blocks when
// blocks [0, e) are found; a sliding group when the blocks of the last W - S
// tokens before token e * P are (cdiv(W - S - 1, P) blocks, vLLM's
// sliding_window_contiguous_blocks) and so are the sinks' blocks. The hit is
// the largest e every group serves whose onboards fit in their pools. With
// partial reuse, a partial block follows (match_partial).
MatchResult BlockManager::match_groups(SeqId seq, Sequence& s, std::span<const int32_t> prompt) {
  const int64_t P = config_.page_size;
  const int64_t limit = static_cast<int64_t>(prompt.size()) - 1;
  const int64_t max_blocks = limit / P;
  const size_t G = groups_.size();
  std::vector<std::vector<uint64_t>> keys(G);
  std::vector<std::vector<const Node*>> found(G);
  for (size_t g = 0; g < G; ++g) {
    uint64_t parent = groups_[g].root;
    for (int64_t i = 0; i < max_blocks; ++i) {
      const auto block_tokens = prompt.subspan(static_cast<size_t>(i * P), static_cast<size_t>(P));
      found[g].push_back(find_node(parent, block_tokens));
      parent = block_key(parent, block_tokens);
      keys[g].push_back(parent);
    }
  }
  // The blocks a group needs for a hit of e blocks: [0, e), or for a sliding
  // group the sinks' blocks and the window's blocks before e.
  auto needed = [&](size_t g, int64_t e, int64_t i) {
    const Group& grp = groups_[g];
    if (grp.config.mode != WindowMode::sliding) return true;
    const int64_t sink_blocks = (grp.config.sinks + P - 1) / P;
    const int64_t recent = grp.config.window - grp.config.sinks;
    const int64_t window_blocks = (recent - 1 + P - 1) / P;
    return i < sink_blocks || i >= e - window_blocks;
  };
  auto serves = [&](int64_t e) {
    for (size_t g = 0; g < G; ++g)
      for (int64_t i = 0; i < e; ++i)
        if (needed(g, e, i) && !found[g][i]) return false;
    return true;
  };
  // Each onboard takes a block of its group's pool (free, or an unreferenced
  // cached one evicted); the hit's own cached primary blocks are referenced
  // first, so they are not among those.
  auto onboards_fit = [&](int64_t e) {
    std::vector<int64_t> onboards(pools_.size(), 0), pinned(pools_.size(), 0);
    for (size_t g = 0; g < G; ++g) {
      const int32_t pool = groups_[g].config.pool;
      for (int64_t i = 0; i < e; ++i) {
        if (!needed(g, e, i)) continue;
        const Node* n = found[g][i];
        if (n->pool == PoolKind::secondary)
          ++onboards[pool];
        else if (pools_[pool].blocks[n->block].refs == 0)
          ++pinned[pool];
      }
    }
    return pools_can_give(onboards, pinned);
  };
  int64_t hit = max_blocks;
  while (hit > 0 && !(serves(hit) && onboards_fit(hit))) --hit;
  // Reference the hit's primary blocks, detach its offloaded ones (so that no
  // eviction below drops them), then onboard those.
  std::vector<std::pair<size_t, uint64_t>> offloaded;  // (group, node key)
  for (size_t g = 0; g < G; ++g)
    for (int64_t i = 0; i < hit; ++i) {
      if (!needed(g, hit, i)) continue;
      const Node* n = found[g][i];
      if (n->pool == PoolKind::primary) {
        ref(groups_[g].config.pool, n->block);
      } else {
        detach_secondary(groups_[g].config.pool, n->key);
        offloaded.push_back({g, n->key});
      }
    }
  for (const auto& [g, key] : offloaded) onboard_node(seq, groups_[g].config.pool, key);
  for (size_t g = 0; g < G; ++g) {
    Table& tb = s.tables[g];
    const int32_t pool = groups_[g].config.pool;
    for (int64_t i = 0; i < hit; ++i) {
      if (needed(g, hit, i)) {
        tb.blocks.push_back(found[g][i]->block);
        tell({BlockEvent::Kind::hit, seq, found[g][i]->block, -1, -1, static_cast<int32_t>(P), pool,
              static_cast<int32_t>(g)});
      } else {
        tb.blocks.push_back(kNullBlock);
      }
      tb.keys.push_back(keys[g][i]);
    }
    tb.registered_blocks = hit;
    if (config_.fault_serve_wrong_blocks && groups_[g].config.mode == WindowMode::none && tb.blocks.size() >= 2)
      std::rotate(tb.blocks.begin(), tb.blocks.begin() + 1, tb.blocks.end());
  }
  MatchResult m;
  m.full_tokens = hit * P;
  if (config_.partial_reuse) m.partial_tokens = match_partial(seq, s, prompt, hit);
  return m;
}

// TensorRT-LLM's partial reuse (cuKVCacheBlockPartialCopy), in every group:
// the prompt's next tokens after the full hit are copied from the cached
// child of the group's last hit block sharing the longest head with them;
// the partial hit is the fewest tokens any group shares (it is one prefix of
// the prompt), and nothing is copied unless every group can take a block.
int64_t BlockManager::match_partial(SeqId seq, Sequence& s, std::span<const int32_t> prompt, int64_t hit) {
  const int64_t P = config_.page_size;
  const int64_t start = hit * P, limit = static_cast<int64_t>(prompt.size()) - 1;
  if (start >= limit) return 0;
  const int64_t room = std::min<int64_t>(limit - start, P);
  const size_t G = groups_.size();
  std::vector<int32_t> src(G);
  int64_t tokens = room;
  for (size_t g = 0; g < G; ++g) {
    const uint64_t parent = hit == 0 ? groups_[g].root : s.tables[g].keys[hit - 1];
    const auto [shared, block] = partial_source(parent, prompt.subspan(static_cast<size_t>(start)), room);
    tokens = std::min(tokens, shared);
    src[g] = block;
  }
  if (tokens == 0) return 0;
  std::vector<int64_t> takes(pools_.size(), 0), pinned(pools_.size(), 0);
  for (size_t g = 0; g < G; ++g) {
    const int32_t pool = groups_[g].config.pool;
    ++takes[pool];
    if (pools_[pool].blocks[src[g]].refs == 0) ++pinned[pool];
  }
  if (!pools_can_give(takes, pinned)) return 0;
  for (size_t g = 0; g < G; ++g) ref(groups_[g].config.pool, src[g]);  // no source is evicted for a destination
  for (size_t g = 0; g < G; ++g) {
    const int32_t pool = groups_[g].config.pool;
    const int32_t dst = *take_block(pool);
    if (mover_) mover_->partial_copy(pool, src[g], dst, static_cast<int32_t>(tokens));
    tell({BlockEvent::Kind::partial_copy, seq, dst, -1, src[g], static_cast<int32_t>(tokens), pool,
          static_cast<int32_t>(g)});
    pools_[pool].blocks[dst].refs = 1;
    s.tables[g].blocks.push_back(dst);
  }
  for (size_t g = 0; g < G; ++g) unref(groups_[g].config.pool, src[g]);
  return tokens;
}

std::vector<int64_t> BlockManager::pages_to_fill(const Sequence& s, int32_t g, int64_t length) const {
  std::vector<int64_t> pages;
  const std::vector<int32_t>& blocks = s.tables[g].blocks;
  const int64_t columns = static_cast<int64_t>(blocks.size());
  for (int64_t pg = columns; pg < pages_for(length, g); ++pg) pages.push_back(pg);
  if (groups_[g].config.mode == WindowMode::release) {
    const int64_t P = config_.page_size;
    for (int64_t t = s.length; t < length; ++t) {
      const int64_t pg = groups_[g].mapping.cache_token(t) / P;
      if (pg < columns && blocks[pg] == kNullBlock && std::find(pages.begin(), pages.end(), pg) == pages.end())
        pages.push_back(pg);
    }
  }
  return pages;
}

int64_t BlockManager::blocks_needed(SeqId seq, int64_t length) const {
  int64_t n = 0;
  for (int32_t g = 0; g < group_count(); ++g) n += static_cast<int64_t>(pages_to_fill(seqs_.at(seq), g, length).size());
  return n;
}

bool BlockManager::ensure_capacity(SeqId seq, int64_t length) {
  Sequence& s = seqs_.at(seq);
  std::vector<std::vector<int64_t>> pages(groups_.size());
  std::vector<int64_t> per_pool(pools_.size(), 0);
  for (int32_t g = 0; g < group_count(); ++g) {
    pages[g] = pages_to_fill(s, g, length);
    per_pool[groups_[g].config.pool] += static_cast<int64_t>(pages[g].size());
  }
  for (int32_t p = 0; p < static_cast<int32_t>(pools_.size()); ++p)
    if (per_pool[p] > available_blocks(p)) return false;
  for (int32_t g = 0; g < group_count(); ++g) {
    const int32_t pool = groups_[g].config.pool;
    std::vector<int32_t>& blocks = s.tables[g].blocks;
    for (int64_t pg : pages[g]) {
      const int32_t b = *take_block(pool);
      pools_[pool].blocks[b].refs = 1;
      if (pg < static_cast<int64_t>(blocks.size()))
        blocks[pg] = b;
      else
        blocks.push_back(b);
    }
  }
  s.length = std::max(s.length, length);
  return true;
}

void BlockManager::commit(SeqId seq, std::span<const int32_t> tokens, int64_t length) {
  if (!config_.reuse) return;
  Sequence& s = seqs_.at(seq);
  const int64_t P = config_.page_size;
  for (int32_t g = 0; g < group_count(); ++g) {
    Table& tb = s.tables[g];
    const int32_t pool = groups_[g].config.pool;
    const int64_t full = std::min<int64_t>(length / P, static_cast<int64_t>(tb.blocks.size()));
    for (int64_t i = tb.registered_blocks; i < full; ++i) {
      const uint64_t parent = i == 0 ? groups_[g].root : tb.keys[i - 1];
      const auto block_tokens = tokens.subspan(static_cast<size_t>(i * P), static_cast<size_t>(P));
      const uint64_t key = block_key(parent, block_tokens);
      const int32_t block = tb.blocks[i];
      tb.keys.push_back(key);
      if (nodes_.count(key)) {  // an equal block is cached already: this one stays private
        ++counters_.duplicate_blocks;
        continue;
      }
      if (pools_[pool].blocks[block].reserved) continue;  // released already: nothing to cache
      Node n;
      n.group = g;
      n.key = key;
      n.parent = parent;
      n.tokens.assign(block_tokens.begin(), block_tokens.end());
      n.block = block;
      nodes_.emplace(key, std::move(n));
      children_.emplace(parent, key);
      pools_[pool].blocks[block].node = key;
    }
    tb.registered_blocks = std::max(tb.registered_blocks, full);
  }
}

void BlockManager::mark_step_written() {
  for (auto& [key, node] : nodes_) node.written = true;
}

void BlockManager::release_out_of_window(SeqId seq, int64_t next_position) {
  Sequence& s = seqs_.at(seq);
  const int64_t P = config_.page_size;
  const int64_t q = next_position;  // the next query; no later query attends further back
  for (int32_t g = 0; g < group_count(); ++g) {
    const Group& grp = groups_[g];
    const WindowMapping& w = grp.mapping;
    std::vector<int32_t>& blocks = s.tables[g].blocks;
    const int32_t pool = grp.config.pool;
    const int64_t window_start = std::max<int64_t>(w.sinks, q + 1 - (static_cast<int64_t>(w.window) - w.sinks));
    if (grp.config.mode == WindowMode::sliding) {
      // vLLM remove_skipped_blocks: every page wholly before the window (and after the sinks' pages).
      for (int64_t pg = (w.sinks + P - 1) / P; pg < static_cast<int64_t>(blocks.size()) && (pg + 1) * P <= window_start;
           ++pg) {
        if (blocks[pg] == kNullBlock) continue;
        unref(pool, blocks[pg]);
        tell({BlockEvent::Kind::release, seq, blocks[pg], -1, -1, 0, pool, g});
        blocks[pg] = kNullBlock;
        ++counters_.released_window_blocks;
      }
      continue;
    }
    if (grp.config.mode != WindowMode::release) continue;
    const int64_t ring_begin = w.sinks + w.bubble;  // slots before it hold sinks (or the bubble): never released
    for (int64_t pg = ring_begin / P; pg < static_cast<int64_t>(blocks.size()); ++pg) {
      if (blocks[pg] == kNullBlock) continue;
      bool attended = false;
      for (int64_t slot = pg * P; slot < (pg + 1) * P && !attended; ++slot) {
        // The token the slot holds: the newest t < q with cache_token(t) = slot.
        const int64_t k = slot - ring_begin;
        if (q - 1 - w.sinks - k < 0) continue;  // not written yet
        const int64_t t = w.sinks + k + w.cyclic_len * ((q - 1 - w.sinks - k) / w.cyclic_len);
        attended = t >= window_start;
      }
      if (attended) continue;
      unref(pool, blocks[pg]);
      tell({BlockEvent::Kind::release, seq, blocks[pg], -1, -1, 0, pool, g});
      blocks[pg] = kNullBlock;
      ++counters_.released_window_blocks;
    }
  }
}

void BlockManager::free_sequence(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  for (int32_t g = 0; g < group_count(); ++g) {
    const int32_t pool = groups_[g].config.pool;
    const std::vector<int32_t>& blocks = it->second.tables[g].blocks;
    for (auto b = blocks.rbegin(); b != blocks.rend(); ++b)  // tail first: the prefix's head stays cached longest
      if (!pools_[pool].blocks[*b].reserved) unref(pool, *b);
  }
  seqs_.erase(it);
}

void BlockManager::cancel_sequence(SeqId seq, const MatchResult& match) {
  free_sequence(seq);
  tell({BlockEvent::Kind::cancel, seq});
  counters_.reuse_hit_tokens -= match.tokens();
  counters_.partial_reuse_tokens -= match.partial_tokens;
}

const std::vector<int32_t>& BlockManager::table(SeqId seq, int32_t group) const {
  return seqs_.at(seq).tables[group].blocks;
}

PoolCounts BlockManager::counts(PoolKind kind) const {
  PoolCounts c;
  if (kind == PoolKind::primary) {
    for (const Pool& p : pools_) {
      c.size += config_.primary_blocks;
      c.free += static_cast<int64_t>(p.free.size());
      c.cached += static_cast<int64_t>(p.lru.size());
      for (const PrimaryBlock& b : p.blocks) c.referenced += (b.refs > 0 || b.reserved) ? 1 : 0;
    }
  } else {
    for (const Pool& p : pools_) {
      c.size += config_.secondary_blocks;
      c.free += static_cast<int64_t>(p.free_secondary.size());
      c.cached += static_cast<int64_t>(p.secondary_lru.size());
    }
  }
  return c;
}

int64_t BlockManager::secondary_cached() const { return counts(PoolKind::secondary).cached; }

BlockUse BlockManager::block_use(int32_t pool, int32_t block) const {
  const PrimaryBlock& b = pools_.at(static_cast<size_t>(pool)).blocks.at(static_cast<size_t>(block));
  if (b.reserved) return BlockUse::reserved;
  if (b.refs > 0) return BlockUse::referenced;
  return b.node ? BlockUse::cached : BlockUse::free;
}

std::vector<CachedBlock> BlockManager::prefix_tree() const {
  std::vector<CachedBlock> out;
  out.reserve(nodes_.size());
  for (const auto& [key, n] : nodes_)
    out.push_back({key, n.parent, n.pool, n.block, n.group, groups_[n.group].config.pool});
  return out;
}

std::vector<int32_t> BlockManager::lru_order(int32_t pool) const { return {pools_[pool].lru.begin(), pools_[pool].lru.end()}; }

std::string BlockManager::check_conservation() const {
  for (PoolKind kind : {PoolKind::primary, PoolKind::secondary}) {
    const PoolCounts c = counts(kind);
    if (c.free + c.referenced + c.cached != c.size)
      return std::string(kind == PoolKind::primary ? "primary" : "secondary") + " pool: free " +
             std::to_string(c.free) + " + referenced " + std::to_string(c.referenced) + " + cached " +
             std::to_string(c.cached) + " != size " + std::to_string(c.size);
  }
  // Every primary block is in exactly one state, and its reference count is
  // the number of table entries (of every group drawing on its pool) that hold it.
  for (int32_t pi = 0; pi < static_cast<int32_t>(pools_.size()); ++pi) {
    const Pool& pool = pools_[pi];
    std::vector<int32_t> holders(pool.blocks.size(), 0);
    for (const auto& [id, s] : seqs_)
      for (int32_t g = 0; g < group_count(); ++g)
        if (groups_[g].config.pool == pi)
          for (int32_t b : s.tables[g].blocks)
            if (!pool.blocks[b].reserved) ++holders[b];
    std::vector<int32_t> on_free(pool.blocks.size(), 0);
    for (int32_t b : pool.free) ++on_free[b];
    for (size_t b = 0; b < pool.blocks.size(); ++b) {
      const PrimaryBlock& pb = pool.blocks[b];
      const bool in_lru = pool.lru_pos.count(static_cast<int32_t>(b)) != 0;
      const std::string where =
          (pools_.size() > 1 ? "pool " + std::to_string(pi) + " " : std::string()) + "primary block " + std::to_string(b) + ": ";
      if (pb.reserved) {
        if (on_free[b] || in_lru) return where + "the reserved null block is on the free list or in the LRU";
        continue;
      }
      if (pb.refs != holders[b])
        return where + "reference count " + std::to_string(pb.refs) + " but " + std::to_string(holders[b]) +
               " table entries hold it";
      const int states = (pb.refs > 0) + (on_free[b] > 0 ? on_free[b] : 0) + (in_lru ? 1 : 0);
      if (states != 1)
        return where + "in " + std::to_string(states) + " states (refs " + std::to_string(pb.refs) + ", free list x" +
               std::to_string(on_free[b]) + ", lru " + (in_lru ? "yes" : "no") + "): rule: exactly one";
      if (in_lru && !pb.node) return where + "in the LRU but not in the prefix tree";
    }
  }
  for (int32_t pi = 0; pi < static_cast<int32_t>(pools_.size()); ++pi) {
    const Pool& pool = pools_[pi];
    const std::string where = pools_.size() > 1 ? "pool " + std::to_string(pi) + " " : std::string();
    for (uint64_t key : pool.secondary_lru) {
      const Node& n = nodes_.at(key);
      if (n.pool != PoolKind::secondary) return where + "secondary LRU holds a node that lives in the primary pool";
      if (groups_[n.group].config.pool != pi) return where + "secondary LRU holds a node of another pool's group";
      if (std::count(pool.free_secondary.begin(), pool.free_secondary.end(), n.block))
        return where + "secondary block " + std::to_string(n.block) + " is both free and holding an offloaded block";
    }
  }
  return "";
}

}  // namespace kvsim::sim
