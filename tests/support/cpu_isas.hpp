// The CPU backend's instruction sets this machine runs (cpu_isa.hpp), in
// order: portable always, then avx2 and avx512 where the CPU has them.
#pragma once

#include <vector>

#include "backends/cpu/cpu_isa.hpp"

namespace kvsim::testing {

inline std::vector<CpuIsa> machine_isas() {
  std::vector<CpuIsa> v;
  for (CpuIsa isa : {CpuIsa::portable, CpuIsa::avx2, CpuIsa::avx512})
    if (cpu_isa_supported(isa)) v.push_back(isa);
  return v;
}

}  // namespace kvsim::testing
