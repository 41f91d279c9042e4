// core's reference attention (attend_query_in_order, attend_mla_query)
// compiled a second time for AVX2 + FMA: the CPU backend's MLA attention, the
// mma order and KVSIM_CPU_ATTENTION=reference at the avx2 and avx512 ISAs.
// Each clone is an internal-linkage function with `flatten`, so core's inline
// functions are inlined into it and compiled with the FMA instruction; the
// out-of-line copies of core's functions this file may emit are defined
// before the pragma and stay baseline x86-64. fma is correctly rounded in the
// instruction and in glibc's fmaf: the same bytes as the baseline copies.
#include "backends/cpu/attention_fast.hpp"
#include "backends/cpu/cpu_target.hpp"

namespace kvsim::cpu_attention {
namespace {

void attend_query_baseline(const AttentionArgs& a, int32_t seq, int64_t position, int64_t row, int32_t kv_head,
                           float* scratch) {
  attend_query_in_order(a, seq, position, row, kv_head, scratch);
}

void attend_mla_baseline(const MlaAttentionArgs& a, int64_t row, int32_t head, float* scratch) {
  attend_mla_query(a, row, head, scratch);
}

#if KVSIM_CPU_X86
KVSIM_CPU_TARGET_BEGIN(KVSIM_CPU_TARGET_AVX2)

__attribute__((flatten)) void attend_query_fma(const AttentionArgs& a, int32_t seq, int64_t position, int64_t row,
                                               int32_t kv_head, float* scratch) {
  attend_query_in_order(a, seq, position, row, kv_head, scratch);
}

__attribute__((flatten)) void attend_mla_fma(const MlaAttentionArgs& a, int64_t row, int32_t head, float* scratch) {
  attend_mla_query(a, row, head, scratch);
}

KVSIM_CPU_TARGET_END
#endif

}  // namespace

AttendQueryFn attend_query_at(CpuIsa isa) {
#if KVSIM_CPU_X86
  if (isa != CpuIsa::portable) return &attend_query_fma;
#endif
  (void)isa;
  return &attend_query_baseline;
}

AttendMlaFn attend_mla_at(CpuIsa isa) {
#if KVSIM_CPU_X86
  if (isa != CpuIsa::portable) return &attend_mla_fma;
#endif
  (void)isa;
  return &attend_mla_baseline;
}

}  // namespace kvsim::cpu_attention
