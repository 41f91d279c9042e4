// core's reference attention (attend_query_in_order, attend_mla_query)
// compiled a second time for AVX2 + FMA: the CPU backend's MLA attention, the
// mma order and KVSIM_CPU_ATTENTION=reference at the avx2 and avx512 ISAs.
// Each clone is an internal-linkage function with `flatten`, so core's inline
// functions are inlined into it and compiled with the FMA instruction; the
// out-of-line copies of core's functions this file may emit are defined
// before the pragma and stay baseline x86-64. fma is correctly rounded in the
// instruction and in glibc's fmaf: the same bytes as the baseline copies.
#include "backends/cpu/attention_fast.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVSIM_CPU_FMA_CLONES 1
#else
#define KVSIM_CPU_FMA_CLONES 0
#endif

namespace kvsim::cpu_attention {
namespace {

void attend_query_baseline(const AttentionArgs& a, int32_t seq, int64_t position, int64_t row, int32_t kv_head,
                           float* scratch) {
  attend_query_in_order(a, seq, position, row, kv_head, scratch);
}

void attend_mla_baseline(const MlaAttentionArgs& a, int64_t row, int32_t head, float* scratch) {
  attend_mla_query(a, row, head, scratch);
}

#if KVSIM_CPU_FMA_CLONES
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

__attribute__((flatten)) void attend_query_fma(const AttentionArgs& a, int32_t seq, int64_t position, int64_t row,
                                               int32_t kv_head, float* scratch) {
  attend_query_in_order(a, seq, position, row, kv_head, scratch);
}

__attribute__((flatten)) void attend_mla_fma(const MlaAttentionArgs& a, int64_t row, int32_t head, float* scratch) {
  attend_mla_query(a, row, head, scratch);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

}  // namespace

AttendQueryFn attend_query_at(CpuIsa isa) {
#if KVSIM_CPU_FMA_CLONES
  if (isa != CpuIsa::portable) return &attend_query_fma;
#endif
  (void)isa;
  return &attend_query_baseline;
}

AttendMlaFn attend_mla_at(CpuIsa isa) {
#if KVSIM_CPU_FMA_CLONES
  if (isa != CpuIsa::portable) return &attend_mla_fma;
#endif
  (void)isa;
  return &attend_mla_baseline;
}

}  // namespace kvsim::cpu_attention
