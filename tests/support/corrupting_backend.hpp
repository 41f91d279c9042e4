// A test double for the checks that must catch a wrong backend: the CPU
// oracle, except that after every op named `corrupt_op` it flips the bits of
// one byte (of the primary pool or of the op's output). Used by
// tests/oracle/differential_backend_test and tests/bench/bench_check_test.
#pragma once

#include <string>

#include "backends/cpu/cpu_backend.hpp"

namespace kvsim::testing {

// pool_byte: a byte of the primary pool; out_byte: a byte of the op's output
// tensor (gather_paged, attention, qkv's q_out, indexer's cache). At most
// `corruptions` ops are corrupted (an op run twice would flip the byte back).
class CorruptingBackend final : public Backend {
 public:
  std::string corrupt_op;
  int64_t pool_byte = -1;
  int64_t out_byte = -1;
  int corruptions = 1 << 30;

  std::string_view name() const override { return "corrupting-cpu"; }
  void* allocate(size_t bytes) override { return cpu_.allocate(bytes); }
  void release(void* p) noexcept override { cpu_.release(p); }
  void to_backend(void* dst, const void* src, size_t bytes) override { cpu_.to_backend(dst, src, bytes); }
  void to_host(void* dst, const void* src, size_t bytes) override { cpu_.to_host(dst, src, bytes); }
  void fill(void* dst, uint8_t byte, size_t bytes) override { cpu_.fill(dst, byte, bytes); }

 protected:
  void corrupt(std::string_view op, const KvPools* pools, const TensorView* out) {
    if (corrupt_op != op || corruptions <= 0) return;
    --corruptions;
    if (pools && pool_byte >= 0) pools->bytes(PoolKind::primary)[pool_byte] ^= 0xFF;
    if (out && out_byte >= 0) static_cast<uint8_t*>(out->data)[out_byte] ^= 0xFF;
  }
  // After op `id`, its primary pool (if it writes a pool) and its first
  // written tensor (op_list.hpp's traits).
  template <OpId id>
  void run_then_corrupt(const KvPools& p, const OpOf<id>& o) {
    call_op<id>(cpu_, p, o);
    const TensorView* out = nullptr;
    for (const auto& t : OpTraits<id>::tensors)
      if (!out && t.access == Access::write) out = &(o.*t.member);
    corrupt(op_name(id), OpTraits<id>::pool_write != PoolWrite::none ? &p : nullptr, out);
  }
#define KVSIM_CORRUPTING_RUN(name, Op, validate, form, impl) \
  void run_##name(KVSIM_OP_PARAMS(Op, form)) override { run_then_corrupt<OpId::name>(KVSIM_OP_POOLS(form), op); }
  KVSIM_OPS(KVSIM_CORRUPTING_RUN)
#undef KVSIM_CORRUPTING_RUN

 private:
  CpuBackend cpu_{2};
};

}  // namespace kvsim::testing
