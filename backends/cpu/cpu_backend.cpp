#include "backends/cpu/cpu_backend.hpp"

#include "backends/cpu/attention_fast.hpp"

#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include <tbb/info.h>
#include <tbb/parallel_for.h>

#include <algorithm>

namespace kvsim {

namespace {
std::optional<tbb::global_control> oversubscription_for(int threads) {
  if (threads > tbb::info::default_concurrency())
    return std::optional<tbb::global_control>(std::in_place, tbb::global_control::max_allowed_parallelism,
                                              static_cast<size_t>(threads));
  return std::nullopt;
}
}  // namespace

CpuBackend::CpuBackend(int threads) : CpuBackend(threads, selected_cpu_isa()) {}

CpuBackend::CpuBackend(int threads, CpuIsa isa)
    : requested_threads_(threads),
      isa_(isa),
      reference_attention_(cpu_attention::selected_attention_path() == cpu_attention::AttentionPath::reference),
      allow_oversubscription_(oversubscription_for(threads)),
      arena_(threads > 0 ? threads : tbb::task_arena::automatic) {
  if (!cpu_isa_supported(isa))
    throw BackendUnavailable(std::string("CPU backend ISA ") + cpu_isa_name(isa) + ": this CPU does not run it");
}

void* CpuBackend::allocate(size_t bytes) {
  // 64-byte alignment: whole cache lines per block, as device allocations are.
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) throw std::bad_alloc();
  return p;
}
void CpuBackend::release(void* p) noexcept { std::free(p); }
void CpuBackend::to_backend(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void CpuBackend::to_host(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void CpuBackend::fill(void* dst, uint8_t byte, size_t bytes) { std::memset(dst, byte, bytes); }

// Blocks of 64 lanes per task; within a block the 512 chains of one round are
// independent: the fma instructions of the backend's ISA at its full vector
// width (the width the attention kernels use: the ceiling they are quoted
// against); glibc's fmaf per element at the portable ISA.
void CpuBackend::run_fma_probe(float* out, int64_t lanes, int32_t steps) {
  constexpr int64_t kBlock = 64;
  constexpr int kChains = canon::kFmaProbeChains;
  const cpu_attention::Kernels& kernels = cpu_attention::kernels_for(isa_);
  arena_.execute([&] {
    tbb::parallel_for(int64_t{0}, (lanes + kBlock - 1) / kBlock, [&](int64_t blk) {
      alignas(64) float x[kBlock * kChains];
      const int64_t first = blk * kBlock, n = std::min(kBlock, lanes - first);
      for (int64_t i = 0; i < kBlock * kChains; ++i) x[i] = canon::fma_probe_seed(first + i / kChains, static_cast<int>(i % kChains));
      kernels.fma_rounds(x, kBlock * kChains, steps, canon::kFmaProbeA, canon::kFmaProbeB);
      std::copy(x, x + n * kChains, out + first * kChains);
    });
  });
}

}  // namespace kvsim
