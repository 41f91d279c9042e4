// The mma attention order's ring kernel (docs/canonical-arithmetic.md, "The
// mma order"): decode (and every plan-driven prefill) on the tensor cores,
// byte-identical to core's attend_query_mma and so to the general mma kernel
// (attention_mma.cu), fed like the bulk kernel (attention_bulk.cuh) from a
// per-warp ring in shared memory.
//
// Work: persistent warps, each alone through (query row, KV head, 256-key
// partition) items, the bulk kernel's items, key table (build_table) and copy
// cursor running kSlots - 1 tiles ahead across items; its tiles of 16 K or V
// rows arrive by cp.async (16 bytes per lane) into rows padded to a 16-byte
// multiple plus 16 (ldmatrix's 8 rows then hit distinct banks), rows past the
// partition as zeros (the oracle's v = 0 past the partition).
//
// The instruction is used transposed: keys (scores) or head dims (P.V) are
// its 16 rows, the group's query heads its 8 columns (G <= 8; columns past G
// read zeros and are never written). Each output element of mma.sync depends
// only on its row of A, its column of B and its c, and core's model of the
// instruction is symmetric in a and b (exact products, one fused sum), so
// S^T = K q^T and O^T = V^T P^T give the order's bits:
//  * scores: per block of 16 keys, A = 16 K rows by ldmatrix, B = q^T (the
//    group's operand codes, in registers), the chain over 16-dim chunks from
//    +0, chunk 0 first; then one multiply by the score scale, -inf past the
//    attended keys, into a [head][key] score buffer;
//  * softmax: the bulk kernel's canonical lane runs (lane l takes keys
//    [8l, 8l + 8) of each head); p split into hi and lo codes in place of the
//    scores, zeros past the partition;
//  * P.V: per group of 8 keys, A = the 8 V rows transposed by ldmatrix.trans
//    (k 0..7 and k 8..15 both the 8 keys: the same registers), B = the keys'
//    hi codes (k 0..7) and lo codes (k 8..15) of each head, accumulators from
//    +0, groups in key order.
// m_p, l_p and acc_p go where the other partition kernels write them; the
// merge kernel (attention.cu) is the same for every order and path.
#include "backends/cuda/attention_bulk.cuh"
#include "backends/cuda/attention_plan.cuh"
#include "backends/cuda/attention_warp.cuh"
#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/mma_fragments.cuh"
#include "backends/cuda/prefill_rows.cuh"

namespace kvsim::cuda {
namespace mma_ring {

using canon::kPartitionSize;
using canon::kWarp;
using bulk::Item;
using bulk::PartInfo;

constexpr int kTile = 16;   // keys per ring slot: one score block, two P.V groups
constexpr int kHeads = 8;   // the instruction's n: the query heads of a group (G <= 8)
constexpr int kScoreStride = kPartitionSize + 8;  // floats; = 8 mod 32: P.V's 64-bit loads hit distinct banks
constexpr int kMaxSlots = 6;

constexpr int kWarpsPerCta = 4;

// One instantiation: head dim, score rows (4 for G <= 4: half the buffer,
// B's columns 4..7 zeros in registers; else 8) and bytes per cache code (2:
// bf16/fp16, 1: fp8, turned into bf16 codes in registers).
template <int kD, int kRowsS, int kCodeBytes>
struct Cfg {
  static constexpr int kElem = kCodeBytes;  // build_table's row offsets
  static constexpr int kRowBytes = kD * kElem;
  static constexpr int kStride = kRowBytes + 16;  // padded ring row
  static constexpr int kPieces = kRowBytes / 16;  // 16-byte pieces per row
  static constexpr int kTileBytes = kTile * kStride;
  static constexpr int kScoreBytes = kRowsS * kScoreStride * 4;
  static constexpr int kTableBytes = 2 * kPartitionSize * 4;
  // CTAs per SM: three for fp8 rows up to D 128 (their half-size tiles
  // still leave 5 slots a warp: 12 warps per SM to hide the latency that
  // bounds the kernel, ncu: 2 warps per scheduler, 4.1 cycles between a
  // warp's instructions), else two (one for D 256 at 16 bits). Slots: as
  // many as fit, up to kMaxSlots. Measured on the H200 (bf16, 64 x 8K, GQA
  // 32:8): 5 slots and 4 score rows ran as fast as 4 slots and 8 rows (0.691
  // vs 0.693 ms), 9 one-warp CTAs of 4 slots slower (0.713 ms).
  static constexpr int kCtasPerSm = kCodeBytes == 1 ? (kD <= 128 ? 3 : 2) : (kD == 256 ? 1 : 2);
  static constexpr int kCtaBudget = 227 * 1024 / kCtasPerSm - 1024;
  static constexpr int kFit = (kCtaBudget / kWarpsPerCta - kScoreBytes - kTableBytes) / kTileBytes;
  static constexpr int kSlots = kFit < kMaxSlots ? kFit : kMaxSlots;
  static constexpr int kWarpBytes = kSlots * kTileBytes + kScoreBytes + kTableBytes;
  static constexpr int kChunks = kD / 16;  // score chain length
  static_assert(kSlots >= 3 && kTile * kPieces % kWarp == 0 && kWarpBytes % 16 == 0);
  static_assert(kCtasPerSm * kWarpsPerCta * kWarpBytes <= 227 * 1024);
};

// The operand codes of a cache's codes, two at a time (the first in the low
// half): bf16/fp16 as stored, fp8 through fp8x2_to_bf16x2 (the low 16 bits).
template <CacheDtype kCache>
__device__ __forceinline__ uint32_t operand_pair(uint32_t codes) {
  if constexpr (kCache == CacheDtype::fp8_e4m3) return fp8x2_to_bf16x2<false>(codes);
  else if constexpr (kCache == CacheDtype::fp8_e5m2) return fp8x2_to_bf16x2<true>(codes);
  else return codes;
}

// The k permutation of an fp8 chunk. ldmatrix over fp8 bytes gives a lane 4
// consecutive dims of a row, 4 t4 .. 4 t4 + 3, which the instruction takes
// as its k 2 t4, 2 t4 + 1 (a0/a1, b0) and 2 t4 + 8, 2 t4 + 9 (a2/a3, b1). The
// model's inner product is one fused addition of exact products, free of
// order within an instruction, so the same permutation of q and k changes no
// bit. bf16/fp16: the identity (dims 2 t4, + 1 and + 8, + 9).
template <CacheDtype kCache>
__device__ __forceinline__ int chunk_dim(int t4, int half) {
  return is_fp8(kCache) ? 4 * t4 + 2 * half : 2 * t4 + 8 * half;
}

// The head dim of P.V's output row r (0..15) of M tile m: bf16/fp16 tiles are
// 16 consecutive dims; an fp8 lane's 32-bit loads give 4 consecutive dims
// 32 (m / 2) + 4 g + 0..3, rows g and g + 8 of tiles m = 2 q and 2 q + 1.
template <CacheDtype kCache>
__device__ __forceinline__ int pv_dim(int m, int g, int upper) {
  return is_fp8(kCache) ? 32 * (m / 2) + 4 * g + 2 * (m % 2) + upper : 16 * m + g + 8 * upper;
}

// Where a lane's pieces of a tile go: lane l moves 16-byte column l % kPieces
// of kPerLane consecutive rows from (l / kPieces) * kPerLane, so that its
// row offsets are one vector load from the table (measured on the H200:
// computing each piece's place from scratch was 50 of 57 warp instructions
// per key; then one scalar table load per piece, waited on by its address,
// was the kernel's most-sampled stall).
template <class K>
struct LanePieces {
  static constexpr int kPerLane = kTile * K::kPieces / kWarp;
  static_assert(kPerLane == 2 || kPerLane % 4 == 0);
  const uint8_t* src;  // pool + the lane's column
  uint32_t dst;        // shared offset of the lane's first piece within a slot
  int32_t row;         // the lane's first row
  __device__ LanePieces(const uint8_t* pool, int lane)
      : src(pool + (lane % K::kPieces) * 16),
        dst(static_cast<uint32_t>((lane / K::kPieces) * kPerLane * K::kStride + (lane % K::kPieces) * 16)),
        row((lane / K::kPieces) * kPerLane) {}
};

// Tile `t` of item `it` (K tiles 0..tiles-1, then V tiles) into the ring
// slot at shared address `slot`: one table read, one address and one cp.async
// per piece; the copy itself zero-fills rows past the partition (the
// oracle's v = 0 there; K rows there are never attended).
template <class K>
__device__ __forceinline__ void issue_tile(const LanePieces<K>& lp, const Item& it, int32_t t, const uint32_t* table,
                                           uint32_t slot) {
  const int32_t kv = t < it.tiles ? 0 : 1;
  const int32_t t0 = (kv == 0 ? t : t - it.tiles) * kTile;
  const int32_t n = it.count - t0;
  constexpr int kPerLane = LanePieces<K>::kPerLane;
  // t0 + row < kPartitionSize: in the table; a multiple of kPerLane words: aligned.
  const uint32_t* rows = table + kv * kPartitionSize + t0 + lp.row;
  uint32_t off[kPerLane];
  load_run<uint32_t, kPerLane>(rows, off);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const bool copy = lp.row + i < n;
    cp_async16_zfill(slot + lp.dst + i * K::kStride, lp.src + static_cast<uint64_t>(copy ? off[i] : 0u) * 16, copy);
  }
}

// A warp's items: a contiguous run of j, where item j is partition j % P of
// KV head j / P (P = the plan's partitions, one row's after another), so that
// consecutive items of a warp mostly share the query row and head and the q
// codes are loaded once for all of them. index(j): bulk's item index, past
// the run `items` (no item).
struct ItemRun {
  int32_t end, parts, heads, items;
  __device__ int32_t index(int32_t j) const { return j < end ? (j % parts) * heads + j / parts : items; }
};

// B of the scores for one item: q^T, column g = head g of the group, k 2 t4,
// + 1 (b0) and + 8, + 9 (b1) of each chunk (chunk_dim), as operand codes
// (RNE from the exact value); zeros for columns past G. The dtype switch is
// taken once, not per element.
template <CacheDtype kCache, int kChunks>
__device__ __forceinline__ void load_q_codes(const AttentionArgs& a, int64_t row, int32_t head0, int g, int t4,
                                             uint32_t (&qb)[kChunks][2]) {
  constexpr mma::Operand f = mma_order::operand_for(kCache);
  const bool present = g < a.group;
  const int64_t base = present ? a.q.offset(row, head0 + g, 0) : 0, step = a.q.stride[2];
  auto fill = [&](auto dtype) {
    constexpr CacheDtype T = decltype(dtype)::value;
    auto code = [&](int32_t d) {
      return present ? mma_order::round_to_operand(f, load_float(a.q.data, T, base + d * step)) : 0u;
    };
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int32_t d0 = 16 * c + chunk_dim<kCache>(t4, 0), d1 = 16 * c + chunk_dim<kCache>(t4, 1);
      qb[c][0] = pack_codes(code(d0), code(d0 + 1));
      qb[c][1] = pack_codes(code(d1), code(d1 + 1));
    }
  };
  switch (a.q.dtype) {
    case CacheDtype::fp32: fill(std::integral_constant<CacheDtype, CacheDtype::fp32>{}); break;
    case CacheDtype::fp16: fill(std::integral_constant<CacheDtype, CacheDtype::fp16>{}); break;
    default: fill(std::integral_constant<CacheDtype, CacheDtype::bf16>{}); break;  // the only other q dtype validation lets through
  }
}

template <int kD, CacheDtype kCache, int kRowsS>
__global__ void __launch_bounds__(kWarpsPerCta * kWarp, (Cfg<kD, kRowsS, bytes_per_element(kCache)>::kCtasPerSm))
    attention_mma_ring_kernel(AttentionArgs a, const PartInfo* parts, int32_t items, float* part_stats,
                              float* part_acc) {
  constexpr bool kFp8 = is_fp8(kCache);
  using K = Cfg<kD, kRowsS, bytes_per_element(kCache)>;
  constexpr mma::Operand f = mma_order::operand_for(kCache);
  constexpr int kSlots = K::kSlots;
  extern __shared__ __align__(128) uint8_t smem[];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int g = lane >> 2, t4 = lane & 3;
  uint8_t* ring = smem + warp * K::kWarpBytes;
  float* s = reinterpret_cast<float*>(ring + kSlots * K::kTileBytes);  // [kRowsS][kScoreStride]
  uint32_t* table = reinterpret_cast<uint32_t*>(ring + kSlots * K::kTileBytes + K::kScoreBytes);
  const int32_t G = a.group;
  // Rows of heads past G are never written: B's absent columns read zeros.
  for (int i = G * kScoreStride + lane; i < kRowsS * kScoreStride; i += kWarp) s[i] = 0.0f;

  const PageDivider page = a.pools.geometry.page_divider();
  const int32_t H = a.pools.geometry.kv_heads;
  const uint8_t* pool = a.pools.bytes(PoolKind::primary);
  const int32_t hq = H * G;
  const float score_scale = a.scales.sm_scale * a.scales.k_scale;

  // Copy cursor: one cp.async group per call (empty past the last item), so
  // that the group of the tile consumed is always the kSlots-th newest.
  const int32_t warps = static_cast<int32_t>(gridDim.x) * kWarpsPerCta;
  const int32_t per_warp = (items + warps - 1) / warps;
  const int32_t j0 = (static_cast<int32_t>(blockIdx.x) * kWarpsPerCta + warp) * per_warp;  // < items + per_warp
  const ItemRun run{j0 + per_warp < items ? j0 + per_warp : items, items / H, H, items};
  int32_t nj = j0;  // the copy cursor's item
  Item nx = bulk::build_item<kTile>(a, page, items, run.index(nj), bulk::fetch_part(parts, items, H, run.index(nj)));
  PartInfo nx_following = bulk::fetch_part(parts, items, H, run.index(nj + 1));
  int32_t nt = 0;
  int issue_slot = 0, consume_slot = 0;
  const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
  const LanePieces<K> pieces(pool, lane);
  auto issue_one = [&]() {
    if (nx.valid) {
      if (nt == 0) bulk::build_table<K>(a, page, nx, table, lane);
      issue_tile<K>(pieces, nx, nt, table, ring_s + issue_slot * K::kTileBytes);
      if (++nt == 2 * nx.tiles) {
        ++nj;
        nx = bulk::build_item<kTile>(a, page, items, run.index(nj), nx_following);
        nx_following = bulk::fetch_part(parts, items, H, run.index(nj + 1));
        nt = 0;
        __syncwarp();  // every lane has read the table before the next item's is built
      }
    }
    cp_async_commit();
    issue_slot = issue_slot + 1 == kSlots ? 0 : issue_slot + 1;
  };
  for (int i = 0; i < kSlots - 1; ++i) issue_one();

  // This lane's A rows: key (or V row) lane % 8 + 8 * (lane / 8 % 2), dims
  // + 8 * (lane / 16) for the scores; row lane % 8, dims + 8 * (lane / 8) for P.V.
  const int score_row = ((lane & 7) + 8 * ((lane >> 3) & 1)) * K::kStride + 16 * (lane >> 4);
  const int pv_row = (lane & 7) * K::kStride + 16 * (lane >> 3);

  int32_t cj = j0;  // the consumer's item
  PartInfo following = bulk::fetch_part(parts, items, H, run.index(cj + 1));
  uint32_t qb[K::kChunks][2];
  int32_t q_row = -1, q_head = -1;  // whose codes qb holds
  for (Item it = bulk::build_item<kTile>(a, page, items, run.index(cj), bulk::fetch_part(parts, items, H, run.index(cj)));
       it.valid;) {
    if (it.row != q_row || it.kv_head != q_head) {  // warp-uniform
      load_q_codes<kCache>(a, it.row, it.kv_head * G, g, t4, qb);
      q_row = it.row;
      q_head = it.kv_head;
    }
    // acc[m]: C of the P.V instruction for dims 16m .. 16m + 15 (rows) x heads (columns).
    float acc[kD / 16][4];
#pragma unroll
    for (int m = 0; m < kD / 16; ++m)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][i] = 0.0f;

    for (int32_t t = 0; t < 2 * it.tiles; ++t) {
      issue_one();
      cp_async_wait<kSlots - 1>();
      __syncwarp();  // every lane's pieces of the tile have landed
      const uint8_t* tile = ring + consume_slot * K::kTileBytes;
      consume_slot = consume_slot + 1 == kSlots ? 0 : consume_slot + 1;
      if (t < it.tiles) {
        // Scores of the tile's 16 keys: C = (key g, + 8) x (head 2 t4, + 1).
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if constexpr (kFp8) {
          // One ldmatrix covers two chunks: matrices 0, 1 = keys 0..7, 8..15 of
          // chunk 2 cp, matrices 2, 3 those of chunk 2 cp + 1.
#pragma unroll
          for (int cp = 0; cp < K::kChunks / 2; ++cp) {
            uint32_t r[4];
            ldmatrix_x4(r, tile + score_row + 32 * cp);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const uint32_t ka[4] = {operand_pair<kCache>(r[2 * h]), operand_pair<kCache>(r[2 * h + 1]),
                                      operand_pair<kCache>(r[2 * h] >> 16), operand_pair<kCache>(r[2 * h + 1] >> 16)};
              mma_16816(f, c, ka, qb[2 * cp + h][0], qb[2 * cp + h][1]);
            }
          }
        } else {
#pragma unroll
          for (int ch = 0; ch < K::kChunks; ++ch) {
            uint32_t ka[4];
            ldmatrix_x4(ka, tile + score_row + 32 * ch);
            mma_16816(f, c, ka, qb[ch][0], qb[ch][1]);
          }
        }
        const int32_t j0 = t * kTile + g, j1 = j0 + 8;
        const int h0 = 2 * t4, h1 = h0 + 1;
        auto scaled = [&](float x, int32_t j) { return j >= it.attended ? canon::neg_inf() : x * score_scale; };
        if (h0 < G) {
          s[h0 * kScoreStride + j0] = scaled(c[0], j0);
          s[h0 * kScoreStride + j1] = scaled(c[2], j1);
        }
        if (h1 < G) {
          s[h1 * kScoreStride + j0] = scaled(c[1], j0);
          s[h1 * kScoreStride + j1] = scaled(c[3], j1);
        }
        if (t == it.tiles - 1) {
          // Softmax of every head, the canonical lane runs (keys past the
          // partition count as -inf: they change neither max nor sum); the
          // split codes (hi low, lo high) replace the scores in place.
          __syncwarp();
#pragma unroll 1
          for (int h = 0; h < G; ++h) {
            float* row = s + h * kScoreStride + lane * canon::kLaneRun;
            const float4 x = reinterpret_cast<const float4*>(row)[0], y = reinterpret_cast<const float4*>(row)[1];
            float v[canon::kLaneRun] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w};
            float m = canon::neg_inf();
#pragma unroll
            for (int k = 0; k < canon::kLaneRun; ++k) {
              if (lane * canon::kLaneRun + k >= it.count) v[k] = canon::neg_inf();
              m = v[k] > m ? v[k] : m;
            }
            m = warp_ordered_max(m, lane);
            float run = 0.0f;
            uint32_t w[canon::kLaneRun];
#pragma unroll
            for (int k = 0; k < canon::kLaneRun; ++k) {
              const float p = canon::probability(v[k], m);
              run = run + p;
              const mma_order::SplitProbability sp = lane * canon::kLaneRun + k < it.count
                                                         ? mma_order::split_probability(f, p)
                                                         : mma_order::SplitProbability{0u, 0u};
              w[k] = pack_codes(sp.hi, sp.lo);
            }
            const float l = warp_butterfly_sum(run);
            reinterpret_cast<uint4*>(row)[0] = make_uint4(w[0], w[1], w[2], w[3]);
            reinterpret_cast<uint4*>(row)[1] = make_uint4(w[4], w[5], w[6], w[7]);
            if (lane == 0) {
              float* st = part_stats + (static_cast<int64_t>(it.rp) * hq + it.kv_head * G + h) * 2;
              st[0] = m;
              st[1] = l;
            }
          }
        }
      } else {
        // P.V over the tile's groups of 8 keys (masked keys included: p = 0).
        const int32_t t0 = (t - it.tiles) * kTile;
#pragma unroll
        for (int q8 = 0; q8 < kTile / 8; ++q8) {
          const int32_t j = t0 + 8 * q8;
          if (j < it.count) {  // uniform
            const uint2 w = g < kRowsS ? *reinterpret_cast<const uint2*>(s + g * kScoreStride + j + 2 * t4) : make_uint2(0u, 0u);
            const uint32_t b0 = __byte_perm(w.x, w.y, 0x5410), b1 = __byte_perm(w.x, w.y, 0x7632);  // hi, lo
            if constexpr (kFp8) {
              // Keys 2 t4 and 2 t4 + 1 (k 2 t4, + 1 and, for the lo codes, + 8,
              // + 9), dims 32 q4 + 4 g .. + 3 (pv_dim): two 32-bit loads, the
              // bytes paired per dim.
              const uint8_t* vrow = tile + (8 * q8 + 2 * t4) * K::kStride + 4 * g;
#pragma unroll
              for (int q4 = 0; q4 < kD / 32; ++q4) {
                const uint32_t x = *reinterpret_cast<const uint32_t*>(vrow + 32 * q4);
                const uint32_t y = *reinterpret_cast<const uint32_t*>(vrow + K::kStride + 32 * q4);
                const uint32_t d01 = __byte_perm(x, y, 0x5140), d23 = __byte_perm(x, y, 0x7362);
                const uint32_t v0 = operand_pair<kCache>(d01), v1 = operand_pair<kCache>(d01 >> 16);
                const uint32_t v2 = operand_pair<kCache>(d23), v3 = operand_pair<kCache>(d23 >> 16);
                const uint32_t lo_dims[4] = {v0, v1, v0, v1}, hi_dims[4] = {v2, v3, v2, v3};
                mma_16816(f, acc[2 * q4], lo_dims, b0, b1);
                mma_16816(f, acc[2 * q4 + 1], hi_dims, b0, b1);
              }
            } else {
              const uint8_t* vrow = tile + 8 * q8 * K::kStride + pv_row;
#pragma unroll
              for (int q4 = 0; q4 < kD / 32; ++q4) {
                uint32_t r[4];
                ldmatrix_x4_trans(r, vrow + 64 * q4);
                const uint32_t lo_dims[4] = {r[0], r[1], r[0], r[1]}, hi_dims[4] = {r[2], r[3], r[2], r[3]};
                mma_16816(f, acc[2 * q4], lo_dims, b0, b1);
                mma_16816(f, acc[2 * q4 + 1], hi_dims, b0, b1);
              }
            }
          }
        }
      }
      __syncwarp();  // the slot and the score buffer are reused
    }
    // acc[m] = (dims pv_dim(m, g, 0), pv_dim(m, g, 1)) x (head 2 t4, + 1).
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int h = 2 * t4 + i;
      if (h < G) {
        float* out = part_acc + (static_cast<int64_t>(it.rp) * hq + it.kv_head * G + h) * kD;
#pragma unroll
        for (int m = 0; m < kD / 16; ++m) {
          out[pv_dim<kCache>(m, g, 0)] = acc[m][i];
          out[pv_dim<kCache>(m, g, 1)] = acc[m][2 + i];
        }
      }
    }
    ++cj;
    it = bulk::build_item<kTile>(a, page, items, run.index(cj), following);
    following = bulk::fetch_part(parts, items, H, run.index(cj + 1));
  }
  cp_async_wait<0>();  // no copy outlives the kernel's shared memory
}

template <int kD, CacheDtype kCache, int kRowsS>
bool launch(const AttentionPlan& plan, cudaStream_t stream, KernelInfo* info) {
  using K = Cfg<kD, kRowsS, bytes_per_element(kCache)>;
  const auto kernel = attention_mma_ring_kernel<kD, kCache, kRowsS>;
  const int smem = kWarpsPerCta * K::kWarpBytes;
  KVSIM_CUDA_CHECK(plan.op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int per_sm = 0;
  KVSIM_CUDA_CHECK(plan.op, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kWarpsPerCta * kWarp, smem));
  if (info) {
    cudaFuncAttributes attr{};
    KVSIM_CUDA_CHECK(plan.op, cudaFuncGetAttributes(&attr, kernel));
    *info = KernelInfo{attr.numRegs, smem, per_sm, kWarpsPerCta, kTile, K::kSlots};
    return true;
  }
  const int32_t items = plan.parts * plan.args.pools.geometry.kv_heads;  // < 2^31: mma_ring_applies()
  const int64_t needed = (static_cast<int64_t>(items) + kWarpsPerCta - 1) / kWarpsPerCta;
  const int64_t resident = static_cast<int64_t>(device_sm_count(plan.op)) * (per_sm > 0 ? per_sm : 1);
  const unsigned grid = static_cast<unsigned>(needed < resident ? needed : resident);
  kernel<<<grid, kWarpsPerCta * kWarp, smem, stream>>>(plan.args, reinterpret_cast<const PartInfo*>(plan.part_info),
                                                       items, plan.part_stats, plan.part_acc);
  check_launch(plan.op, "attention_mma_ring_kernel", stream);
  return true;
}

template <int kD, CacheDtype kCache>
bool launch_rows(const AttentionPlan& plan, cudaStream_t stream, KernelInfo* info) {
  return plan.args.group > 4 ? launch<kD, kCache, 8>(plan, stream, info) : launch<kD, kCache, 4>(plan, stream, info);
}

template <CacheDtype kCache>
bool launch_dims(const AttentionPlan& plan, cudaStream_t stream, KernelInfo* info) {
  switch (plan.args.pools.geometry.head_dim) {
    case 64: return launch_rows<64, kCache>(plan, stream, info);
    case 128: return launch_rows<128, kCache>(plan, stream, info);
    case 256: return launch_rows<256, kCache>(plan, stream, info);
    default: return false;
  }
}

}  // namespace mma_ring

bool mma_ring_applies(const AttentionPlan& plan) {
  const KvPools& pools = plan.args.pools;
  const PoolGeometry& g = pools.geometry;
  if (plan.args.order != AttentionOrder::mma) return false;
  if (g.dtype != CacheDtype::bf16 && g.dtype != CacheDtype::fp16 && !is_fp8(g.dtype)) return false;
  if (g.head_dim != 64 && g.head_dim != 128 && g.head_dim != 256) return false;
  if (plan.args.group < 1 || plan.args.group > mma_ring::kHeads) return false;
  if (static_cast<int64_t>(plan.parts) * g.kv_heads >= INT32_MAX) return false;  // 32-bit item indices
  // Row offsets in 16-byte units in 32 bits (build_table): pools up to 64 GiB.
  const int64_t bytes = pools.data_allocation(PoolKind::primary) * (bits_per_element(g.dtype) / 8);
  if (bytes / 16 > static_cast<int64_t>(UINT32_MAX)) return false;
  return prefill_rows_contiguous(pools);
}

bool launch_mma_ring(const AttentionPlan& plan, cudaStream_t stream, KernelInfo* info) {
  if (!mma_ring_applies(plan)) return false;
  switch (plan.args.pools.geometry.dtype) {
    case CacheDtype::fp16: return mma_ring::launch_dims<CacheDtype::fp16>(plan, stream, info);
    case CacheDtype::fp8_e4m3: return mma_ring::launch_dims<CacheDtype::fp8_e4m3>(plan, stream, info);
    case CacheDtype::fp8_e5m2: return mma_ring::launch_dims<CacheDtype::fp8_e5m2>(plan, stream, info);
    default: return mma_ring::launch_dims<CacheDtype::bf16>(plan, stream, info);
  }
}

}  // namespace kvsim::cuda
