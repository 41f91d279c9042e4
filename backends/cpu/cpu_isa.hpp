// The instruction sets of the CPU backend, chosen at run time. The library is
// compiled for baseline x86-64; AVX2 + FMA and AVX-512 code lives only in
// functions with target attributes (attention_avx2.cpp, attention_avx512.cpp,
// fma_clones.cpp), called after __builtin_cpu_supports has seen the features,
// so one binary runs on any x86-64. Every ISA gives the same bytes (fma is
// correctly rounded in the instruction and in glibc's fmaf; no flag of the
// build changes: -ffp-contract=off stays); only speed differs.
#pragma once

#include <cstdint>

namespace kvsim {

enum class CpuIsa : uint8_t {
  portable,  // baseline x86-64 (or any host): plain C++, fma() through glibc's fmaf
  avx2,      // AVX2 + FMA
  avx512,    // AVX-512F/BW/VL/DQ + AVX2 + FMA
};

const char* cpu_isa_name(CpuIsa isa);
// Whether this CPU runs the ISA (portable: always).
bool cpu_isa_supported(CpuIsa isa);
// The widest ISA this CPU runs.
CpuIsa best_cpu_isa();
// The ISA the CPU backend uses by default: best_cpu_isa(), or the one named by
// the environment variable KVSIM_CPU_ISA (portable, avx2, avx512) to force a
// lower one for testing and benchmarking. Throws ValidationError
// (bad_argument) for another value and BackendUnavailable for an ISA this
// CPU lacks; read once per process.
CpuIsa selected_cpu_isa();

}  // namespace kvsim
