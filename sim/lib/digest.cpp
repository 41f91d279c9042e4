// BLAKE2b-128 (digest.hpp): RFC 7693's reference algorithm, unkeyed, digest
// length 16 (parameter block word 0 = 0x01010010); blake2b_128_each runs it on
// 8 messages at once in AVX-512 lanes, 4 in AVX2's, where the CPU has them.
#include "kvsim/sim/digest.hpp"

#include <algorithm>
#include <cstring>

#include "backends/cpu/cpu_isa.hpp"
#include "backends/cpu/cpu_target.hpp"

#if KVSIM_CPU_X86
#include <immintrin.h>
#endif

namespace kvsim::sim {
namespace {

constexpr uint64_t kIv[8] = {0x6a09e667f3bcc908ull, 0xbb67ae8584caa73bull, 0x3c6ef372fe94f82bull,
                             0xa54ff53a5f1d36f1ull, 0x510e527fade682d1ull, 0x9b05688c2b3e6c1full,
                             0x1f83d9abfb41bd6bull, 0x5be0cd19137e2179ull};
constexpr uint8_t kSigma[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4}, {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13}, {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11}, {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5}, {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3}};

constexpr uint64_t kParameterWord0 = 0x01010000ull ^ 16;  // depth 1, fanout 1, no key, 16-byte digest

inline uint64_t rotr(uint64_t x, int n) { return (x >> n) | (x << (64 - n)); }

void compress(uint64_t h[8], const uint8_t block[128], uint64_t counter, bool last) {
  uint64_t m[16], v[16];
  std::memcpy(m, block, 128);  // little-endian words (x86, aarch64)
  for (int i = 0; i < 8; ++i) {
    v[i] = h[i];
    v[i + 8] = kIv[i];
  }
  v[12] ^= counter;
  if (last) v[14] = ~v[14];
  auto g = [&](int a, int b, int c, int d, uint64_t x, uint64_t y) {
    v[a] = v[a] + v[b] + x;
    v[d] = rotr(v[d] ^ v[a], 32);
    v[c] = v[c] + v[d];
    v[b] = rotr(v[b] ^ v[c], 24);
    v[a] = v[a] + v[b] + y;
    v[d] = rotr(v[d] ^ v[a], 16);
    v[c] = v[c] + v[d];
    v[b] = rotr(v[b] ^ v[c], 63);
  };
  for (const auto& s : kSigma) {
    g(0, 4, 8, 12, m[s[0]], m[s[1]]);
    g(1, 5, 9, 13, m[s[2]], m[s[3]]);
    g(2, 6, 10, 14, m[s[4]], m[s[5]]);
    g(3, 7, 11, 15, m[s[6]], m[s[7]]);
    g(0, 5, 10, 15, m[s[8]], m[s[9]]);
    g(1, 6, 11, 12, m[s[10]], m[s[11]]);
    g(2, 7, 8, 13, m[s[12]], m[s[13]]);
    g(3, 4, 9, 14, m[s[14]], m[s[15]]);
  }
  for (int i = 0; i < 8; ++i) h[i] ^= v[i] ^ v[i + 8];
}

}  // namespace

#if KVSIM_CPU_X86
KVSIM_CPU_TARGET_BEGIN(KVSIM_CPU_TARGET_AVX512)
namespace {
namespace lanes_avx512 {
using Vec = __m512i;
constexpr int kLanes = 8;
inline Vec add64(Vec a, Vec b) { return _mm512_add_epi64(a, b); }
inline Vec xor64(Vec a, Vec b) { return _mm512_xor_si512(a, b); }
template <int N>
inline Vec ror64(Vec x) { return _mm512_ror_epi64(x, N); }
inline Vec splat64(uint64_t x) { return _mm512_set1_epi64(static_cast<long long>(x)); }
// Word at byte `offset` of each lane's block: the lanes' addresses are the gather's indices.
inline Vec gather64(const uint8_t* const* blocks, int offset) {
  const Vec at = _mm512_add_epi64(_mm512_loadu_si512(blocks), _mm512_set1_epi64(offset));
  return _mm512_i64gather_epi64(at, nullptr, 1);
}
inline void store64(uint64_t* out, Vec x) { _mm512_store_si512(out, x); }
#include "blake2b_lanes.inc"
}  // namespace lanes_avx512
}  // namespace
KVSIM_CPU_TARGET_END

KVSIM_CPU_TARGET_BEGIN(KVSIM_CPU_TARGET_AVX2)
namespace {
namespace lanes_avx2 {
using Vec = __m256i;
constexpr int kLanes = 4;
inline Vec add64(Vec a, Vec b) { return _mm256_add_epi64(a, b); }
inline Vec xor64(Vec a, Vec b) { return _mm256_xor_si256(a, b); }
template <int N>
inline Vec ror64(Vec x) {
  if constexpr (N == 32) return _mm256_shuffle_epi32(x, _MM_SHUFFLE(2, 3, 0, 1));
  return _mm256_or_si256(_mm256_srli_epi64(x, N), _mm256_slli_epi64(x, 64 - N));
}
inline Vec splat64(uint64_t x) { return _mm256_set1_epi64x(static_cast<long long>(x)); }
inline Vec gather64(const uint8_t* const* blocks, int offset) {
  const Vec at = _mm256_add_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blocks)), _mm256_set1_epi64x(offset));
  return _mm256_i64gather_epi64(static_cast<const long long*>(nullptr), at, 1);
}
inline void store64(uint64_t* out, Vec x) { _mm256_store_si256(reinterpret_cast<__m256i*>(out), x); }
#include "blake2b_lanes.inc"
}  // namespace lanes_avx2
}  // namespace
KVSIM_CPU_TARGET_END
#endif

void blake2b_128_each(const void* const* messages, size_t n, size_t bytes, Digest128* out, CpuIsa isa) {
  size_t i = 0;
#if KVSIM_CPU_X86
  const uint8_t* group[8];
  const auto lanes = [&](auto digest_lanes, size_t width) {
    for (; i + width <= n; i += width) {
      for (size_t l = 0; l < width; ++l) group[l] = static_cast<const uint8_t*>(messages[i + l]);
      digest_lanes(group, bytes, out + i);
    }
  };
  if (isa == CpuIsa::avx512) lanes(lanes_avx512::digest_lanes, 8);
  if (isa == CpuIsa::avx512 || isa == CpuIsa::avx2) lanes(lanes_avx2::digest_lanes, 4);
#else
  (void)isa;
#endif
  for (; i < n; ++i) out[i] = blake2b_128(messages[i], bytes);
}

void blake2b_128_each(const void* const* messages, size_t n, size_t bytes, Digest128* out) {
  static const CpuIsa isa = selected_cpu_isa();
  blake2b_128_each(messages, n, bytes, out, isa);
}

Digest128 blake2b_128(const void* data, size_t bytes) {
  uint64_t h[8];
  std::memcpy(h, kIv, sizeof h);
  h[0] ^= kParameterWord0;
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t counter = 0;
  while (bytes > 128) {
    counter += 128;
    compress(h, p, counter, false);
    p += 128;
    bytes -= 128;
  }
  uint8_t last[128] = {};
  if (bytes) std::memcpy(last, p, bytes);
  counter += bytes;
  compress(h, last, counter, true);
  Digest128 d;
  d.word[0] = h[0];
  d.word[1] = h[1];
  return d;
}

uint64_t fnv1a(uint64_t h, const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

FnvStream::FnvStream() : worker_([this] { work(); }) {}

FnvStream::~FnvStream() {
  {
    std::lock_guard<std::mutex> lock(m_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void FnvStream::add(const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    const size_t n = std::min(bytes, kChunkBytes - filling_.size());
    filling_.insert(filling_.end(), p, p + n);
    p += n;
    bytes -= n;
    if (filling_.size() == kChunkBytes) hand_over();
  }
}

void FnvStream::hand_over() {
  std::unique_lock<std::mutex> lock(m_);
  cv_.wait(lock, [&] { return queued_.size() < kMaxQueued; });
  queued_.push_back(std::move(filling_));
  ++busy_;
  if (spare_.empty()) {
    filling_ = {};
  } else {
    filling_ = std::move(spare_.back());
    spare_.pop_back();
    filling_.clear();
  }
  lock.unlock();
  cv_.notify_all();
}

uint64_t FnvStream::value() {
  if (!filling_.empty()) hand_over();
  std::unique_lock<std::mutex> lock(m_);
  cv_.wait(lock, [&] { return busy_ == 0; });
  return hash_;
}

void FnvStream::work() {
  std::unique_lock<std::mutex> lock(m_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queued_.empty(); });
    if (queued_.empty()) return;  // stopping, nothing left
    std::vector<uint8_t> chunk = std::move(queued_.front());
    queued_.pop_front();
    const uint64_t h = hash_;
    lock.unlock();
    cv_.notify_all();  // a place in the queue is free
    const uint64_t next = fnv1a(h, chunk.data(), chunk.size());
    lock.lock();
    hash_ = next;
    --busy_;
    if (spare_.size() < 2) spare_.push_back(std::move(chunk));
    cv_.notify_all();
  }
}

}  // namespace kvsim::sim
