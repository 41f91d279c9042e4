// kvsim core configuration: the one place that decides how a core function is
// compiled for host and device. core/ is header-only and knows nothing of TBB,
// CUDA runtime APIs, TOML or the CLI; a .cu file that includes it gets device
// versions of every KVSIM_HD function for free.
#pragma once

#include <cstdint>

// KVSIM_UNROLL: unroll a loop with a constant trip bound on the device, so a
// small local array indexed by it lives in registers (the host ignores it).
#if defined(__CUDA_ARCH__)
#define KVSIM_UNROLL _Pragma("unroll")
#else
#define KVSIM_UNROLL
#endif

#if defined(__CUDACC__)
#define KVSIM_HD __host__ __device__
#define KVSIM_FORCEINLINE __forceinline__
// Before a host/device template that host code instantiates with a host-only
// callable (a lambda): nvcc then checks the execution space per instantiation
// instead of warning about the host one.
#define KVSIM_HD_TEMPLATE _Pragma("nv_exec_check_disable")
#else
#define KVSIM_HD
#define KVSIM_FORCEINLINE inline
#define KVSIM_HD_TEMPLATE
#endif

// Exactness guard (contract §1): fast-math would let the compiler reassociate and
// contract the canonical order, so refuse to build under it.
#if defined(__FAST_MATH__)
#error "kvsim must not be compiled with -ffast-math: outputs must be bit-exact"
#endif

namespace kvsim {

inline constexpr const char* kVersion = "0.1.0";

}  // namespace kvsim
