// The one backend interface that sim/ drives. A backend owns memory (pools,
// tensors) and runs the ops of contract §5 on descriptors core defines. Every op
// entry point here validates on the host first (validation/'s validate_* functions)
// and only then calls the backend's implementation, so a rejected op leaves
// every pool unchanged on every backend. Backends know nothing of scenarios.
#pragma once

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "backends/op_list.hpp"
#include "kvsim/validation/errors.hpp"  // the entry points throw ValidationError

namespace kvsim {

// The memory part of the Backend interface below, declared as overrides by a
// backend that implements all of it out of line (cuda, differential), as
// KVSIM_BACKEND_OP_OVERRIDES declares the ops.
#define KVSIM_BACKEND_MEMORY_OVERRIDES                                          \
  void* allocate(size_t bytes) override;                                        \
  void* allocate_pool_memory(size_t bytes, PoolKind kind) override;             \
  void release(void* p) noexcept override;                                      \
  void to_backend(void* dst, const void* host_src, size_t bytes) override;      \
  void to_host(void* host_dst, const void* src, size_t bytes) override;         \
  void fill(void* dst, uint8_t byte, size_t bytes) override;                    \
  void synchronize() override;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  // ---- memory: pointers returned live in this backend's address space
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* p) noexcept = 0;
  virtual void to_backend(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void fill(void* dst, uint8_t byte, size_t bytes) = 0;
  virtual void synchronize() {}
  // Waits for all work queued on this backend's device by anyone, the
  // caller's streams included (cuda: cudaDeviceSynchronize): before an op on
  // memory another library just wrote (the Python module, PyTorch tensors).
  virtual void wait_for_device() {}
  // Free memory now, in bytes: where allocate() draws from, and the host's
  // (the smaller of MemAvailable and what `ulimit -v` leaves). A host
  // backend's allocations are host memory: backend_is_host.
  struct MemoryInfo {
    int64_t backend_free = 0;
    int64_t host_free = 0;
    bool backend_is_host = true;
  };
  virtual MemoryInfo memory_info() const;
  // A second, independent instance of this backend (its own memory and
  // state, the same settings), for runs made at once on other threads (a
  // small scenario's comparison runs, sim/lib/replay.cpp); nullptr where runs
  // must share this one (a device, the differential pair).
  virtual std::unique_ptr<Backend> another() const { return nullptr; }
  // Memory for one pool of allocate_pools(), freed with release(). A backend
  // may place a pool kind elsewhere (cuda: the secondary pool in pinned host
  // memory, so offload/onboard are real host<->device copies).
  virtual void* allocate_pool_memory(size_t bytes, PoolKind kind) {
    (void)kind;
    return allocate(bytes);
  }

  // Data and nvfp4 scale pools for both pool kinds, contiguous strides,
  // filled with `fill_byte`. Validates the geometry first.
  KvPools allocate_pools(const PoolGeometry& g, uint8_t fill_byte = 0);
  void release_pools(KvPools& pools) noexcept;

  // ---- ops (validate, then run): one entry point per op of the op list
  // (op_list.hpp), e.g. append_paged(pools, op), indexer_k_scatter(op).
#define KVSIM_DECLARE_ENTRY_POINT(name, Op, validate, form, impl) void name(KVSIM_OP_PARAMS(Op, form));
  KVSIM_OPS(KVSIM_DECLARE_ENTRY_POINT)
#undef KVSIM_DECLARE_ENTRY_POINT

  // A plain copy of `bytes` between two buffers of this backend (the ceiling
  // kvsim bench quotes every op against: memcpy on the CPU, a device-to-device
  // cudaMemcpy on CUDA). Timed like an op.
  void copy(void* dst, const void* src, size_t bytes);

  // The FMA ceiling (kvsim bench's fma_throughput row): `lanes` x
  // canon::kFmaProbeChains independent fp32 chains x = fma(x, a, b) of
  // `steps` rounds each (core's attention_math.hpp); out (this backend's
  // memory) receives lane-major final values. Timed like an op.
  void fma_probe(float* out, int64_t lanes, int32_t steps);

  // ---- timing (kvsim bench). With kernel timing on, every op records the
  // seconds its backend work took, without host validation and index uploads:
  // the CPU times run_* on the host clock, CUDA brackets the op's kernels
  // with CUDA events. Off by default (events cost a little).
  virtual void set_kernel_timing(bool on) { kernel_timing_ = on; }
  bool kernel_timing() const { return kernel_timing_; }
  double last_kernel_seconds() const { return last_kernel_seconds_; }

 protected:
  // Hooks around every run_* (and copy): a device backend starts its clock in
  // run_begin (and again after its uploads), and returns its device time from
  // run_end; the default returns the host time of run_*.
  virtual void run_begin() {}
  virtual double run_end(double host_seconds) { return host_seconds; }
  // Default: through a host buffer (correct, slow); cpu and cuda override it.
  virtual void run_copy(void* dst, const void* src, size_t bytes);
  // Default: on the host, then copied to out; cpu and cuda override it.
  virtual void run_fma_probe(float* out, int64_t lanes, int32_t steps);

  // Each op's implementation: run_<name>, with the entry point's parameters.
#define KVSIM_DECLARE_RUN(name, Op, validate, form, impl) virtual void run_##name(KVSIM_OP_PARAMS(Op, form)) = 0;
  KVSIM_OPS(KVSIM_DECLARE_RUN)
#undef KVSIM_DECLARE_RUN

 private:
  template <class Run>
  void timed(const Run& run);
  bool kernel_timing_ = false;
  double last_kernel_seconds_ = 0.0;
};

// Calls op `id`'s entry point on `b` (a tensors-form op ignores `pools`):
// generic code over the op list (the differential and test backends).
template <OpId id>
void call_op(Backend& b, const KvPools& pools, const OpOf<id>& op);
#define KVSIM_CALL_ENTRY_pools(name) b.name(pools, op)
#define KVSIM_CALL_ENTRY_tensors(name) ((void)pools, b.name(op))
#define KVSIM_DEFINE_CALL_OP(name, Op, validate, form, impl)                       \
  template <>                                                                \
  inline void call_op<OpId::name>(Backend & b, const KvPools& pools, const Op& op) { \
    KVSIM_CALL_ENTRY_##form(name);                                           \
  }
KVSIM_OPS(KVSIM_DEFINE_CALL_OP)
#undef KVSIM_DEFINE_CALL_OP
#undef KVSIM_CALL_ENTRY_pools
#undef KVSIM_CALL_ENTRY_tensors

// Backend memory that frees itself.
class BackendBuffer {
 public:
  BackendBuffer() = default;
  BackendBuffer(Backend& b, size_t bytes) : backend_(&b), bytes_(bytes), ptr_(bytes ? b.allocate(bytes) : nullptr) {}
  ~BackendBuffer() { reset(); }
  BackendBuffer(BackendBuffer&& o) noexcept { *this = std::move(o); }
  BackendBuffer& operator=(BackendBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      backend_ = o.backend_;
      bytes_ = o.bytes_;
      ptr_ = o.ptr_;
      o.ptr_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;

  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  void upload(const void* host, size_t n) { backend_->to_backend(ptr_, host, n); }
  void download(void* host, size_t n) const { backend_->to_host(host, ptr_, n); }
  void reset() noexcept {
    if (ptr_ && backend_) backend_->release(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }

 private:
  Backend* backend_ = nullptr;
  size_t bytes_ = 0;
  void* ptr_ = nullptr;
};

// Free host memory: /proc/meminfo's MemAvailable, capped by what RLIMIT_AS
// (`ulimit -v`) leaves above this process's current address space.
int64_t host_free_memory();

// ---- registry: selecting a backend by name goes through here only.
struct BackendOptions {
  int threads = 0;  // cpu: oneTBB max concurrency (0 = all cores)
};

class BackendUnavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A backend's runtime failed while running a validated op (a CUDA launch or
// copy error, device memory exhausted). The message names the backend and the
// op: "cuda: decode_attention: cudaErrorIllegalAddress: ...". Not a
// validation error: the inputs were accepted; the pools may be in any state.
class BackendError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::vector<std::string> backend_names();  // compiled-in backends
std::unique_ptr<Backend> make_backend(std::string_view name, const BackendOptions& options = {});

}  // namespace kvsim
