// decode_attention and prefill_attention on the GPU, byte-identical to the
// CPU oracle's attend_query() (core's canonical order, ops/attention.hpp).
// CudaBackend calls these after Backend::op() has validated the op on the host.
#pragma once

#include <cuda_runtime.h>

#include <kvsim/core/ops/attention.hpp>

namespace kvsim::cuda {

// pools, op.q, op.out: device pointers; op's spans (seq_lens, block_table,
// q_indptr): HOST memory. Uploads what it needs, launches on `stream`, checks
// every call (BackendError naming the op), and has consumed the host spans
// when it returns (the kernels may still be running). kernels_start, when
// given, is recorded on `stream` after the uploads, before the first kernel
// (kvsim bench's kernel time).
void decode_attention(const KvPools& pools, const DecodeAttentionOp& op, cudaStream_t stream,
                      cudaEvent_t kernels_start = nullptr);
void prefill_attention(const KvPools& pools, const PrefillAttentionOp& op, cudaStream_t stream,
                       cudaEvent_t kernels_start = nullptr);

}  // namespace kvsim::cuda
