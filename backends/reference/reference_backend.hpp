// The reference backend: the floor every other backend is held to. Each op is
// a plain sequential loop over core's host/device work items (core/ops/*.hpp)
// in their natural order, one item at a time on the calling thread: no SIMD
// kernels, no threads, no whole-block shortcuts, attention through core's
// scalar attend_query (or the mma model, attend_query_mma) per (query row, KV
// head). It is slow on purpose: what it computes is only what core says.
// The fast CPU backend (tests/oracle/cpu_is_equivalent_to_ref_test.cpp) and
// CUDA (tests/cuda) are compared with it byte for byte.
#pragma once

#include "backends/backend.hpp"

namespace kvsim {

class ReferenceBackend final : public Backend {
 public:
  std::string_view name() const override { return "reference"; }

  // Host memory, 64-byte aligned like the other backends' allocations.
  void* allocate(size_t bytes) override;
  void release(void* p) noexcept override;
  void to_backend(void* dst, const void* host_src, size_t bytes) override;
  void to_host(void* host_dst, const void* src, size_t bytes) override;
  void fill(void* dst, uint8_t byte, size_t bytes) override;

 protected:
  KVSIM_BACKEND_OP_OVERRIDES
  void run_copy(void* dst, const void* src, size_t bytes) override;  // one memcpy

 private:
  // offload (primary -> secondary) and onboard (secondary -> primary).
  static void move_blocks(const KvPools& pools, const MoveBlocksOp& op, PoolKind from);
};

}  // namespace kvsim
