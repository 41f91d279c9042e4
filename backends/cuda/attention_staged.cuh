// The staged attention kernel (AttentionPath::staged): persistent warps, each
// working through (query row, KV head, partition) items and streaming the K
// then V rows of every item through a private shared-memory ring with
// cp.async, several tiles ahead (also across items). Arithmetic is the same
// canonical order as the general kernel in attention.cu, mapped so that one
// warp serves all G query heads of a KV head from each K/V load:
//  * scores: lane l owns dims [l*C, l*C + C) (C = D / 32 = ceil(D / 32)); a
//    pass takes 32 / G keys, each lane holds 32 partial dots (key, head) and
//    a reduce-scatter butterfly leaves the full dot of column `lane` in lane
//    `lane`, adding exactly the pairs canon::butterfly_sum32 adds;
//  * P.V: lane l keeps the fma chains of its C dims for the G heads.
//
// Why it is kept beside the bulk kernel (issue 14): choose_path() takes it only
// where bulk cannot go, pools over 64 GiB (bulk keeps row offsets in 16-byte
// units in 32 bits), and such pools are real on a 141 GB H200 (engines give
// most of the memory to the KV cache). There it is the only fast path: measured
// on the H200 (docs/benchmarks.md, "Decode attention (the staged kernel)",
// bf16 64 x 8K) at 66% of copy bandwidth against the general kernel's 2.4%.
// It can go once bulk takes 64-bit row offsets at an unchanged speed (to be
// measured with attention_bench).
#pragma once

#include <cuda_runtime.h>

#include "backends/cuda/attention_plan.cuh"
#include "backends/cuda/attention_warp.cuh"
#include "backends/cuda/cuda_check.hpp"

namespace kvsim::cuda::staged {

using canon::kPartitionSize;
using canon::kWarp;
inline constexpr int kWarps = 2;     // warps per CTA (each with its own ring)
inline constexpr int kMaxRowBytes = 256;


// Per partition: {row, sequence, position, partition within the row}.
using PartInfo = int4;

// One work item: a partition of a query row's keys against one KV head.
struct Item {
  int64_t index = 0;
  bool valid = false;
  int32_t rp = 0, kv_head = 0, row = 0, seq = 0, count = 0, tiles = 0;  // tiles: K tiles (= V tiles)
  int64_t first = 0;
  KeyList keys;
};

// The descriptor load is issued one item ahead of build_item(), so its
// latency hides behind a whole item's work.
__device__ __forceinline__ PartInfo fetch_part(const AttentionArgs& a, const PartInfo* parts, int64_t items,
                                               int64_t index) {
  return index < items ? parts[index / a.pools.geometry.kv_heads] : PartInfo{0, 0, 0, 0};
}

__device__ __forceinline__ Item build_item(const AttentionArgs& a, int64_t items, int64_t index, PartInfo info,
                                           int tile_keys) {
  Item it;
  it.index = index;
  it.valid = index < items;
  if (!it.valid) return it;
  const int32_t H = a.pools.geometry.kv_heads;
  it.rp = static_cast<int32_t>(index / H);
  it.kv_head = static_cast<int32_t>(index % H);
  it.row = info.x;
  it.seq = info.y;
  it.keys = make_key_list(info.z, a.window, a.pools.geometry.page_divider());
  it.first = static_cast<int64_t>(info.w) * kPartitionSize;
  const int64_t left = it.keys.size() - it.first;
  it.count = static_cast<int32_t>(left < kPartitionSize ? left : kPartitionSize);
  it.tiles = (it.count + tile_keys - 1) / tile_keys;
  return it;
}

// Ring geometry of one (dtype, C, G, tile keys): slots of kTileKeys rows
// (at least one score pass, 32 / G keys). Smaller tiles keep a warp's ring
// small, so more warps fit on an SM; smaller tiles get more slots so each
// warp keeps a similar number of bytes in flight.
template <CacheDtype kDtype, int C, int G, int kTile>
struct Ring {
  static constexpr int kElemBytes = static_cast<int>(sizeof(typename Code<kDtype>::T));
  static constexpr int kRowBytes = C * kWarp * kElemBytes;
  static constexpr int kChunksPerRow = kRowBytes / 16;
  static constexpr int kTileKeys = kTile;
  static constexpr int kTileBytes = kTileKeys * kRowBytes;
  static constexpr int kSlots = kTileBytes <= 2048 ? 6 : (kTileBytes <= 4096 ? 4 : 3);
  static_assert(kTileKeys >= kWarp / G && kTileKeys % (kWarp / G) == 0);
  static_assert(kRowBytes % 16 == 0 && kRowBytes <= kMaxRowBytes);
  static_assert(kTileKeys * kChunksPerRow % kWarp == 0 && kPartitionSize % kTileKeys == 0);
};

template <int G>
__host__ __device__ constexpr int warp_smem_bytes(int tile_bytes, int slots) {
  return slots * tile_bytes + G * kPartitionSize * static_cast<int>(sizeof(float));
}

// A tile's copies are issued in two steps one ring step apart: prepare_tile
// loads the page-table entry of key `lane` of the tile (a global load whose
// latency then hides behind a tile of work), issue_tile turns it into the
// row's offset through element_offset() and issues the cp.async copies. The
// row is contiguous (checked on the host), so its 16-byte pieces follow it.
struct PreparedTile {
  int32_t block_ref = 0;
  int32_t entry = 0;
};

template <int kTileKeys>
__device__ __forceinline__ PreparedTile prepare_tile(const AttentionArgs& a, const Item& it, int32_t t, int lane) {
  PreparedTile p;
  const int32_t t0 = (t < it.tiles ? t : t - it.tiles) * kTileKeys;
  if (lane < kTileKeys && t0 + lane < it.count) {
    bool masked = false;
    const int64_t slot = it.keys.slot(it.first + t0 + lane, a.window, masked);
    const PageDivider page = a.pools.geometry.page_divider();
    p.block_ref = a.block_table[static_cast<int64_t>(it.seq) * a.max_blocks_per_seq + page.div(slot)];
    p.entry = page.mod(slot);
  }
  return p;
}

template <class R>
__device__ __forceinline__ void issue_tile(const AttentionArgs& a, const Item& it, int32_t t, PreparedTile p,
                                           uint8_t* dst, int lane) {
  constexpr int kTileKeys = R::kTileKeys;
  const int32_t kv = t < it.tiles ? 0 : 1;
  const int32_t t0 = (kv == 0 ? t : t - it.tiles) * kTileKeys;
  const int32_t n = it.count - t0 < kTileKeys ? it.count - t0 : kTileKeys;
  int64_t row_byte = 0;
  if (lane < n)
    row_byte = element_offset(a.pools.strides[0], BlockRef{p.block_ref}.block(), a.layer, kv, it.kv_head, p.entry, 0) *
               R::kElemBytes;
  const uint8_t* pool = a.pools.bytes(PoolKind::primary);
#pragma unroll
  for (int i = 0; i < kTileKeys * R::kChunksPerRow / kWarp; ++i) {
    const int chunk = lane + i * kWarp;
    const int key = chunk / R::kChunksPerRow;
    const int piece = chunk % R::kChunksPerRow;
    const int64_t src = __shfl_sync(kFullMask, row_byte, key);
    if (key < n) cp_async16(dst + key * R::kRowBytes + piece * 16, pool + src + piece * 16);
  }
}

// Lane's C codes of one row in the ring, decoded.
template <CacheDtype kDtype, int C>
__device__ __forceinline__ void load_codes(const uint8_t* row, int lane, float* v) {
  constexpr int kBytes = C * static_cast<int>(sizeof(typename Code<kDtype>::T));
  constexpr int kPerWord = 4 / static_cast<int>(sizeof(typename Code<kDtype>::T));
  const uint8_t* src = row + lane * kBytes;
  if constexpr (kBytes < 4) {  // two fp8 codes: the word's upper bytes decode to unused values
    float w[4];
    Code<kDtype>::decode(*reinterpret_cast<const uint16_t*>(src), w);
#pragma unroll
    for (int i = 0; i < C; ++i) v[i] = w[i];
  } else {
    uint32_t words[kBytes / 4];
    load_words<kBytes>(src, words);
#pragma unroll
    for (int i = 0; i < kBytes / 4; ++i) Code<kDtype>::decode(words[i], v + i * kPerWord);
  }
}

template <CacheDtype kDtype, int C, int G, int kTile>
__global__ void __launch_bounds__(kWarps * kWarp)
    attention_staged_kernel(AttentionArgs a, const PartInfo* parts, int64_t items, float* part_stats, float* part_acc) {
  using R = Ring<kDtype, C, G, kTile>;
  constexpr int kTileKeys = R::kTileKeys;
  constexpr int kD = C * kWarp;
  constexpr int kPassKeys = kWarp / G;
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  uint8_t* ring = smem + warp * warp_smem_bytes<G>(R::kTileBytes, R::kSlots);
  float* probs = reinterpret_cast<float*>(ring + R::kSlots * R::kTileBytes);  // [G][kPartitionSize]
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarps;
  const int32_t hq = a.pools.geometry.kv_heads * G;
  const float score_scale = a.scales.sm_scale * a.scales.k_scale;

  // Producer cursor: runs up to kSlots - 1 tiles ahead, across items, with
  // the next tile's page-table loads and the next item's descriptor in flight.
  const int64_t first_index = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  Item next = build_item(a, items, first_index, fetch_part(a, parts, items, first_index), kTileKeys);
  PartInfo next_following = fetch_part(a, parts, items, first_index + stride);
  int32_t next_t = 0;
  PreparedTile prepared = prepare_tile<kTileKeys>(a, next, 0, lane);
  uint32_t issued = 0;
  auto issue_next = [&]() {
    if (next.valid) {
      issue_tile<R>(a, next, next_t, prepared, ring + (issued % R::kSlots) * R::kTileBytes, lane);
      ++issued;
      if (++next_t == 2 * next.tiles) {
        next = build_item(a, items, next.index + stride, next_following, kTileKeys);
        next_following = fetch_part(a, parts, items, next.index + stride);
        next_t = 0;
      }
      if (next.valid) prepared = prepare_tile<kTileKeys>(a, next, next_t, lane);
    }
    cp_async_commit();  // empty groups keep the wait count uniform
  };
  for (int s = 0; s < R::kSlots - 1; ++s) issue_next();

  uint32_t consumed = 0;
  PartInfo following = fetch_part(a, parts, items, first_index + stride);
  for (Item it = build_item(a, items, first_index, fetch_part(a, parts, items, first_index), kTileKeys); it.valid;) {
    float q[G][C];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int i = 0; i < C; ++i)
        q[g][i] = load_float(a.q.data, a.q.dtype, a.q.offset(it.row, it.kv_head * G + g, lane * C + i));
    float acc[G][C];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int i = 0; i < C; ++i) acc[g][i] = 0.0f;
    float m_mine = 0.0f, l_mine = 0.0f;  // lane g holds head g's m_p, l_p

    for (int32_t t = 0; t < 2 * it.tiles; ++t) {
      issue_next();
      cp_async_wait<R::kSlots - 1>();
      __syncwarp();
      const uint8_t* tile = ring + (consumed % R::kSlots) * R::kTileBytes;
      ++consumed;
      if (t < it.tiles) {
        // Scores of this tile's keys, kPassKeys at a time.
        const int32_t t0 = t * kTileKeys;
#pragma unroll 1
        for (int pass = 0; pass < kTileKeys / kPassKeys; ++pass) {
          if (t0 + pass * kPassKeys >= it.count) break;  // uniform
          float part[kWarp];
#pragma unroll
          for (int kk = 0; kk < kPassKeys; ++kk) {
            float k[C];
            load_codes<kDtype, C>(tile + (pass * kPassKeys + kk) * R::kRowBytes, lane, k);
#pragma unroll
            for (int g = 0; g < G; ++g) {
              float d = 0.0f;
#pragma unroll
              for (int i = 0; i < C; ++i) d = canon::fma_f32(q[g][i], k[i], d);
              part[kk * G + g] = d;
            }
          }
          const float dot = reduce_scatter32(part, lane);
          const int32_t j = t0 + pass * kPassKeys + lane / G;
          if (j < it.count)
            probs[(lane % G) * kPartitionSize + j] = it.first + j >= it.keys.n_attended ? canon::neg_inf() : dot * score_scale;
        }
        if (t == it.tiles - 1) {
          // Partition max, probabilities and sum per query head.
          __syncwarp();
#pragma unroll 1
          for (int g = 0; g < G; ++g) {
            float* s = probs + g * kPartitionSize;
            float m = canon::neg_inf();
            for (int32_t j = lane * canon::kLaneRun; j < (lane + 1) * canon::kLaneRun && j < it.count; ++j)
              m = s[j] > m ? s[j] : m;
            m = warp_ordered_max(m, lane);
            float run = 0.0f;
            for (int32_t j = lane * canon::kLaneRun; j < (lane + 1) * canon::kLaneRun && j < it.count; ++j) {
              s[j] = canon::probability(s[j], m);
              run = run + s[j];
            }
            const float l = warp_butterfly_sum(run);
            if (lane == g) {
              m_mine = m;
              l_mine = l;
            }
          }
        }
      } else {
        // P.V over this tile's keys, masked ones included (p = 0).
        const int32_t t0 = (t - it.tiles) * kTileKeys;
        const int32_t n = it.count - t0 < kTileKeys ? it.count - t0 : kTileKeys;
#pragma unroll 2
        for (int32_t kk = 0; kk < n; ++kk) {
          float v[C];
          load_codes<kDtype, C>(tile + kk * R::kRowBytes, lane, v);
#pragma unroll
          for (int g = 0; g < G; ++g) {
            const float p = probs[g * kPartitionSize + t0 + kk];
#pragma unroll
            for (int i = 0; i < C; ++i) acc[g][i] = canon::fma_f32(p, v[i], acc[g][i]);
          }
        }
      }
      __syncwarp();  // the slot is refilled by the next issue
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float* out = part_acc + (static_cast<int64_t>(it.rp) * hq + it.kv_head * G + g) * kD + lane * C;
#pragma unroll
      for (int i = 0; i < C; ++i) out[i] = acc[g][i];
    }
    if (lane < G) {
      float* st = part_stats + (static_cast<int64_t>(it.rp) * hq + it.kv_head * G + lane) * 2;
      st[0] = m_mine;
      st[1] = l_mine;
    }
    const int64_t next_index = it.index + stride;
    it = build_item(a, items, next_index, following, kTileKeys);
    following = fetch_part(a, parts, items, next_index + stride);
  }
  cp_async_wait<0>();
}

// Launches the staged kernel for one (dtype, C, G).
template <CacheDtype kDtype, int C, int G, int kTile>
void launch(const AttentionPlan& plan, cudaStream_t stream) {
  using R = Ring<kDtype, C, G, kTile>;
  const auto kernel = attention_staged_kernel<kDtype, C, G, kTile>;
  const int smem = kWarps * warp_smem_bytes<G>(R::kTileBytes, R::kSlots);
  KVSIM_CUDA_CHECK(plan.op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int sms = device_sm_count(plan.op);
  int per_sm = 0;
  KVSIM_CUDA_CHECK(plan.op, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kWarps * kWarp, smem));
  const int64_t items = static_cast<int64_t>(plan.parts) * plan.args.pools.geometry.kv_heads;
  const int64_t needed = (items + kWarps - 1) / kWarps;
  const int64_t resident = static_cast<int64_t>(sms) * (per_sm > 0 ? per_sm : 1);
  const unsigned grid = static_cast<unsigned>(needed < resident ? needed : resident);
  const auto* parts = reinterpret_cast<const PartInfo*>(plan.part_info);
  kernel<<<grid, kWarps * kWarp, smem, stream>>>(plan.args, parts, items, plan.part_stats, plan.part_acc);
  check_launch(plan.op, "attention_staged_kernel", stream);
}

// Dispatch over C (D / 32) and G for one dtype; false when not instantiated.
template <CacheDtype kDtype>
bool launch_for_dtype(const AttentionPlan& plan, cudaStream_t stream) {
  const int C = plan.args.pools.geometry.head_dim / kWarp;
  const int G = plan.args.group;
  constexpr int kElem = static_cast<int>(sizeof(typename Code<kDtype>::T));
  auto with_c = [&]<int kC>() {
    if constexpr (kC * kWarp * kElem <= kMaxRowBytes) {
      const bool small_tiles = plan.staged_tile_keys == 16;
      switch (G) {
        case 1: launch<kDtype, kC, 1, 32>(plan, stream); return true;
        case 4:
          small_tiles ? launch<kDtype, kC, 4, 16>(plan, stream) : launch<kDtype, kC, 4, 32>(plan, stream);
          return true;
        case 8:
          if constexpr (kC * 8 <= 32) {
            small_tiles ? launch<kDtype, kC, 8, 16>(plan, stream) : launch<kDtype, kC, 8, 32>(plan, stream);
            return true;
          }
          return false;
        default: return false;
      }
    }
    return false;
  };
  return dispatch_lane_codes(C, with_c);
}

}  // namespace kvsim::cuda::staged
