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
#include "backends/cpu/cpu_target.hpp"
#include "backends/cpu/nvfp4_rows.hpp"

namespace kvsim {
namespace {

// The work item, whole heads as rows: core's qkv_preprocess_token_head<0>,
// once for baseline x86-64 and once more per wider ISA as internal-linkage
// `flatten` clones (fma_clones.cpp's pattern), so that core's row loops
// (load_floats, the bias, rope_rotate, store_floats, qkv_store_cache_run)
// are compiled with vector instructions. Only the width changes: the same
// operations in the same order (-ffp-contract=off stays), so the same bytes
// at every ISA (tests/oracle/qkv_preprocess_test.cpp runs each). nvfp4
// caches are quantized by the ISA's cpu_nvfp4 quantizer (nvfp4_rows.hpp).
using QkvItemFn = void (*)(const KvPools&, const QkvPreprocessArgs&, int32_t, int32_t, int64_t, int32_t,
                           cpu_nvfp4::Rows);

void qkv_item_baseline(const KvPools& pools, const QkvPreprocessArgs& a, int32_t b, int32_t t, int64_t row,
                       int32_t kv_head, cpu_nvfp4::Rows rows) {
  qkv_preprocess_token_head<0>(pools, a, b, t, row, kv_head, rows);
}

#if KVSIM_CPU_X86
KVSIM_CPU_TARGET_BEGIN(KVSIM_CPU_TARGET_AVX2)
__attribute__((flatten)) void qkv_item_avx2(const KvPools& pools, const QkvPreprocessArgs& a, int32_t b, int32_t t,
                                            int64_t row, int32_t kv_head, cpu_nvfp4::Rows rows) {
  qkv_preprocess_token_head<0>(pools, a, b, t, row, kv_head, rows);
}
KVSIM_CPU_TARGET_END

KVSIM_CPU_TARGET_BEGIN(KVSIM_CPU_TARGET_AVX512)
__attribute__((flatten)) void qkv_item_avx512(const KvPools& pools, const QkvPreprocessArgs& a, int32_t b, int32_t t,
                                              int64_t row, int32_t kv_head, cpu_nvfp4::Rows rows) {
  qkv_preprocess_token_head<0>(pools, a, b, t, row, kv_head, rows);
}
KVSIM_CPU_TARGET_END
#endif

QkvItemFn qkv_item_at(CpuIsa isa) {
#if KVSIM_CPU_X86
  if (isa == CpuIsa::avx512) return &qkv_item_avx512;
  if (isa == CpuIsa::avx2) return &qkv_item_avx2;
#endif
  (void)isa;
  return &qkv_item_baseline;
}

}  // namespace

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

  const QkvItemFn item = qkv_item_at(isa_);
  const cpu_nvfp4::Rows rows{cpu_nvfp4::rows_at(isa_)};
  for_each_item(items, [&](int64_t i) {
    const int64_t row = i / kv_heads;
    item(pools, args, row_sequence[row], row_token[row], row, static_cast<int32_t>(i % kv_heads), rows);
  });
}

}  // namespace kvsim
