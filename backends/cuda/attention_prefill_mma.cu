// prefill_attention in the mma order (docs/canonical-arithmetic.md, "The mma
// order") as a tiled tensor-core kernel, byte-identical to the CPU oracle's
// attend_query_mma (core/include/kvsim/core/ops/attention.hpp), with each K/V
// tile loaded once for a block of consecutive query rows.
//
// Work: one CTA of kWarps warps per (row block, KV head); a row block is up to
// kUnits / G consecutive query rows of one sequence (prefill_rows.cuh), whose
// (row, query head) "units" u = r * G + h are the rows of kWarps m16 tiles:
// warp w owns units 16w .. 16w + 15. K/V tiles of 64 keys arrive by cp.async
// into a two-stage shared-memory ring as the cache's own 16-bit codes and are
// read with ldmatrix; tiles past the block's last key are never loaded.
//
// The merge folds partition p with w_p = exp(m_p - M) in partition order, so
// the CTA makes two passes:
//  pass 1: every K tile: scores (the mma chain over 16-dim chunks from +0,
//          then one multiply by the scale; masked keys -inf), the max of each
//          unit's 256-key partitions (order-free: only a zero's sign can
//          differ, and exp(s - m) is the same for either zero) into a small
//          global scratch, and M per unit;
//  pass 2: per tile: the scores again (the same instructions: the same bits),
//          p = probability(s, m_p), the lane runs of 8 keys in order (through
//          shared memory), P split into bf16/fp16 hi and lo and P.V by one mma
//          per 8 keys and 8 dims (k 0..7 the hi parts, 8..15 the lo parts, B
//          the 8 V codes twice), acc_p from +0 per partition; at a partition's
//          end the butterfly of its 32 runs gives l_p, and L = fma(l_p, w_p, L),
//          O = fma(acc_p, w_p, O) for the units whose key list reaches it.
//
// Units of one m16 tile can have key lists of different lengths (rows of
// different pages). A key past a unit's list must add nothing to its P.V,
// although p = 0 for it: a NaN or Inf V there would poison 0 * V. A group of
// 8 keys that some of the warp's lists end inside runs once per distinct cut
// with the V codes past the cut zeroed (the oracle's v = 0), each unit taking
// the run of its own cut; groups past every list are skipped (an mma of zero
// products returns its c unchanged, so skipping equals running).
#include "backends/cuda/attention_plan.cuh"
#include "backends/cuda/attention_warp.cuh"
#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/mma_fragments.cuh"
#include "backends/cuda/prefill_rows.cuh"

#include <climits>
#include <vector>

namespace kvsim::cuda {
namespace prefill_mma {

using canon::kPartitionSize;
using canon::kWarp;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarp;
constexpr int kUnits = kWarps * 16;  // (row, query head) units per CTA
constexpr int kTileKeys = 64;
constexpr int kTilesPerPart = kPartitionSize / kTileKeys;
constexpr int kD = 128;
constexpr int kDimTiles = kD / 8;  // n-tiles of P.V's output
constexpr int kChunks = kD / 16;   // k-chunks of a score
constexpr int kKeyTiles = kTileKeys / 8;
constexpr int kRowCodes = kD + 8;  // padded shared row (272 bytes): ldmatrix's 8 rows hit distinct banks
constexpr int kPStride = kTileKeys + 8;  // probability rows: a warp's 64-bit stores hit distinct banks
constexpr int kRunsPerPart = kPartitionSize / canon::kLaneRun;
static_assert(kRunsPerPart == kWarp && kTilesPerPart * kTileKeys == kPartitionSize);

struct Smem {
  uint16_t k[2][kTileKeys][kRowCodes];
  uint16_t v[2][kTileKeys][kRowCodes];
  uint16_t q[kUnits][kRowCodes];      // operand codes
  float p[kWarps][16][kPStride];      // one tile's probabilities, per warp
  float run[kUnits][kRunsPerPart + 1];  // a partition's lane-run sums
  float part_sum[kUnits];
};

// One tile's scores for the warp's 16 units: S[n] is the C fragment of keys
// 8n .. 8n + 7 of the tile, each the chain of kChunks mma from +0, chunk 0
// first.
__device__ __forceinline__ void tile_scores(mma::Operand f, const Smem& sm, int buf, int warp, int lane,
                                            float (&S)[kKeyTiles][4]) {
#pragma unroll
  for (int n = 0; n < kKeyTiles; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) S[n][i] = 0.0f;
  const int qrow = warp * 16 + (lane & 7) + 8 * ((lane >> 3) & 1);
#pragma unroll
  for (int kp = 0; kp < kChunks / 2; ++kp) {
    uint32_t qa[4], qb[4];  // A of chunks 2kp and 2kp + 1
    ldmatrix_x4(qa, &sm.q[qrow][32 * kp + 8 * (lane >> 4)]);
    ldmatrix_x4(qb, &sm.q[qrow][32 * kp + 16 + 8 * (lane >> 4)]);
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
      uint32_t b[4];  // b0, b1 of chunk 2kp, then of chunk 2kp + 1
      ldmatrix_x4(b, &sm.k[buf][8 * n + (lane & 7)][32 * kp + 8 * (lane >> 3)]);
      mma_16816(f, S[n], qa, b[0], b[1]);
      mma_16816(f, S[n], qb, b[2], b[3]);
    }
  }
}

// P.V of one group of 8 keys (starting at absolute key kg) for the warp's 16
// units: A = the keys' hi parts (k 0..7) and lo parts (k 8..15) from the
// probabilities p (the score's C fragment), B = the 8 V codes twice by
// ldmatrix.trans from vrow (this lane's row of the group in the V tile).
// Where some list of the warp ends inside the group (kg + 8 > lo_end), one
// run per distinct cut with the V codes past the cut zeroed; each unit keeps
// its own cut's result (cut 0: nothing).
__device__ __forceinline__ void pv_group(mma::Operand f, float p0, float p1, float p2, float p3, const uint16_t* vrow, int64_t kg,
                                         int32_t lo_end, int64_t end_a, int64_t end_b, int t4,
                                         float (&acc)[kDimTiles][4]) {
  mma_order::SplitProbability sp[4];
  const float p[4] = {p0, p1, p2, p3};
#pragma unroll
  for (int i = 0; i < 4; ++i) sp[i] = mma_order::split_probability(f, p[i]);
  const uint32_t pa[4] = {pack_codes(sp[0].hi, sp[1].hi), pack_codes(sp[2].hi, sp[3].hi),
                          pack_codes(sp[0].lo, sp[1].lo), pack_codes(sp[2].lo, sp[3].lo)};
  if (kg + 8 <= lo_end) {
#pragma unroll
    for (int dq = 0; dq < kDimTiles / 4; ++dq) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, vrow + 32 * dq);
#pragma unroll
      for (int m = 0; m < 4; ++m) mma_16816(f, acc[4 * dq + m], pa, b[m], b[m]);
    }
    return;
  }
  auto cut = [&](int64_t end) { return end <= kg ? 0 : end - kg >= 8 ? 8 : static_cast<int>(end - kg); };
  const int cut_a = cut(end_a), cut_b = cut(end_b);
  for (int c = 1; c <= 8; ++c) {
    if (!__any_sync(kFullMask, cut_a == c || cut_b == c)) continue;
    const uint32_t keep = (2 * t4 < c ? 0x0000FFFFu : 0u) | (2 * t4 + 1 < c ? 0xFFFF0000u : 0u);
#pragma unroll
    for (int dq = 0; dq < kDimTiles / 4; ++dq) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, vrow + 32 * dq);
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        float r[4] = {acc[4 * dq + m][0], acc[4 * dq + m][1], acc[4 * dq + m][2], acc[4 * dq + m][3]};
        mma_16816(f, r, pa, b[m] & keep, b[m] & keep);
        if (cut_a == c) {
          acc[4 * dq + m][0] = r[0];
          acc[4 * dq + m][1] = r[1];
        }
        if (cut_b == c) {
          acc[4 * dq + m][2] = r[2];
          acc[4 * dq + m][3] = r[3];
        }
      }
    }
  }
}

template <bool kF16>
__global__ void __launch_bounds__(kThreads, 2)
    prefill_mma_kernel(AttentionArgs a, const RowBlock* __restrict__ blocks, int32_t kv_heads,
                       float* __restrict__ part_max) {
  constexpr mma::Operand f = kF16 ? mma::Operand::fp16 : mma::Operand::bf16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % kWarp, warp = tid / kWarp;
  const int g = lane >> 2, t4 = lane & 3;
  const RowBlock blk = blocks[blockIdx.x / kv_heads];
  const int32_t kv_head = static_cast<int32_t>(blockIdx.x % kv_heads);
  const int32_t G = a.group;
  const PageDivider page = a.pools.geometry.page_divider();
  const int32_t* table = a.block_table + static_cast<int64_t>(blk.seq) * a.max_blocks_per_seq;
  const uint8_t* pool = a.pools.bytes(PoolKind::primary);
  const float score_scale = a.scales.sm_scale * a.scales.k_scale;

  const BlockKeys bk{blk, page};
  const int64_t keys_attended = bk.attended(), keys_listed = bk.listed();
  const int32_t tiles1 = static_cast<int32_t>((keys_attended + kTileKeys - 1) / kTileKeys);
  const int32_t tiles2 = static_cast<int32_t>((keys_listed + kTileKeys - 1) / kTileKeys);
  const int32_t parts = (tiles2 + kTilesPerPart - 1) / kTilesPerPart;
  const int32_t parts1 = (tiles1 + kTilesPerPart - 1) / kTilesPerPart;
  const int32_t steps = tiles1 + tiles2;

  // This thread's two units (rows g and g + 8 of the warp's tile).
  const int ua = warp * 16 + g, ub = ua + 8;
  const int ra = ua / G, rb = ub / G;
  const int64_t att_a = bk.attended_end(ra), att_b = bk.attended_end(rb);
  const bool valid_a = ra < blk.rows, valid_b = rb < blk.rows;
  // The warp's shortest and longest key list; units past the block take the longest.
  const int32_t own_a = static_cast<int32_t>(bk.list_end(ra)), own_b = static_cast<int32_t>(bk.list_end(rb));
  const int32_t lo_end = static_cast<int32_t>(__reduce_min_sync(
      kFullMask, static_cast<unsigned>(min(valid_a ? own_a : INT_MAX, valid_b ? own_b : INT_MAX))));
  const int32_t hi_end = static_cast<int32_t>(__reduce_max_sync(kFullMask, static_cast<unsigned>(max(own_a, own_b))));
  const bool warp_active = hi_end > 0;
  const int64_t lo_att = __reduce_min_sync(
      kFullMask, static_cast<unsigned>(min(valid_a ? att_a : int64_t{INT_MAX}, valid_b ? att_b : int64_t{INT_MAX})));
  const int64_t end_a = valid_a ? own_a : hi_end, end_b = valid_b ? own_b : hi_end;
  const int64_t stats_a = blk.stats_first + (static_cast<int64_t>(kv_head) * kUnits + ua) * parts;
  const int64_t stats_b = blk.stats_first + (static_cast<int64_t>(kv_head) * kUnits + ub) * parts;

  // q of every unit as operand codes (RNE from its exact fp32 value).
  for (int i = tid; i < kUnits * kD; i += kThreads) {
    const int u = i / kD, d = i % kD, r = u / G;
    sm.q[u][d] = static_cast<uint16_t>(
        r < blk.rows ? mma_order::operand_code(
                           f, load_float(a.q.data, a.q.dtype, a.q.offset(int64_t{blk.first_row} + r, kv_head * G + u % G, d)))
                     : 0u);
  }

  // Step s < tiles1: K tile s (pass 1); else K and V tile s - tiles1 (pass 2).
  // Thread t moves the kPieces consecutive 16-byte pieces from piece
  // (t % kThreadsPerRow) * kPieces of row t / kThreadsPerRow: one page lookup
  // and one element_offset per row and thread (measured on the H200: a
  // lookup per piece was a third of the kernel's instructions); slots past
  // the block's list are zeros.
  constexpr int kThreadsPerRow = kThreads / kTileKeys;
  constexpr int kPieces = kD * 2 / 16 / kThreadsPerRow;
  static_assert(kThreadsPerRow * kTileKeys == kThreads && kPieces * kThreadsPerRow * 16 == kD * 2);
  const int copy_row = tid / kThreadsPerRow, copy_col = (tid % kThreadsPerRow) * kPieces * 8;  // in codes
  auto issue = [&](int32_t s) {
    const bool pass2 = s >= tiles1;
    const int64_t slot = int64_t{pass2 ? s - tiles1 : s} * kTileKeys + copy_row;
    const int buf = s & 1;
    if (slot < keys_listed) {
      const int64_t block = BlockRef{table[page.div(slot)]}.block();
      const int32_t entry = page.mod(slot);
      // Contiguous rows (prefill_rows_contiguous): element_offset(.., d + j) = element_offset(.., d) + j.
      const uint8_t* k_src = pool + element_offset(a.pools.strides[0], block, a.layer, 0, kv_head, entry, copy_col) * 2;
#pragma unroll
      for (int i = 0; i < kPieces; ++i) cp_async16(&sm.k[buf][copy_row][copy_col + 8 * i], k_src + 16 * i);
      if (pass2) {
        const uint8_t* v_src = pool + element_offset(a.pools.strides[0], block, a.layer, 1, kv_head, entry, copy_col) * 2;
#pragma unroll
        for (int i = 0; i < kPieces; ++i) cp_async16(&sm.v[buf][copy_row][copy_col + 8 * i], v_src + 16 * i);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kPieces; ++i) {
        *reinterpret_cast<uint4*>(&sm.k[buf][copy_row][copy_col + 8 * i]) = make_uint4(0, 0, 0, 0);
        if (pass2) *reinterpret_cast<uint4*>(&sm.v[buf][copy_row][copy_col + 8 * i]) = make_uint4(0, 0, 0, 0);
      }
    }
    cp_async_commit();
  };

  float M_a = canon::neg_inf(), M_b = canon::neg_inf();  // pass 1: global max per unit
  float m_a = canon::neg_inf(), m_b = canon::neg_inf();  // the current partition's max
  float L_a = 0.0f, L_b = 0.0f;
  float O[kDimTiles][4], acc[kDimTiles][4];
#pragma unroll
  for (int n = 0; n < kDimTiles; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) O[n][i] = acc[n][i] = 0.0f;
  float* P = &sm.p[warp][0][0];

  if (steps > 0) issue(0);
  for (int32_t s = 0; s < steps; ++s) {
    if (s + 1 < steps) {
      issue(s + 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int buf = s & 1;
    if (s < tiles1) {
      // ---------------------------------------------------------------- pass 1
      const int64_t first_key = int64_t{s} * kTileKeys;
      if (warp_active) {
        float S[kKeyTiles][4];
        tile_scores(f, sm, buf, warp, lane, S);
        const bool unmasked = first_key + kTileKeys <= lo_att;  // inside every list's attended keys
#pragma unroll
        for (int n = 0; n < kKeyTiles; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int64_t key = first_key + 8 * n + 2 * t4 + (i & 1);
            const float sc = unmasked || key < (i < 2 ? att_a : att_b) ? S[n][i] * score_scale : canon::neg_inf();
            if (i < 2) m_a = sc > m_a ? sc : m_a;
            else m_b = sc > m_b ? sc : m_b;
          }
      }
      if (s % kTilesPerPart == kTilesPerPart - 1 || s == tiles1 - 1) {
#pragma unroll
        for (int x = 1; x <= 2; x <<= 1) {
          const float oa = __shfl_xor_sync(kFullMask, m_a, x), ob = __shfl_xor_sync(kFullMask, m_b, x);
          m_a = oa > m_a ? oa : m_a;
          m_b = ob > m_b ? ob : m_b;
        }
        const int32_t part = s / kTilesPerPart;
        if (t4 == 0 && valid_a) part_max[stats_a + part] = m_a;
        if (t4 == 1 && valid_b) part_max[stats_b + part] = m_b;
        M_a = m_a > M_a ? m_a : M_a;
        M_b = m_b > M_b ? m_b : M_b;
        m_a = m_b = canon::neg_inf();
      }
    } else {
      // ---------------------------------------------------------------- pass 2
      const int32_t t = s - tiles1;
      const int32_t part = t / kTilesPerPart, ch = t % kTilesPerPart;
      const int64_t first_key = int64_t{t} * kTileKeys;
      if (ch == 0) {
        // (pass 1's scratch writes are visible: a barrier lies between)
        m_a = part < parts1 && valid_a ? part_max[stats_a + part] : canon::neg_inf();
        m_b = part < parts1 && valid_b ? part_max[stats_b + part] : canon::neg_inf();
#pragma unroll
        for (int n = 0; n < kDimTiles; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[n][i] = 0.0f;
      }
      if (warp_active) {
        float S[kKeyTiles][4];
        tile_scores(f, sm, buf, warp, lane, S);
        // Probabilities in place, all 32 first (independent exp chains), then
        // P.V group by group; a tile inside every list's attended keys needs no mask.
        const bool unmasked = first_key + kTileKeys <= lo_att;
#pragma unroll
        for (int n = 0; n < kKeyTiles; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int64_t key = first_key + 8 * n + 2 * t4 + (i & 1);
            const float sc = unmasked || key < (i < 2 ? att_a : att_b) ? S[n][i] * score_scale : canon::neg_inf();
            S[n][i] = canon::probability(sc, i < 2 ? m_a : m_b);
          }
#pragma unroll
        for (int n = 0; n < kKeyTiles; ++n) {
          *reinterpret_cast<float2*>(&P[g * kPStride + 8 * n + 2 * t4]) = make_float2(S[n][0], S[n][1]);
          *reinterpret_cast<float2*>(&P[(g + 8) * kPStride + 8 * n + 2 * t4]) = make_float2(S[n][2], S[n][3]);
        }
#pragma unroll
        for (int n = 0; n < kKeyTiles; ++n) {
          const int64_t kg = first_key + 8 * n;
          if (kg < hi_end)  // else past every list of the warp
            pv_group(f, S[n][0], S[n][1], S[n][2], S[n][3], &sm.v[buf][8 * n + (lane & 7)][8 * (lane >> 3)], kg, lo_end, end_a, end_b, t4, acc);
        }
        __syncwarp();
        // Lane runs of this tile (keys [8 run, 8 run + 8) of the tile, in order).
        {
          const int u = lane >> 1;
#pragma unroll
          for (int r = 0; r < kKeyTiles / 2; ++r) {
            const int run = 2 * r + (lane & 1);
            const float4 x = *reinterpret_cast<const float4*>(&P[u * kPStride + 8 * run]);
            const float4 y = *reinterpret_cast<const float4*>(&P[u * kPStride + 8 * run + 4]);
            float sum = 0.0f;
            sum = sum + x.x;
            sum = sum + x.y;
            sum = sum + x.z;
            sum = sum + x.w;
            sum = sum + y.x;
            sum = sum + y.y;
            sum = sum + y.z;
            sum = sum + y.w;
            sm.run[warp * 16 + u][ch * kKeyTiles + run] = sum;
          }
        }
        __syncwarp();
      }
      if (ch == kTilesPerPart - 1 || t == tiles2 - 1) {
        // The partition's end: l_p (canon::partition_sum: its runs, then
        // butterfly_sum32's lane 0), then the fold in partition order.
        if (warp_active) {
          if (lane < 16) {
            const int u = warp * 16 + lane;
            float v[kWarp];
#pragma unroll
            for (int l = 0; l < kWarp; ++l) v[l] = l < (ch + 1) * kKeyTiles ? sm.run[u][l] : 0.0f;
            sm.part_sum[u] = butterfly_lane0(v);
          }
          __syncwarp();
          const int64_t part_first = int64_t{part} * kPartitionSize;
          if (part_first < end_a) {
            const float w = canon::merge_weight(m_a, M_a);
            L_a = canon::fma_f32(sm.part_sum[ua], w, L_a);
#pragma unroll
            for (int n = 0; n < kDimTiles; ++n) {
              O[n][0] = canon::fma_f32(acc[n][0], w, O[n][0]);
              O[n][1] = canon::fma_f32(acc[n][1], w, O[n][1]);
            }
          }
          if (part_first < end_b) {
            const float w = canon::merge_weight(m_b, M_b);
            L_b = canon::fma_f32(sm.part_sum[ub], w, L_b);
#pragma unroll
            for (int n = 0; n < kDimTiles; ++n) {
              O[n][2] = canon::fma_f32(acc[n][2], w, O[n][2]);
              O[n][3] = canon::fma_f32(acc[n][3], w, O[n][3]);
            }
          }
          __syncwarp();
        }
      }
    }
    __syncthreads();  // the stage is free for step s + 2's loads
  }

  // out = (O / L) * v_scale, rounded to the output dtype; the LSE where asked.
  if (valid_a || valid_b) {
#pragma unroll
    for (int n = 0; n < kDimTiles; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const bool first = i < 2;
        if (!(first ? valid_a : valid_b)) continue;
        const int u = first ? ua : ub, r = first ? ra : rb;
        const int d = 8 * n + 2 * t4 + (i & 1);
        store_float(a.out.data, a.out.dtype, a.out.offset(int64_t{blk.first_row} + r, kv_head * G + u % G, d),
                    (O[n][i] / (first ? L_a : L_b)) * a.scales.v_scale);
      }
    if (t4 == 0 && valid_a) store_lse(a, int64_t{blk.first_row} + ra, kv_head * G + ua % G, M_a, L_a);
    if (t4 == 0 && valid_b) store_lse(a, int64_t{blk.first_row} + rb, kv_head * G + ub % G, M_b, L_b);
  }
}

template <bool kF16>
bool launch(const AttentionArgs& a, const RowBlock* blocks, int32_t n_blocks, float* part_max, cudaStream_t stream,
            KernelInfo* info) {
  auto kernel = prefill_mma_kernel<kF16>;
  const int smem = static_cast<int>(sizeof(Smem));
  if (prefill_kernel_setup(kernel, kThreads, smem, kTileKeys, 2, info)) return true;
  const int32_t kv_heads = a.pools.geometry.kv_heads;
  kernel<<<static_cast<unsigned>(n_blocks) * kv_heads, kThreads, smem, stream>>>(a, blocks, kv_heads, part_max);
  check_launch("prefill_attention", "prefill_mma_kernel", stream);
  return true;
}

bool launch_dtype(const AttentionArgs& a, const RowBlock* blocks, int32_t n, float* part_max, cudaStream_t stream,
                  KernelInfo* info) {
  return a.pools.geometry.dtype == CacheDtype::fp16 ? launch<true>(a, blocks, n, part_max, stream, info)
                                                    : launch<false>(a, blocks, n, part_max, stream, info);
}

}  // namespace prefill_mma

bool prefill_mma_applies(const KvPools& pools, const TensorView& q, const WindowMapping& window) {
  const PoolGeometry& g = pools.geometry;
  if (window.enabled()) return false;
  if (g.dtype != CacheDtype::bf16 && g.dtype != CacheDtype::fp16) return false;
  if (g.head_dim != prefill_mma::kD) return false;
  const int64_t group = q.shape[1] / g.kv_heads;
  if (group < 1 || group > prefill_mma::kUnits) return false;
  return prefill_rows_contiguous(pools);
}

bool prefill_mma_info(const KvPools& pools, const TensorView& q, KernelInfo& info) {
  AttentionArgs a;
  a.pools = pools;
  a.group = static_cast<int32_t>(q.shape[1] / pools.geometry.kv_heads);
  return prefill_mma::launch_dtype(a, nullptr, 0, nullptr, nullptr, &info);
}

void prefill_attention_mma(const KvPools& pools, const PrefillAttentionOp& op, cudaStream_t stream,
                           cudaEvent_t kernels_start) {
  using prefill_mma::kUnits;
  const int32_t group = static_cast<int32_t>(op.q.shape[1] / pools.geometry.kv_heads);
  std::vector<RowBlock> blocks = make_row_blocks(op, kUnits / group);
  if (blocks.empty()) return;
  // Partition maxima: kUnits x (the block's partitions) per (block, KV head).
  const PageDivider page = pools.geometry.page_divider();
  int64_t stats = 0;
  for (RowBlock& b : blocks) {
    b.stats_first = stats;
    const int64_t listed = BlockKeys{b, page}.listed();
    stats += (listed + canon::kPartitionSize - 1) / canon::kPartitionSize * kUnits * pools.geometry.kv_heads;
  }
  PrefillUpload up = upload_prefill("prefill_attention", pools, op, group, blocks,
                                    static_cast<size_t>(stats) * sizeof(float), stream);
  if (kernels_start) KVSIM_CUDA_CHECK("attention timing", cudaEventRecord(kernels_start, stream));
  prefill_mma::launch_dtype(up.args, up.blocks, static_cast<int32_t>(blocks.size()), static_cast<float*>(up.extra),
                            stream, nullptr);
  up.release(stream);
}

}  // namespace kvsim::cuda
