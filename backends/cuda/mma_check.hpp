// The tensor-core check: runs the real mma.sync (inline PTX) and core's model
// (core/include/kvsim/core/mma_model.hpp) on the same inner products and
// counts the results whose bits differ. Plain C++ (no CUDA headers), so the
// CLI can call it; `kvsim mma-check` is its command line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <kvsim/core/mma_model.hpp>

namespace kvsim::cuda {

// Families of inner products the check draws (per tile of 16 x 8 outputs).
// The first two are the random ones (--count), the rest targeted (--targeted).
inline constexpr int kMmaRandomFamilies = 2;
inline constexpr int kMmaFamilies = 14;
const char* mma_family_name(int family);

struct MmaCheckOptions {
  mma::Operand operand = mma::Operand::bf16;
  uint64_t random_count = 100'000'000;   // random inner products (rounded up to whole tiles)
  uint64_t targeted_count = 25'000'000;  // targeted inner products, spread over the targeted families
  uint64_t seed = 2026;
  // Every how many'th tile also runs each alternative of mma_rule_alternative().
  int alternatives_every = 8;
  // Inner products of the first batch the host's build of the model recomputes.
  uint64_t host_count = 1 << 20;
  // Optional binary dump (differing and sample vectors) for offline analysis.
  std::string dump_path;
};

struct MmaVector {  // one inner product with both results
  int family = 0;
  uint32_t a[32] = {}, b[32] = {};
  uint32_t c = 0, hardware = 0, model = 0;
};

struct MmaCheckReport {
  mma::Operand operand = mma::Operand::bf16;
  uint64_t products[kMmaFamilies] = {}, differences[kMmaFamilies] = {};
  uint64_t alternative_products = 0;
  uint64_t alternative_differences[mma::kMmaRuleAlternatives] = {};
  uint64_t host_products = 0, host_differences = 0;
  std::vector<MmaVector> first_differences;  // at most 8
  uint64_t total_products() const;
  uint64_t total_differences() const;
};

// Throws kvsim::BackendUnavailable without a CUDA device, BackendError on a
// CUDA failure.
MmaCheckReport run_mma_check(const MmaCheckOptions& options);

}  // namespace kvsim::cuda
