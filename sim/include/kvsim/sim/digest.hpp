// The replay's two hashes. BLAKE2b (RFC 7693) with a 16-byte digest: the
// content hash the comparison invariants keep per output row instead of the
// row itself (docs/invariants.md, "Memory"); a cryptographic hash, so two
// different rows have the same digest with probability 2^-128 whatever the
// fault that made them differ. FNV-1a: the whole replay's content hash.
#pragma once

#include <compare>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "backends/cpu/cpu_isa.hpp"

namespace kvsim::sim {

struct Digest128 {
  uint64_t word[2] = {0, 0};
  auto operator<=>(const Digest128&) const = default;
};

Digest128 blake2b_128(const void* data, size_t bytes);

// blake2b_128 of each of n messages of one length (messages[i] -> out[i]),
// 8 at once in AVX-512 lanes or 4 in AVX2's where `isa` (default: the
// selected one, backends/cpu/cpu_isa.hpp) has them, the rest one at a time:
// the same digests. The replay hashes a step's output rows so.
void blake2b_128_each(const void* const* messages, size_t n, size_t bytes, Digest128* out);
void blake2b_128_each(const void* const* messages, size_t n, size_t bytes, Digest128* out, CpuIsa isa);

// FNV-1a (64-bit): the replay's content hash (ScenarioReport::content_hash,
// the golden replays). Byte-serial by definition (each step multiplies the
// last), about 0.9 GB/s on one core whatever the machine has.
inline constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
uint64_t fnv1a(uint64_t h, const void* data, size_t bytes);

// The same FNV-1a over every byte given to add(), in order, computed on a
// worker thread so that the byte-serial hash runs beside the replay instead
// of inside it (at a real model's size it was half of a replay's wall time).
// add() copies into chunks of up to kChunkBytes and blocks while kMaxQueued
// full chunks wait: the stream holds at most kMaxQueued + 4 chunks (the queue,
// the one filling, the one being hashed, two kept for reuse), 32 MiB, and
// never more than it was given.
class FnvStream {
 public:
  static constexpr size_t kChunkBytes = size_t{4} << 20;
  static constexpr size_t kMaxQueued = 4;
  FnvStream();
  ~FnvStream();
  FnvStream(const FnvStream&) = delete;
  FnvStream& operator=(const FnvStream&) = delete;
  void add(const void* data, size_t bytes);
  // The hash of everything added so far (waits for the worker).
  uint64_t value();

 private:
  void hand_over();  // queues the current chunk
  void work();
  std::vector<uint8_t> filling_;
  std::deque<std::vector<uint8_t>> queued_;
  std::vector<std::vector<uint8_t>> spare_;
  uint64_t hash_ = kFnvOffset;
  size_t busy_ = 0;  // chunks queued or being hashed
  bool stop_ = false;
  std::mutex m_;
  std::condition_variable cv_;
  std::thread worker_;
};

}  // namespace kvsim::sim
