// The one way a device test skips where no GPU is present: it prints
// "SKIPPED (differential test needs a GPU): WHY" (CTest's skip regex) and
// returns, so the test passes on machines without a device and runs on the
// GPU machine.
#pragma once

#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

namespace kvsim::test {

inline bool gpu_present(std::string& why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    why = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(e);
    return false;
  }
  if (n == 0) {
    why = "no CUDA device";
    return false;
  }
  return true;
}

}  // namespace kvsim::test

#define SKIP_WITHOUT_GPU()                                                         \
  do {                                                                             \
    std::string why_;                                                              \
    if (!::kvsim::test::gpu_present(why_)) {                                       \
      MESSAGE("SKIPPED (differential test needs a GPU): " << why_);                \
      std::printf("SKIPPED (differential test needs a GPU): %s\n", why_.c_str()); \
      return;                                                                      \
    }                                                                              \
  } while (0)
