// Reads and block copies: gather_paged (TensorRT-LLM _gather_paged_kv),
// partial_copy (cuKVCacheBlockPartialCopy), copy_blocks, offload / onboard.
#pragma once

#include <span>
#include <utility>

#include "../cache_io.hpp"
#include "../page_table.hpp"
#include "../tensor.hpp"

namespace kvsim {

// SPEC §5.6 — the first num_tokens logical tokens of K (kv = 0) or V (kv = 1)
// of one sequence as a contiguous [n, H, D] fp32 tensor, dequantized
// (fp8/int8: code * scale; nvfp4: SPEC §4 decode with global_scale). A
// BAD_PAGE range reads as zeros.
struct GatherPagedOp {
  int32_t layer = 0;
  int32_t kv = 0;
  std::span<const int32_t> block_ids;  // one sequence's table (BlockRefs, -1 allowed)
  int64_t num_tokens = 0;
  TensorView out;  // [num_tokens, H, D] fp32
  float scale = 1.0f;
  float global_scale = 1.0f;  // nvfp4
};

// SPEC §5.9 — copy the first n tokens of every layer/kv/head of a block
// (n <= 0: the whole block; nvfp4 always whole blocks, scales too).
struct PartialCopyOp {
  int32_t src_block = 0;  // BlockRef raw values (primary only)
  int32_t dst_block = 0;
  int32_t num_tokens = 0;
};

// Whole-block copies, in order; pairs (src, dst) of primary blocks.
struct CopyBlocksOp {
  std::span<const std::pair<int32_t, int32_t>> pairs;
};

// Offload: primary[i] -> secondary[i]; onboard: secondary[i] -> primary[i];
// data and scale pools, whole blocks.
struct MoveBlocksOp {
  std::span<const int32_t> primary;
  std::span<const int32_t> secondary;
};

// Host validation: throws a named ValidationError before any byte moves.
void validate_gather_paged(const KvPools& pools, const GatherPagedOp& op);
void validate_partial_copy(const KvPools& pools, const PartialCopyOp& op);
void validate_copy_blocks(const KvPools& pools, const CopyBlocksOp& op);
void validate_move_blocks(const KvPools& pools, const MoveBlocksOp& op);

}  // namespace kvsim
