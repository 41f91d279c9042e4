// The backend registry: the only place that maps a name to a backend.
#include "backends/backend.hpp"
#include "backends/cpu/cpu_backend.hpp"
#include "backends/reference/reference_backend.hpp"

#ifndef KVSIM_HAVE_CUDA
#define KVSIM_HAVE_CUDA 0
#endif
#if KVSIM_HAVE_CUDA
#include "backends/cuda/cuda_factory.hpp"
#endif

namespace kvsim {

std::vector<std::string> backend_names() {
  if (KVSIM_HAVE_CUDA) return {"reference", "cpu", "cuda"};
  return {"reference", "cpu"};
}

std::unique_ptr<Backend> make_backend(std::string_view name, const BackendOptions& options) {
  if (name == "reference") return std::make_unique<ReferenceBackend>();  // single-threaded: ignores options
  if (name == "cpu") return std::make_unique<CpuBackend>(options.threads);
  if (name == "cuda") {
#if KVSIM_HAVE_CUDA
    return make_cuda_backend(options);  // BackendUnavailable("no CUDA device ...") without a GPU
#else
    throw BackendUnavailable("CUDA backend not compiled in this build (configure with -DKVSIM_CUDA=ON where nvcc "
                             "is available)");
#endif
  }
  throw BackendUnavailable("unknown backend '" + std::string(name) + "' (available: reference, cpu, cuda)");
}

}  // namespace kvsim
