// mla_attention on the GPU: one thread per (query row, query head) work item
// running core's attend_mla_query, the canonical order itself, with its
// scratch in device memory. Simple on purpose: the bytes are the CPU's by
// construction; speed is for a later kernel to earn against this one.
#include <algorithm>
#include <vector>

#include "backends/cuda/cuda_backend.hpp"
#include "backends/cuda/launch.cuh"

namespace kvsim {

namespace {

struct MlaAttentionItem {
  MlaAttentionArgs args;
  float* scratch = nullptr;
  int64_t scratch_floats = 0;  // per item
  __device__ void operator()(int64_t i) const {
    const int64_t row = i / args.heads;
    const int32_t head = static_cast<int32_t>(i - row * args.heads);
    attend_mla_query(args, row, head, scratch + i * scratch_floats);
  }
};

}  // namespace

void CudaBackend::run_mla_attention(const KvPools& pools, const MlaAttentionOp& op) {
  constexpr const char* kOp = "mla_attention";
  const MlaRows rows = make_mla_rows(op);
  MlaAttentionArgs args = make_mla_attention_args(pools, op);
  const int64_t items = args.rows * args.heads;
  if (items == 0) return;
  int64_t per_item = 0;
  for (int64_t p : rows.position) per_item = std::max(per_item, mla_scratch_floats(args.d_ckv, args.d_kpe, p));
  const std::vector<const void*> d = upload(kOp, {op.block_table, rows.seq, rows.position});
  args.block_table = static_cast<const int32_t*>(d[0]);
  args.row_seq = static_cast<const int32_t*>(d[1]);
  args.row_position = static_cast<const int64_t*>(d[2]);
  BackendBuffer scratch(*this, static_cast<size_t>(items * per_item) * sizeof(float));
  begin_kernels();
  cuda::launch_items(kOp, "attend_mla_query", stream_, items,
                     MlaAttentionItem{args, static_cast<float*>(scratch.get()), per_item});
  finish(kOp);
}

}  // namespace kvsim
