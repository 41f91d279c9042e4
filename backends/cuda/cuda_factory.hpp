// What the registry (a plain C++ file) needs from the CUDA backend, without
// the CUDA runtime headers.
#pragma once

#include <memory>

#include "backends/backend.hpp"

namespace kvsim {

// Throws BackendUnavailable("no CUDA device ...") where none can be used.
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);

}  // namespace kvsim
