#include "backends/backend.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "kvsim/validation.hpp"

namespace kvsim {

template <class Run>
void Backend::timed(const Run& run) {
  if (!kernel_timing_) {
    run();
    return;
  }
  run_begin();
  const auto t0 = std::chrono::steady_clock::now();
  run();
  last_kernel_seconds_ = run_end(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

int64_t host_free_memory() {
  int64_t available = INT64_MAX;
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f))
      if (long long kb = 0; std::sscanf(line, "MemAvailable: %lld kB", &kb) == 1) available = kb * 1024;
    std::fclose(f);
  }
  rlimit lim{};
  if (getrlimit(RLIMIT_AS, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
    long long pages = 0;
    if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%lld", &pages) != 1) pages = 0;
      std::fclose(f);
    }
    const int64_t used = static_cast<int64_t>(pages) * sysconf(_SC_PAGESIZE);
    available = std::min<int64_t>(available, std::max<int64_t>(0, static_cast<int64_t>(lim.rlim_cur) - used));
  }
  return available;
}

Backend::MemoryInfo Backend::memory_info() const {
  MemoryInfo m;
  m.host_free = m.backend_free = host_free_memory();
  return m;
}

KvPools Backend::allocate_pools(const PoolGeometry& g, uint8_t fill_byte) {
  validate_geometry(g);
  KvPools p;
  p.geometry = g;
  for (PoolKind k : {PoolKind::primary, PoolKind::secondary}) {
    const int i = static_cast<int>(k);
    p.strides[i] = contiguous_strides(g, k);
    const size_t bytes = static_cast<size_t>(g.pool_bytes(k));
    if (bytes) {
      p.data[i] = allocate_pool_memory(bytes, k);
      fill(p.data[i], fill_byte, bytes);
    }
    if (g.has_scale_pool()) {
      const PoolGeometry sg = g.scale_geometry();
      p.scale_strides[i] = contiguous_strides(sg, k);
      const size_t sbytes = static_cast<size_t>(sg.pool_bytes(k));
      if (sbytes) {
        p.scales[i] = allocate_pool_memory(sbytes, k);
        fill(p.scales[i], fill_byte, sbytes);
      }
    }
  }
  return p;
}

void Backend::release_pools(KvPools& pools) noexcept {
  for (int i = 0; i < 2; ++i) {
    if (pools.data[i]) release(pools.data[i]);
    if (pools.scales[i]) release(pools.scales[i]);
    pools.data[i] = pools.scales[i] = nullptr;
  }
}

// Every entry point: host validation first, then the backend's run_*.
#define KVSIM_DEFINE_ENTRY_POINT(name, Op, validate, form, impl)   \
  void Backend::name(KVSIM_OP_PARAMS(Op, form)) {            \
    validate(KVSIM_OP_ARGS(form));                           \
    timed([&] { run_##name(KVSIM_OP_ARGS(form)); });         \
  }
KVSIM_OPS(KVSIM_DEFINE_ENTRY_POINT)
#undef KVSIM_DEFINE_ENTRY_POINT

void Backend::run_copy(void* dst, const void* src, size_t bytes) {
  std::vector<uint8_t> host(bytes);
  to_host(host.data(), src, bytes);
  to_backend(dst, host.data(), bytes);
}

void Backend::copy(void* dst, const void* src, size_t bytes) {
  timed([&] { run_copy(dst, src, bytes); });
}

void Backend::run_fma_probe(float* out, int64_t lanes, int32_t steps) {
  std::vector<float> host(static_cast<size_t>(lanes) * canon::kFmaProbeChains);
  for (int64_t i = 0; i < lanes; ++i)
    for (int c = 0; c < canon::kFmaProbeChains; ++c) {
      float x = canon::fma_probe_seed(i, c);
      for (int32_t s = 0; s < steps; ++s) x = canon::fma_f32(x, canon::kFmaProbeA, canon::kFmaProbeB);
      host[static_cast<size_t>(i) * canon::kFmaProbeChains + c] = x;
    }
  to_backend(out, host.data(), host.size() * sizeof(float));
}

void Backend::fma_probe(float* out, int64_t lanes, int32_t steps) {
  if (lanes < 0 || steps < 0) fail(ErrorCode::bad_argument, "fma_probe: lanes and steps must be >= 0");
  timed([&] { run_fma_probe(out, lanes, steps); });
}

}  // namespace kvsim
