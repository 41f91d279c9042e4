// decode_attention / prefill_attention on oneTBB: one work item per (query
// token, KV head), each running core's attend_query() with per-thread
// scratch. Work items write disjoint output rows, so the result is the same
// for any thread count.
#include <tbb/blocked_range2d.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include <vector>

#include "backends/cpu/cpu_backend.hpp"

namespace kvsim {
namespace {

AttentionArgs make_args(const KvPools& pools, int32_t layer, const TensorView& q, const TensorView& out,
                        const int32_t* table, int32_t max_blocks, const AttentionScales& scales,
                        const WindowMapping& window) {
  AttentionArgs a;
  a.pools = pools;
  a.layer = layer;
  a.q = q;
  a.out = out;
  a.block_table = table;
  a.max_blocks_per_seq = max_blocks;
  a.scales = scales;
  a.window = window;
  a.group = static_cast<int32_t>(q.shape[1] / pools.geometry.kv_heads);
  return a;
}

// rows[i] = (sequence, position) of query row i.
void run_queries(tbb::task_arena& arena, const AttentionArgs& a, const std::vector<std::pair<int32_t, int64_t>>& rows) {
  tbb::enumerable_thread_specific<std::vector<float>> scratch;
  const int32_t heads = a.pools.geometry.kv_heads;
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range2d<int64_t, int32_t>(0, static_cast<int64_t>(rows.size()), 0, heads),
                      [&](const tbb::blocked_range2d<int64_t, int32_t>& r) {
                        std::vector<float>& buf = scratch.local();
                        for (int64_t i = r.rows().begin(); i < r.rows().end(); ++i) {
                          const auto [seq, position] = rows[i];
                          const KeyList keys = make_key_list(position, a.window, a.pools.geometry.page_divider());
                          const int64_t need = attention_scratch_floats(a.group, a.pools.geometry.head_dim, keys.size());
                          if (static_cast<int64_t>(buf.size()) < need) buf.resize(need);
                          for (int32_t h = r.cols().begin(); h < r.cols().end(); ++h)
                            attend_query(a, seq, position, i, h, buf.data());
                        }
                      });
  });
}

}  // namespace

void CpuBackend::run_decode_attention(const KvPools& pools, const DecodeAttentionOp& op) {
  const AttentionArgs a = make_args(pools, op.layer, op.q, op.out, op.block_table.data(), op.max_blocks_per_seq,
                                    op.scales, op.window);
  std::vector<std::pair<int32_t, int64_t>> rows;
  for (size_t b = 0; b < op.seq_lens.size(); ++b) rows.emplace_back(static_cast<int32_t>(b), op.seq_lens[b] - 1);
  run_queries(arena_, a, rows);
}

void CpuBackend::run_prefill_attention(const KvPools& pools, const PrefillAttentionOp& op) {
  const AttentionArgs a = make_args(pools, op.layer, op.q, op.out, op.block_table.data(), op.max_blocks_per_seq,
                                    op.scales, op.window);
  std::vector<std::pair<int32_t, int64_t>> rows;
  for (size_t b = 0; b + 1 < op.q_indptr.size(); ++b)
    for (int32_t i = op.q_indptr[b]; i < op.q_indptr[b + 1]; ++i)
      rows.emplace_back(static_cast<int32_t>(b), prefill_position(op.seq_lens[b], op.q_indptr[b], op.q_indptr[b + 1], i));
  run_queries(arena_, a, rows);
}

}  // namespace kvsim
