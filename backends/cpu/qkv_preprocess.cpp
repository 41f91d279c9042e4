// CPU oracle of qkv_preprocess_write (contract §5.3, TensorRT-LLM
// applyBiasRopeUpdateKVCache). The arithmetic and the write rules live in
// core (kvsim/core/ops/qkv_preprocess.hpp); this file only enumerates the
// work items (fused-qkv row, kv head) and runs them in the backend's arena.
// Each work item owns its Q heads, its K/V rows and its V-tail rows, so the
// bytes written do not depend on the thread count or the schedule.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <vector>

#include "backends/cpu/cpu_backend.hpp"

namespace kvsim {

void CpuBackend::run_qkv_preprocess_write(const KvPools& pools, const QkvPreprocessOp& op) {
  const QkvPreprocessArgs args = make_qkv_preprocess_args(pools, op);

  // (sequence, token in chunk) of every fused-qkv row: rows are packed per sequence.
  std::vector<int32_t> row_sequence, row_token;
  for (size_t b = 0; b < op.seq_lens.size(); ++b)
    for (int32_t t = 0; t < op.seq_lens[b]; ++t) {
      row_sequence.push_back(static_cast<int32_t>(b));
      row_token.push_back(t);
    }
  const int64_t kv_heads = pools.geometry.kv_heads;
  const int64_t items = static_cast<int64_t>(row_sequence.size()) * kv_heads;

  for_each_item(items, [&](int64_t i) {
    const int64_t row = i / kv_heads;
    qkv_preprocess_token_head<0>(pools, args, row_sequence[row], row_token[row], row,  // whole heads as rows
                                 static_cast<int32_t>(i % kv_heads));
  });
}

}  // namespace kvsim
