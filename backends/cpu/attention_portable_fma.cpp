// The portable kernels (attention_portable_kernels.inc) compiled for AVX2 +
// FMA: the fallback of the avx2 and avx512 ISAs for head dims their SIMD
// kernels do not take, called only where the CPU runs AVX2 and FMA. fma() is
// the FMA instruction here, glibc's fmaf in the baseline copy: both correctly
// rounded, so the bytes are the same. Every header is included before the
// target pragma: only this file's internal-linkage functions get AVX2 code.
#include <cstring>

#include "backends/cpu/attention_fast.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

#include "backends/cpu/attention_portable_kernels.inc"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace kvsim::cpu_attention {
const Kernels& portable_fma_kernels() { return kPortableKernels; }
}  // namespace kvsim::cpu_attention

#else  // no AVX2 on this host: the baseline copy

namespace kvsim::cpu_attention {
const Kernels& portable_fma_kernels() { return portable_kernels(); }
}  // namespace kvsim::cpu_attention

#endif
