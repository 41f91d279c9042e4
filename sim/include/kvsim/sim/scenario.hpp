// The scenario data model (contract §6): everything a scripted replay needs, as
// plain values. scenario_file.hpp turns a TOML file into one of these (and
// rejects a malformed one with file:line:column); replay.hpp runs it on a
// Backend. Nothing here knows TOML, the CLI or a particular backend.
//
// Every field has the default a scenario file gets when it omits the key;
// docs/scenarios.md is the format reference and lists the same defaults.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <kvsim/core.hpp>
#include <kvsim/validation/engine_presets.hpp>
#include <kvsim/validation/errors.hpp>
#include <kvsim/core/attention_mma.hpp>
#include <kvsim/validation/rope.hpp>

#include "invariant_table.hpp"

namespace kvsim::sim {

// Where a value came from in the scenario file, for error messages
// ("file:line:column: key: ..."). line/column are 1-based; 0 = unknown.
struct SourceLocation {
  std::string file;
  int line = 0;
  int column = 0;
};

// Synthetic model (contract §6): Q/K/V of the token at position p are a
// deterministic function of (seed, layer, head, dim, p, hash of tokens 0..p).
struct ModelSpec {
  int32_t layers = 2;
  int32_t q_heads = 8;       // Hq; must be a multiple of kv_heads (GQA group = Hq / H)
  int32_t kv_heads = 2;      // H
  int32_t head_dim = 64;     // D (for MLA: d_ckv + d_kpe, see mla below)
  uint64_t seed = 1;
  float value_scale = 1.0f;  // typical |x| of K/V/Q elements
  float outlier_rate = 0.0f; // share of elements multiplied by outlier_scale (saturation, block scales)
  float outlier_scale = 64.0f;
  // Shares of K/V (and latent) input elements replaced by NaN and by +-Inf
  // (TensorRT-LLM / vLLM reports of non-finite activations reaching the cache).
  float nan_rate = 0.0f;
  float inf_rate = 0.0f;
  CacheDtype input_dtype = CacheDtype::bf16;  // dtype of the fused QKV / K / V inputs (fp32, fp16, bf16)
  RopeStyle rope = RopeStyle::neox;           // none, neox, gptj (qkv_preprocess write path)
  int32_t rotary_dim = 0;                     // 0 = head_dim
  double rope_theta = 10000.0;
  // fp8 queries (TensorRT-LLM's FP8 FMHA, FlashInfer's trtllm-gen fp8 decode):
  // Q is quantized per tensor, code = fp8(q / q_scale), attention runs on the
  // codes and q_scale is folded into the softmax scale (bmm1 scale =
  // sm_scale * q_scale, the K scale as before). Unset: queries in input_dtype.
  std::optional<CacheDtype> query_dtype;  // fp8_e4m3 or fp8_e5m2
  float q_scale = 1.0f;
};

// MLA (kv_factor 1): a latent row [ckv | kpe] per token.
struct MlaSpec {
  bool enabled = false;
  int32_t d_ckv = 512;
  int32_t d_kpe = 64;
  // Also run mla_attention (absorbed DeepSeek-V3 attention over the latent
  // pool) for every layer of every step; its outputs are attention outputs.
  bool attention = false;
};

// How K/V reach the pool each step; one of contract §5's write ops.
enum class WritePath : uint8_t {
  qkv_preprocess,     // TensorRT-LLM applyBiasRopeUpdateKVCache (default)
  append_paged,       // FlashInfer append_paged_kv_cache
  reshape_and_cache,  // vLLM reshape_and_cache(_flash)
  append_mla,         // FlashInfer append_paged_mla_kv_cache (requires mla.enabled)
};

// The order a pool hands out free blocks: lowest id first (the default),
// highest first (puts tokens at the far end of a pool, past 2^31 elements
// in a large one), or a shuffle seeded by model.seed.
enum class BlockOrder : uint8_t { lowest, highest, shuffled };

struct CacheSpec {
  CacheDtype dtype = CacheDtype::bf16;
  BlockLayout layout = BlockLayout::nhd;
  LayerPlacement placement = LayerPlacement::in_block;
  int32_t page_size = 16;          // tokens_per_block P
  int64_t primary_blocks = 64;
  int64_t secondary_blocks = 0;
  // FlashInfer's arrangement: K and V as strided views into one shared
  // [pages, 2, P, H, D] allocation per layer (requires per_layer + nhd).
  bool shared_kv_allocation = false;
  // An engine's own tensors (validation/engine_presets.hpp): sets layout (FlashInfer
  // keeps nhd/hnd) and placement; pools get the engine's strides in one allocation.
  std::optional<Engine> engine;
  WritePath write_path = WritePath::qkv_preprocess;
  float k_scale = 1.0f;            // fp8/int8 per-tensor scales (decode convention: x ≈ code * scale)
  float v_scale = 1.0f;
  float k_global_scale = 1.0f;     // nvfp4 second-level decode scales
  float v_global_scale = 1.0f;
  bool zero_v_tail = true;         // qkv_preprocess: zero V rows beyond cache_len in the last block
  bool poison_nan = false;         // fill every pool with NaN bytes before the run (no-NaN invariant)
  // A finite value every pool element holds before the run (TensorRT-LLM's
  // TRTLLM_KV_FRESH_PAGE_FILL idea): a read of a never-written slot shows it.
  std::optional<float> fresh_page_fill;
  BlockOrder block_order = BlockOrder::lowest;
};

enum class WindowMode : uint8_t {
  none,
  cyclic,   // TensorRT-LLM: a ring of blocks, sinks, bubble, optional one more block
  release,  // vLLM: blocks that leave the window return to the free list
  // [layers] only: vLLM's (and TensorRT-LLM VSWA's) sliding window with slot =
  // position (WindowMapping::make_linear); pages that leave the window are
  // released to the prefix cache and their table entries point at the null block.
  sliding,
};

struct WindowSpec {
  WindowMode mode = WindowMode::none;
  int32_t window = 0;  // W (tokens attended, sinks included)
  int32_t sinks = 0;   // S
  bool one_more_block = false;
};

// How a model whose layers mix attention kinds is given its KV cache.
enum class KvAllocation : uint8_t {
  // TensorRT-LLM VSWA (kvCacheManager.cpp, WindowBlockManager): one pool per
  // window size, each with its own blocks and one page table per sequence.
  vswa,
  // vLLM's hybrid KV cache manager (kv_cache_coordinator.py,
  // single_type_kv_cache_manager.py): layers of one kind in KV cache groups of
  // equal size sharing one block pool, one page table per group.
  hybrid,
};
// TensorRT-LLM VSWA's rule for a sliding pool: a ring (cyclic, reuse off) or
// blocks that leave the window freed to the radix tree (release).
enum class VswaRule : uint8_t { cyclic, release };

// [layers]: per-layer attention kinds. windows[l % windows.size()] is layer
// l's window (0 = full attention): a list of every layer, or a pattern repeated.
struct LayersSpec {
  bool enabled = false;
  std::vector<int32_t> windows;
  int32_t sinks = 0;  // sink tokens of every sliding layer (TensorRT-LLM VSWA only)
  KvAllocation allocation = KvAllocation::hybrid;
  VswaRule rule = VswaRule::release;
  bool one_more_block = false;  // vswa cyclic only
};

// One KV cache group: the layers that share a page table (and, with VSWA, a
// pool of their own). Derived from the scenario by kv_groups().
struct KvGroup {
  WindowMode mode = WindowMode::none;  // none = full attention
  int32_t window = 0;
  int32_t sinks = 0;
  bool one_more_block = false;
  int32_t pool = 0;            // index of the pool its blocks come from
  std::vector<int32_t> layers;  // model layers, in order; layers[i] is layer i of its pool
};

// [recurrent]: a hybrid model's recurrent (Mamba / Gated DeltaNet style)
// layers beside its attention layers: one fixed-size fp32 state per request
// per layer, folded a token at a time by core's synthetic recurrence
// (core/recurrence.hpp). With prefix reuse a state is snapshotted at block
// boundaries, and a hit may only stop where a snapshot is (vLLM's
// MambaManager under the hybrid coordinator).
enum class SnapshotMode : uint8_t {
  all,    // every block boundary a request passes (vLLM mamba_cache_mode "all")
  align,  // only the last block boundary before each prompt's end (vLLM "align", the mode #45238 reports on)
};
struct RecurrentSpec {
  int32_t layers = 0;        // 0 = no recurrent layers
  int32_t state_size = 64;   // fp32 elements of one layer's state
  SnapshotMode snapshots = SnapshotMode::all;
};

struct ReuseSpec {
  bool enabled = false;   // prefix-reuse tree over full blocks
  bool partial = false;   // partial-block reuse by partial_copy
  bool offload = false;   // evicted cached blocks go to the secondary pool; onboarded on a later hit
};

struct SchedulerSpec {
  int32_t token_budget = 2048;  // tokens (prefill + decode) per step
  int32_t chunk_size = 0;       // prefill chunk per request per step; 0 = whole prompt
  int32_t max_batch = 256;      // running requests per step
  int32_t max_steps = 100000;   // a replay that has not finished by then fails (no hang)
  // A waiting request is admitted only when the step's remaining budget takes
  // its whole prefill (no cut by the budget; a cyclic ring's cut still
  // applies). Not a file key: the chunking invariant's one-chunk run, whose
  // steps then hold at most max(token_budget, longest request) tokens.
  bool whole_prompts = false;
};

// A named, shared prompt prefix: explicit tokens, or `length` tokens
// generated from `seed`.
struct PrefixSpec {
  std::string name;
  std::vector<int32_t> tokens;
  SourceLocation where;
};

// A request's prompt is its prefixes (by name, in order) followed by its
// own tokens: explicit ones, or `generated` tokens from the request's seed.
struct RequestSpec {
  std::string id;
  int32_t arrival_step = 0;
  std::vector<std::string> prefixes;
  std::vector<int32_t> tokens;
  int32_t generated = 0;
  uint64_t seed = 0;            // for generated tokens; 0 = derived from the id
  int32_t decode_tokens = 0;    // tokens generated after the prompt
  SourceLocation where;
};

struct Expectations {
  // Counts the replay must report (nullopt = not checked).
  std::optional<int64_t> reuse_hit_tokens, evicted_blocks, offloaded_blocks, onboarded_blocks, preemptions;
  std::vector<Invariant> must_pass;    // empty = every invariant that applies to the scenario
  std::vector<Fault> must_catch;       // faults switched on must be caught by their invariant
};

// [attention]: the arithmetic order of every decode/prefill attention op
// (docs/canonical-arithmetic.md): fp32 (today's CUDA-core order) or mma
// (tensor-core inner products, offered for bf16/fp16/fp8/int8 caches).
struct AttentionSpec {
  AttentionOrder order = AttentionOrder::fp32;
};

struct Scenario {
  std::string name;         // file stem
  std::string description;  // the file's header comment: what it teaches, which engine it models
  std::string path;
  ModelSpec model;
  MlaSpec mla;
  CacheSpec cache;
  WindowSpec window;
  AttentionSpec attention;
  ReuseSpec reuse;
  SchedulerSpec scheduler;
  LayersSpec layers;
  RecurrentSpec recurrent;
  bool indexer_k_scatter = false;  // also scatter each token's fp8 indexer K into an indexer cache
  std::vector<PrefixSpec> prefixes;
  std::vector<RequestSpec> requests;
  std::vector<Fault> faults;       // switched on
  Expectations expect;
  // Where each key was set in the file ("cache.page_size", "window"), so a
  // semantic check (check_scenario) can say FILE:LINE:COLUMN; empty for
  // scenarios built in C++.
  std::map<std::string, SourceLocation> key_locations;
};

std::string_view write_path_name(WritePath w);
std::optional<WritePath> parse_write_path(std::string_view s);
std::string_view window_mode_name(WindowMode m);
std::optional<WindowMode> parse_window_mode(std::string_view s);
std::string_view block_order_name(BlockOrder o);
std::optional<BlockOrder> parse_block_order(std::string_view s);
std::string_view snapshot_mode_name(SnapshotMode m);
std::optional<SnapshotMode> parse_snapshot_mode(std::string_view s);
// The split_x_heads_unwritten fault's kernel: one thread per x-element vector
// of a token's K row, at most 512 threads a block and no stride loop, so only
// heads below 512 / (D / x) are written (x = 16 bytes of the cache dtype).
int64_t split_x_written_heads(CacheDtype t, int32_t head_dim);

// The pool geometry a scenario describes (every layer; with [layers], the
// geometry of pool `pool` is kv_pool_geometry).
PoolGeometry pool_geometry(const Scenario& s);

// Layer l's window (0 = full attention) and sinks: [layers] or [window].
int32_t layer_window(const Scenario& s, int32_t layer);
// The KV cache groups: without [layers], one group of every layer with the
// [window] section's mode. VSWA: one group (and pool) per window size, in
// increasing size, full attention last. hybrid: each kind's layers cut into
// groups of the smallest kind's layer count, all in pool 0.
std::vector<KvGroup> kv_groups(const Scenario& s);
int32_t kv_pool_count(const std::vector<KvGroup>& groups);
// Pool `pool`'s geometry: as pool_geometry, with the layers of one group of it.
PoolGeometry kv_pool_geometry(const Scenario& s, const std::vector<KvGroup>& groups, int32_t pool);
std::string_view allocation_name(KvAllocation a);
std::optional<KvAllocation> parse_allocation(std::string_view s);
std::string_view vswa_rule_name(VswaRule r);
std::optional<VswaRule> parse_vswa_rule(std::string_view s);

}  // namespace kvsim::sim
