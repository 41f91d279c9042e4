// The mma attention order's partition kernel (docs/canonical-arithmetic.md,
// "The mma order"): q.k and P.V on the tensor cores with mma.sync
// m16n8k16 (bf16 or fp16 operands, fp32 accumulation), byte-identical to
// core's attend_query_mma, whose inner products are core's model of this very
// instruction (core/include/kvsim/core/mma_model.hpp, verified on the H200).
//
// One warp per (query row, partition, KV head): the group's query heads are
// the instruction's 16 rows (blocks of 16 heads when G > 16; rows past G are
// zeros and never written), keys are its 8 columns.
//  * scores: per tile of 8 keys, the chain over 16-dim chunks from +0, chunk 0
//    first: one mma per chunk, the accumulator the previous result;
//  * softmax: the canonical steps of the general kernel (lane runs of 8 keys,
//    ordered max, butterfly sum), one query head at a time;
//  * P.V: per 8 keys one mma whose k elements 0..7 are the keys' hi parts and
//    8..15 their lo parts; B holds the keys' V rows twice (its two registers
//    are the same), accumulators from +0, groups in key order.
// Writes m_p, l_p and acc_p where the general kernel does; the merge kernel
// (attention.cu) is the same for both orders. K and V codes are read one
// element at a time through element_offset (any layout): correctness first,
// and the fallback of every shape the fast kernels leave: decode (and plan-
// driven prefill) takes attention_mma_ring.cu's ring kernel, prefill
// attention_prefill_mma.cu's tiled kernel, wherever they apply.
#include "backends/cuda/attention_plan.cuh"
#include "backends/cuda/attention_warp.cuh"
#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/mma_fragments.cuh"

namespace kvsim::cuda {
namespace {

using canon::kPartitionSize;
constexpr int kRows = 16;  // the instruction's m

struct Key {
  bool live = false;    // inside the partition (masked tail keys are live: V is read)
  bool masked = false;  // page tail: score -inf, probability 0
  int32_t block = 0, entry = 0;
};

__device__ __forceinline__ Key key_at(const AttentionArgs& a, const KeyList& keys, int32_t seq, int64_t first,
                                      int32_t count, int32_t j) {
  Key k;
  if (j >= count) return k;
  k.live = true;
  const int64_t slot = keys.slot(first + j, a.window, k.masked);
  const TableSlot at = table_slot(a.pools.geometry, a.block_table, a.max_blocks_per_seq, seq, slot);
  k.block = static_cast<int32_t>(at.block);
  k.entry = at.entry;
  return k;
}

// Operand code of element d of a K (kv 0) or V (kv 1) row; 0 past D.
__device__ __forceinline__ uint32_t code_at(const AttentionArgs& a, const Key& k, int32_t kv, int32_t head, int32_t d) {
  if (d >= a.pools.geometry.head_dim) return 0u;
  return mma_order::load_cache_operand(a.pools.bytes(PoolKind::primary), a.pools.geometry.dtype,
                                       element_offset(a.pools.strides[0], k.block, a.layer, kv, head, k.entry, d));
}

__global__ void __launch_bounds__(32)
    attention_mma_kernel(AttentionArgs a, const int32_t* part_info, int32_t hq, float* part_stats, float* part_acc) {
  extern __shared__ uint32_t shared_words[];
  const int lane = threadIdx.x;
  const int g = lane >> 2, t4 = lane & 3;
  const int32_t kv_heads = a.pools.geometry.kv_heads;
  const int32_t rp = static_cast<int32_t>(blockIdx.x / kv_heads);
  const int32_t kv_head = static_cast<int32_t>(blockIdx.x % kv_heads);
  const int32_t row = part_info[4 * rp + 0], seq = part_info[4 * rp + 1], position = part_info[4 * rp + 2],
                part = part_info[4 * rp + 3];
  const int32_t D = a.pools.geometry.head_dim;
  const int32_t D16 = (D + 15) / 16 * 16;
  const int32_t G = a.group;
  const mma::Operand f = mma_order::operand_for(a.pools.geometry.dtype);
  const KeyList keys = make_key_list(position, a.window, a.pools.geometry.page_divider());
  const int64_t first = static_cast<int64_t>(part) * kPartitionSize;
  const int32_t count = static_cast<int32_t>(keys.size() - first < kPartitionSize ? keys.size() - first : kPartitionSize);
  const float score_scale = a.scales.sm_scale * a.scales.k_scale;
  float* s = reinterpret_cast<float*>(shared_words);                      // [kRows][kPartitionSize]
  uint16_t* qs = reinterpret_cast<uint16_t*>(s + kRows * kPartitionSize);  // [kRows][D16] operand codes

  for (int32_t h0 = 0; h0 < G; h0 += kRows) {
    const int32_t heads = G - h0 < kRows ? G - h0 : kRows;
    for (int32_t i = lane; i < kRows * D16; i += 32) {
      const int32_t r = i / D16, d = i % D16;
      qs[i] = static_cast<uint16_t>(
          r < heads && d < D
              ? mma_order::operand_code(f, load_float(a.q.data, a.q.dtype, a.q.offset(row, kv_head * G + h0 + r, d)))
              : 0u);
    }
    __syncwarp();
    auto q_pair = [&](int r, int d) { return pack_codes(qs[r * D16 + d], qs[r * D16 + d + 1]); };

    // Scores, 8 keys per tile: lane holds key j0 + g's K codes (B) and
    // the scores of keys j0 + 2 t4, + 1 for heads g and g + 8 (C).
    for (int32_t j0 = 0; j0 < count; j0 += 8) {
      const Key k = key_at(a, keys, seq, first, count, j0 + g);
      const bool load = k.live && !k.masked;
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int32_t d0 = 0; d0 < D16; d0 += 16) {
        const uint32_t ra[4] = {q_pair(g, d0 + 2 * t4), q_pair(g + 8, d0 + 2 * t4), q_pair(g, d0 + 8 + 2 * t4),
                                q_pair(g + 8, d0 + 8 + 2 * t4)};
        const int32_t d = d0 + 2 * t4;
        const uint32_t b0 = load ? pack_codes(code_at(a, k, 0, kv_head, d), code_at(a, k, 0, kv_head, d + 1)) : 0u;
        const uint32_t b1 = load ? pack_codes(code_at(a, k, 0, kv_head, d + 8), code_at(a, k, 0, kv_head, d + 9)) : 0u;
        mma_16816(f, c, ra, b0, b1);
      }
      for (int i = 0; i < 4; ++i) {
        const int32_t r = g + 8 * (i / 2), j = j0 + 2 * t4 + i % 2;
        if (r >= heads || j >= count) continue;
        bool masked = false;
        keys.slot(first + j, a.window, masked);
        s[r * kPartitionSize + j] = masked ? canon::neg_inf() : c[i] * score_scale;
      }
    }
    __syncwarp();

    // Softmax per head, the general kernel's canonical steps; s becomes p.
    for (int32_t r = 0; r < heads; ++r) {
      float m, l;
      warp_partition_softmax(s + r * kPartitionSize, count, lane, m, l);
      if (lane == 0) {
        const int64_t at = (static_cast<int64_t>(rp) * hq + kv_head * G + h0 + r) * 2;
        part_stats[at + 0] = m;
        part_stats[at + 1] = l;
      }
    }
    __syncwarp();

    // P.V, 64 output dims (8 n-tiles) at a time.
    auto split = [&](int r, int32_t j) {
      return r < heads && j < count ? mma_order::split_probability(f, s[r * kPartitionSize + j])
                                    : mma_order::SplitProbability{0u, 0u};
    };
    for (int32_t dc = 0; dc < D; dc += 64) {
      float acc[8][4];
      for (int u = 0; u < 8; ++u)
        for (int i = 0; i < 4; ++i) acc[u][i] = 0.0f;
      for (int32_t j0 = 0; j0 < count; j0 += 8) {
        const int32_t j = j0 + 2 * t4;
        const mma_order::SplitProbability p00 = split(g, j), p01 = split(g, j + 1), p10 = split(g + 8, j),
                                          p11 = split(g + 8, j + 1);
        const uint32_t ra[4] = {pack_codes(p00.hi, p01.hi), pack_codes(p10.hi, p11.hi), pack_codes(p00.lo, p01.lo),
                                pack_codes(p10.lo, p11.lo)};
        const Key k0 = key_at(a, keys, seq, first, count, j), k1 = key_at(a, keys, seq, first, count, j + 1);
        for (int u = 0; u < 8; ++u) {
          const int32_t d = dc + 8 * u + g;
          const uint32_t b = pack_codes(k0.live ? code_at(a, k0, 1, kv_head, d) : 0u, k1.live ? code_at(a, k1, 1, kv_head, d) : 0u);
          mma_16816(f, acc[u], ra, b, b);
        }
      }
      for (int u = 0; u < 8; ++u)
        for (int i = 0; i < 4; ++i) {
          const int32_t r = g + 8 * (i / 2), d = dc + 8 * u + 2 * t4 + i % 2;
          if (r < heads && d < D) part_acc[(static_cast<int64_t>(rp) * hq + kv_head * G + h0 + r) * D + d] = acc[u][i];
        }
    }
    __syncwarp();
  }
}

}  // namespace

void launch_mma_partitions(const AttentionPlan& plan, cudaStream_t stream) {
  const int32_t D = plan.args.pools.geometry.head_dim;
  const size_t smem = static_cast<size_t>(kRows) * kPartitionSize * sizeof(float) +
                      static_cast<size_t>(kRows) * ((D + 15) / 16 * 16) * sizeof(uint16_t);  // <= 48 KiB for D <= 1024
  const unsigned blocks = static_cast<unsigned>(static_cast<int64_t>(plan.parts) * plan.args.pools.geometry.kv_heads);
  attention_mma_kernel<<<blocks, 32, smem, stream>>>(plan.args, plan.part_info, plan.query_heads, plan.part_stats,
                                                     plan.part_acc);
  check_launch(plan.op, "attention_mma_kernel", stream);
}

}  // namespace kvsim::cuda
