// The oneTBB CPU backend: the oracle every other backend is held to. Each op
// runs core's work-item functions under tbb::parallel_for inside an arena of
// the requested thread count; every output byte has exactly one writer and
// every reduction runs inside one work item in core's canonical order, so
// results are identical for any thread count and from run to run.
#pragma once

#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <memory>
#include <optional>

#include "backends/backend.hpp"
#include "backends/cpu/cpu_isa.hpp"

namespace kvsim {

class CpuBackend final : public Backend {
 public:
  // The ISA is selected_cpu_isa() (KVSIM_CPU_ISA or the widest the CPU runs)
  // unless given (one the CPU runs; tests compare every ISA byte for byte).
  // Throws ValidationError / BackendUnavailable for a bad KVSIM_CPU_ISA or
  // KVSIM_CPU_ATTENTION, before anything is allocated.
  explicit CpuBackend(int threads = 0);
  CpuBackend(int threads, CpuIsa isa);
  std::string_view name() const override { return "cpu"; }
  int threads() const { return arena_.max_concurrency(); }
  CpuIsa isa() const { return isa_; }
  std::unique_ptr<Backend> another() const override { return std::make_unique<CpuBackend>(requested_threads_, isa_); }

  void* allocate(size_t bytes) override;
  void release(void* p) noexcept override;
  void to_backend(void* dst, const void* host_src, size_t bytes) override;
  void to_host(void* host_dst, const void* src, size_t bytes) override;
  void fill(void* dst, uint8_t byte, size_t bytes) override;

  // Runs body(w) for w in [0, items) on the arena's threads (independent
  // work items: any split gives the same bytes).
  // item_bytes (optional): the bytes one item moves; an op that moves less
  // than kInlineBytes in all runs on the calling thread, where waking the
  // arena would cost more than the copy (partial_copy's 32 KiB ops).
  static constexpr int64_t kInlineBytes = 64 << 10;
  template <class Body>
  void for_each_item(int64_t items, const Body& body, int64_t item_bytes = 0) {
    if (items <= 0) return;
    if (item_bytes > 0 && items <= kInlineBytes / item_bytes) {
      for (int64_t w = 0; w < items; ++w) body(w);
      return;
    }
    arena_.execute([&] {
      tbb::parallel_for(tbb::blocked_range<int64_t>(0, items), [&](const tbb::blocked_range<int64_t>& r) {
        for (int64_t w = r.begin(); w < r.end(); ++w) body(w);
      });
    });
  }

 protected:
  KVSIM_BACKEND_OP_OVERRIDES
  void run_copy(void* dst, const void* src, size_t bytes) override;  // parallel memcpy in the arena
  void run_fma_probe(float* out, int64_t lanes, int32_t steps) override;  // lanes spread over the arena

 private:
  // offload (primary -> secondary) and onboard (secondary -> primary).
  void move_blocks(const KvPools& pools, const MoveBlocksOp& op, bool to_secondary);
  // oneTBB caps workers at the core count; a request for more threads than
  // cores (e.g. 3 on a 2-core CI machine) raises the cap so the requested
  // concurrency is real and the thread-count determinism tests mean something.
  int requested_threads_;  // the constructor's (0: every core)
  CpuIsa isa_;
  bool reference_attention_;  // KVSIM_CPU_ATTENTION=reference
  std::optional<tbb::global_control> allow_oversubscription_;
  tbb::task_arena arena_;
};

}  // namespace kvsim
