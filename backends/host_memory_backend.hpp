// A backend whose memory is the host's (the reference backend): 64-byte
// aligned allocations, as device allocations are (whole cache lines per
// block), and plain memcpy / memset transfers.
#pragma once

#include <cstdlib>
#include <cstring>
#include <new>

#include "backends/backend.hpp"

namespace kvsim {

class HostMemoryBackend : public Backend {
 public:
  void* allocate(size_t bytes) override {
    if (void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64)) return p;
    throw std::bad_alloc();
  }
  void release(void* p) noexcept override { std::free(p); }
  void to_backend(void* dst, const void* host_src, size_t bytes) override { std::memcpy(dst, host_src, bytes); }
  void to_host(void* host_dst, const void* src, size_t bytes) override { std::memcpy(host_dst, src, bytes); }
  void fill(void* dst, uint8_t byte, size_t bytes) override { std::memset(dst, byte, bytes); }

 protected:
  void run_copy(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
};

}  // namespace kvsim
