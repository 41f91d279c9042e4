// prefill_attention as a tiled kernel, byte-identical to the CPU oracle's
// attend_query() (core's canonical order, ops/attention.hpp), with each K/V
// tile loaded once for a block of consecutive query rows.
//
// Work: one CTA per (row block, KV head). A row block is up to kUnits / G
// consecutive query rows of one sequence; with the G query heads of the GQA
// group that is kUnits (row, head) "units". Without a window, key j of every
// row is cache slot j and partition k is slots [256k, 256k + 256) for all of
// them, so the rows of a block share every tile; they differ only in where
// their key list ends (masking) and how many partitions they have.
//
// The canonical merge (O = fma(acc_p, exp(m_p - M), O) in partition order)
// needs the global max M before the first partition is folded, so a CTA makes
// two passes over its keys:
//  pass 1: M = max per unit of the canonical scores (order-free: a different
//          order can change only the sign of a zero max, and exp(s - m) is
//          the same for either zero). M needs the exact score of the key that
//          holds the max, not of every key: each K tile's scores are first
//          bounded on the tensor cores (bf16 hi/lo splits of q and k, an error
//          bound e per (unit, key), below), and only the candidates, keys whose
//          upper bound reaches the best lower bound seen so far, get their
//          canonical score (one warp each, canon::dot's lanes and butterfly);
//          a tile with too many candidates, or a score scale that is not a
//          positive finite number, computes every canonical score as before;
//  pass 2: per partition: scores of its (up to) four 64-key tiles into
//          shared memory, the partition max, core's probabilities and lane-run
//          sums with the butterfly, P.V over its V tiles in key order, then
//          the fold into O and L with w = merge_weight(m_p, M).
// No partition scratch leaves the CTA; tiles past a block's last key are never
// loaded (causal skip). Keys past a unit's own key list are masked in its
// scores (s = -inf, probability 0, which adds +0 to its lane runs: no change),
// take no part in its P.V, and a partition its list does not reach is not
// folded for it.
//
// The arithmetic order is a policy (CanonicalFp32Order): which thread does
// which canonical step. A second order (a tensor-core model) would be a second
// policy with the same kernel skeleton.
#include "backends/cuda/attention_plan.cuh"
#include "backends/cuda/attention_warp.cuh"
#include "backends/cuda/cuda_check.hpp"
#include "backends/env_switch.hpp"
#include "backends/cuda/mma_fragments.cuh"
#include "backends/cuda/prefill_rows.cuh"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace kvsim::cuda {
namespace prefill_tiled {

using canon::kPartitionSize;
using canon::kWarp;

constexpr int kThreads = 256;
constexpr int kUnits = 64;  // (query row, query head) pairs per CTA
constexpr int kChunk = 64;  // keys per K/V tile
constexpr int kChunksPerPart = kPartitionSize / kChunk;
static_assert(kChunksPerPart * kChunk == kPartitionSize);
constexpr int kMaxTreeLevels = 6;  // 32 leaves: levels 0..5

template <int C>
struct Shape {
  static constexpr int D = C * kWarp;
  static constexpr int kStride = D + 4;  // padded rows: 16-byte row offsets step across banks
};

// Pass 1's bounded scores on the tensor cores (mma.sync m16n8k16, bf16, fp32
// accumulation): q and k as bf16 hi + lo parts (hi = bf16(x), lo =
// bf16(x - hi); a bf16 cache's k is its own hi, lo = 0), a ~ qh.kh + ql.kh +
// qh.kl. Its distance to the canonical score d is bounded per (unit, key) by
// e = 2^-5 * max|q| * max|k| (128 * max|q| * max|k| >= sum |q_i k_i| =: S):
//   the dropped ql.kl and split residuals  <= 3 * 2^-18 * S = 2^-9.4 qk,
//   the tensor cores (mma_model.hpp: terms truncated to 2^(e_max - 25), the
//   result rounded toward zero; <= 2^-20.6 S per instruction, <= 24 of them)
//                                           <= 2^-16 * S  = 2^-9 qk,
//   the canonical fp32 order (9 roundings)  <= 9 * 2^-24 * S = 2^-13.8 qk,
// about 0.0035 qk against e = 0.031 qk: nine times the sum. The bound needs
// max|q| and max|k| in [2^-60, 2^50] (no underflow or overflow anywhere in
// it); outside that range, and for NaN or Inf, it is Inf: every key a candidate.
constexpr int kCandidateLimit = 1024;  // above this a tile's canonical scores are cheaper all at once
constexpr float kBoundScale = 0x1p-5f;
constexpr uint32_t kBoundMinBits = 0x21800000u;  // 2^-60
constexpr uint32_t kBoundMaxBits = 0x58800000u;  // 2^50

template <int C>
struct Pass1Smem {
  static constexpr int kStride = Shape<C>::D + 8;  // bf16 codes per row (D 128: 272-byte rows, conflict-free ldmatrix)
  alignas(16) uint16_t q_hi[kUnits][kStride];
  uint16_t q_lo[kUnits][kStride];
  uint16_t k_hi[kChunk][kStride];
  uint16_t k_lo[kChunk][kStride];
  float q_bound[kUnits];       // 2^-5 max|q| of the unit (Inf outside the range)
  float k_bound[kChunk];       // max|k| of the tile's key (Inf outside the range)
  float lower[2][2][kUnits];   // [tile parity][key half]: a lower bound of the unit's max dot
  uint32_t max_key[kUnits];    // ordered_key of the unit's max score so far
  uint32_t candidates[kChunk * kUnits];  // (unit << 6) | key of the tile
  uint32_t count[2];           // candidates of the tile, by tile parity
};
template <int C>
struct Pass2Smem {
  float s[kPartitionSize][kUnits];  // scores, then probabilities, key-major
  float run[kUnits][kWarp + 1];     // lane-run partial sums
  float quarter_max[kThreads / kUnits][kUnits];
  float o[kUnits][Shape<C>::D];     // O of the merge, per unit
};

// Shared memory of one CTA: pass 1's working set lives where pass 2's scores,
// runs and O go later.
template <int C>
struct Smem {
  float q[kUnits][Shape<C>::kStride];
  float tile[kChunk][Shape<C>::kStride];
  union {
    Pass1Smem<C> p1;
    Pass2Smem<C> p2;
  };
  float global_max[kUnits];
  float part_max[kUnits];
  float part_sum[kUnits];
};

// A float as an unsigned key whose order is the floats' (-0 below +0), for
// atomicMax; NaN is never stored.
__device__ __forceinline__ uint32_t ordered_key(float f) {
  const uint32_t u = float_bits(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float from_ordered_key(uint32_t k) {
  return bits_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

// The bf16 hi/lo split of a pair (core's split_probability: hi = bf16(x),
// lo = bf16(x - hi)), the lower k in each register's low half.
__device__ __forceinline__ void split_bf16x2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const mma_order::SplitProbability a = mma_order::split_probability(mma::Operand::bf16, x0);
  const mma_order::SplitProbability b = mma_order::split_probability(mma::Operand::bf16, x1);
  hi = pack_codes(a.hi, b.hi);
  lo = pack_codes(a.lo, b.lo);
}

// max|x| (as magnitude bits) as the bound's factor: itself, or Inf outside [2^-60, 2^50].
__device__ __forceinline__ float bound_factor(uint32_t magnitude_bits) {
  return magnitude_bits >= kBoundMinBits && magnitude_bits <= kBoundMaxBits ? bits_float(magnitude_bits)
                                                                           : canon::pos_inf();
}

KVSIM_HD constexpr int trailing_ones(int t) { return (t & 1) ? 1 + trailing_ones(t >> 1) : 0; }

KVSIM_HD constexpr int brev5(int t) { return ((t & 1) << 4) | ((t & 2) << 2) | (t & 4) | ((t & 8) >> 2) | ((t & 16) >> 4); }

// ---------------------------------------------------------------- the canonical fp32 order
// score: lane l's fma chain over dims [l*C, l*C + C) from +0, then the xor
// butterfly (16, 8, 4, 2, 1). A thread computes 4 units x 4 keys; it visits
// the leaves in bit-reversed lane order (0, 16, 8, 24, 4, ...), which is the
// butterfly's tree walked left to right, and joins sibling subtrees as soon
// as both exist (a binary counter): every add is one of the butterfly's, with
// the same operands, so the float is canon::dot's.
struct CanonicalFp32Order {
  template <int C, int T>
  static __device__ __forceinline__ void dot_leaf(const float* __restrict__ q, const float* __restrict__ k,
                                                  float (&stack)[kMaxTreeLevels][4][4]) {
    constexpr int S = Shape<C>::kStride;
    constexpr int lane = brev5(T);
    float qv[4][C], kv[4][C];
#pragma unroll
    for (int i = 0; i < 4; ++i) load_run<float, C>(q + i * S + lane * C, qv[i]);
#pragma unroll
    for (int j = 0; j < 4; ++j) load_run<float, C>(k + j * 16 * S + lane * C, kv[j]);
    constexpr int level = trailing_ones(T);  // subtrees this leaf completes
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float v = 0.0f;
#pragma unroll
        for (int c = 0; c < C; ++c) v = canon::fma_f32(qv[i][c], kv[j][c], v);
#pragma unroll
        for (int b = 0; b < level; ++b) v = stack[b][i][j] + v;
        stack[level][i][j] = v;
      }
    if constexpr (T + 1 < kWarp) dot_leaf<C, T + 1>(q, k, stack);
  }

  // dots[i][j] = canon::dot(q of unit u0 + i, k of key k0 + 16 j).
  template <int C>
  static __device__ __forceinline__ void dots(const float* q_rows, const float* k_rows, float (&out)[4][4]) {
    float stack[kMaxTreeLevels][4][4];
    dot_leaf<C, 0>(q_rows, k_rows, stack);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) out[i][j] = stack[5][i][j];
  }

  // P.V for one key: acc = fma(p, v[d], acc), key order, one chain per (unit, dim).
  template <int C, bool kGuarded>
  static __device__ __forceinline__ void pv_key(const float (&p)[8], const float (&v)[C], const bool (&take)[8],
                                                float (&acc)[8][C]) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const float r = canon::fma_f32(p[i], v[c], acc[i][c]);
        acc[i][c] = (!kGuarded || take[i]) ? r : acc[i][c];
      }
  }
};

// ---------------------------------------------------------------- K/V tiles
// The 16-bit cache codes (a fp32 cache's element is float).
struct Bf16Code {
  uint16_t bits;
  static constexpr bool kBf16 = true;
};
struct F16Code {
  uint16_t bits;
  static constexpr bool kBf16 = false;
};
template <class Elem>
constexpr bool kIsBf16 = std::is_same_v<Elem, Bf16Code>;

// A tile is kChunk rows of D codes; thread t moves the kPieces consecutive
// 16-byte pieces from piece (t % kThreadsPerRow) * kPieces of row
// t / kThreadsPerRow: one page lookup and one element_offset per row and
// thread. Codes become their exact fp32 values in shared memory (the
// decoders core's load_head_row matches).
template <class Elem, int C>
struct TileLoader {
  static constexpr int kRowBytes = Shape<C>::D * static_cast<int>(sizeof(Elem));
  static constexpr int kPiecesPerRow = kRowBytes / 16;
  static constexpr int kThreadsPerRow = kThreads / kChunk;
  static constexpr int kPieces = kPiecesPerRow / kThreadsPerRow;
  static_assert(kThreadsPerRow * kChunk == kThreads && kPieces * kThreadsPerRow == kPiecesPerRow);
  uint4 regs[kPieces];

  static __device__ __forceinline__ int row() { return static_cast<int>(threadIdx.x) / kThreadsPerRow; }
  static __device__ __forceinline__ int first_piece() { return (static_cast<int>(threadIdx.x) % kThreadsPerRow) * kPieces; }

  __device__ __forceinline__ void load(const AttentionArgs& a, const int32_t* table, int32_t kv_head, int32_t kv,
                                       int64_t first_slot, int64_t slot_end) {
    const PoolGeometry& g = a.pools.geometry;
    const PageDivider page = g.page_divider();
    const uint8_t* pool = a.pools.bytes(PoolKind::primary);
    const int64_t slot = first_slot + row();
#pragma unroll
    for (int i = 0; i < kPieces; ++i) regs[i] = make_uint4(0, 0, 0, 0);
    if (slot < slot_end) {
      const int64_t block = BlockRef{table[page.div(slot)]}.block();
      const int64_t off = element_offset(a.pools.strides[0], block, a.layer, kv, kv_head, page.mod(slot), 0);
      // Contiguous rows (prefill_rows_contiguous): the row's pieces follow each other.
      const uint4* src = reinterpret_cast<const uint4*>(pool + off * static_cast<int64_t>(sizeof(Elem))) + first_piece();
#pragma unroll
      for (int i = 0; i < kPieces; ++i) regs[i] = __ldg(src + i);
    }
  }

  // With `bounds` (pass 1 of the filtered order), the tile also goes to
  // bounds->k_hi / k_lo as bf16 parts, and bounds->k_bound gets each key's
  // bound factor (the 4 threads of a row are consecutive lanes).
  __device__ __forceinline__ void store(float (*tile)[Shape<C>::kStride], Pass1Smem<C>* bounds) const {
    constexpr int kPer = 16 / static_cast<int>(sizeof(Elem));  // codes per piece
    uint32_t magnitude = 0;
#pragma unroll
    for (int i = 0; i < kPieces; ++i) {
      float* dst = &tile[row()][(first_piece() + i) * kPer];
      const uint32_t w[4] = {regs[i].x, regs[i].y, regs[i].z, regs[i].w};
      float f[kPer];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if constexpr (sizeof(Elem) == 4) {
          f[k] = __uint_as_float(w[k]);
        } else if constexpr (Elem::kBf16) {
          f[2 * k] = __uint_as_float(w[k] << 16);  // codec::bf16_to_f32
          f[2 * k + 1] = __uint_as_float(w[k] & 0xFFFF0000u);
        } else {
          canon::decode_f16x2_arith(w[k], f + 2 * k);  // only ever enters arithmetic
        }
      }
#pragma unroll
      for (int k = 0; k < kPer; k += 4) *reinterpret_cast<float4*>(dst + k) = make_float4(f[k], f[k + 1], f[k + 2], f[k + 3]);
      if (bounds) {
#pragma unroll
        for (int k = 0; k < kPer; ++k) magnitude = max(magnitude, float_bits(f[k]) & 0x7FFFFFFFu);
        uint16_t* hi = &bounds->k_hi[row()][(first_piece() + i) * kPer];
        if constexpr (kIsBf16<Elem>) {
          *reinterpret_cast<uint4*>(hi) = regs[i];  // bf16 codes are their own hi part; lo = 0 is never read
        } else {
          uint32_t h[kPer / 2], l[kPer / 2];
#pragma unroll
          for (int k = 0; k < kPer; k += 2) split_bf16x2(f[k], f[k + 1], h[k / 2], l[k / 2]);
          uint16_t* lo = &bounds->k_lo[row()][(first_piece() + i) * kPer];
          if constexpr (kPer == 8) {
            *reinterpret_cast<uint4*>(hi) = make_uint4(h[0], h[1], h[2], h[3]);
            *reinterpret_cast<uint4*>(lo) = make_uint4(l[0], l[1], l[2], l[3]);
          } else {
            *reinterpret_cast<uint2*>(hi) = make_uint2(h[0], h[1]);
            *reinterpret_cast<uint2*>(lo) = make_uint2(l[0], l[1]);
          }
        }
      }
    }
    if (bounds) {
      static_assert(kThreadsPerRow == 4);
      magnitude = max(magnitude, __shfl_xor_sync(kFullMask, magnitude, 1));
      magnitude = max(magnitude, __shfl_xor_sync(kFullMask, magnitude, 2));
      if (threadIdx.x % kThreadsPerRow == 0) bounds->k_bound[row()] = bound_factor(magnitude);
    }
  }
};


// P.V of one V tile (keys first_key ..) for 8 units x C dims of a thread.
template <class Order, int C, int G, bool kGuarded, class SmemT>
__device__ __forceinline__ void pv_tile(const SmemT& sm, int ch, int pu0, int lane, int64_t first_key,
                                        const BlockKeys& bk, float (&acc)[8][C]) {
  int64_t end[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) end[i] = kGuarded ? bk.list_end((pu0 + i) / G) : 0;
#pragma unroll 4
  for (int jj = 0; jj < kChunk; ++jj) {
    const float4 pa = *reinterpret_cast<const float4*>(&sm.p2.s[ch * kChunk + jj][pu0]);
    const float4 pb = *reinterpret_cast<const float4*>(&sm.p2.s[ch * kChunk + jj][pu0 + 4]);
    const float p[8] = {pa.x, pa.y, pa.z, pa.w, pb.x, pb.y, pb.z, pb.w};
    float v[C];
    load_run<float, C>(&sm.tile[jj][lane * C], v);
    bool take[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) take[i] = !kGuarded || first_key + jj < end[i];
    Order::template pv_key<C, kGuarded>(p, v, take, acc);
  }
}

// ---------------------------------------------------------------- the kernel
template <class Order, class Elem, int C, int G>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_tiled_kernel(AttentionArgs a, const RowBlock* __restrict__ blocks, int32_t kv_heads, bool allow_bounds,
                         bool two_tiles_ahead) {
  static_assert(kUnits % G == 0);
  constexpr int D = Shape<C>::D;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem<C>& sm = *reinterpret_cast<Smem<C>*>(smem_raw);
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % kWarp;
  const int warp = tid / kWarp;
  const RowBlock blk = blocks[blockIdx.x / kv_heads];
  const int32_t kv_head = static_cast<int32_t>(blockIdx.x % kv_heads);
  const PageDivider page = a.pools.geometry.page_divider();
  const int32_t* table = a.block_table + static_cast<int64_t>(blk.seq) * a.max_blocks_per_seq;
  const float score_scale = a.scales.sm_scale * a.scales.k_scale;

  const BlockKeys bk{blk, page};
  const int64_t keys_attended = bk.attended(), keys_listed = bk.listed();
  const int32_t pass1_chunks = static_cast<int32_t>((keys_attended + kChunk - 1) / kChunk);
  const int32_t pass2_chunks = static_cast<int32_t>((keys_listed + kChunk - 1) / kChunk);
  const int32_t steps = pass1_chunks + 2 * pass2_chunks;

  // q of every unit (u = r * G + g) as exact fp32.
  for (int i = tid; i < kUnits * D; i += kThreads) {
    const int u = i / D, d = i % D, r = u / G;
    sm.q[u][d] = r < blk.rows ? load_float(a.q.data, a.q.dtype,
                                           a.q.offset(int64_t{blk.first_row} + r, kv_head * G + u % G, d))
                              : 0.0f;
  }
  // Pass 1 bounds its scores on the tensor cores only for a positive finite
  // scale: then the max of the scaled scores is the scaled max of the dots
  // (rounding is monotone), the max the candidates are chosen for.
  const bool bounded = allow_bounds && score_scale > 0.0f && score_scale < canon::pos_inf();
  Pass1Smem<C>& p1 = sm.p1;
  if (bounded) {
    __syncthreads();  // sm.q is written
    for (int i = tid; i < kUnits * D / 2; i += kThreads) {
      const int u = i / (D / 2), d = 2 * (i % (D / 2));
      uint32_t hi, lo;
      split_bf16x2(sm.q[u][d], sm.q[u][d + 1], hi, lo);
      *reinterpret_cast<uint32_t*>(&p1.q_hi[u][d]) = hi;
      *reinterpret_cast<uint32_t*>(&p1.q_lo[u][d]) = lo;
    }
    {
      // 4 threads per unit (consecutive lanes), D / 4 dims each.
      const int u = tid / 4;
      uint32_t magnitude = 0;
      for (int d = (tid % 4) * (D / 4); d < (tid % 4 + 1) * (D / 4); ++d)
        magnitude = max(magnitude, float_bits(sm.q[u][d]) & 0x7FFFFFFFu);
      magnitude = max(magnitude, __shfl_xor_sync(kFullMask, magnitude, 1));
      magnitude = max(magnitude, __shfl_xor_sync(kFullMask, magnitude, 2));
      if (tid % 4 == 0) p1.q_bound[u] = kBoundScale * bound_factor(magnitude);
    }
    static_assert(kThreads == 4 * kUnits);
  }
  if (tid < kUnits) {
    p1.max_key[tid] = ordered_key(canon::neg_inf());
#pragma unroll
    for (int par = 0; par < 2; ++par)
#pragma unroll
      for (int half = 0; half < 2; ++half) p1.lower[par][half][tid] = canon::neg_inf();
  }
  if (tid == 0) p1.count[0] = 0;

  // The tile schedule: pass 1's K tiles, then per partition its K tiles and
  // its V tiles. advance() makes step s's tile current and starts loading
  // step s + 2's into the registers it frees, so a tile's global loads overlap
  // the two tiles' arithmetic before it.
  const int32_t parts = (pass2_chunks + kChunksPerPart - 1) / kChunksPerPart;
  auto chunks_of = [&](int32_t part) { return min(kChunksPerPart, pass2_chunks - part * kChunksPerPart); };
  auto tile_of = [&](int32_t s, int32_t& kv, int32_t& chunk) {
    if (s < pass1_chunks) {
      kv = 0;
      chunk = s;
      return;
    }
    const int32_t t = s - pass1_chunks;
    const int32_t part = t / (2 * kChunksPerPart);
    const int32_t r = t % (2 * kChunksPerPart);
    const int32_t n = chunks_of(part);
    kv = r >= n ? 1 : 0;
    chunk = part * kChunksPerPart + r - kv * n;
  };
  // Two tiles in flight: step s's tile waits in the registers of the loader
  // of its parity while step s + 1's loads are still outstanding. With one, a
  // pass-1 tile's loads had only its short tensor-core bound to hide behind.
  // (!two_tiles_ahead, KVSIM_PREFILL_TILES_AHEAD=1: one tile, the loaders
  // alternating, for same-binary timings.)
  TileLoader<Elem, C> even, odd;
  auto prefetch = [&](TileLoader<Elem, C>& loader, int32_t s) {
    if (s >= steps) return;
    int32_t kv, chunk;
    tile_of(s, kv, chunk);
    loader.load(a, table, kv_head, kv, int64_t{chunk} * kChunk, keys_listed);
  };
  auto advance = [&](int32_t s) {
    __syncthreads();  // the tile is free; earlier shared writes are visible
    Pass1Smem<C>* bounds = bounded && s < pass1_chunks ? &p1 : nullptr;
    auto store_and_refill = [&](TileLoader<Elem, C>& current, TileLoader<Elem, C>& other) {
      current.store(sm.tile, bounds);
      __syncthreads();
      if (two_tiles_ahead)
        prefetch(current, s + 2);
      else
        prefetch(other, s + 1);
    };
    // Two calls, not a reference chosen at run time: that would put the loaders' registers on the stack.
    if (s % 2 == 0)
      store_and_refill(even, odd);
    else
      store_and_refill(odd, even);
  };
  prefetch(even, 0);
  if (two_tiles_ahead) prefetch(odd, 1);

  // Score-tile coordinates: units u0 .. u0 + 3, keys k0, k0 + 16, k0 + 32, k0 + 48.
  const int u0 = (tid / 16) * 4;
  const int k0 = tid % 16;
  auto scores = [&](int64_t first_key, float (&sc)[4][4]) {
    float dot[4][4];
    Order::template dots<C>(&sm.q[u0][0], &sm.tile[k0][0], dot);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t key = first_key + k0 + 16 * j;
#pragma unroll
      for (int i = 0; i < 4; ++i)
        sc[i][j] = key < bk.attended_end((u0 + i) / G) ? dot[i][j] * score_scale : canon::neg_inf();
    }
  };

  // Pass 1: M per unit. Tiles whose scores are computed in full keep their
  // maxima in run_max (order-free over the 16 key columns of each unit); the
  // candidates' exact scores go to p1.max_key.
  int32_t s = 0;
  {
    float run_max[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) run_max[i] = canon::neg_inf();
    // Bounds: warp w holds units 16 (w % 4) .. + 15 and keys 32 (w / 4) .. + 31
    // of a tile as m16n8 fragments (rows g, g + 8; columns 2t, 2t + 1 of 4 n-tiles).
    const int mb = warp % 4, half = warp / 4, g = lane / 4, t = lane % 4;
    const int unit[2] = {16 * mb + g, 16 * mb + g + 8};
    float lower[2] = {canon::neg_inf(), canon::neg_inf()};  // this quad's best lower bounds so far
    for (; s < pass1_chunks; ++s) {
      advance(s);
      const int64_t first_key = int64_t{s} * kChunk;
      bool every_score = !bounded;
      if (bounded) {
        const int par = s % 2;
        float acc[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
          uint32_t a_hi[4], a_lo[4];
          const int a_row = 16 * mb + (lane % 8) + 8 * ((lane / 8) % 2), a_col = 16 * ks + 8 * (lane / 16);
          ldmatrix_x4(a_hi, &p1.q_hi[a_row][a_col]);
          ldmatrix_x4(a_lo, &p1.q_lo[a_row][a_col]);
#pragma unroll
          for (int pair = 0; pair < 2; ++pair) {
            // Matrix i = lane / 8: n-tile 2 pair + i / 2, k half i % 2: b0, b1 of two n-tiles.
            const int b_row = 32 * half + 8 * (2 * pair + lane / 16) + lane % 8, b_col = 16 * ks + 8 * ((lane / 8) % 2);
            uint32_t b[4];
            ldmatrix_x4(b, &p1.k_hi[b_row][b_col]);
            mma_16816(mma::Operand::bf16, acc[2 * pair], a_hi, b[0], b[1]);
            mma_16816(mma::Operand::bf16, acc[2 * pair], a_lo, b[0], b[1]);
            mma_16816(mma::Operand::bf16, acc[2 * pair + 1], a_hi, b[2], b[3]);
            mma_16816(mma::Operand::bf16, acc[2 * pair + 1], a_lo, b[2], b[3]);
            if constexpr (!kIsBf16<Elem>) {
              ldmatrix_x4(b, &p1.k_lo[b_row][b_col]);
              mma_16816(mma::Operand::bf16, acc[2 * pair], a_hi, b[0], b[1]);
              mma_16816(mma::Operand::bf16, acc[2 * pair + 1], a_hi, b[2], b[3]);
            }
          }
        }
        // acc[nt][2 r + c]: unit[r], key 32 half + 8 nt + 2 t + c; f(r, key, a, e)
        // for each of them the unit attends.
        float q_bound[2];
        int64_t end[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          q_bound[r] = p1.q_bound[unit[r]];
          end[r] = bk.attended_end(unit[r] / G);
        }
        auto each_attended = [&](auto&& f) {
#pragma unroll
          for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int kk = 32 * half + 8 * nt + 2 * t + c;
              const float k_bound = p1.k_bound[kk];
#pragma unroll
              for (int r = 0; r < 2; ++r)
                if (first_key + kk < end[r]) f(r, kk, acc[nt][2 * r + c], q_bound[r] * k_bound);
            }
        };
        // Lower bounds a - e first (NaN: no bound), joined over the quad.
        each_attended([&](int r, int, float a, float e) {
          const float low = a - e;
          if (low > lower[r]) lower[r] = low;
        });
        float best[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
#pragma unroll
          for (int off = 1; off < 4; off <<= 1) {
            const float o = __shfl_xor_sync(kFullMask, lower[r], off);
            lower[r] = o > lower[r] ? o : lower[r];
          }
          if (t == 0) p1.lower[par][half][unit[r]] = lower[r];
          // The other key half's bound of the previous tile (written before this tile's barriers).
          const float other = p1.lower[par ^ 1][half ^ 1][unit[r]];
          best[r] = other > lower[r] ? other : lower[r];
        }
        // Candidates: keys whose upper bound a + e reaches the best lower bound
        // (NaN and Inf bounds included); any other key's dot is below that of
        // the key that gave the bound.
        each_attended([&](int r, int kk, float a, float e) {
          if (!(a + e < best[r])) p1.candidates[atomicAdd(&p1.count[par], 1u)] = static_cast<uint32_t>(unit[r] << 6 | kk);
        });
        if (tid == 0) p1.count[par ^ 1] = 0;  // the next tile's list (its last reader was the previous tile)
        __syncthreads();
        const int n = static_cast<int>(p1.count[par]);
        if (n > kCandidateLimit) {
          every_score = true;
        } else {
          // One warp per candidate: canon::dot's lane chains and butterfly.
          for (int i = warp; i < n; i += kThreads / kWarp) {
            const uint32_t cand = p1.candidates[i];
            const int u = static_cast<int>(cand >> 6), kk = static_cast<int>(cand & 63u);
            float qv[C], kv[C];
            load_run<float, C>(&sm.q[u][lane * C], qv);
            load_run<float, C>(&sm.tile[kk][lane * C], kv);
            float v = 0.0f;
#pragma unroll
            for (int c = 0; c < C; ++c) v = canon::fma_f32(qv[c], kv[c], v);
            const float score = warp_butterfly_sum(v) * score_scale;
            if (lane == 0 && !is_nan(score)) atomicMax(&p1.max_key[u], ordered_key(score));
          }
        }
      }
      if (every_score) {
        float sc[4][4];
        scores(first_key, sc);
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) run_max[i] = sc[i][j] > run_max[i] ? sc[i][j] : run_max[i];
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float m = group16_max(run_max[i]);
      if (k0 == 0 && !is_nan(m)) atomicMax(&p1.max_key[u0 + i], ordered_key(m));
    }
    __syncthreads();
    if (tid < kUnits) sm.global_max[tid] = from_ordered_key(p1.max_key[tid]);
    __syncthreads();  // pass 2 reuses p1's memory
  }

  // Pass 2. P.V coordinates: units 8 * warp .. + 7, dims lane * C .. + C - 1;
  // O lives in shared memory (sm.o), L in registers (the same in every lane).
  const int pu0 = warp * 8;
  float out_sum[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    out_sum[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < C; ++c) sm.p2.o[pu0 + i][lane * C + c] = 0.0f;
  }
  for (int32_t part = 0; part < parts; ++part) {
    const int32_t n_chunks = chunks_of(part);
    const int64_t part_first = int64_t{part} * kPartitionSize;
    for (int32_t ch = 0; ch < n_chunks; ++ch, ++s) {
      advance(s);
      float sc[4][4];
      scores(part_first + ch * kChunk, sc);
#pragma unroll
      for (int j = 0; j < 4; ++j)
        *reinterpret_cast<float4*>(&sm.p2.s[ch * kChunk + k0 + 16 * j][u0]) =
            make_float4(sc[0][j], sc[1][j], sc[2][j], sc[3][j]);
    }
    // Softmax of the partition: keys [0, n) of sm.s hold its scores.
    const int n = n_chunks * kChunk;
    __syncthreads();
    {
      const int u = tid % kUnits, qtr = tid / kUnits;
      constexpr int kQuarter = kPartitionSize / (kThreads / kUnits);
      float m = canon::neg_inf();
      for (int j = qtr * kQuarter; j < (qtr + 1) * kQuarter && j < n; ++j) m = sm.p2.s[j][u] > m ? sm.p2.s[j][u] : m;
      sm.p2.quarter_max[qtr][u] = m;
    }
    __syncthreads();
    if (tid < kUnits) {
      float m = canon::neg_inf();
#pragma unroll
      for (int qtr = 0; qtr < kThreads / kUnits; ++qtr) m = sm.p2.quarter_max[qtr][tid] > m ? sm.p2.quarter_max[qtr][tid] : m;
      sm.part_max[tid] = m;
    }
    __syncthreads();
    {
      // Probabilities and core's lane runs (keys [8l, 8l + 8) in order).
      const int u = tid % kUnits;
      const float m = sm.part_max[u];
      for (int l = tid / kUnits; l < kWarp; l += kThreads / kUnits) {
        float sum = 0.0f;
        for (int j = l * canon::kLaneRun; j < (l + 1) * canon::kLaneRun && j < n; ++j) {
          const float p = canon::probability(sm.p2.s[j][u], m);
          sm.p2.s[j][u] = p;
          sum = sum + p;
        }
        sm.p2.run[u][l] = sum;
      }
    }
    __syncthreads();
    if (tid < kUnits) {
      float v[kWarp];
#pragma unroll
      for (int l = 0; l < kWarp; ++l) v[l] = sm.p2.run[tid][l];
      sm.part_sum[tid] = butterfly_lane0(v);
    }
    // (advance()'s barrier publishes the probabilities and sums.)

    // P.V over the partition's V tiles in key order; keys past a unit's list add nothing.
    float acc[8][C];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int c = 0; c < C; ++c) acc[i][c] = 0.0f;
    for (int32_t ch = 0; ch < n_chunks; ++ch, ++s) {
      advance(s);
      const int64_t first_key = part_first + ch * kChunk;
      if (first_key + kChunk > bk.list_end(0)) {
        pv_tile<Order, C, G, true>(sm, ch, pu0, lane, first_key, bk, acc);
      } else {
        pv_tile<Order, C, G, false>(sm, ch, pu0, lane, first_key, bk, acc);
      }
    }
    // Fold the partition in partition order: attend_query's merge, for the
    // units whose key list reaches it (the others have no such partition).
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (part_first >= bk.list_end((pu0 + i) / G)) continue;
      const float w = canon::merge_weight(sm.part_max[pu0 + i], sm.global_max[pu0 + i]);
      out_sum[i] = canon::fma_f32(sm.part_sum[pu0 + i], w, out_sum[i]);
#pragma unroll
      for (int c = 0; c < C; ++c) {
        float& o = sm.p2.o[pu0 + i][lane * C + c];
        o = canon::fma_f32(acc[i][c], w, o);
      }
    }
  }

  // out = (O / L) * v_scale, rounded to the output dtype.
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int u = pu0 + i, r = u / G;
    if (r >= blk.rows) continue;
    if (lane == 0) store_lse(a, int64_t{blk.first_row} + r, kv_head * G + u % G, sm.global_max[u], out_sum[i]);
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int d = lane * C + c;
      store_float(a.out.data, a.out.dtype, a.out.offset(int64_t{blk.first_row} + r, kv_head * G + u % G, d),
                  (sm.p2.o[u][d] / out_sum[i]) * a.scales.v_scale);
    }
  }
}

// ---------------------------------------------------------------- dispatch
// KVSIM_PREFILL_PASS1=every computes every canonical score in pass 1 (the
// kernel before the bounds), for same-binary before/after timings; unset or
// `bounded`: the bounds where the scale allows them. The bytes are the same.
bool pass1_bounds_allowed() {
  static const bool allowed = env_switch("KVSIM_PREFILL_PASS1", "bounded", "every");  // a throw leaves it unset
  return allowed;
}

// KVSIM_PREFILL_TILES_AHEAD=1 keeps one K/V tile in flight instead of two
// (same-binary timings of the two-deep prefetch); unset or 2: two.
bool two_tiles_ahead() {
  static const bool two = env_switch("KVSIM_PREFILL_TILES_AHEAD", "2", "1");
  return two;
}

template <class Elem, int C, int G>
bool launch_shape(const AttentionArgs& a, const RowBlock* blocks, int32_t n_blocks, cudaStream_t stream,
                  KernelInfo* info) {
  auto kernel = prefill_tiled_kernel<CanonicalFp32Order, Elem, C, G>;
  const int smem = static_cast<int>(sizeof(Smem<C>));
  if (prefill_kernel_setup(kernel, kThreads, smem, kChunk, 1, info)) return true;
  const int32_t kv_heads = a.pools.geometry.kv_heads;
  kernel<<<static_cast<unsigned>(n_blocks) * kv_heads, kThreads, smem, stream>>>(a, blocks, kv_heads,
                                                                                 pass1_bounds_allowed(), two_tiles_ahead());
  check_launch("prefill_attention", "prefill_tiled_kernel", stream);
  return true;
}

template <class Elem, int C>
bool launch_group(const AttentionArgs& a, const RowBlock* blocks, int32_t n, cudaStream_t stream, KernelInfo* info) {
  switch (a.group) {
    case 1: return launch_shape<Elem, C, 1>(a, blocks, n, stream, info);
    case 2: return launch_shape<Elem, C, 2>(a, blocks, n, stream, info);
    case 4: return launch_shape<Elem, C, 4>(a, blocks, n, stream, info);
    case 8: return launch_shape<Elem, C, 8>(a, blocks, n, stream, info);
    default: return false;
  }
}

// D = 128 only: the register budget of the 4 x 4 score tile fits C = 4 (a
// C = 2 instantiation spilled); other head dims take the partition plan.
template <class Elem>
bool launch_dims(const AttentionArgs& a, const RowBlock* blocks, int32_t n, cudaStream_t stream, KernelInfo* info) {
  if (a.pools.geometry.head_dim != 128) return false;
  return launch_group<Elem, 4>(a, blocks, n, stream, info);
}

bool launch(const AttentionArgs& a, const RowBlock* blocks, int32_t n, cudaStream_t stream, KernelInfo* info) {
  switch (a.pools.geometry.dtype) {
    case CacheDtype::bf16: return launch_dims<Bf16Code>(a, blocks, n, stream, info);
    case CacheDtype::fp16: return launch_dims<F16Code>(a, blocks, n, stream, info);
    case CacheDtype::fp32: return launch_dims<float>(a, blocks, n, stream, info);
    default: return false;
  }
}

}  // namespace prefill_tiled

bool prefill_rows_contiguous(const KvPools& pools) {
  const PoolGeometry& g = pools.geometry;
  if (g.kv_factor != 2) return false;
  const int64_t elem = bits_per_element(g.dtype) / 8;
  if (elem == 0 || reinterpret_cast<uintptr_t>(pools.data[0]) % 16 != 0) return false;
  const PoolStrides& st = pools.strides[0];
  for (const int64_t s : {st.block, st.layer, st.kv})
    if (s * elem % 16 != 0) return false;
  for (int kv = 0; kv < 2; ++kv) {
    const InnerStrides& in = st.inner[kv];
    if (in.x != g.head_dim || in.dim_inner != 1 || in.head * elem % 16 != 0 || in.token * elem % 16 != 0) return false;
  }
  return true;
}

bool prefill_tiled_applies(const KvPools& pools, const TensorView& q, const WindowMapping& window) {
  const PoolGeometry& g = pools.geometry;
  if (window.enabled()) return false;
  if (g.dtype != CacheDtype::bf16 && g.dtype != CacheDtype::fp16 && g.dtype != CacheDtype::fp32) return false;
  if (g.head_dim != 128) return false;
  const int64_t group = q.shape[1] / g.kv_heads;
  if (group != 1 && group != 2 && group != 4 && group != 8) return false;
  return prefill_rows_contiguous(pools);
}

bool prefill_tiled_info(const KvPools& pools, const TensorView& q, KernelInfo& info) {
  AttentionArgs a;
  a.pools = pools;
  a.group = static_cast<int32_t>(q.shape[1] / pools.geometry.kv_heads);
  return prefill_tiled::launch(a, nullptr, 0, nullptr, &info);
}

std::vector<RowBlock> make_row_blocks(const PrefillAttentionOp& op, int32_t rows_per_block) {
  std::vector<RowBlock> blocks;
  for (size_t b = 0; b + 1 < op.q_indptr.size(); ++b)
    for (int32_t i = op.q_indptr[b]; i < op.q_indptr[b + 1]; i += rows_per_block) {
      RowBlock r;
      r.seq = static_cast<int32_t>(b);
      r.first_row = i;
      r.rows = std::min(rows_per_block, op.q_indptr[b + 1] - i);
      r.first_position =
          static_cast<int32_t>(prefill_position(op.seq_lens[b], op.q_indptr[b], op.q_indptr[b + 1], i));
      blocks.push_back(r);
    }
  std::stable_sort(blocks.begin(), blocks.end(), [](const RowBlock& x, const RowBlock& y) {
    return x.first_position + x.rows > y.first_position + y.rows;
  });
  return blocks;
}

PrefillUpload upload_prefill(const char* name, const KvPools& pools, const PrefillAttentionOp& op, int32_t group,
                             const std::vector<RowBlock>& blocks, size_t extra_bytes, cudaStream_t stream) {
  auto aligned = [](size_t n) { return (n + 255) / 256 * 256; };
  const size_t block_bytes = blocks.size() * sizeof(RowBlock);
  const size_t table_bytes = op.block_table.size() * sizeof(int32_t);
  PrefillUpload up;
  KVSIM_CUDA_CHECK(name, cudaMallocAsync(&up.meta, aligned(block_bytes) + aligned(table_bytes) + extra_bytes, stream));
  KVSIM_CUDA_CHECK(name, cudaMemcpyAsync(up.meta, blocks.data(), block_bytes, cudaMemcpyHostToDevice, stream));
  char* table = static_cast<char*>(up.meta) + aligned(block_bytes);
  if (table_bytes)
    KVSIM_CUDA_CHECK(name, cudaMemcpyAsync(table, op.block_table.data(), table_bytes, cudaMemcpyHostToDevice, stream));
  up.blocks = static_cast<const RowBlock*>(up.meta);
  up.extra = extra_bytes ? table + aligned(table_bytes) : nullptr;
  AttentionArgs& a = up.args;
  a.pools = pools;
  a.layer = op.layer;
  a.q = op.q;
  a.out = op.out;
  a.lse = op.lse;
  a.block_table = reinterpret_cast<const int32_t*>(table);
  a.max_blocks_per_seq = op.max_blocks_per_seq;
  a.scales = op.scales;
  a.window = op.window;
  a.order = op.order;
  a.group = group;
  return up;
}

void PrefillUpload::release(cudaStream_t stream) {
  if (meta) KVSIM_CUDA_CHECK("prefill_attention", cudaFreeAsync(meta, stream));
  meta = nullptr;
}

void prefill_attention_tiled(const KvPools& pools, const PrefillAttentionOp& op, cudaStream_t stream,
                             cudaEvent_t kernels_start) {
  const int32_t group = static_cast<int32_t>(op.q.shape[1] / pools.geometry.kv_heads);
  const std::vector<RowBlock> blocks = make_row_blocks(op, prefill_tiled::kUnits / group);
  if (blocks.empty()) return;
  PrefillUpload up = upload_prefill("prefill_attention", pools, op, group, blocks, 0, stream);
  if (kernels_start) KVSIM_CUDA_CHECK("attention timing", cudaEventRecord(kernels_start, stream));
  prefill_tiled::launch(up.args, up.blocks, static_cast<int32_t>(blocks.size()), stream, nullptr);
  up.release(stream);
}

}  // namespace kvsim::cuda
