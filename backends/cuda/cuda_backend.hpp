// The CUDA backend: every op of contract §5 as kernels that call core's KVSIM_HD
// work-item functions (core/ops/*.hpp), one thread per work item, so each
// output byte is computed by the same function, in the same order, as the
// CPU oracle (backends/cpu). Memory:
//   * pools and scale pools: device memory (cudaMalloc); tensors and per-op
//     buffers: the device's stream-ordered pool (cudaMallocAsync), which
//     keeps freed memory for the next buffer;
//   * the secondary pool: pinned host memory (cudaMallocHost), so offload /
//     onboard are real asynchronous host<->device copies;
//   * an op's host index arrays (page tables, slot mappings, coordinates) are
//     packed into one pinned staging buffer and uploaded per op.
// Every op runs on the backend's stream and synchronizes before returning, so
// the per-op scratch is reused safely and errors surface in the op that
// caused them (BackendError naming the op).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <initializer_list>
#include <span>
#include <unordered_set>
#include <vector>

#include "backends/backend.hpp"
#include "backends/cuda/cuda_check.hpp"

namespace kvsim {

class CudaBackend final : public Backend {
 public:
  // Throws BackendUnavailable when there is no usable CUDA device.
  explicit CudaBackend(int device = 0);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string_view name() const override { return "cuda"; }
  KVSIM_BACKEND_MEMORY_OVERRIDES
  void wait_for_device() override;
  MemoryInfo memory_info() const override;  // cudaMemGetInfo's free device memory

  cudaStream_t stream() const { return stream_; }

  // One host array an op needs on the device.
  struct HostArray {
    const void* data;
    size_t bytes;
    template <class T>
    HostArray(std::span<const T> s) : data(s.data()), bytes(s.size_bytes()) {}
    template <class T>
    HostArray(const std::vector<T>& v) : data(v.data()), bytes(v.size() * sizeof(T)) {}
  };
  // Packs the arrays into the staging buffer and copies them to the device
  // scratch in one transfer; returns their device addresses (nullptr for an
  // empty array). Valid until the next upload; the host arrays may be reused
  // as soon as it returns.
  std::vector<const void*> upload(const char* op, std::span<const HostArray> arrays);
  std::vector<const void*> upload(const char* op, std::initializer_list<HostArray> arrays) {
    return upload(op, std::span<const HostArray>(arrays.begin(), arrays.size()));
  }
  // Waits for the op's work and turns any asynchronous failure into a
  // BackendError naming the op.
  void finish(const char* op);
  // Marks where an op's kernels start on the stream (after its uploads): with
  // kernel timing on, the op's device time runs from here to finish().
  void begin_kernels();

 protected:
  KVSIM_BACKEND_OP_OVERRIDES
  void run_copy(void* dst, const void* src, size_t bytes) override;  // device to device
  void run_fma_probe(float* out, int64_t lanes, int32_t steps) override;  // one thread per lane
  void run_begin() override;
  double run_end(double host_seconds) override;

 private:
  // offload (primary -> secondary) and onboard (secondary -> primary).
  void move_blocks(const KvPools& pools, const MoveBlocksOp& op, bool to_secondary);
  bool is_pinned(const void* p) const;

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  std::unordered_set<const void*> pinned_;  // secondary pools (cudaMallocHost)
  std::unordered_set<const void*> device_pools_;  // primary pools (cudaMalloc); other buffers: mem_pool_
  cudaMemPool_t mem_pool_ = nullptr;             // the device's default stream-ordered pool
  void* scratch_ = nullptr;                 // device side of upload()
  size_t scratch_bytes_ = 0;
  void* staging_ = nullptr;                 // pinned host side of upload()
  size_t staging_bytes_ = 0;
  cudaEvent_t kernels_start_ = nullptr;  // kernel timing (kvsim bench)
  cudaEvent_t kernels_stop_ = nullptr;
  bool timing_stopped_ = false;
};

}  // namespace kvsim
