// Internals of backends/cuda/attention.cu shared with its tests and its
// benchmark: an attention op turned into device-resident work (the "plan"),
// so a benchmark can time the kernels alone and a test can force either
// kernel path on the same data.
#pragma once

#include <cuda_runtime.h>

#include <span>
#include <vector>

#include <kvsim/core/ops/attention.hpp>

namespace kvsim::cuda {

// general: any dtype, layout, head dim and GQA group; one warp per (query
// row, query head, partition), every element through element_offset().
// staged: rows of K/V streamed into a per-warp shared-memory ring with
// cp.async, one warp per (query row, KV head, partition); needs a
// contiguous head row (NHD/HND strides), 8/16/32-bit codes, D in
// {64, 128, 256} with a row of <= 256 bytes, group 1, 4 or 8 with
// (D/32)*group <= 32, 16-byte aligned rows.
// bulk: the staged path's shapes (rows up to 1024 bytes), one warp per
// (query row, KV head, partition), K/V tiles brought by cp.async.bulk into a
// per-warp ring (attention_bulk.cuh); fewest instructions per key.
// mma: the mma order's paths (args.order == mma): the ring kernel
// (attention_mma_ring.cu: bf16/fp16 caches with contiguous 16-byte aligned
// rows, D 64/128/256, group 1..8, pools up to 64 GiB) where it applies, else
// the general mma kernel (attention_mma.cu: any dtype the order is offered
// for, any layout, head dim and group); a plan in the mma order whose path is
// set to general takes the general mma kernel (tests, benchmarks).
enum class AttentionPath { general, staged, bulk, mma };

// Resources of the bulk kernel a plan launches (benchmark report).
struct KernelInfo {
  int registers = 0;
  int smem_per_cta = 0;
  int ctas_per_sm = 0;
  int warps_per_cta = 0;
  int tile_keys = 0;
  int slots = 0;
};

struct AttentionPlan {
  const char* op = "";
  AttentionArgs args;            // block_table: device copy
  const int32_t* row_seq = nullptr;        // [rows] sequence of query row
  const int32_t* row_position = nullptr;   // [rows] absolute position
  const int32_t* row_part_base = nullptr;  // [rows + 1] first partition of a row
  const int32_t* part_row = nullptr;       // [parts] row of a partition
  const int32_t* part_info = nullptr;      // [parts][4] {row, sequence, position, partition in row}, 16-byte aligned
  int32_t rows = 0;
  int32_t parts = 0;      // partitions over all rows
  int32_t max_parts = 0;  // of one row
  int32_t query_heads = 0;
  AttentionPath path = AttentionPath::general;
  // Keys per ring slot of the staged path when G >= 2: 16 or 32. Measured on
  // the H200 (decode, D 128, GQA 32:8, batch 64 x 8K): 32 is 11% faster for
  // bf16, 16 is 4% faster for fp8 e4m3; the plan starts with that choice.
  int32_t staged_tile_keys = 32;
  // Keys per ring slot of the bulk path when G >= 4: 16 or 32.
  int32_t bulk_tile_keys = 16;
  // Ring slots of the bulk path: 0 = the kernel's default (3); a benchmark
  // may ask for the instantiated alternatives (D 128, G 4: bf16 16-key tiles
  // 2; fp8 e4m3 16-key tiles 4, 32-key tiles 2), anything else runs the default.
  int32_t bulk_slots = 0;
  // Query heads per bulk work item: 0 = bulk::heads_per_item chooses at
  // launch; a test or benchmark may force the group itself or a divisor the
  // kernel instantiates (1, 4). The bytes do not depend on it.
  int32_t bulk_heads_per_item = 0;
  // Run the merge kernel after the partition kernel (a benchmark times the
  // partition kernel alone by turning it off).
  bool merge = true;
  float* part_stats = nullptr;  // [parts][Hq][2]: m_p, l_p
  float* part_acc = nullptr;    // [parts][Hq][D]
  void* meta = nullptr;         // one device allocation holding the int32 tables
};

// Default ring slot of the staged path (16 keys for 8-bit codes, else 32).
inline int32_t default_staged_tile_keys(CacheDtype t) { return bits_per_element(t) == 8 ? 16 : 32; }

// Default ring slot of the bulk path (G >= 4): 16 keys for every cache dtype.
// It takes no dtype because it gives every dtype the same answer; choosing per
// dtype needs an H200 measurement first (attention_bench has the 32-key rows,
// and the differential test runs both tile sizes).
inline constexpr int32_t default_bulk_tile_keys() { return 16; }

// Path the plan takes for this geometry and op (staged where it applies).
AttentionPath choose_path(const KvPools& pools, const TensorView& q);

// rows[i] = (sequence, absolute position) of query row i. Allocates and
// uploads on `stream`; the host spans are consumed on return.
AttentionPlan make_plan(const char* op, const KvPools& pools, int32_t layer, const TensorView& q,
                        const TensorView& out, std::span<const int32_t> block_table, int32_t max_blocks,
                        const AttentionScales& scales, const WindowMapping& window,
                        const std::vector<int32_t>& row_seq, const std::vector<int32_t>& row_position,
                        cudaStream_t stream);
void launch_plan(const AttentionPlan& plan, cudaStream_t stream);
// Staged kernels by cache width (attention_staged_{wide,byte}.cu); false when
// the plan's (dtype, D, group) has no staged instantiation.
bool launch_staged_wide(const AttentionPlan& plan, cudaStream_t stream);
bool launch_staged_byte(const AttentionPlan& plan, cudaStream_t stream);
// Bulk kernels by cache width (attention_bulk_{wide,byte}.cu); false when the
// plan's (dtype, D, group) has no instantiation. With `info`, only reports the
// kernel's resources (nothing is launched).
bool launch_bulk_wide(const AttentionPlan& plan, cudaStream_t stream, KernelInfo* info = nullptr);
bool launch_bulk_byte(const AttentionPlan& plan, cudaStream_t stream, KernelInfo* info = nullptr);
// The mma order's partition kernels: m_p, l_p, acc_p of every (row,
// partition, query head) into the plan's scratch. The general one
// (attention_mma.cu) takes every plan; the ring kernel (attention_mma_ring.cu)
// returns false where it does not apply; with `info` it only reports its
// resources.
void launch_mma_partitions(const AttentionPlan& plan, cudaStream_t stream);
bool mma_ring_applies(const AttentionPlan& plan);
bool launch_mma_ring(const AttentionPlan& plan, cudaStream_t stream, KernelInfo* info = nullptr);
// Sets the plan's arithmetic order (mma: the mma path).
inline void set_order(AttentionPlan& plan, AttentionOrder order) {
  plan.args.order = order;
  if (order == AttentionOrder::mma) plan.path = AttentionPath::mma;
}
// The staged path's conditions (rows <= 256 bytes) hold for this geometry.
bool staged_applies(const KvPools& pools, const TensorView& q);
void release_plan(AttentionPlan& plan, cudaStream_t stream);

// The tiled prefill kernel (attention_prefill.cu): one CTA per (block of
// consecutive query rows of one sequence, KV head), every K/V tile loaded once
// for the block's rows and query heads, two passes (the global max, then the
// partitions folded in order), no partition scratch. Applies without a window
// to bf16/fp16/fp32 caches with contiguous 16-byte aligned rows, D 128,
// GQA group 1, 2, 4 or 8; prefill_attention() takes it wherever it applies.
bool prefill_tiled_applies(const KvPools& pools, const TensorView& q, const WindowMapping& window);
void prefill_attention_tiled(const KvPools& pools, const PrefillAttentionOp& op, cudaStream_t stream,
                             cudaEvent_t kernels_start = nullptr);
// Resources of the tiled kernel for this geometry (false: it does not apply).
bool prefill_tiled_info(const KvPools& pools, const TensorView& q, KernelInfo& info);

// The mma order's tiled prefill kernel (attention_prefill_mma.cu): the same
// row blocks and two passes on the tensor cores, K/V tiles by cp.async read
// with ldmatrix, a partition max per (unit, partition) as its only scratch.
// Applies without a window to bf16/fp16 caches with contiguous 16-byte
// aligned rows, D 128, GQA group 1 .. 64; prefill_attention() takes it for an
// op in the mma order wherever it applies.
bool prefill_mma_applies(const KvPools& pools, const TensorView& q, const WindowMapping& window);
void prefill_attention_mma(const KvPools& pools, const PrefillAttentionOp& op, cudaStream_t stream,
                           cudaEvent_t kernels_start = nullptr);
bool prefill_mma_info(const KvPools& pools, const TensorView& q, KernelInfo& info);

}  // namespace kvsim::cuda
