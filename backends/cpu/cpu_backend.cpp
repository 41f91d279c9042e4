#include "backends/cpu/cpu_backend.hpp"

#include <cstdlib>
#include <cstring>
#include <new>

#include <tbb/info.h>

namespace kvsim {

namespace {
std::optional<tbb::global_control> oversubscription_for(int threads) {
  if (threads > tbb::info::default_concurrency())
    return std::optional<tbb::global_control>(std::in_place, tbb::global_control::max_allowed_parallelism,
                                              static_cast<size_t>(threads));
  return std::nullopt;
}
}  // namespace

CpuBackend::CpuBackend(int threads)
    : allow_oversubscription_(oversubscription_for(threads)),
      arena_(threads > 0 ? threads : tbb::task_arena::automatic) {}

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

}  // namespace kvsim
