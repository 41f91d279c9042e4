// The block manager (contract §6): which physical blocks each sequence owns, and
// the prefix-reuse cache over full blocks. It models:
//  * TensorRT-LLM's KVCacheManager / vLLM v1's BlockPool: a primary pool with a
//    free list and reference counts, full blocks cached in a prefix tree keyed
//    by (parent key, block tokens), LRU eviction of unreferenced cached
//    blocks (a finished sequence's blocks are released tail first, as vLLM
//    does, so a prefix's tail is evicted before its head);
//  * TensorRT-LLM's secondary pool: an evicted cached block can be offloaded
//    there and is onboarded again on a later hit (each primary pool has its
//    own secondary pool of secondary_blocks, as each VSWA window size has its
//    own host pool);
//  * partial-block reuse (TensorRT-LLM cuKVCacheBlockPartialCopy): the
//    matching prefix of a cached block is copied into a fresh private block;
//  * sliding windows: TensorRT-LLM's cyclic mode (a sequence's table maps
//    cache slots through core's WindowMapping and stops growing at the ring;
//    new tokens overwrite the ring's blocks in place) and vLLM's release mode
//    (a block whose tokens all left the window goes back to the free list
//    right after the step; its table entry points at a reserved null block,
//    vLLM v1's `null_block`, so every page a reader meets is a live id, and
//    a fresh block is taken when the ring comes back to that page). Both
//    modes address slots through the same WindowMapping, since core's
//    readers and writers accept no other (vLLM itself keeps slot = token and
//    masks the window in the kernel; the released blocks are the same ones).
//  * per-layer attention kinds ([layers]): one page table per KV cache group.
//    Groups draw blocks from the pool their config names: vLLM's hybrid KV
//    cache manager (groups share one BlockPool; kv_cache_coordinator.py) or
//    TensorRT-LLM VSWA (a pool per window size; kvCacheManager.cpp's
//    WindowBlockManager). A `sliding` group addresses slot = position
//    (WindowMapping::make_linear) and, after each step, releases the pages
//    no later query attends (vLLM SlidingWindowManager.remove_skipped_blocks;
//    TensorRT-LLM: "blocks that leave the attention window are freed and
//    placed on the radix search tree"): a registered block stays cached.
//    Prefix hits follow vLLM's rule (HybridKVCacheCoordinator
//    .find_longest_cache_hit): the longest prefix every group can serve, a
//    full group with all its blocks cached, a sliding group with the blocks
//    of the last W - S tokens before the hit point (and the sinks' blocks)
//    cached (SlidingWindowManager.find_longest_cache_hit); the sliding
//    group's earlier entries are the null block. Each group keys its blocks
//    in its own chain (vLLM's BlockHashWithGroupId). An offloaded block
//    counts as cached there too (it is onboarded into its group's pool when
//    the hit needs it, and a hit is lowered until its onboards fit), and a
//    partial hit extends the prefix by the tokens every group can copy from
//    one cached block of its own chain (the same count for every group: the
//    hit is one prefix of the prompt).
// The last prompt token is never matched (it is always recomputed: its
// output is what the engine samples from). Blocks of a sequence are
// registered in the tree as soon as the scheduler commits the step that
// fills them, so a second request scheduled in the same step hits them
// instead of computing duplicates (their bytes are written by the same
// step's write op, before any attention op of that layer reads them).
//
// Conservation: free + referenced + cached = size, for each pool, after
// every operation (check_conservation()). Reference counting and the cache
// are host bookkeeping only; bytes move through BlockMover (the backend).
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <kvsim/validation/window.hpp>

#include "scenario.hpp"

namespace kvsim::sim {

// How the block manager moves bytes: the replay implements it with the
// backend's partial_copy / offload / onboard; unit tests record the calls.
// `pool` names the primary pool (and its secondary pool) the blocks are of:
// always 0 but with [layers] on TensorRT-LLM VSWA (a pool per window size).
class BlockMover {
 public:
  virtual ~BlockMover() = default;
  virtual void partial_copy(int32_t pool, int32_t src_block, int32_t dst_block, int32_t tokens) = 0;
  virtual void offload(int32_t pool, int32_t primary_block, int32_t secondary_block) = 0;
  virtual void onboard(int32_t pool, int32_t secondary_block, int32_t primary_block) = 0;
};

// One page table per sequence: a KV cache group's window and pool.
struct GroupConfig {
  WindowMode mode = WindowMode::none;
  int32_t window = 0;
  int32_t sinks = 0;
  bool one_more_block = false;
  int32_t pool = 0;
};

struct BlockManagerConfig {
  int64_t primary_blocks = 0;  // per pool
  int64_t secondary_blocks = 0;  // per pool
  int32_t page_size = 16;
  bool reuse = false;
  bool partial_reuse = false;
  bool offload = false;
  WindowMode window_mode = WindowMode::none;
  int32_t window = 0;
  int32_t sinks = 0;
  bool one_more_block = false;
  // Fault reused_block_mismatch: a prefix hit is served blocks holding other
  // tokens' K/V, as a stale or colliding cache entry would: the hit blocks in
  // rotated order (block i gets hit block i + 1's bytes), or, for a single
  // hit, another cached block.
  bool fault_serve_wrong_blocks = false;
  BlockOrder block_order = BlockOrder::lowest;  // the order free blocks are handed out
  uint64_t order_seed = 1;                       // BlockOrder::shuffled
  // Empty: one group with the window fields above, pool 0.
  std::vector<GroupConfig> groups;

  static BlockManagerConfig from(const Scenario& s);
};

struct PoolCounts {
  int64_t size = 0;
  int64_t free = 0;
  int64_t referenced = 0;  // held by at least one sequence (or reserved: the null block)
  int64_t cached = 0;      // unreferenced, in the prefix tree, evictable
};

struct BlockManagerCounters {
  int64_t reuse_hit_tokens = 0;      // prompt tokens served from the cache (full and partial)
  int64_t partial_reuse_tokens = 0;  // of which by partial_copy
  int64_t evicted_blocks = 0;        // cached blocks taken from the tree for a new owner
  int64_t offloaded_blocks = 0;
  int64_t onboarded_blocks = 0;
  int64_t released_window_blocks = 0;  // release mode: blocks that left the window
  int64_t duplicate_blocks = 0;      // full blocks computed again while an equal one was cached
};

// What the block manager did to one block, told as it happens (replay
// observers, step_observer.hpp). `block` is a primary block id, `secondary`
// a secondary one, -1 where the event has none.
struct BlockEvent {
  enum class Kind : uint8_t {
    hit,            // seq reuses cached `block` (a full block; after an onboard when it was offloaded)
    partial_copy,   // the first `tokens` tokens of cached `source` copied into seq's fresh `block`
    evict,          // cached, unreferenced `block` taken from the tree for a new owner
    offload,        // the evicted `block` moved to `secondary`
    onboard,        // offloaded `secondary` moved back into `block` for seq's hit
    drop_secondary, // the secondary pool was full: its oldest offloaded `secondary` forgotten
    release,        // release mode: seq's `block` left the window and went back to the free list
    cancel,         // seq was not admitted after all: its hits of this step are taken back
  };
  Kind kind = Kind::hit;
  int32_t seq = -1;
  int32_t block = -1;
  int32_t secondary = -1;
  int32_t source = -1;
  int32_t tokens = 0;  // hit: the block's tokens (each group that hits tells its own block)
  int32_t pool = 0;    // the primary pool of `block` and `source` (per-layer groups may have several)
  int32_t group = 0;   // the KV cache group whose table the event concerns
};
std::string_view block_event_name(BlockEvent::Kind k);

// One primary block's state (the conservation invariant's four).
enum class BlockUse : uint8_t { free, referenced, cached, reserved };

// A block of the prefix tree: chained key, parent key (its group's root for
// a prompt's first block), and where its bytes live.
struct CachedBlock {
  uint64_t key = 0;
  uint64_t parent = 0;
  PoolKind pool = PoolKind::primary;
  int32_t block = -1;
  int32_t group = 0;
  int32_t primary_pool = 0;  // the group's pool (its block, while pool is primary)
};

struct MatchResult {
  int64_t full_tokens = 0;     // matched by whole cached blocks
  int64_t partial_tokens = 0;  // copied from a cached block by partial_copy
  int64_t tokens() const { return full_tokens + partial_tokens; }
};

class BlockManager {
 public:
  using SeqId = int32_t;
  static constexpr int32_t kNullBlock = 0;  // release and sliding modes only (of each pool that has one)

  BlockManager(const BlockManagerConfig& config, BlockMover* mover);

  const BlockManagerConfig& config() const { return config_; }
  const BlockManagerCounters& counters() const { return counters_; }

  // Starts a sequence: with reuse, references the longest cached prefix of
  // prompt[0, prompt.size() - 1) (onboarding secondary hits) and, with
  // partial reuse, copies the matching head of one more cached block. The
  // sequence's first match.tokens() tokens are then in the cache.
  MatchResult add_sequence(SeqId seq, std::span<const int32_t> prompt);
  bool has_sequence(SeqId seq) const { return seqs_.count(seq) != 0; }

  // Makes the sequence's table cover `length` tokens (cache slots through
  // the window mapping). All or nothing: false (and nothing changed) when
  // the pool cannot supply the blocks even after evicting every cached one.
  bool ensure_capacity(SeqId seq, int64_t length);
  // Blocks ensure_capacity(seq, length) would have to take from the pool.
  int64_t blocks_needed(SeqId seq, int64_t length) const;
  // Blocks the pool can hand out now (free + evictable cached).
  int64_t available_blocks() const;

  // The step that brings the sequence to `length` tokens is scheduled:
  // register its full blocks (tokens[0, length) known) in the prefix tree.
  void commit(SeqId seq, std::span<const int32_t> tokens, int64_t length);
  // The step's ops have run: blocks committed during it now hold their bytes.
  // Until then they serve full-block hits (the same step's write op fills
  // them before any attention op reads) but are no partial_copy source: a
  // copy reads its source at once.
  void mark_step_written();
  // Release mode: after a step, return the blocks no query at position >=
  // next_position can attend to (every token of the block is a non-sink
  // before the window of next_position).
  void release_out_of_window(SeqId seq, int64_t next_position);
  // Drops the sequence (finished or preempted): its blocks are unreferenced,
  // tail first; cached ones stay in the tree, the rest go to the free list.
  void free_sequence(SeqId seq);
  // Undoes add_sequence of a sequence that was not admitted after all: frees
  // it and takes its hits back out of the counters (onboards stay counted:
  // those bytes did move).
  void cancel_sequence(SeqId seq, const MatchResult& match);

  // The sequence's dense block-table row of a group: raw BlockRefs of its cache pages.
  const std::vector<int32_t>& table(SeqId seq, int32_t group = 0) const;
  // Pages a group's table needs for `length` tokens (cache slots through the window).
  int64_t pages_for(int64_t length, int32_t group = 0) const;
  // Largest table a sequence of `length` tokens can need.
  int64_t max_pages(int64_t length) const { return pages_for(length); }
  const WindowMapping& window_mapping(int32_t group = 0) const { return groups_[group].mapping; }
  int32_t group_count() const { return static_cast<int32_t>(groups_.size()); }
  const GroupConfig& group(int32_t g) const { return groups_[g].config; }

  // Counts summed over the pools.
  PoolCounts counts(PoolKind kind) const;
  // "" when free + referenced + cached = size for both pools and every
  // block is in exactly one of those states; otherwise what is wrong.
  std::string check_conservation() const;
  // Told every BlockEvent as it happens (empty = nobody listens).
  void set_event_listener(std::function<void(const BlockEvent&)> listener) { listener_ = std::move(listener); }
  // Where a prefix hit may stop: with recurrent layers, only where their
  // states have a snapshot (vLLM's MambaManager in the hybrid coordinator).
  // add_sequence lowers the hit to the deepest block boundary it allows;
  // empty = anywhere.
  void set_hit_filter(std::function<bool(SeqId seq, int64_t tokens)> filter) { hit_filter_ = std::move(filter); }
  BlockUse block_use(int32_t pool, int32_t primary_block) const;
  int32_t pool_count() const { return static_cast<int32_t>(pools_.size()); }
  // Every block of the prefix tree (any order); group 0's root key is kTreeRoot.
  std::vector<CachedBlock> prefix_tree() const;
  static constexpr uint64_t kTreeRoot = 0xcbf29ce484222325ull;
  // Reference count of a primary block (tests).
  int32_t ref_count(int32_t block, int32_t pool = 0) const { return pools_[pool].blocks[block].refs; }
  // Cached primary blocks, least recently used first (tests).
  std::vector<int32_t> lru_order(int32_t pool = 0) const;
  // Secondary blocks holding offloaded cached blocks, of every pool (tests).
  int64_t secondary_cached() const;

 private:
  struct Node {  // a cached full block
    int32_t group = 0;
    uint64_t key = 0;
    uint64_t parent = 0;
    std::vector<int32_t> tokens;
    PoolKind pool = PoolKind::primary;
    int32_t block = -1;
    bool written = false;  // false while the step that fills it has not run
  };
  struct PrimaryBlock {
    int32_t refs = 0;
    std::optional<uint64_t> node;  // cached in the tree under this key
    bool reserved = false;         // the null block
  };
  struct Pool {
    std::vector<PrimaryBlock> blocks;
    std::vector<int32_t> free;  // stack of free block ids
    std::list<int32_t> lru;     // cached, unreferenced blocks, oldest first
    std::unordered_map<int32_t, std::list<int32_t>::iterator> lru_pos;
    std::vector<int32_t> free_secondary;  // this pool's secondary pool: stack of free block ids
    std::list<uint64_t> secondary_lru;    // its offloaded nodes, oldest first
  };
  struct Group {
    GroupConfig config;
    WindowMapping mapping;
    uint64_t root = 0;  // the group's chain starts here: equal tokens give each group its own keys
  };
  struct Table {
    std::vector<int32_t> blocks;    // raw refs per cache page (null block after release)
    std::vector<uint64_t> keys;     // chained key per full block registered/matched so far
    int64_t registered_blocks = 0;  // leading full blocks whose key is known
  };
  struct Sequence {
    std::vector<Table> tables;  // one per group
    int64_t length = 0;         // tokens the tables cover (ensure_capacity)
  };
  // Pages ensure_capacity(seq, length) must fill in group g: new columns, and
  // (release mode) released pages the tokens [s.length, length) are written to.
  std::vector<int64_t> pages_to_fill(const Sequence& s, int32_t g, int64_t length) const;
  // The vLLM hit rule over every group (any group sliding, or several groups).
  MatchResult match_groups(SeqId seq, Sequence& s, std::span<const int32_t> prompt);
  // With partial reuse, after a hit of `hit` full blocks: copies the head of
  // the next block every group can serve from a cached block of its chain.
  int64_t match_partial(SeqId seq, Sequence& s, std::span<const int32_t> prompt, int64_t hit);
  // Whether each pool p can give takes[p] blocks (free, or unreferenced cached
  // ones evicted) once pinned[p] of its cached blocks are referenced.
  bool pools_can_give(const std::vector<int64_t>& takes, const std::vector<int64_t>& pinned) const;
  // The cached, written child of `parent` sharing the longest head with
  // tokens[0, room): (tokens shared, its primary block), (0, -1) for none.
  std::pair<int64_t, int32_t> partial_source(uint64_t parent, std::span<const int32_t> tokens, int64_t room) const;
  // Takes offloaded node `key` out of its pool's secondary LRU, so that no
  // eviction drops it before its onboard.
  void detach_secondary(int32_t pool, uint64_t key);
  // Moves detached offloaded node `key` back into a primary block of `pool`
  // (taken from the free list, else by evicting; the caller made sure there
  // is one), referenced once.
  void onboard_node(SeqId seq, int32_t pool, uint64_t key);
  bool single_legacy_group() const;

  uint64_t block_key(uint64_t parent, std::span<const int32_t> tokens) const;
  const Node* find_node(uint64_t parent, std::span<const int32_t> tokens) const;
  std::optional<int32_t> take_block(int32_t pool);  // free list, else evict the LRU cached block
  void evict(int32_t pool, int32_t block);
  void forget_node(uint64_t key);  // removes a cached block from the tree
  void unref(int32_t pool, int32_t block);
  void ref(int32_t pool, int32_t block);
  void touch_lru(int32_t pool, int32_t block);
  int64_t available_blocks(int32_t pool) const;

  BlockManagerConfig config_;
  BlockMover* mover_;
  std::vector<Group> groups_;
  std::vector<Pool> pools_;
  std::unordered_map<uint64_t, Node> nodes_;
  std::unordered_multimap<uint64_t, uint64_t> children_;  // parent key -> child keys
  std::map<SeqId, Sequence> seqs_;
  BlockManagerCounters counters_;
  std::function<void(const BlockEvent&)> listener_;
  std::function<bool(SeqId, int64_t)> hit_filter_;
  void tell(const BlockEvent& e) const {
    if (listener_) listener_(e);
  }
};

}  // namespace kvsim::sim
