// CPU write ops (contract §5.1, §5.2, §5.4): loops only (append_mla and
// indexer_k_scatter are items-form ops: item_ops.cpp).
// Every byte written comes from core's work-item functions in
// core/ops/write_ops.hpp; validation (Backend's entry points) has already
// proved that no two work items share a byte, so any thread count gives the
// same pools.
#include "backends/cpu/cpu_backend.hpp"
#include "backends/cpu/cpu_target.hpp"
#include "backends/cpu/nvfp4_rows.hpp"

namespace kvsim {
namespace {

// The work items -- core's append_paged_token_head and
// reshape_and_cache_token_head -- once for baseline x86-64 and once more per
// wider ISA as internal-linkage `flatten` clones (qkv_preprocess.cpp's
// pattern), so that core's row loops (load_floats, fp8_encode_divided_run)
// are compiled as vector code. The same
// operations in the same order (-ffp-contract=off stays): the same bytes at
// every ISA (tests/oracle/write_ops_test.cpp runs each). nvfp4 rows are
// quantized by the ISA's cpu_nvfp4 quantizer (nvfp4_rows.hpp: at avx2 and
// avx512 the explicit ones, the same bytes as core's), an item's K and V rows
// in one call where both are nvfp4 (write_kv_rows).

#define KVSIM_WRITE_ITEMS(SUFFIX, ATTR)                                                                   \
  ATTR void append_item_##SUFFIX(const KvPools& pools, const AppendPagedArgs& a, int64_t i, int32_t h,    \
                                 cpu_nvfp4::Rows rows) {                                                  \
    append_paged_token_head(pools, a, i, h, rows);                                                        \
  }                                                                                                       \
  ATTR void reshape_item_##SUFFIX(const KvPools& pools, const ReshapeAndCacheArgs& a, int64_t t, int32_t h) { \
    reshape_and_cache_token_head(pools, a, t, h);                                                         \
  }

KVSIM_WRITE_ITEMS(baseline, )
#if KVSIM_CPU_X86
KVSIM_CPU_TARGET_BEGIN(KVSIM_CPU_TARGET_AVX2)
KVSIM_WRITE_ITEMS(avx2, __attribute__((flatten)))
KVSIM_CPU_TARGET_END
KVSIM_CPU_TARGET_BEGIN(KVSIM_CPU_TARGET_AVX512)
KVSIM_WRITE_ITEMS(avx512, __attribute__((flatten)))
KVSIM_CPU_TARGET_END
#endif
#undef KVSIM_WRITE_ITEMS

template <class ItemFn>
ItemFn write_item_at(CpuIsa isa, ItemFn baseline, ItemFn avx2, ItemFn avx512) {
#if KVSIM_CPU_X86
  if (isa == CpuIsa::avx512) return avx512;
  if (isa == CpuIsa::avx2) return avx2;
#endif
  (void)isa, (void)avx2, (void)avx512;
  return baseline;
}

}  // namespace

void CpuBackend::run_append_paged(const KvPools& pools, const AppendPagedOp& op) {
  const AppendPagedArgs args = make_append_paged_args(pools, op);
  const int32_t heads = pools.geometry.kv_heads;
#if KVSIM_CPU_X86
  const auto item = write_item_at(isa_, &append_item_baseline, &append_item_avx2, &append_item_avx512);
#else
  const auto item = &append_item_baseline;
#endif
  const cpu_nvfp4::Rows rows{cpu_nvfp4::rows_at(isa_)};
  for_each_item(args.nnz * heads,
                [&](int64_t w) { item(pools, args, w / heads, static_cast<int32_t>(w % heads), rows); });
}

void CpuBackend::run_reshape_and_cache(const KvPools& pools, const ReshapeAndCacheOp& op) {
  const ReshapeAndCacheArgs args = make_reshape_and_cache_args(pools, op);
  const int32_t heads = pools.geometry.kv_heads;
#if KVSIM_CPU_X86
  const auto item = write_item_at(isa_, &reshape_item_baseline, &reshape_item_avx2, &reshape_item_avx512);
#else
  const auto item = &reshape_item_baseline;
#endif
  for_each_item(args.num_tokens * heads,
                [&](int64_t w) { item(pools, args, w / heads, static_cast<int32_t>(w % heads)); });
}

}  // namespace kvsim
