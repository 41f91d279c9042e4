// The block manager: see block_manager.hpp for the engines it models.
#include "kvsim/sim/block_manager.hpp"

#include <algorithm>
#include <limits>

namespace kvsim::sim {

namespace {
constexpr uint64_t kRootKey = 0xcbf29ce484222325ull;

uint64_t mix(uint64_t h, uint64_t v) {  // splitmix64 of the running key and one value
  uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
}  // namespace

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
  return c;
}

BlockManager::BlockManager(const BlockManagerConfig& config, BlockMover* mover) : config_(config), mover_(mover) {
  if (config_.primary_blocks < 1 || config_.page_size < 1 || config_.secondary_blocks < 0)
    fail(ErrorCode::bad_scenario, "block manager: primary_blocks >= 1, page_size >= 1 and secondary_blocks >= 0");
  if (config_.window_mode != WindowMode::none && config_.reuse)
    fail(ErrorCode::bad_scenario,
         "block manager: prefix reuse with a sliding window is not modelled (TensorRT-LLM disables block reuse "
         "for cyclic windows)");
  if (config_.window_mode != WindowMode::none) {
    mapping_ = WindowMapping::make(config_.window, config_.sinks, config_.page_size, config_.one_more_block);
    validate_window(mapping_);
  }
  primary_.resize(static_cast<size_t>(config_.primary_blocks));
  for (int64_t b = config_.primary_blocks - 1; b >= 0; --b) free_primary_.push_back(static_cast<int32_t>(b));
  for (int64_t b = config_.secondary_blocks - 1; b >= 0; --b) free_secondary_.push_back(static_cast<int32_t>(b));
  if (config_.window_mode == WindowMode::release) {
    if (config_.primary_blocks < 2)
      fail(ErrorCode::bad_scenario, "block manager: release mode reserves block 0 as the null block: primary_blocks >= 2");
    primary_[kNullBlock].reserved = true;
    free_primary_.erase(std::find(free_primary_.begin(), free_primary_.end(), kNullBlock));
  }
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

void BlockManager::touch_lru(int32_t block) {
  primary_lru_.push_back(block);
  primary_lru_pos_[block] = std::prev(primary_lru_.end());
}

void BlockManager::ref(int32_t block) {
  PrimaryBlock& b = primary_[block];
  if (b.refs == 0 && b.node) {
    auto it = primary_lru_pos_.find(block);
    primary_lru_.erase(it->second);
    primary_lru_pos_.erase(it);
  }
  ++b.refs;
}

void BlockManager::unref(int32_t block) {
  PrimaryBlock& b = primary_[block];
  if (--b.refs > 0) return;
  if (b.node)
    touch_lru(block);
  else
    free_primary_.push_back(block);
}

void BlockManager::evict(int32_t block) {
  PrimaryBlock& b = primary_[block];
  auto pos = primary_lru_pos_.find(block);
  primary_lru_.erase(pos->second);
  primary_lru_pos_.erase(pos);
  const uint64_t key = *b.node;
  b.node.reset();
  ++counters_.evicted_blocks;
  Node& node = nodes_.at(key);
  if (config_.offload && config_.secondary_blocks > 0) {
    if (free_secondary_.empty()) {  // the secondary pool is full: drop its least recently offloaded block
      const uint64_t oldest = secondary_lru_.front();
      secondary_lru_.pop_front();
      free_secondary_.push_back(nodes_.at(oldest).block);
      forget_node(oldest);
    }
    const int32_t sec = free_secondary_.back();
    free_secondary_.pop_back();
    if (mover_) mover_->offload(block, sec);
    node.pool = PoolKind::secondary;
    node.block = sec;
    secondary_lru_.push_back(key);
    ++counters_.offloaded_blocks;
    return;
  }
  forget_node(key);
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

std::optional<int32_t> BlockManager::take_block() {
  if (!free_primary_.empty()) {
    const int32_t b = free_primary_.back();
    free_primary_.pop_back();
    return b;
  }
  if (primary_lru_.empty()) return std::nullopt;
  const int32_t b = primary_lru_.front();
  evict(b);
  return b;
}

int64_t BlockManager::available_blocks() const {
  return static_cast<int64_t>(free_primary_.size() + primary_lru_.size());
}

int64_t BlockManager::pages_for(int64_t length) const {
  const int64_t slots = mapping_.cache_length(length);
  return (slots + config_.page_size - 1) / config_.page_size;
}

MatchResult BlockManager::add_sequence(SeqId seq, std::span<const int32_t> prompt) {
  if (seqs_.count(seq)) fail(ErrorCode::bad_argument, "block manager: sequence " + std::to_string(seq) + " exists");
  Sequence& s = seqs_[seq];
  MatchResult m;
  if (!config_.reuse || prompt.empty()) return m;
  const int64_t P = config_.page_size;
  const int64_t limit = static_cast<int64_t>(prompt.size()) - 1;  // the last prompt token is always recomputed
  uint64_t parent = kRootKey;
  while (m.full_tokens + P <= limit) {
    const auto block_tokens = prompt.subspan(static_cast<size_t>(m.full_tokens), static_cast<size_t>(P));
    const Node* found = find_node(parent, block_tokens);
    if (!found) break;
    Node& node = nodes_.at(found->key);
    if (node.pool == PoolKind::secondary) {  // onboard the hit into a primary block
      const auto dst = take_block();
      if (!dst) break;
      if (mover_) mover_->onboard(node.block, *dst);
      secondary_lru_.erase(std::find(secondary_lru_.begin(), secondary_lru_.end(), node.key));
      free_secondary_.push_back(node.block);
      node.pool = PoolKind::primary;
      node.block = *dst;
      primary_[*dst].node = node.key;
      ++counters_.onboarded_blocks;
      ++primary_[*dst].refs;
    } else {
      ref(node.block);
    }
    s.blocks.push_back(node.block);
    s.keys.push_back(node.key);
    parent = node.key;
    m.full_tokens += P;
  }
  s.registered_blocks = static_cast<int64_t>(s.keys.size());
  if (config_.fault_serve_wrong_blocks && !s.blocks.empty()) {
    if (s.blocks.size() >= 2) {
      std::rotate(s.blocks.begin(), s.blocks.begin() + 1, s.blocks.end());
    } else {
      for (int32_t other : primary_lru_)  // any other cached block will do
        if (other != s.blocks[0]) {
          unref(s.blocks[0]);
          ref(other);
          s.blocks[0] = other;
          break;
        }
    }
  }
  if (config_.partial_reuse && m.full_tokens < limit) {
    // The cached child of the matched prefix that shares the longest head with the prompt's next tokens.
    const int64_t room = std::min<int64_t>(limit - m.full_tokens, P);
    int64_t best = 0;
    int32_t src = -1;
    auto range = children_.equal_range(parent);
    for (auto it = range.first; it != range.second; ++it) {
      const Node& c = nodes_.at(it->second);
      if (c.pool != PoolKind::primary || !c.written) continue;
      int64_t n = 0;
      while (n < room && c.tokens[n] == prompt[m.full_tokens + n]) ++n;
      if (n > best || (n == best && n > 0 && c.block < src)) {
        best = n;
        src = c.block;
      }
    }
    if (best > 0) {
      ref(src);  // keep the source out of eviction while the copy's destination is taken
      const auto dst = take_block();
      if (dst) {
        if (mover_) mover_->partial_copy(src, *dst, static_cast<int32_t>(best));
        primary_[*dst].refs = 1;
        s.blocks.push_back(*dst);
        m.partial_tokens = best;
      }
      unref(src);
    }
  }
  counters_.reuse_hit_tokens += m.tokens();
  counters_.partial_reuse_tokens += m.partial_tokens;
  return m;
}

std::vector<int64_t> BlockManager::pages_to_fill(const Sequence& s, int64_t length) const {
  std::vector<int64_t> pages;
  const int64_t columns = static_cast<int64_t>(s.blocks.size());
  for (int64_t pg = columns; pg < pages_for(length); ++pg) pages.push_back(pg);
  if (config_.window_mode == WindowMode::release) {
    const int64_t P = config_.page_size;
    for (int64_t t = s.length; t < length; ++t) {
      const int64_t pg = mapping_.cache_token(t) / P;
      if (pg < columns && s.blocks[pg] == kNullBlock && std::find(pages.begin(), pages.end(), pg) == pages.end())
        pages.push_back(pg);
    }
  }
  return pages;
}

int64_t BlockManager::blocks_needed(SeqId seq, int64_t length) const {
  return static_cast<int64_t>(pages_to_fill(seqs_.at(seq), length).size());
}

bool BlockManager::ensure_capacity(SeqId seq, int64_t length) {
  Sequence& s = seqs_.at(seq);
  const std::vector<int64_t> pages = pages_to_fill(s, length);
  if (static_cast<int64_t>(pages.size()) > available_blocks()) return false;
  for (int64_t pg : pages) {
    const int32_t b = *take_block();
    primary_[b].refs = 1;
    if (pg < static_cast<int64_t>(s.blocks.size()))
      s.blocks[pg] = b;
    else
      s.blocks.push_back(b);
  }
  s.length = std::max(s.length, length);
  return true;
}

void BlockManager::commit(SeqId seq, std::span<const int32_t> tokens, int64_t length) {
  if (!config_.reuse) return;
  Sequence& s = seqs_.at(seq);
  const int64_t P = config_.page_size;
  const int64_t full = std::min<int64_t>(length / P, static_cast<int64_t>(s.blocks.size()));
  for (int64_t i = s.registered_blocks; i < full; ++i) {
    const uint64_t parent = i == 0 ? kRootKey : s.keys[i - 1];
    const auto block_tokens = tokens.subspan(static_cast<size_t>(i * P), static_cast<size_t>(P));
    const uint64_t key = block_key(parent, block_tokens);
    const int32_t block = s.blocks[i];
    s.keys.push_back(key);
    if (nodes_.count(key)) {  // an equal block is cached already: this one stays private
      ++counters_.duplicate_blocks;
      continue;
    }
    Node n;
    n.key = key;
    n.parent = parent;
    n.tokens.assign(block_tokens.begin(), block_tokens.end());
    n.block = block;
    nodes_.emplace(key, std::move(n));
    children_.emplace(parent, key);
    primary_[block].node = key;
  }
  s.registered_blocks = std::max(s.registered_blocks, full);
}

void BlockManager::mark_step_written() {
  for (auto& [key, node] : nodes_) node.written = true;
}

void BlockManager::release_out_of_window(SeqId seq, int64_t next_position) {
  if (config_.window_mode != WindowMode::release) return;
  Sequence& s = seqs_.at(seq);
  const WindowMapping& w = mapping_;
  const int64_t P = config_.page_size;
  const int64_t q = next_position;  // the next query; no later query attends further back
  const int64_t window_start = std::max<int64_t>(w.sinks, q + 1 - (static_cast<int64_t>(w.window) - w.sinks));
  const int64_t ring_begin = w.sinks + w.bubble;  // slots before it hold sinks (or the bubble): never released
  for (int64_t pg = ring_begin / P; pg < static_cast<int64_t>(s.blocks.size()); ++pg) {
    if (s.blocks[pg] == kNullBlock) continue;
    bool attended = false;
    for (int64_t slot = pg * P; slot < (pg + 1) * P && !attended; ++slot) {
      // The token the slot holds: the newest t < q with cache_token(t) = slot.
      const int64_t k = slot - ring_begin;
      if (q - 1 - w.sinks - k < 0) continue;  // not written yet
      const int64_t t = w.sinks + k + w.cyclic_len * ((q - 1 - w.sinks - k) / w.cyclic_len);
      attended = t >= window_start;
    }
    if (attended) continue;
    unref(s.blocks[pg]);
    s.blocks[pg] = kNullBlock;
    ++counters_.released_window_blocks;
  }
}

void BlockManager::free_sequence(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  const std::vector<int32_t>& blocks = it->second.blocks;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b)  // tail first: the prefix's head stays cached longest
    if (!primary_[*b].reserved) unref(*b);
  seqs_.erase(it);
}

void BlockManager::cancel_sequence(SeqId seq, const MatchResult& match) {
  free_sequence(seq);
  counters_.reuse_hit_tokens -= match.tokens();
  counters_.partial_reuse_tokens -= match.partial_tokens;
}

const std::vector<int32_t>& BlockManager::table(SeqId seq) const { return seqs_.at(seq).blocks; }

PoolCounts BlockManager::counts(PoolKind kind) const {
  PoolCounts c;
  if (kind == PoolKind::primary) {
    c.size = config_.primary_blocks;
    c.free = static_cast<int64_t>(free_primary_.size());
    c.cached = static_cast<int64_t>(primary_lru_.size());
    for (const PrimaryBlock& b : primary_) c.referenced += (b.refs > 0 || b.reserved) ? 1 : 0;
  } else {
    c.size = config_.secondary_blocks;
    c.free = static_cast<int64_t>(free_secondary_.size());
    c.cached = static_cast<int64_t>(secondary_lru_.size());
  }
  return c;
}

std::vector<int32_t> BlockManager::lru_order() const { return {primary_lru_.begin(), primary_lru_.end()}; }

std::string BlockManager::check_conservation() const {
  for (PoolKind kind : {PoolKind::primary, PoolKind::secondary}) {
    const PoolCounts c = counts(kind);
    if (c.free + c.referenced + c.cached != c.size)
      return std::string(kind == PoolKind::primary ? "primary" : "secondary") + " pool: free " +
             std::to_string(c.free) + " + referenced " + std::to_string(c.referenced) + " + cached " +
             std::to_string(c.cached) + " != size " + std::to_string(c.size);
  }
  // Every primary block is in exactly one state, and its reference count is
  // the number of table entries that hold it.
  std::vector<int32_t> holders(primary_.size(), 0);
  for (const auto& [id, s] : seqs_)
    for (int32_t b : s.blocks)
      if (!primary_[b].reserved) ++holders[b];
  std::vector<int32_t> on_free(primary_.size(), 0);
  for (int32_t b : free_primary_) ++on_free[b];
  for (size_t b = 0; b < primary_.size(); ++b) {
    const PrimaryBlock& pb = primary_[b];
    const bool in_lru = primary_lru_pos_.count(static_cast<int32_t>(b)) != 0;
    const std::string where = "primary block " + std::to_string(b) + ": ";
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
  for (uint64_t key : secondary_lru_) {
    const Node& n = nodes_.at(key);
    if (n.pool != PoolKind::secondary) return "secondary LRU holds a node that lives in the primary pool";
    if (std::count(free_secondary_.begin(), free_secondary_.end(), n.block))
      return "secondary block " + std::to_string(n.block) + " is both free and holding an offloaded block";
  }
  return "";
}

}  // namespace kvsim::sim
