// The backend registry: the only place that maps a name to a backend.
#include "backends/backend.hpp"
#include "backends/cpu/cpu_backend.hpp"

#ifndef KVSIM_HAVE_CUDA
#define KVSIM_HAVE_CUDA 0
#endif

namespace kvsim {

std::vector<std::string> backend_names() { return {"cpu"}; }

std::unique_ptr<Backend> make_backend(std::string_view name, const BackendOptions& options) {
  if (name == "cpu") return std::make_unique<CpuBackend>(options.threads);
  if (name == "cuda") {
    if (!KVSIM_HAVE_CUDA)
      throw BackendUnavailable("CUDA backend not compiled in this build (configure with -DKVSIM_CUDA=ON where nvcc "
                               "is available)");
    throw BackendUnavailable("CUDA backend: this build compiles core for the device (tests/cuda) but the CUDA "
                             "op library is not part of this version yet");
  }
  throw BackendUnavailable("unknown backend '" + std::string(name) + "' (available: cpu, cuda)");
}

}  // namespace kvsim
