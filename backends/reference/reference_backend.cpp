// The reference backend's ops: for each op, core's make_*_args, then every
// work item of core/ops/*.hpp in order, one at a time. Nothing here computes
// a value or an offset; where the fast backends pick a faster equivalent
// (a block copy as one run of bytes, SIMD attention, row groups sharing K/V)
// this file takes the plain item, so a difference between the two is the
// faster path's.
#include "backends/reference/reference_backend.hpp"

#include <vector>

namespace kvsim {

// ---------------------------------------------------------------- writes
void ReferenceBackend::run_append_paged(const KvPools& pools, const AppendPagedOp& op) {
  const AppendPagedArgs args = make_append_paged_args(pools, op);
  for (int64_t i = 0; i < args.nnz; ++i)
    for (int32_t head = 0; head < pools.geometry.kv_heads; ++head) append_paged_token_head(pools, args, i, head);
}

void ReferenceBackend::run_reshape_and_cache(const KvPools& pools, const ReshapeAndCacheOp& op) {
  const ReshapeAndCacheArgs args = make_reshape_and_cache_args(pools, op);
  for (int64_t t = 0; t < args.num_tokens; ++t)
    for (int32_t head = 0; head < pools.geometry.kv_heads; ++head) reshape_and_cache_token_head(pools, args, t, head);
}

void ReferenceBackend::run_qkv_preprocess_write(const KvPools& pools, const QkvPreprocessOp& op) {
  const QkvPreprocessArgs args = make_qkv_preprocess_args(pools, op);
  int64_t row = 0;  // fused-qkv rows are packed per sequence
  for (size_t b = 0; b < op.seq_lens.size(); ++b)
    for (int32_t t = 0; t < op.seq_lens[b]; ++t, ++row)
      for (int32_t head = 0; head < pools.geometry.kv_heads; ++head)
        qkv_preprocess_token_head(pools, args, static_cast<int32_t>(b), t, row, head);
}

// append_mla, indexer_k_scatter: items-form ops (item_ops.cpp).

// ---------------------------------------------------------------- reads
void ReferenceBackend::run_gather_paged(const KvPools& pools, const GatherPagedOp& op) {
  const GatherPagedArgs args = make_gather_paged_args(pools, op);
  for (int64_t t = 0; t < op.num_tokens; ++t)
    for (int32_t head = 0; head < pools.geometry.kv_heads; ++head) gather_paged_token_head(args, t, head);
}

namespace {

// Every (query row, KV head) of a decode or prefill op through core's
// attend_query in the op's order, each with scratch of its own.
template <class Op>
void attend_every_row(const KvPools& pools, const Op& op) {
  const AttentionArgs args = make_attention_args(pools, op);
  const AttentionRows rows = make_attention_rows(op);
  const PoolGeometry& g = pools.geometry;
  std::vector<float> scratch;
  for (size_t i = 0; i < rows.seq.size(); ++i) {
    const KeyList keys = make_key_list(rows.position[i], args.window, g.page_divider());
    for (int32_t head = 0; head < g.kv_heads; ++head) {
      scratch.assign(static_cast<size_t>(attention_order_scratch_floats(args.order, args.group, g.head_dim, keys.size())),
                     0.0f);
      attend_query_in_order(args, rows.seq[i], rows.position[i], static_cast<int64_t>(i), head, scratch.data());
    }
  }
}

}  // namespace

void ReferenceBackend::run_decode_attention(const KvPools& pools, const DecodeAttentionOp& op) {
  attend_every_row(pools, op);
}
void ReferenceBackend::run_prefill_attention(const KvPools& pools, const PrefillAttentionOp& op) {
  attend_every_row(pools, op);
}

void ReferenceBackend::run_mla_attention(const KvPools& pools, const MlaAttentionOp& op) {
  const MlaRows rows = make_mla_rows(op);
  MlaAttentionArgs args = make_mla_attention_args(pools, op);
  args.row_seq = rows.seq.data();
  args.row_position = rows.position.data();
  std::vector<float> scratch;
  for (int64_t i = 0; i < args.rows; ++i)
    for (int32_t head = 0; head < args.heads; ++head) {
      scratch.assign(static_cast<size_t>(mla_scratch_floats(args.d_ckv, args.d_kpe, args.row_position[i])), 0.0f);
      attend_mla_query(args, i, head, scratch.data());
    }
}

// ---------------------------------------------------------------- block copies
namespace {

// Every row of block src to the same row of block dst, one row at a time
// (never BlockCopyArgs::run_bytes' whole-block run: the rows are the contract).
void copy_rows(const BlockCopyArgs& args, int64_t src, int64_t dst) {
  for (int64_t row = 0; row < args.rows_per_block(); ++row) copy_block_row(args, src, dst, row);
}

}  // namespace

void ReferenceBackend::run_partial_copy(const KvPools& pools, const PartialCopyOp& op) {
  const PoolGeometry& g = pools.geometry;
  // n <= 0 is the whole-block sentinel; nvfp4 always copies whole blocks.
  const int32_t tokens = (op.num_tokens <= 0 || g.dtype == CacheDtype::nvfp4) ? g.tokens_per_block : op.num_tokens;
  copy_rows(make_block_copy_args(pools, PoolKind::primary, PoolKind::primary, tokens), BlockRef{op.src_block}.block(),
            BlockRef{op.dst_block}.block());
}

void ReferenceBackend::run_copy_blocks(const KvPools& pools, const CopyBlocksOp& op) {
  const BlockCopyArgs args =
      make_block_copy_args(pools, PoolKind::primary, PoolKind::primary, pools.geometry.tokens_per_block);
  for (const auto& [src, dst] : op.pairs) copy_rows(args, BlockRef{src}.block(), BlockRef{dst}.block());
}

void ReferenceBackend::run_offload(const KvPools& pools, const MoveBlocksOp& op) {
  move_blocks(pools, op, PoolKind::primary);
}
void ReferenceBackend::run_onboard(const KvPools& pools, const MoveBlocksOp& op) {
  move_blocks(pools, op, PoolKind::secondary);
}

void ReferenceBackend::move_blocks(const KvPools& pools, const MoveBlocksOp& op, PoolKind from) {
  const bool offload = from == PoolKind::primary;
  const BlockCopyArgs args = make_block_copy_args(pools, from, offload ? PoolKind::secondary : PoolKind::primary,
                                                  pools.geometry.tokens_per_block);
  for (size_t i = 0; i < op.primary.size(); ++i)
    copy_rows(args, offload ? op.primary[i] : op.secondary[i], offload ? op.secondary[i] : op.primary[i]);
}

}  // namespace kvsim
