// The bulk attention kernel (AttentionPath::bulk): the canonical order of
// attention.cu with the fewest instructions per key the order allows, fed by
// the copy engine.
//
// Work: persistent warps; each warp works alone through (query row, KV head,
// head split, 256-key partition) items: scores, softmax and P.V of an item,
// for G query heads of the KV head from each K/V load -- the whole group, or
// a G-head part of it when there are too few items to occupy the GPU or the
// group's registers would leave too few warps (heads_per_item): every query
// head's arithmetic is the same whichever item holds it, so the split changes
// no byte; a KV head's K/V rows are then read once per part, after the first
// mostly from L2. Memory: a private ring of
// kSlots tiles (kTile keys of K or of V) per warp in shared memory, filled by
// cp.async.bulk copies that complete on one mbarrier per slot. The warp issues
// its own copies (no producer warp, no cross-warp synchronisation), kSlots - 1
// tiles ahead of the tile it consumes, across item boundaries. When the copy
// cursor enters an item, the warp computes the K and V row offsets of its
// keys once (key list, page table, element_offset(); lane l takes keys l,
// l + 32, ...) into a per-warp table; a tile's copies read the table: each run
// of rows that follow each other in memory (an HND page) is one copy, started
// by the run's first lane.
//
// Measured on the H200 (ncu, 64 x 8K, GQA 32:8, warp instructions per key and
// KV head): computing the offsets per tile instead cost ~30, a third of the
// kernel (95 -> 79 bf16, 100 -> 83 fp8 with the table). Now: the K/V tile
// bodies 54 (bf16) / 58 (fp8: 32 FFMA, 8 HADD2.F32, 4 F2FP, 3.9 SHFL, 3.9 FADD,
// 3 LDS), per-tile issue/wait/loop 12.6, per item 11 (softmax 6.1). Marking
// whole-page tiles in the table so that lane 0 issues one copy without the
// shuffle/ballot saved only 0.8 per key and ran fp8 11% slower (not kept).
//
// Arithmetic (core's canonical order; the kernel only chooses which lane
// performs which canonical step):
//  * scores: lane l owns dims [l*C, l*C + C); a pass takes kPass = 32 / G keys
//    and each lane holds 32 partial dots, column c = (key c / G, head c % G).
//    Lane l keeps column c in register c ^ l (it reads key row (i / G) ^ (l / G)
//    and uses the query of head (i % G) ^ (l % G) for register i), so the
//    reduce-scatter form of the xor butterfly needs no selects: at level off
//    lane l adds its register i and lane (l ^ off)'s register i + off, which
//    hold the same column -- exactly the pair canon::butterfly_sum32 adds at
//    that level -- and column l ends in lane l (31 shuffles and adds per 32
//    dots).
//  * scores are stored [key][head]; softmax: lane l takes keys [8l, 8l + 8) of
//    every head (the canonical lane runs), first maximum within the run, runs
//    joined left to right, probabilities, sums in order, butterfly.
//  * P.V: lane l keeps the fma chains of its C dims for the G heads; one
//    vector load gives the G probabilities of a key.
#pragma once

#include <cuda_runtime.h>

#include "backends/cuda/attention_plan.cuh"
#include "backends/cuda/attention_warp.cuh"
#include "backends/cuda/cuda_check.hpp"

namespace kvsim::cuda::bulk {

using canon::kPartitionSize;
using canon::kWarp;
inline constexpr int kWarpsPerCta = 2;

// Geometry of one instantiation.
template <CacheDtype kDtype, int C, int G, int T, int S = 0>
struct Cfg {
  static constexpr int kElem = Code<kDtype>::kBytes;
  static constexpr int kLaneBytes = C * kElem;
  static constexpr int kRowBytes = kWarp * kLaneBytes;
  static constexpr int kTile = T;
  static constexpr int kTileBytes = T * kRowBytes;
  // Slots: enough bytes in flight per warp with 12-16 warps per SM; S
  // overrides (benchmark variants).
  // Measured on the H200 (64 x 8K, GQA 32:8, 16-key tiles): bf16 3 slots
  // (12 warps per SM) 0.627 ms, 2 slots (14 warps) 0.662 ms; fp8 e4m3 3 slots
  // (16 warps, the register limit) 0.538 ms, 4 slots (14 warps) 0.627 ms.
  static constexpr int kSlots = S != 0 ? S : 3;
  static constexpr int kPass = kWarp / G;  // keys per score pass
  static constexpr int kLogG = G == 1 ? 0 : (G == 2 ? 1 : (G == 4 ? 2 : 3));
  static constexpr int kProbBytes = kPartitionSize * G * 4;
  static constexpr int kTableBytes = 2 * kPartitionSize * 4;  // [kv][key] row offsets in 16-byte units
  static constexpr int kWarpBytes = kSlots * kTileBytes + kProbBytes + kTableBytes + ((kSlots * 8 + 15) / 16) * 16;
  static_assert((1 << kLogG) == G && G <= 8);
  static_assert(T % kPass == 0 && kPartitionSize % T == 0 && T <= kWarp);
  static_assert(kRowBytes % 16 == 0 && (kRowBytes & (kRowBytes - 1)) == 0);
  static_assert(kLaneBytes == 2 || kLaneBytes % 4 == 0);
  static_assert(C * G <= 32);
};

// ---------------------------------------------------------------- async copy primitives
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred P1;\n"
      "LAB_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@P1 bra DONE;\n"
      "bra LAB_WAIT;\n"
      "DONE:\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// ---------------------------------------------------------------- work items
// Per partition: {row, sequence, position, partition within the row}.
using PartInfo = int4;

// One work item: a partition of a query row's keys against one KV head.
// Indices are 32-bit (the host checks items < 2^31).
struct Item {
  int32_t index = 0;
  bool valid = false;
  int32_t rp = 0, kv_head = 0, row = 0, count = 0, tiles = 0;
  int32_t head0 = 0;     // the item's first query head: kv_head * group + part * G
  int32_t attended = 0;  // keys of the partition before the masked tail
  PartInfo info{0, 0, 0, 0};
};

// units = KV heads x head parts: the items of one partition.
__device__ __forceinline__ PartInfo fetch_part(const PartInfo* parts, int32_t items, int32_t units, int32_t index) {
  return index < items ? parts[index / units] : PartInfo{0, 0, 0, 0};
}

// Item `index`: partition index / units, then KV head, then head part
// (fastest, so a KV head's parts run side by side and share its K/V tiles
// in L2). G heads per item, `log_parts` = log2(group / G).
template <int T, int G>
__device__ __forceinline__ Item build_item(const AttentionArgs& a, PageDivider page, int32_t items, int32_t index,
                                           PartInfo info, int32_t units, int32_t log_parts) {
  Item it;
  it.index = index;
  it.valid = index < items;
  if (!it.valid) return it;
  it.rp = index / units;
  const int32_t unit = index - it.rp * units;
  it.kv_head = unit >> log_parts;
  it.head0 = it.kv_head * a.group + (unit - (it.kv_head << log_parts)) * G;
  it.row = info.x;
  it.info = info;
  const KeyList keys = make_key_list(info.z, a.window, page);
  const int64_t first = static_cast<int64_t>(info.w) * kPartitionSize;
  const int64_t left = keys.size() - first;
  it.count = static_cast<int32_t>(left < kPartitionSize ? left : kPartitionSize);
  const int64_t att = keys.n_attended - first;
  it.attended = static_cast<int32_t>(att < 0 ? 0 : (att < kPartitionSize ? att : kPartitionSize));
  it.tiles = (it.count + T - 1) / T;
  return it;
}

// Item `index` of whole groups (units = KV heads): the mma ring kernel's.
template <int T>
__device__ __forceinline__ Item build_item(const AttentionArgs& a, PageDivider page, int32_t items, int32_t index,
                                           PartInfo info) {
  return build_item<T, 1>(a, page, items, index, info, a.pools.geometry.kv_heads, 0);
}

// Row offsets (16-byte units) of the item's K and V rows into the warp's
// table: lane l takes keys l, l + 32, ... (every key through the key list,
// the page table and element_offset()).
template <class K>
__device__ __forceinline__ void build_table(const AttentionArgs& a, PageDivider page, const Item& it, uint32_t* table,
                                            int lane) {
  const KeyList keys = make_key_list(it.info.z, a.window, page);
  const int64_t first = static_cast<int64_t>(it.info.w) * kPartitionSize;
  const int32_t* row_table = a.block_table + static_cast<int64_t>(it.info.y) * a.max_blocks_per_seq;
  int32_t refs[kPartitionSize / kWarp];
  int32_t entries[kPartitionSize / kWarp];
#pragma unroll
  for (int k = 0; k < kPartitionSize / kWarp; ++k) {
    const int32_t j = lane + k * kWarp;
    refs[k] = 0;
    entries[k] = 0;
    if (j < it.count) {
      bool masked = false;
      const int64_t slot = keys.slot(first + j, a.window, masked);
      refs[k] = row_table[page.div(slot)];
      entries[k] = page.mod(slot);
    }
  }
#pragma unroll
  for (int k = 0; k < kPartitionSize / kWarp; ++k) {
    const int32_t j = lane + k * kWarp;
    if (j < it.count) {
      const int64_t block = BlockRef{refs[k]}.block();
#pragma unroll
      for (int kv = 0; kv < 2; ++kv)
        table[kv * kPartitionSize + j] = static_cast<uint32_t>(
            element_offset(a.pools.strides[0], block, a.layer, kv, it.kv_head, entries[k], 0) * K::kElem / 16);
    }
  }
  __syncwarp();
}

// Issues tile t of `it` (K tiles 0..tiles-1, then V tiles) into the ring slot
// at `dst` (shared address) with barrier `bar`: lane l < n reads its key's row
// offset from the table; each run of rows that follow each other in memory is
// one bulk copy.
template <class K>
__device__ __forceinline__ void issue_tile(const uint8_t* pool, const Item& it, int32_t t, const uint32_t* table,
                                           uint32_t dst, uint32_t bar, int lane) {
  constexpr uint32_t kRowUnits = K::kRowBytes / 16;
  const int32_t kv = t < it.tiles ? 0 : 1;
  const int32_t t0 = (kv == 0 ? t : t - it.tiles) * K::kTile;
  const int32_t n = it.count - t0 < K::kTile ? it.count - t0 : K::kTile;
  const bool valid = lane < n;
  const uint32_t off = valid ? table[kv * kPartitionSize + t0 + lane] : 0u;
  const uint32_t prev = __shfl_up_sync(kFullMask, off, 1);
  const bool start = valid && (lane == 0 || off != prev + kRowUnits);
  const unsigned starts = __ballot_sync(kFullMask, start);
  if (lane == 0) mbar_expect_tx(bar, static_cast<uint32_t>(n * K::kRowBytes));
  if (start) {
    const unsigned later = static_cast<unsigned>(static_cast<uint64_t>(starts) >> (lane + 1));
    const int end = later == 0 ? n : lane + __ffs(later);
    bulk_copy(dst + lane * K::kRowBytes, pool + static_cast<uint64_t>(off) * 16,
              static_cast<uint32_t>((end - lane) * K::kRowBytes), bar);
  }
}

// The lane's C codes of the row at shared address `row` (lane offset included).
template <CacheDtype kDtype, int C>
__device__ __forceinline__ void load_codes(const uint8_t* src, float* v) {
  constexpr int kBytes = C * Code<kDtype>::kBytes;
  constexpr int kPerWord = 4 / Code<kDtype>::kBytes;
  if constexpr (kBytes == 2) {
    Code<kDtype>::decode2_arith(*reinterpret_cast<const uint16_t*>(src), v);
  } else {
    uint32_t words[kBytes / 4];
    load_words<kBytes>(src, words);
#pragma unroll
    for (int i = 0; i < kBytes / 4; ++i) Code<kDtype>::decode_arith(words[i], v + i * kPerWord);
  }
}

// G consecutive floats (16-byte aligned for G >= 4).
template <int G>
__device__ __forceinline__ void load_probs(const float* src, float* p) {
  if constexpr (G >= 4) {
#pragma unroll
    for (int i = 0; i < G / 4; ++i) {
      const float4 x = reinterpret_cast<const float4*>(src)[i];
      p[4 * i] = x.x;
      p[4 * i + 1] = x.y;
      p[4 * i + 2] = x.z;
      p[4 * i + 3] = x.w;
    }
  } else if constexpr (G == 2) {
    const float2 x = *reinterpret_cast<const float2*>(src);
    p[0] = x.x;
    p[1] = x.y;
  } else {
    p[0] = src[0];
  }
}
template <int G>
__device__ __forceinline__ void store_probs(float* dst, const float* p) {
  if constexpr (G >= 4) {
#pragma unroll
    for (int i = 0; i < G / 4; ++i)
      reinterpret_cast<float4*>(dst)[i] = make_float4(p[4 * i], p[4 * i + 1], p[4 * i + 2], p[4 * i + 3]);
  } else if constexpr (G == 2) {
    *reinterpret_cast<float2*>(dst) = make_float2(p[0], p[1]);
  } else {
    dst[0] = p[0];
  }
}

template <CacheDtype kDtype, int C, int G, int T, int S>
__global__ void __launch_bounds__(kWarpsPerCta * kWarp)
    attention_bulk_kernel(AttentionArgs a, const PartInfo* parts, int32_t items, float* part_stats, float* part_acc) {
  using K = Cfg<kDtype, C, G, T, S>;
  constexpr int kD = C * kWarp;
  constexpr int kPass = K::kPass;
  constexpr int kSlots = K::kSlots;
  extern __shared__ __align__(128) uint8_t smem[];
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  uint8_t* ring = smem + warp * K::kWarpBytes;
  float* probs = reinterpret_cast<float*>(ring + kSlots * K::kTileBytes);  // [kPartitionSize][G]
  uint32_t* table = reinterpret_cast<uint32_t*>(ring + kSlots * K::kTileBytes + K::kProbBytes);
  const uint32_t ring_s = smem_addr(ring);
  const uint32_t bars_s = ring_s + kSlots * K::kTileBytes + K::kProbBytes + K::kTableBytes;
  if (lane == 0)
    for (int s = 0; s < kSlots; ++s) mbar_init(bars_s + 8 * s, 1);
  mbar_init_fence();
  __syncwarp();

  const PageDivider page = a.pools.geometry.page_divider();
  const int32_t H = a.pools.geometry.kv_heads;
  const uint8_t* pool = a.pools.bytes(PoolKind::primary);
  const int32_t stride = static_cast<int32_t>(gridDim.x) * kWarpsPerCta;
  const int32_t hq = H * a.group;
  const int32_t log_parts = __ffs(a.group / G) - 1;  // group / G: a power of two (heads_per_item)
  const int32_t units = H << log_parts;
  const float score_scale = a.scales.sm_scale * a.scales.k_scale;
  const int lane_key = lane >> K::kLogG;  // key of column `lane` within a pass
  const int lane_head = lane & (G - 1);   // head of column `lane`
  // Shared offset of key row (i ^ lane_key) of a pass, lane's bytes included.
  uint32_t key_off[kPass];
#pragma unroll
  for (int i = 0; i < kPass; ++i) key_off[i] = (i ^ lane_key) * K::kRowBytes + lane * K::kLaneBytes;

  // Copy cursor: runs kSlots - 1 tiles ahead, across items.
  const int32_t first_index = static_cast<int32_t>(blockIdx.x) * kWarpsPerCta + warp;
  Item nx = build_item<T, G>(a, page, items, first_index, fetch_part(parts, items, units, first_index), units, log_parts);
  PartInfo nx_following = fetch_part(parts, items, units, first_index + stride);
  int32_t nt = 0;
  uint32_t issued = 0, consumed = 0;
  // Issues tiles while a slot is free (the slot of tile `consumed` is in use
  // until the end of its iteration): kSlots tiles in the first iteration, then
  // one per iteration. One copy of this code in the kernel.
  auto issue_ahead = [&]() {
#pragma unroll 1
    while (nx.valid && issued < consumed + kSlots) {
      if (nt == 0) build_table<K>(a, page, nx, table, lane);
      const uint32_t slot = issued % kSlots;
      issue_tile<K>(pool, nx, nt, table, ring_s + slot * K::kTileBytes, bars_s + 8 * slot, lane);
      ++issued;
      if (++nt == 2 * nx.tiles) {
        nx = build_item<T, G>(a, page, items, nx.index + stride, nx_following, units, log_parts);
        nx_following = fetch_part(parts, items, units, nx.index + stride);
        nt = 0;
        __syncwarp();  // every lane has read the table before the next item's is built
      }
    }
  };

  PartInfo following = fetch_part(parts, items, units, first_index + stride);
  for (Item it = build_item<T, G>(a, page, items, first_index, fetch_part(parts, items, units, first_index), units,
                                  log_parts);
       it.valid;) {
    // Queries, head-permuted: qp[g] is head (g ^ lane_head) of the group.
    float qp[G][C];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int i = 0; i < C; ++i)
        qp[g][i] = load_float(a.q.data, a.q.dtype, a.q.offset(it.row, it.head0 + (g ^ lane_head), lane * C + i));
    float acc[G][C];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int i = 0; i < C; ++i) acc[g][i] = 0.0f;
    float m_part[G], l_part[G];

    for (int32_t t = 0; t < 2 * it.tiles; ++t) {
      issue_ahead();
      const uint32_t slot = consumed % kSlots;
      mbar_wait(bars_s + 8 * slot, (consumed / kSlots) & 1);
      const uint8_t* tile = ring + slot * K::kTileBytes;
      ++consumed;
      if (t < it.tiles) {
        // Scores of this tile's keys, kPass at a time ([key][head] into probs).
        const int32_t t0 = t * T;
        const uint8_t* krow[kPass];  // row (kk ^ lane_key) of the tile's first pass, lane's bytes
#pragma unroll
        for (int kk = 0; kk < kPass; ++kk) krow[kk] = tile + key_off[kk];
#pragma unroll
        for (int pass = 0; pass < T / kPass; ++pass) {
          if (t0 + pass * kPass < it.count) {  // uniform
            float part[kWarp];
#pragma unroll
            for (int kk = 0; kk < kPass; ++kk) {
              float k[C];
              load_codes<kDtype, C>(krow[kk] + pass * kPass * K::kRowBytes, k);
#pragma unroll
              for (int g = 0; g < G; ++g) {
                float d = 0.0f;
#pragma unroll
                for (int i = 0; i < C; ++i) d = canon::fma_f32(qp[g][i], k[i], d);
                part[kk * G + g] = d;
              }
            }
            const float dot = reduce_scatter_xor(part);
            const int32_t j = t0 + pass * kPass + lane_key;
            probs[(t0 + pass * kPass) * G + lane] = j >= it.attended ? canon::neg_inf() : dot * score_scale;
          }
        }
        if (t == it.tiles - 1) {
          // Max, probabilities and sums of every head: lane l takes keys
          // [8l, 8l + 8), the canonical lane run (keys past the partition
          // count as -inf: they change neither the max nor the sum).
          __syncwarp();
          float s[canon::kLaneRun][G];
#pragma unroll
          for (int k = 0; k < canon::kLaneRun; ++k) {
            const int32_t j = lane * canon::kLaneRun + k;
            load_probs<G>(probs + j * G, s[k]);
#pragma unroll
            for (int g = 0; g < G; ++g) s[k][g] = j < it.count ? s[k][g] : canon::neg_inf();
          }
#pragma unroll
          for (int g = 0; g < G; ++g) {
            float m = canon::neg_inf();
#pragma unroll
            for (int k = 0; k < canon::kLaneRun; ++k) m = s[k][g] > m ? s[k][g] : m;
            m_part[g] = warp_ordered_max(m, lane);
          }
          float run[G];
#pragma unroll
          for (int g = 0; g < G; ++g) run[g] = 0.0f;
#pragma unroll
          for (int k = 0; k < canon::kLaneRun; ++k) {
#pragma unroll
            for (int g = 0; g < G; ++g) {
              s[k][g] = canon::probability(s[k][g], m_part[g]);
              run[g] = run[g] + s[k][g];
            }
            store_probs<G>(probs + (lane * canon::kLaneRun + k) * G, s[k]);
          }
#pragma unroll
          for (int g = 0; g < G; ++g) l_part[g] = warp_butterfly_sum(run[g]);
          __syncwarp();
        }
      } else {
        // P.V over this tile's keys, masked ones included (p = 0).
        const int32_t t0 = (t - it.tiles) * T;
        const int32_t n = it.count - t0 < T ? it.count - t0 : T;
        const uint8_t* rows = tile + lane * K::kLaneBytes;
        const float* pt = probs + t0 * G;
        auto step = [&](int kk) {
          float v[C], p[G];
          load_codes<kDtype, C>(rows + kk * K::kRowBytes, v);
          load_probs<G>(pt + kk * G, p);
#pragma unroll
          for (int g = 0; g < G; ++g)
#pragma unroll
            for (int i = 0; i < C; ++i) acc[g][i] = canon::fma_f32(p[g], v[i], acc[g][i]);
        };
        if (n == T) {
#pragma unroll
          for (int kk = 0; kk < T; ++kk) step(kk);
        } else {
#pragma unroll 1
          for (int kk = 0; kk < n; ++kk) step(kk);
        }
      }
      __syncwarp();  // the slot is refilled by the next issue
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float* out = part_acc + (static_cast<int64_t>(it.rp) * hq + it.head0 + g) * kD + lane * C;
      if constexpr (C % 4 == 0) {
#pragma unroll
        for (int i = 0; i < C; i += 4)
          *reinterpret_cast<float4*>(out + i) = make_float4(acc[g][i], acc[g][i + 1], acc[g][i + 2], acc[g][i + 3]);
      } else {
#pragma unroll
        for (int i = 0; i < C; ++i) out[i] = acc[g][i];
      }
      if (lane == g) {
        float* st = part_stats + (static_cast<int64_t>(it.rp) * hq + it.head0 + g) * 2;
        st[0] = m_part[g];
        st[1] = l_part[g];
      }
    }
    const int32_t next_index = it.index + stride;
    it = build_item<T, G>(a, page, items, next_index, following, units, log_parts);
    following = fetch_part(parts, items, units, next_index + stride);
  }
}

template <CacheDtype kDtype, int C, int G, int T, int S>
void kernel_info(const AttentionPlan& plan, KernelInfo& info) {
  using K = Cfg<kDtype, C, G, T, S>;
  const auto kernel = attention_bulk_kernel<kDtype, C, G, T, S>;
  const int smem = kWarpsPerCta * K::kWarpBytes;
  KVSIM_CUDA_CHECK(plan.op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaFuncAttributes attr{};
  KVSIM_CUDA_CHECK(plan.op, cudaFuncGetAttributes(&attr, kernel));
  int per_sm = 0;
  KVSIM_CUDA_CHECK(plan.op, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kWarpsPerCta * kWarp, smem));
  info.registers = attr.numRegs;
  info.smem_per_cta = smem;
  info.ctas_per_sm = per_sm;
  info.warps_per_cta = kWarpsPerCta;
  info.tile_keys = T;
  info.slots = K::kSlots;
}

template <CacheDtype kDtype, int C, int G, int T, int S>
void launch(const AttentionPlan& plan, cudaStream_t stream) {
  KernelInfo info;
  kernel_info<kDtype, C, G, T, S>(plan, info);
  const int sms = device_sm_count(plan.op);
  // < 2^31: dispatch() checks.
  const int32_t items = plan.parts * plan.args.pools.geometry.kv_heads * (plan.args.group / G);
  const int64_t needed = (static_cast<int64_t>(items) + kWarpsPerCta - 1) / kWarpsPerCta;
  const int64_t resident = static_cast<int64_t>(sms) * (info.ctas_per_sm > 0 ? info.ctas_per_sm : 1);
  const unsigned grid = static_cast<unsigned>(needed < resident ? needed : resident);
  const auto* parts = reinterpret_cast<const PartInfo*>(plan.part_info);
  attention_bulk_kernel<kDtype, C, G, T, S><<<grid, kWarpsPerCta * kWarp, info.smem_per_cta, stream>>>(
      plan.args, parts, items, plan.part_stats, plan.part_acc);
  check_launch(plan.op, "attention_bulk_kernel", stream);
}

// Dispatch over C (D / 32), G and the tile size for one dtype; false when the
// plan's shape has no instantiation. With `info`, only fills it.
// Query heads per work item (AttentionPlan::bulk_heads_per_item, or chosen):
// one when the items of whole groups would leave most resident warps idle
// (each item is one warp's 256 keys in turn: decode at batch 1 to 16), G
// times the items; four for a group of eight, whose items hold ~197
// registers (12% occupancy on the H200); else the group. Measured in
// docs/benchmarks.md (session 26).
inline int32_t heads_per_item(const AttentionPlan& plan) {
  const int32_t group = plan.args.group;
  if (plan.bulk_heads_per_item != 0) return plan.bulk_heads_per_item;
  constexpr int64_t kResidentWarpsPerSm = 8;
  const int64_t items = static_cast<int64_t>(plan.parts) * plan.args.pools.geometry.kv_heads;
  if (group > 1 && 2 * items <= device_sm_count(plan.op) * kResidentWarpsPerSm) return 1;
  return group == 8 ? 4 : group;
}

template <CacheDtype kDtype>
bool dispatch(const AttentionPlan& plan, cudaStream_t stream, KernelInfo* info) {
  const int C = plan.args.pools.geometry.head_dim / kWarp;
  const int G = heads_per_item(plan);
  if (G < 1 || plan.args.group % G != 0) return false;
  if (static_cast<int64_t>(plan.parts) * plan.args.pools.geometry.kv_heads * (plan.args.group / G) >= INT32_MAX)
    return false;  // 32-bit item indices
  const bool small = plan.bulk_tile_keys == 16;
  auto go = [&]<int kC, int kG, int kT>() {
    // Benchmark variants: another slot count for the main shapes (D 128, G 4):
    // bf16 2 slots (16-key tiles); fp8 e4m3 4 slots (16-key tiles), 2 slots (32-key tiles).
    if constexpr (kC == 4 && kG == 4 && (kDtype == CacheDtype::bf16 || kDtype == CacheDtype::fp8_e4m3) &&
                  (kT == 16 || kDtype == CacheDtype::fp8_e4m3)) {
      constexpr int kAlt = kDtype == CacheDtype::bf16 ? 2 : (kT == 16 ? 4 : 2);
      if (plan.bulk_slots == kAlt) {
        if (info) kernel_info<kDtype, kC, kG, kT, kAlt>(plan, *info);
        else launch<kDtype, kC, kG, kT, kAlt>(plan, stream);
        return true;
      }
    }
    if (info) kernel_info<kDtype, kC, kG, kT, 0>(plan, *info);
    else launch<kDtype, kC, kG, kT, 0>(plan, stream);
    return true;
  };
  auto with_c = [&]<int kC>() {
    constexpr int kRow = kC * kWarp * Code<kDtype>::kBytes;
    if constexpr (kRow > 1024) {
      return false;
    } else {
      switch (G) {
        case 1: return go.template operator()<kC, 1, 32>();
        case 4:
          return small ? go.template operator()<kC, 4, 16>() : go.template operator()<kC, 4, 32>();
        case 8:
          if constexpr (kC * 8 <= 32) return small ? go.template operator()<kC, 8, 16>() : go.template operator()<kC, 8, 32>();
          return false;
        default: return false;
      }
    }
  };
  return dispatch_lane_codes(C, with_c);
}

}  // namespace kvsim::cuda::bulk
