// The portable kernels (attention_portable_kernels.inc) compiled for AVX2 +
// FMA: the fallback of the avx2 and avx512 ISAs for head dims their SIMD
// kernels do not take, called only where the CPU runs AVX2 and FMA. fma() is
// the FMA instruction here, glibc's fmaf in the baseline copy: both correctly
// rounded, so the bytes are the same. Every header is included before the
// target pragma: only this file's internal-linkage functions get AVX2 code.
#include <cstring>

#include "backends/cpu/attention_fast.hpp"
#include "backends/cpu/cpu_target.hpp"

#if KVSIM_CPU_X86

KVSIM_CPU_TARGET_BEGIN(KVSIM_CPU_TARGET_AVX2)

#include "backends/cpu/attention_portable_kernels.inc"

KVSIM_CPU_TARGET_END

namespace kvsim::cpu_attention {
const Kernels& portable_fma_kernels() { return kPortableKernels; }
}  // namespace kvsim::cpu_attention

#else  // no AVX2 on this host: the baseline copy

namespace kvsim::cpu_attention {
const Kernels& portable_fma_kernels() { return portable_kernels(); }
}  // namespace kvsim::cpu_attention

#endif
