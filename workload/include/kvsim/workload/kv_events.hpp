// Engines' KV-cache event streams (docs/traces.md, "KV-event streams"):
// what a serving engine publishes as its prefix cache stores and drops
// blocks, read from a capture file, checked for consistency, and replayed
// through kvsim's own block manager.
//
// Encodings read (the engine is recognised from the content):
//  * vLLM (vllm/distributed/kv_events.py): KVEventBatch{ts, events,
//    data_parallel_rank} of BlockStored / BlockRemoved / AllBlocksCleared,
//    msgpack, structs as positional arrays (array_like, older versions; the
//    event's tag first) or as maps (tag in "type"), trailing defaults
//    omitted; published as ZMQ frames (topic, 8-byte big-endian sequence
//    number, payload). A capture file is a sequence of msgpack objects, each
//    a batch or a [topic, seq, payload] frame triple; or JSON Lines, one
//    batch per line, in either struct encoding;
//  * SGLang (python/sglang/srt/disaggregation/kv_events.py): vLLM's format,
//    array-encoded, BlockRemoved without medium, attn_dp_rank;
//  * TensorRT-LLM (tensorrt_llm/_utils.py, KVCacheEventSerializer): JSON
//    events {event_id, data, window_size, attention_dp_rank} with data.type
//    created / stored / removed / updated; a JSON array of them or one per line.
//
// Malformed input (bad JSON, truncated msgpack, an unknown field or tag, a
// wrong type) is ValidationError(bad_event_stream, "FILE:LINE: ..." or
// "FILE:byte N: ..."), thrown before any check runs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvsim::workload {

enum class EventKind : uint8_t { stored, removed, cleared, created, updated };

struct StoredBlock {
  std::string hash;             // canonical text: "123", "-5" or "0x<hex bytes>"
  std::vector<int64_t> tokens;  // its tokens (vLLM: its share of token_ids)
};

struct KvEvent {
  EventKind kind = EventKind::stored;
  std::string where;            // FILE:LINE or FILE:byte N, then the batch and event index
  int64_t batch = 0;            // index of its batch in the file (TRT-LLM: of the event)
  std::optional<uint64_t> seq;  // the ZMQ sequence number (vLLM/SGLang frames) or TRT-LLM's event_id
  int64_t rank = 0;             // data_parallel_rank / attn_dp_rank / attention_dp_rank
  int64_t group = 0;            // vLLM group_idx; TensorRT-LLM window_size
  std::string medium;           // vLLM medium ("" = none given, the GPU); TensorRT-LLM: none
  // stored
  std::optional<std::string> parent;
  std::vector<StoredBlock> blocks;
  int64_t block_size = 0;       // vLLM/SGLang block_size; TensorRT-LLM: 0 (not published)
  bool token_count_free = false;  // the stream says blocks need not be full (kv_cache_spec_kind other than full attention)
  std::vector<int64_t> cache_levels;  // TensorRT-LLM stored: per block
  // removed
  std::vector<std::string> removed;
  // updated (TensorRT-LLM)
  std::string updated_hash;
  std::optional<std::pair<int64_t, int64_t>> level_change;  // old, new cache_level
  // created (TensorRT-LLM)
  std::vector<int64_t> blocks_per_level;
};

struct EventStream {
  std::string source;
  std::string engine;    // "vllm", "sglang" or "trtllm"
  std::string encoding;  // "msgpack-array", "msgpack-map", "msgpack-zmq-frames+...", "jsonl-array", "jsonl-map", "trtllm-json"
  int64_t batches = 0;
  std::vector<KvEvent> events;
};

EventStream parse_event_stream(std::string_view bytes, const std::string& source);
EventStream load_event_stream(const std::string& path);

// The stream's invariants (docs/traces.md), each with its first violation.
enum class EventInvariant : uint8_t {
  sequence_contiguous,       // sequence numbers increase by one (gaps are lost batches)
  removed_is_live,           // a removed hash is stored and not removed since
  parent_is_live,            // a stored block's parent is live when the child is stored
  no_duplicate_store,        // no live hash stored again
  one_block_size_per_group,  // every store of a group (TRT-LLM: a window size) has one block size
  full_blocks,               // a stored block holds block_size tokens
  cleared_means_empty,       // nothing stored before AllBlocksCleared is referred to after it
  cache_levels_exist,        // TRT-LLM updated/stored cache levels are levels `created` announced; old level = the block's
};
std::string_view event_invariant_name(EventInvariant i);
inline constexpr int kEventInvariants = 8;

struct EventCheck {
  EventInvariant invariant;
  bool applicable = true;
  int64_t violations = 0;
  std::string first;  // where and what, "" when none
};

struct EventCheckReport {
  int64_t events = 0, stored_blocks = 0, removed_blocks = 0, clears = 0, lost_batches = 0;
  std::vector<EventCheck> checks;
  bool ok() const;
};
EventCheckReport check_event_stream(const EventStream& s);

// events replay: the stores rebuild the prefix-content tree; each store is
// replayed in a block manager of `capacity_blocks` as a request whose prompt
// is the stored chain from the root (plus one token, so every block of it
// may be matched); kvsim's LRU then decides what to evict. Compared with the
// engine's removals: a hash kvsim evicted while the engine still held it,
// and a hash the engine removed while kvsim still held it, are divergences.
//
// Every (data-parallel rank, group) is a cache of its own in the engine (one
// publisher per rank; vLLM's KV cache groups and TensorRT-LLM's window sizes
// each have their own block pool and hashes), so each is replayed through
// its own block manager of `capacity_blocks` and reported separately. Stores
// to another medium (vLLM's CPU / disk offload tiers, TensorRT-LLM cache
// level > 0) are not replayed: the engine fills those tiers by its
// connector's policy, not by primary evictions as kvsim's secondary tier is
// filled, so block-by-block they are not comparable; they are counted per
// medium, with the primary stores of a hash that tier held at the time.
struct EventReplayStream {
  int64_t rank = 0, group = 0;
  int64_t replayed_stores = 0;     // store events replayed
  int64_t unrooted_stores = 0;     // stores whose chain does not reach the root (parent never stored): skipped
  int64_t other_medium_stores = 0; // stores to another medium / cache level than the primary one: skipped
  int64_t unfit_stores = 0;        // chains longer than the whole pool: skipped
  int64_t block_size = 0;
  int64_t kvsim_evictions = 0;
  int64_t engine_removals = 0;
  int64_t kvsim_evicted_engine_kept = 0;   // divergences of one kind
  int64_t engine_removed_kvsim_kept = 0;   // ... and of the other
  std::string first_divergence;            // "" = none
  int64_t first_divergence_event = -1;     // its index in EventStream::events, -1 = none
  int64_t chain_tokens = 0;                // prompt tokens of the replayed requests
  int64_t hit_tokens = 0;                  // of which found in kvsim's cache
  int64_t engine_hit_tokens = 0;           // of which the engine had cached (the chain less what it stored)
};

// One non-primary medium of one (rank, group): what the engine did there.
struct EventMediumReport {
  int64_t rank = 0, group = 0;
  std::string medium;          // vLLM's medium ("CPU", "DISK", ...); TensorRT-LLM "cache_level N"
  int64_t stored_blocks = 0, removed_blocks = 0, live_at_end = 0;
  int64_t restored_blocks = 0; // primary stores of a hash this medium held then (an onboard or a recomputation)
};

struct EventReplayReport : EventReplayStream {  // the totals over every stream (rank, group = -1 when several)
  std::vector<EventReplayStream> streams;       // by (rank, group)
  std::vector<EventMediumReport> other_media;   // by (rank, group, medium)
};
EventReplayReport replay_event_stream(const EventStream& s, int64_t capacity_blocks);

}  // namespace kvsim::workload
