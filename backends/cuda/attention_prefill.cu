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
//  pass 1: every K tile, canonical scores, M = max per unit (order-free: a
//          different order can change only the sign of a zero max, and
//          exp(s - m) is the same for either zero);
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
#include "backends/cuda/prefill_rows.cuh"

#include <algorithm>
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

// Shared memory of one CTA (floats).
template <int C>
struct Smem {
  float q[kUnits][Shape<C>::kStride];
  float tile[kChunk][Shape<C>::kStride];
  float s[kPartitionSize][kUnits];  // scores, then probabilities, key-major
  float run[kUnits][kWarp + 1];     // lane-run partial sums
  float quarter_max[kThreads / kUnits][kUnits];
  float o[kUnits][Shape<C>::D];     // O of the merge, per unit
  float global_max[kUnits];
  float part_max[kUnits];
  float part_sum[kUnits];
};

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

  __device__ __forceinline__ void store(float (*tile)[Shape<C>::kStride]) const {
    constexpr int kPer = 16 / static_cast<int>(sizeof(Elem));  // codes per piece
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
    }
  }
};

struct Bf16Code {
  uint16_t bits;
  static constexpr bool kBf16 = true;
};
struct F16Code {
  uint16_t bits;
  static constexpr bool kBf16 = false;
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
    const float4 pa = *reinterpret_cast<const float4*>(&sm.s[ch * kChunk + jj][pu0]);
    const float4 pb = *reinterpret_cast<const float4*>(&sm.s[ch * kChunk + jj][pu0 + 4]);
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
    prefill_tiled_kernel(AttentionArgs a, const RowBlock* __restrict__ blocks, int32_t kv_heads) {
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

  // The tile schedule: pass 1's K tiles, then per partition its K tiles and
  // its V tiles. advance() makes step s's tile current and starts loading
  // step s + 1's into registers, so a tile's global loads overlap the
  // previous tile's arithmetic.
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
  TileLoader<Elem, C> loader;
  auto prefetch = [&](int32_t s) {
    if (s >= steps) return;
    int32_t kv, chunk;
    tile_of(s, kv, chunk);
    loader.load(a, table, kv_head, kv, int64_t{chunk} * kChunk, keys_listed);
  };
  auto advance = [&](int32_t s) {
    __syncthreads();  // the tile is free; earlier shared writes are visible
    loader.store(sm.tile);
    __syncthreads();
    prefetch(s + 1);
  };
  prefetch(0);

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

  // Pass 1: M per unit (order-free max over the 16 key columns of each unit).
  int32_t s = 0;
  {
    float run_max[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) run_max[i] = canon::neg_inf();
    for (; s < pass1_chunks; ++s) {
      advance(s);
      float sc[4][4];
      scores(int64_t{s} * kChunk, sc);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) run_max[i] = sc[i][j] > run_max[i] ? sc[i][j] : run_max[i];
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float m = group16_max(run_max[i]);
      if (k0 == 0) sm.global_max[u0 + i] = m;
    }
  }

  // Pass 2. P.V coordinates: units 8 * warp .. + 7, dims lane * C .. + C - 1;
  // O lives in shared memory (sm.o), L in registers (the same in every lane).
  const int pu0 = warp * 8;
  float out_sum[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    out_sum[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < C; ++c) sm.o[pu0 + i][lane * C + c] = 0.0f;
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
        *reinterpret_cast<float4*>(&sm.s[ch * kChunk + k0 + 16 * j][u0]) =
            make_float4(sc[0][j], sc[1][j], sc[2][j], sc[3][j]);
    }
    // Softmax of the partition: keys [0, n) of sm.s hold its scores.
    const int n = n_chunks * kChunk;
    __syncthreads();
    {
      const int u = tid % kUnits, qtr = tid / kUnits;
      constexpr int kQuarter = kPartitionSize / (kThreads / kUnits);
      float m = canon::neg_inf();
      for (int j = qtr * kQuarter; j < (qtr + 1) * kQuarter && j < n; ++j) m = sm.s[j][u] > m ? sm.s[j][u] : m;
      sm.quarter_max[qtr][u] = m;
    }
    __syncthreads();
    if (tid < kUnits) {
      float m = canon::neg_inf();
#pragma unroll
      for (int qtr = 0; qtr < kThreads / kUnits; ++qtr) m = sm.quarter_max[qtr][tid] > m ? sm.quarter_max[qtr][tid] : m;
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
          const float p = canon::probability(sm.s[j][u], m);
          sm.s[j][u] = p;
          sum = sum + p;
        }
        sm.run[u][l] = sum;
      }
    }
    __syncthreads();
    if (tid < kUnits) {
      float v[kWarp];
#pragma unroll
      for (int l = 0; l < kWarp; ++l) v[l] = sm.run[tid][l];
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
        float& o = sm.o[pu0 + i][lane * C + c];
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
                  (sm.o[u][d] / out_sum[i]) * a.scales.v_scale);
    }
  }
}

// ---------------------------------------------------------------- dispatch
template <class Elem, int C, int G>
bool launch_shape(const AttentionArgs& a, const RowBlock* blocks, int32_t n_blocks, cudaStream_t stream,
                  KernelInfo* info) {
  auto kernel = prefill_tiled_kernel<CanonicalFp32Order, Elem, C, G>;
  const int smem = static_cast<int>(sizeof(Smem<C>));
  if (prefill_kernel_setup(kernel, kThreads, smem, kChunk, 1, info)) return true;
  const int32_t kv_heads = a.pools.geometry.kv_heads;
  kernel<<<static_cast<unsigned>(n_blocks) * kv_heads, kThreads, smem, stream>>>(a, blocks, kv_heads);
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
