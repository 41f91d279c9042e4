// The portable kernels (attention_portable_kernels.inc) for baseline x86-64 or
// any other host: fma() is glibc's correctly rounded fmaf where the baseline
// has no FMA instruction.
#include "backends/cpu/attention_portable_kernels.inc"

namespace kvsim::cpu_attention {

const Kernels& portable_kernels() { return kPortableKernels; }

}  // namespace kvsim::cpu_attention
