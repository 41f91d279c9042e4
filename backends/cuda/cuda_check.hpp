// Every CUDA call and launch in backends/cuda is checked; a failure becomes a
// kvsim::BackendError naming the backend, the op and the CUDA error:
//   "cuda: decode_attention: cudaErrorIllegalAddress: an illegal memory access ..."
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "backends/backend.hpp"

namespace kvsim::cuda {

[[noreturn]] inline void throw_cuda_error(const char* op, cudaError_t e, const char* what) {
  throw BackendError(std::string("cuda: ") + op + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e) +
                     " (" + what + ")");
}

inline void check(cudaError_t e, const char* op, const char* what) {
  if (e != cudaSuccess) throw_cuda_error(op, e, what);
}

// After a kernel launch: the launch itself (bad configuration) and, when
// `sync` is set, its execution.
inline void check_launch(const char* op, const char* kernel, cudaStream_t stream = nullptr, bool sync = false) {
  check(cudaGetLastError(), op, kernel);
  if (sync) check(cudaStreamSynchronize(stream), op, kernel);
}

// Streaming multiprocessors of the current device (grids sized to fill it).
inline int device_sm_count(const char* op) {
  int device = 0, sms = 0;
  check(cudaGetDevice(&device), op, "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), op, "cudaDeviceGetAttribute");
  return sms > 0 ? sms : 1;
}

}  // namespace kvsim::cuda

#define KVSIM_CUDA_CHECK(op, expr) ::kvsim::cuda::check((expr), (op), #expr)
