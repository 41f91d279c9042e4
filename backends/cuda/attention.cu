// decode_attention / prefill_attention kernels, byte-identical to the CPU
// oracle's attend_query() (core/include/kvsim/core/ops/attention.hpp).
//
// Paths: bulk (attention_bulk.cuh; the default wherever its shape conditions
// hold: 8/16/32-bit codes, contiguous 16-byte aligned rows of up to 1024
// bytes, D = 64/128/256, group 1/4/8 with D/32 * group <= 32, pools up to
// 64 GiB), staged (the previous fast kernel, attention_staged.cuh: rows up to
// 256 bytes; what pools over 64 GiB take, its header says why) and general
// (every other shape: nvfp4, split-x, D = 80, ...).
//
// Work: every query row's key list (make_key_list, core) is cut into
// partitions of canon::kPartitionSize keys. Kernel 1 computes, per
// (row, head, partition), the partition max m_p, sum l_p and the P.V
// accumulators acc_p[D] in the canonical order and writes them to a scratch
// buffer; kernel 2 merges partitions in partition order exactly as the
// oracle does. All arithmetic is core's (canon::*, codecs, element_offset);
// the kernels only choose which thread performs which canonical step:
//  * score butterfly: __shfl_xor_sync at offsets 16..1 adds the same pairs as
//    canon::butterfly_sum32; the staged and bulk paths use reduce-scatter forms
//    (reduce_scatter32, reduce_scatter_xor in attention_warp.cuh) that add exactly
//    those pairs too;
//  * partition max: each lane takes its 8-key run in order, runs are joined
//    left to right (ties keep the left value), which is the oracle's
//    sequential "first maximum" (this matters for +0 / -0);
//  * partition sum: lane l sums keys [8l, 8l+8) in order, then the butterfly;
//  * P.V: one fma chain per (query head, dim) over the partition in order.
#include "backends/cuda/attention_kernels.hpp"
#include "backends/cuda/attention_plan.cuh"
#include "backends/cuda/attention_warp.cuh"
#include "backends/cuda/cuda_check.hpp"

#include <algorithm>
#include <string>

namespace kvsim::cuda {
namespace {

using canon::kPartitionSize;
using canon::kWarp;
constexpr int kGeneralWarps = 4;  // warps (work items) per CTA of the general kernel
constexpr int kMergeThreads = 128;
constexpr int kMergeDimsPerThread = canon::kMaxHeadDim / kMergeThreads;
constexpr int kMergeChunk = 1024;  // merge weights staged in shared memory per pass

// One key of a query row: its physical block and entry (whole-page read).
struct KeyPlace {
  int32_t block = 0;
  int32_t entry = 0;
};

__device__ __forceinline__ KeyPlace place_of(const AttentionArgs& a, int32_t seq, int64_t slot) {
  const PageDivider page = a.pools.geometry.page_divider();
  const BlockRef ref{a.block_table[static_cast<int64_t>(seq) * a.max_blocks_per_seq + page.div(slot)]};
  return KeyPlace{ref.block(), page.mod(slot)};
}

// Exact fp32 value of element d of a head row, as load_head_row reads it.
__device__ __forceinline__ float load_element(const AttentionArgs& a, KeyPlace k, int32_t kv, int32_t head,
                                              int32_t d) {
  const PoolGeometry& g = a.pools.geometry;
  const uint8_t* pool = a.pools.bytes(PoolKind::primary);
  const int64_t off = element_offset(a.pools.strides[0], k.block, a.layer, kv, head, k.entry, d);
  if (g.dtype == CacheDtype::nvfp4) {
    const uint8_t sf =
        a.pools.scale_bytes(PoolKind::primary)[scale_offset(a.pools.scale_strides[0], k.block, a.layer, kv, head, k.entry, d)];
    return codec::nvfp4_decode(load_nibble(pool, off), sf, kv == 0 ? a.scales.k_global_scale : a.scales.v_global_scale);
  }
  return load_cache_code_value(pool, g.dtype, off);
}

struct RowTables {
  const int32_t* seq;
  const int32_t* position;
  const int32_t* part_base;
  const int32_t* part_row;
};

// ---------------------------------------------------------------- general kernel
// One warp per (partition, query head); K and V elements read straight from
// the pool through element_offset(). Handles every dtype, layout, head dim.
__global__ void __launch_bounds__(kGeneralWarps * kWarp)
    attention_general_kernel(AttentionArgs a, RowTables rt, int32_t parts, int32_t hq, float* part_stats,
                             float* part_acc) {
  __shared__ float probs[kGeneralWarps][kPartitionSize];
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kGeneralWarps + warp;
  if (item >= static_cast<int64_t>(parts) * hq) return;  // whole warp: uniform
  const int32_t rp = static_cast<int32_t>(item / hq);
  const int32_t qh = static_cast<int32_t>(item % hq);
  const int32_t row = rt.part_row[rp];
  const int32_t part = rp - rt.part_base[row];
  const int32_t seq = rt.seq[row];
  const int32_t kv_head = qh / a.group;
  const int32_t D = a.pools.geometry.head_dim;
  const KeyList keys = make_key_list(rt.position[row], a.window, a.pools.geometry.page_divider());
  const int64_t first = static_cast<int64_t>(part) * kPartitionSize;
  const int32_t count = static_cast<int32_t>(keys.size() - first < kPartitionSize ? keys.size() - first : kPartitionSize);
  const int32_t c = (D + kWarp - 1) / kWarp;
  const float score_scale = a.scales.sm_scale * a.scales.k_scale;
  float* s = probs[warp];

  // Scores: lane l's canonical run of dims, then the butterfly.
  for (int32_t j = 0; j < count; ++j) {
    bool masked = false;
    const int64_t slot = keys.slot(first + j, a.window, masked);
    float partial = 0.0f;
    if (!masked) {
      const KeyPlace k = place_of(a, seq, slot);
      for (int32_t i = 0; i < c; ++i) {
        const int32_t d = lane * c + i;
        if (d < D)
          partial = canon::fma_f32(load_float(a.q.data, a.q.dtype, a.q.offset(row, qh, d)),
                                   load_element(a, k, 0, kv_head, d), partial);
      }
    }
    const float dot = warp_butterfly_sum(partial);
    if (lane == 0) s[j] = masked ? canon::neg_inf() : dot * score_scale;
  }
  __syncwarp();
  float m, l;
  warp_partition_softmax(s, count, lane, m, l);
  __syncwarp();

  // P.V: every key of the partition, masked ones included (p = 0).
  float* acc_out = part_acc + (static_cast<int64_t>(rp) * hq + qh) * D;
  for (int32_t d0 = 0; d0 < D; d0 += kWarp) {
    const int32_t d = d0 + lane;
    if (d >= D) break;
    float acc = 0.0f;
    for (int32_t j = 0; j < count; ++j) {
      bool masked = false;
      const int64_t slot = keys.slot(first + j, a.window, masked);
      acc = canon::fma_f32(s[j], load_element(a, place_of(a, seq, slot), 1, kv_head, d), acc);
    }
    acc_out[d] = acc;
  }
  if (lane == 0) {
    part_stats[(static_cast<int64_t>(rp) * hq + qh) * 2 + 0] = m;
    part_stats[(static_cast<int64_t>(rp) * hq + qh) * 2 + 1] = l;
  }
}

// ---------------------------------------------------------------- merge kernel
// One CTA per (query row, query head): the oracle's merge in partition order.
__global__ void __launch_bounds__(kMergeThreads)
    attention_merge_kernel(AttentionArgs a, RowTables rt, int32_t hq, const float* part_stats, const float* part_acc) {
  // Every thread loads a share of the partitions' (m_p, l_p) into shared
  // memory; thread 0 takes the global max in partition order (the oracle's
  // first maximum); weights are computed in parallel; then each thread runs
  // the fma chains of its dims over the partitions in order, loads batched.
  __shared__ float weights[kMergeChunk];
  __shared__ float sums[kMergeChunk];
  __shared__ float maxima[kMergeChunk];
  __shared__ float global_max_s;
  const int32_t row = blockIdx.x / hq;
  const int32_t qh = blockIdx.x % hq;
  const int32_t D = a.pools.geometry.head_dim;
  const int32_t dims = (D + kMergeThreads - 1) / kMergeThreads;  // per thread
  const int32_t base = rt.part_base[row];
  const int32_t parts = rt.part_base[row + 1] - base;
  auto stat = [&](int32_t p, int which) { return part_stats[(static_cast<int64_t>(base + p) * hq + qh) * 2 + which]; };
  // One chunk (parts <= kMergeChunk, every decode of up to 256K keys): the
  // stats are loaded once and kept.
  const bool one_chunk = parts <= kMergeChunk;
  float global_max = canon::neg_inf();  // thread 0's
  for (int32_t c0 = 0; c0 < parts; c0 += kMergeChunk) {
    const int32_t n = parts - c0 < kMergeChunk ? parts - c0 : kMergeChunk;
    __syncthreads();
    for (int32_t p = threadIdx.x; p < n; p += kMergeThreads) {
      maxima[p] = stat(c0 + p, 0);
      if (one_chunk) sums[p] = stat(c0 + p, 1);
    }
    __syncthreads();
    if (threadIdx.x == 0)
      for (int32_t p = 0; p < n; ++p) global_max = maxima[p] > global_max ? maxima[p] : global_max;
  }
  if (threadIdx.x == 0) global_max_s = global_max;
  __syncthreads();
  global_max = global_max_s;
  float L = 0.0f;  // every thread computes the same chain
  float merged[kMergeDimsPerThread];
#pragma unroll
  for (int i = 0; i < kMergeDimsPerThread; ++i) merged[i] = 0.0f;
  for (int32_t c0 = 0; c0 < parts; c0 += kMergeChunk) {
    const int32_t n = parts - c0 < kMergeChunk ? parts - c0 : kMergeChunk;
    __syncthreads();
    for (int32_t p = threadIdx.x; p < n; p += kMergeThreads) {
      if (one_chunk) {
        weights[p] = canon::merge_weight(maxima[p], global_max);
      } else {
        weights[p] = canon::merge_weight(stat(c0 + p, 0), global_max);
        sums[p] = stat(c0 + p, 1);
      }
    }
    __syncthreads();
    const float* acc = part_acc + (static_cast<int64_t>(base + c0) * hq + qh) * D + threadIdx.x;
    const int64_t part_stride = static_cast<int64_t>(hq) * D;
    if (dims == 1 && static_cast<int32_t>(threadIdx.x) < D) {
      // One dim per thread (D <= 128): sixteen partitions' loads in flight.
      int32_t p = 0;
      for (; p + 16 <= n; p += 16) {
        float x[16];
#pragma unroll
        for (int k = 0; k < 16; ++k) x[k] = acc[(p + k) * part_stride];
#pragma unroll
        for (int k = 0; k < 16; ++k) {
          L = canon::fma_f32(sums[p + k], weights[p + k], L);
          merged[0] = canon::fma_f32(x[k], weights[p + k], merged[0]);
        }
      }
      for (; p < n; ++p) {
        L = canon::fma_f32(sums[p], weights[p], L);
        merged[0] = canon::fma_f32(acc[p * part_stride], weights[p], merged[0]);
      }
    } else {
      for (int32_t p = 0; p < n; ++p) {
        const float w = weights[p];
        L = canon::fma_f32(sums[p], w, L);
#pragma unroll
        for (int i = 0; i < kMergeDimsPerThread; ++i) {
          const int32_t d = threadIdx.x + i * kMergeThreads;
          if (i < dims && d < D) merged[i] = canon::fma_f32(acc[p * part_stride + i * kMergeThreads], w, merged[i]);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kMergeDimsPerThread; ++i) {
    const int32_t d = threadIdx.x + i * kMergeThreads;
    if (i < dims && d < D) store_float(a.out.data, a.out.dtype, a.out.offset(row, qh, d), (merged[i] / L) * a.scales.v_scale);
  }
  // The LSE from the same M and L as the oracle's (core's store_lse; every thread holds the same chain).
  if (threadIdx.x == 0) store_lse(a, row, qh, global_max, L);
}

}  // namespace

namespace {
// Shape conditions shared by the staged and bulk paths, with the largest row
// (bytes) the path takes: rows must be contiguous and 16-byte aligned
// (element_offset(.., d) is the row start plus d, and every stride moves whole
// 16-byte units), 8/16/32-bit codes, D = 32 * C with C in {2, 4, 8}, group 1, 4
// or 8 with C * group <= 32.
bool rows_apply(const KvPools& pools, const TensorView& q, int64_t max_row_bytes) {
  const PoolGeometry& g = pools.geometry;
  const int bits = bits_per_element(g.dtype);
  if (g.dtype == CacheDtype::nvfp4 || g.kv_factor != 2) return false;
  const int64_t elem = bits / 8;
  const int D = g.head_dim;
  const int C = D / kWarp;
  const int64_t group = q.shape[1] / g.kv_heads;
  if (D % kWarp != 0 || (C != 2 && C != 4 && C != 8) || D * elem > max_row_bytes) return false;
  if ((group != 1 && group != 4 && group != 8) || C * group > 32) return false;
  const PoolStrides& st = pools.strides[0];
  if (reinterpret_cast<uintptr_t>(pools.data[0]) % 16 != 0) return false;
  for (const int64_t s : {st.block, st.layer, st.kv})
    if (s * elem % 16 != 0) return false;
  for (int kv = 0; kv < 2; ++kv) {
    const InnerStrides& in = st.inner[kv];
    if (in.x != D || in.dim_inner != 1 || in.head * elem % 16 != 0 || in.token * elem % 16 != 0) return false;
  }
  return true;
}
}  // namespace

bool staged_applies(const KvPools& pools, const TensorView& q) { return rows_apply(pools, q, 256); }

AttentionPath choose_path(const KvPools& pools, const TensorView& q) {
  // The bulk kernel keeps row offsets in 16-byte units in 32 bits: pools up
  // to 64 GiB (larger ones take the staged or general path).
  const int64_t bytes = pools.data_allocation(PoolKind::primary) * (bits_per_element(pools.geometry.dtype) / 8);
  if (rows_apply(pools, q, 1024) && bytes / 16 <= static_cast<int64_t>(UINT32_MAX)) return AttentionPath::bulk;
  if (staged_applies(pools, q)) return AttentionPath::staged;
  return AttentionPath::general;
}

AttentionPlan make_plan(const char* op, const KvPools& pools, int32_t layer, const TensorView& q,
                        const TensorView& out, std::span<const int32_t> block_table, int32_t max_blocks,
                        const AttentionScales& scales, const WindowMapping& window,
                        const std::vector<int32_t>& row_seq, const std::vector<int32_t>& row_position,
                        cudaStream_t stream) {
  AttentionPlan plan;
  plan.op = op;
  plan.args.pools = pools;
  plan.args.layer = layer;
  plan.args.q = q;
  plan.args.out = out;
  plan.args.max_blocks_per_seq = max_blocks;
  plan.args.scales = scales;
  plan.args.window = window;
  plan.args.group = static_cast<int32_t>(q.shape[1] / pools.geometry.kv_heads);
  plan.query_heads = static_cast<int32_t>(q.shape[1]);
  plan.rows = static_cast<int32_t>(row_seq.size());
  plan.path = choose_path(pools, q);
  plan.staged_tile_keys = default_staged_tile_keys(pools.geometry.dtype);
  plan.bulk_tile_keys = default_bulk_tile_keys();

  // Host tables: [part_info | block_table | row_seq | row_position | row_part_base | part_row].
  const PageDivider page = pools.geometry.page_divider();
  std::vector<int32_t> part_base(row_seq.size() + 1, 0);
  for (size_t r = 0; r < row_seq.size(); ++r) {
    const int64_t n = make_key_list(row_position[r], window, page).size();
    const int64_t parts = (n + kPartitionSize - 1) / kPartitionSize;
    plan.max_parts = std::max<int32_t>(plan.max_parts, static_cast<int32_t>(parts));
    part_base[r + 1] = part_base[r] + static_cast<int32_t>(parts);
  }
  plan.parts = part_base.back();
  std::vector<int32_t> host;
  host.reserve(4 * plan.parts + block_table.size() + 3 * row_seq.size() + 1 + plan.parts);
  for (size_t r = 0; r < row_seq.size(); ++r)
    for (int32_t p = part_base[r]; p < part_base[r + 1]; ++p)
      host.insert(host.end(), {static_cast<int32_t>(r), row_seq[r], row_position[r], p - part_base[r]});
  host.insert(host.end(), block_table.begin(), block_table.end());
  host.insert(host.end(), row_seq.begin(), row_seq.end());
  host.insert(host.end(), row_position.begin(), row_position.end());
  host.insert(host.end(), part_base.begin(), part_base.end());
  for (size_t r = 0; r < row_seq.size(); ++r)
    for (int32_t p = part_base[r]; p < part_base[r + 1]; ++p) host.push_back(static_cast<int32_t>(r));

  const size_t meta_bytes = host.size() * sizeof(int32_t);
  const int64_t D = pools.geometry.head_dim;
  const size_t stats_bytes = static_cast<size_t>(plan.parts) * plan.query_heads * 2 * sizeof(float);
  const size_t acc_bytes = static_cast<size_t>(plan.parts) * plan.query_heads * D * sizeof(float);
  const size_t meta_padded = (meta_bytes + 255) / 256 * 256;
  const size_t stats_padded = (stats_bytes + 255) / 256 * 256;
  KVSIM_CUDA_CHECK(op, cudaMallocAsync(&plan.meta, meta_padded + stats_padded + acc_bytes + 256, stream));
  // Pageable source: cudaMemcpyAsync returns once the bytes are staged, so
  // `host` may die when this function returns.
  KVSIM_CUDA_CHECK(op, cudaMemcpyAsync(plan.meta, host.data(), meta_bytes, cudaMemcpyHostToDevice, stream));
  const int32_t* dev = static_cast<const int32_t*>(plan.meta);  // cudaMallocAsync: 256-byte aligned
  plan.part_info = dev;
  dev += 4 * static_cast<size_t>(plan.parts);
  plan.args.block_table = dev;
  dev += block_table.size();
  plan.row_seq = dev;
  dev += row_seq.size();
  plan.row_position = dev;
  dev += row_seq.size();
  plan.row_part_base = dev;
  dev += row_seq.size() + 1;
  plan.part_row = dev;
  plan.part_stats = reinterpret_cast<float*>(static_cast<char*>(plan.meta) + meta_padded);
  plan.part_acc = reinterpret_cast<float*>(static_cast<char*>(plan.meta) + meta_padded + stats_padded);
  return plan;
}

void launch_plan(const AttentionPlan& plan, cudaStream_t stream) {
  if (plan.rows == 0 || plan.parts == 0) return;
  const RowTables rt{plan.row_seq, plan.row_position, plan.row_part_base, plan.part_row};
  bool done = false;
  if (plan.args.order == AttentionOrder::mma) {  // the ring kernel where it applies, unless the general one is asked
    if (plan.path == AttentionPath::general || !launch_mma_ring(plan, stream)) launch_mma_partitions(plan, stream);
    done = true;
  }
  if (!done && plan.path == AttentionPath::bulk) done = launch_bulk_wide(plan, stream) || launch_bulk_byte(plan, stream);
  if (!done && plan.path == AttentionPath::staged)
    done = staged_applies(plan.args.pools, plan.args.q) &&
           (launch_staged_wide(plan, stream) || launch_staged_byte(plan, stream));
  if (!done) {
    const int64_t items = static_cast<int64_t>(plan.parts) * plan.query_heads;
    const unsigned blocks = static_cast<unsigned>((items + kGeneralWarps - 1) / kGeneralWarps);
    attention_general_kernel<<<blocks, kGeneralWarps * kWarp, 0, stream>>>(plan.args, rt, plan.parts, plan.query_heads,
                                                                            plan.part_stats, plan.part_acc);
    check_launch(plan.op, "attention_general_kernel", stream);
  }
  if (!plan.merge) return;
  attention_merge_kernel<<<static_cast<unsigned>(plan.rows) * plan.query_heads, kMergeThreads, 0, stream>>>(
      plan.args, rt, plan.query_heads, plan.part_stats, plan.part_acc);
  check_launch(plan.op, "attention_merge_kernel", stream);
}

void release_plan(AttentionPlan& plan, cudaStream_t stream) {
  if (plan.meta) KVSIM_CUDA_CHECK(plan.op, cudaFreeAsync(plan.meta, stream));
  plan.meta = nullptr;
}

namespace {
// Every query row of a decode or prefill op (core's make_attention_rows: the
// same rows, in the same order, as the reference) through one plan.
template <class Op>
void attend_rows(const char* name, const KvPools& pools, const Op& op, cudaStream_t stream, cudaEvent_t kernels_start) {
  const AttentionRows rows = make_attention_rows(op);
  const std::vector<int32_t> position(rows.position.begin(), rows.position.end());  // < seq_lens: int32
  AttentionPlan plan = make_plan(name, pools, op.layer, op.q, op.out, op.block_table, op.max_blocks_per_seq, op.scales,
                                 op.window, rows.seq, position, stream);
  plan.args.lse = op.lse;  // written by the merge kernel
  set_order(plan, op.order);
  if (kernels_start) KVSIM_CUDA_CHECK("attention timing", cudaEventRecord(kernels_start, stream));  // after the upload
  launch_plan(plan, stream);
  release_plan(plan, stream);
}
}  // namespace

void decode_attention(const KvPools& pools, const DecodeAttentionOp& op, cudaStream_t stream,
                      cudaEvent_t kernels_start) {
  attend_rows("decode_attention", pools, op, stream, kernels_start);
}

void prefill_attention(const KvPools& pools, const PrefillAttentionOp& op, cudaStream_t stream,
                       cudaEvent_t kernels_start) {
  if (op.order == AttentionOrder::fp32 && prefill_tiled_applies(pools, op.q, op.window))
    return prefill_attention_tiled(pools, op, stream, kernels_start);
  if (op.order == AttentionOrder::mma && prefill_mma_applies(pools, op.q, op.window))
    return prefill_attention_mma(pools, op, stream, kernels_start);
  attend_rows("prefill_attention", pools, op, stream, kernels_start);
}

}  // namespace kvsim::cuda
