// The reference backend: the floor every other backend is held to. Each op is
// a plain sequential loop over core's host/device work items (core/ops/*.hpp)
// in their natural order, one item at a time on the calling thread: no SIMD
// kernels, no threads, no whole-block shortcuts, attention through core's
// scalar attend_query (or the mma model, attend_query_mma) per (query row, KV
// head). It is slow on purpose: what it computes is only what core says.
// The fast CPU backend (tests/oracle/cpu_is_equivalent_to_ref_test.cpp) and
// CUDA (tests/cuda) are compared with it byte for byte.
#pragma once

#include "backends/host_memory_backend.hpp"

namespace kvsim {

// Host memory (HostMemoryBackend); the ops in reference_backend.cpp.
class ReferenceBackend final : public HostMemoryBackend {
 public:
  std::string_view name() const override { return "reference"; }
  std::unique_ptr<Backend> another() const override { return std::make_unique<ReferenceBackend>(); }

 protected:
  KVSIM_BACKEND_OP_OVERRIDES

 private:
  // offload (primary -> secondary) and onboard (secondary -> primary).
  static void move_blocks(const KvPools& pools, const MoveBlocksOp& op, PoolKind from);
};

}  // namespace kvsim
