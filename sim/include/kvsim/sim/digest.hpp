// BLAKE2b (RFC 7693) with a 16-byte digest: the content hash the comparison
// invariants keep per output row instead of the row itself (docs/invariants.md,
// "Memory"). A cryptographic hash, so two different rows have the same digest
// with probability 2^-128 whatever the fault that made them differ.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>

namespace kvsim::sim {

struct Digest128 {
  uint64_t word[2] = {0, 0};
  auto operator<=>(const Digest128&) const = default;
};

Digest128 blake2b_128(const void* data, size_t bytes);

}  // namespace kvsim::sim
