#include "backends/cpu/cpu_isa.hpp"

#include <cstdlib>
#include <string>
#include <string_view>

#include "backends/backend.hpp"
#include "kvsim/core/errors.hpp"

namespace kvsim {

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::portable: return "portable";
    case CpuIsa::avx2: return "avx2";
    case CpuIsa::avx512: return "avx512";
  }
  return "?";
}

bool cpu_isa_supported(CpuIsa isa) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  switch (isa) {
    case CpuIsa::portable: return true;
    case CpuIsa::avx2: return avx2;
    case CpuIsa::avx512:
      return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }
  return false;
#else
  return isa == CpuIsa::portable;
#endif
}

CpuIsa best_cpu_isa() {
  for (CpuIsa isa : {CpuIsa::avx512, CpuIsa::avx2})
    if (cpu_isa_supported(isa)) return isa;
  return CpuIsa::portable;
}

namespace {
CpuIsa isa_from_environment() {
  const char* env = std::getenv("KVSIM_CPU_ISA");
  if (env == nullptr || *env == '\0') return best_cpu_isa();
  const std::string_view v(env);
  for (CpuIsa isa : {CpuIsa::portable, CpuIsa::avx2, CpuIsa::avx512}) {
    if (v != cpu_isa_name(isa)) continue;
    if (!cpu_isa_supported(isa))
      throw BackendUnavailable(std::string("KVSIM_CPU_ISA = ") + env + ": this CPU does not run it (it runs up to " +
                               cpu_isa_name(best_cpu_isa()) + ")");
    return isa;
  }
  throw ValidationError(ErrorCode::bad_argument, std::string("KVSIM_CPU_ISA = '") + clipped(env) +
                                                     "': expected portable, avx2 or avx512 (or unset: the widest "
                                                     "this CPU runs)");
}
}  // namespace

CpuIsa selected_cpu_isa() {
  static const CpuIsa chosen = isa_from_environment();  // a throw leaves it unset: the next call throws again
  return chosen;
}

}  // namespace kvsim
