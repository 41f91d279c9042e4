// Target regions of the CPU backend's runtime dispatch (cpu_isa.hpp): code
// between KVSIM_CPU_TARGET_BEGIN_* and KVSIM_CPU_TARGET_END is compiled for
// that instruction set and may only be called where the CPU runs it. Include
// every header before BEGIN and define only internal-linkage functions inside,
// so no inline function shared with other files is emitted with wide code
// (tests/CMakeLists.txt's arch.isa_confinement checks the library).
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVSIM_CPU_X86 1
#define KVSIM_CPU_PRAGMA_(...) _Pragma(#__VA_ARGS__)
#if defined(__clang__)
#define KVSIM_CPU_TARGET_BEGIN(ISA) KVSIM_CPU_PRAGMA_(clang attribute push(__attribute__((target(ISA))), apply_to = function))
#define KVSIM_CPU_TARGET_END _Pragma("clang attribute pop")
#else
#define KVSIM_CPU_TARGET_BEGIN(ISA) _Pragma("GCC push_options") KVSIM_CPU_PRAGMA_(GCC target(ISA))
#define KVSIM_CPU_TARGET_END _Pragma("GCC pop_options")
#endif
#else
#define KVSIM_CPU_X86 0
#endif

// The feature lists of cpu_isa.hpp's avx2 and avx512.
#define KVSIM_CPU_TARGET_AVX2 "avx2,fma"
#define KVSIM_CPU_TARGET_AVX512 "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma"
