// CudaBackend: memory, per-op uploads, block moves, attention entry points
// and the factory the registry calls. The op kernels live in write_ops.cu,
// read_copy_ops.cu and qkv_preprocess.cu.
#include "backends/cuda/cuda_backend.hpp"

#include <cstring>
#include <string>

#include "backends/cuda/attention_kernels.hpp"
#include "backends/cuda/cuda_factory.hpp"
#include "backends/cuda/launch.cuh"

namespace kvsim {

namespace {
constexpr size_t kUploadAlign = 16;
size_t align_up(size_t n) { return (n + kUploadAlign - 1) / kUploadAlign * kUploadAlign; }
}  // namespace

CudaBackend::CudaBackend(int device) : device_(device) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0)
    throw BackendUnavailable(std::string("no CUDA device (cudaGetDeviceCount: ") +
                             (e == cudaSuccess ? "0 devices" : cudaGetErrorString(e)) + ")");
  if (device < 0 || device >= count)
    throw BackendUnavailable("no CUDA device " + std::to_string(device) + " (" + std::to_string(count) + " present)");
  KVSIM_CUDA_CHECK("init", cudaSetDevice(device_));
  KVSIM_CUDA_CHECK("init", cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  KVSIM_CUDA_CHECK("init", cudaEventCreate(&kernels_start_));
  KVSIM_CUDA_CHECK("init", cudaEventCreate(&kernels_stop_));
  // Per-op buffers come from the device's stream-ordered pool and go back to
  // it on release: a replay makes and drops several a step, and cudaMalloc /
  // cudaFree (which waits for the whole device) cost more than the small ops
  // they serve. The pool keeps what it was given (no release threshold);
  // memory_info() trims it first, so free memory is reported as before.
  KVSIM_CUDA_CHECK("init", cudaDeviceGetDefaultMemPool(&mem_pool_, device_));
  uint64_t keep = UINT64_MAX;
  KVSIM_CUDA_CHECK("init", cudaMemPoolSetAttribute(mem_pool_, cudaMemPoolAttrReleaseThreshold, &keep));
}

CudaBackend::~CudaBackend() {
  cudaStreamSynchronize(stream_);
  cudaMemPoolTrimTo(mem_pool_, 0);
  if (scratch_) cudaFree(scratch_);
  if (staging_) cudaFreeHost(staging_);
  for (const void* p : pinned_) cudaFreeHost(const_cast<void*>(p));
  cudaEventDestroy(kernels_start_);
  cudaEventDestroy(kernels_stop_);
  cudaStreamDestroy(stream_);
}

Backend::MemoryInfo CudaBackend::memory_info() const {
  MemoryInfo m;
  size_t free_bytes = 0, total_bytes = 0;
  KVSIM_CUDA_CHECK("memory_info", cudaStreamSynchronize(stream_));
  KVSIM_CUDA_CHECK("memory_info", cudaMemPoolTrimTo(mem_pool_, 0));  // what the pool keeps is free to a new run
  KVSIM_CUDA_CHECK("memory_info", cudaMemGetInfo(&free_bytes, &total_bytes));
  m.backend_free = static_cast<int64_t>(free_bytes);
  m.host_free = host_free_memory();
  m.backend_is_host = false;
  return m;
}

// Stream-ordered: the buffer is usable by work on stream_ and by the host
// after the next synchronization (every op and transfer synchronizes).
void* CudaBackend::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  KVSIM_CUDA_CHECK("allocate", cudaMallocAsync(&p, bytes, stream_));
  KVSIM_CUDA_CHECK("allocate", cudaStreamSynchronize(stream_));
  return p;
}

void* CudaBackend::allocate_pool_memory(size_t bytes, PoolKind kind) {
  if (bytes == 0) return nullptr;
  if (kind == PoolKind::primary) {  // a pool lives as long as its replay: its own cudaMalloc, outside the op pool
    void* p = nullptr;
    KVSIM_CUDA_CHECK("allocate pool", cudaMalloc(&p, bytes));
    device_pools_.insert(p);
    return p;
  }
  // Host memory the DMA engines reach directly (and kernels through UVA).
  void* p = nullptr;
  KVSIM_CUDA_CHECK("allocate secondary pool", cudaMallocHost(&p, bytes));
  pinned_.insert(p);
  return p;
}

bool CudaBackend::is_pinned(const void* p) const { return pinned_.count(p) != 0; }

void CudaBackend::release(void* p) noexcept {
  if (!p) return;
  if (pinned_.erase(p)) {
    cudaStreamSynchronize(stream_);
    cudaFreeHost(p);
  } else if (device_pools_.erase(p)) {
    cudaStreamSynchronize(stream_);
    cudaFree(p);
  } else {
    cudaFreeAsync(p, stream_);  // back to the pool once the stream's work before it is done
  }
}

// Copies go on the backend's own stream and are waited for: a plain
// cudaMemcpy from pageable memory may return before its DMA lands, and the
// legacy stream it uses does not order a non-blocking stream's kernels after
// it (a kernel then raced the upload of its own inputs). cudaMemcpyDefault:
// UVA tells device memory from (pinned or pageable) host memory.
void CudaBackend::to_backend(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  KVSIM_CUDA_CHECK("to_backend", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
  KVSIM_CUDA_CHECK("to_backend", cudaStreamSynchronize(stream_));
}

void CudaBackend::to_host(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  KVSIM_CUDA_CHECK("to_host", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
  KVSIM_CUDA_CHECK("to_host", cudaStreamSynchronize(stream_));
}

void CudaBackend::fill(void* dst, uint8_t byte, size_t bytes) {
  if (bytes == 0) return;
  KVSIM_CUDA_CHECK("fill", cudaStreamSynchronize(stream_));
  // A pointer inside a pinned allocation is host memory: fill it on the host.
  cudaPointerAttributes attr{};
  KVSIM_CUDA_CHECK("fill", cudaPointerGetAttributes(&attr, dst));
  if (attr.type == cudaMemoryTypeHost) {
    std::memset(dst, byte, bytes);
    return;
  }
  KVSIM_CUDA_CHECK("fill", cudaMemsetAsync(dst, byte, bytes, stream_));
  KVSIM_CUDA_CHECK("fill", cudaStreamSynchronize(stream_));
}

void CudaBackend::synchronize() { KVSIM_CUDA_CHECK("synchronize", cudaStreamSynchronize(stream_)); }

void CudaBackend::wait_for_device() {
  KVSIM_CUDA_CHECK("wait_for_device", cudaSetDevice(device_));
  KVSIM_CUDA_CHECK("wait_for_device", cudaDeviceSynchronize());
}

std::vector<const void*> CudaBackend::upload(const char* op, std::span<const HostArray> arrays) {
  size_t total = 0;
  for (const HostArray& a : arrays) total += align_up(a.bytes);
  std::vector<const void*> out;
  out.reserve(arrays.size());
  if (total == 0) {
    out.assign(arrays.size(), nullptr);
    return out;
  }
  // The previous op has finished (finish() synchronizes), so both buffers are free.
  if (total > scratch_bytes_) {
    if (scratch_) KVSIM_CUDA_CHECK(op, cudaFree(scratch_));
    if (staging_) KVSIM_CUDA_CHECK(op, cudaFreeHost(staging_));
    scratch_ = staging_ = nullptr;
    scratch_bytes_ = staging_bytes_ = 0;
    const size_t bytes = std::max<size_t>(total, 1 << 16) * 2;
    KVSIM_CUDA_CHECK(op, cudaMalloc(&scratch_, bytes));
    KVSIM_CUDA_CHECK(op, cudaMallocHost(&staging_, bytes));
    scratch_bytes_ = staging_bytes_ = bytes;
  }
  size_t at = 0;
  for (const HostArray& a : arrays) {
    if (a.bytes == 0) {
      out.push_back(nullptr);
      continue;
    }
    std::memcpy(static_cast<uint8_t*>(staging_) + at, a.data, a.bytes);
    out.push_back(static_cast<const uint8_t*>(scratch_) + at);
    at += align_up(a.bytes);
  }
  KVSIM_CUDA_CHECK(op, cudaMemcpyAsync(scratch_, staging_, at, cudaMemcpyHostToDevice, stream_));
  return out;
}

void CudaBackend::finish(const char* op) {
  cuda::check_launch(op, "op", stream_);
  if (kernel_timing()) {
    KVSIM_CUDA_CHECK(op, cudaEventRecord(kernels_stop_, stream_));
    timing_stopped_ = true;
  }
  KVSIM_CUDA_CHECK(op, cudaStreamSynchronize(stream_));
}

// Kernel timing: the start event is recorded when the op begins and again
// after its uploads (begin_kernels), the stop event in finish(). An op that
// launched nothing (empty) reports its host time.
void CudaBackend::begin_kernels() {
  if (kernel_timing()) KVSIM_CUDA_CHECK("timing", cudaEventRecord(kernels_start_, stream_));
}

void CudaBackend::run_begin() {
  timing_stopped_ = false;
  begin_kernels();
}

double CudaBackend::run_end(double host_seconds) {
  if (!timing_stopped_) return host_seconds;
  float ms = 0.0f;
  KVSIM_CUDA_CHECK("timing", cudaEventElapsedTime(&ms, kernels_start_, kernels_stop_));
  return static_cast<double>(ms) * 1e-3;
}

// ---------------------------------------------------------------- attention (attention.cu)
void CudaBackend::run_decode_attention(const KvPools& pools, const DecodeAttentionOp& op) {
  cuda::decode_attention(pools, op, stream_, kernel_timing() ? kernels_start_ : nullptr);
  finish("decode_attention");
}

void CudaBackend::run_prefill_attention(const KvPools& pools, const PrefillAttentionOp& op) {
  cuda::prefill_attention(pools, op, stream_, kernel_timing() ? kernels_start_ : nullptr);
  finish("prefill_attention");
}

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions&) { return std::make_unique<CudaBackend>(0); }

}  // namespace kvsim
