// CUDA qkv_preprocess_write (contract §5.3): core's qkv_preprocess_token_head
// (bias, RoPE from the shared table, quantize, GQA, window mapping, V-tail
// zeroing): one thread per chunk of a fused head -- qkv_preprocess_word (8 or
// 16 dims by 16-byte words) where qkv_word_path allows, else
// qkv_preprocess_chunk (4 dims, 16 for nvfp4) -- then the V tails
// (qkv_zero_v_tail_head) -- the same core functions the CPU
// oracle's (row, kv head) items run.
#include <vector>

#include "backends/cuda/cuda_backend.hpp"
#include "backends/cuda/launch.cuh"

namespace kvsim {

namespace {

// Row = fused-qkv row, i = (fused head, chunk), chunk fastest: a warp reads
// and writes consecutive dims of the same heads.
// kChunk: the chunk's size, a constant so its values stay in registers.
// What every qkv row item holds: chunks = chunks per fused head.
struct QkvRowItem {
  KvPools pools;
  QkvPreprocessArgs args;
  const int32_t* row_sequence;
  const int32_t* row_token;
  int32_t chunks;
};

template <int kChunk>
struct QkvPreprocessItem : QkvRowItem {
  __device__ void operator()(int64_t row, int32_t i) const {
    __builtin_assume((pools.geometry.dtype == CacheDtype::nvfp4) == (kChunk == 16));  // the host chose by dtype
    qkv_preprocess_chunk<kChunk>(pools, args, row_sequence[row], row_token[row], row, i / chunks, i % chunks);
  }
};

// The word path (qkv_preprocess_word): i = (fused head, chunk of
// qkv_word_elements(TCache) dims), input and cache dtypes fixed.
template <CacheDtype TIn, CacheDtype TCache>
struct QkvPreprocessWordItem : QkvRowItem {
  __device__ void operator()(int64_t row, int32_t i) const {
    qkv_preprocess_word<TIn, TCache>(pools, args, row_sequence[row], row_token[row], row, i / chunks,
                                     (i % chunks) * qkv_word_elements(TCache));
  }
};

template <CacheDtype TIn, CacheDtype TCache>
void launch_qkv_words(cudaStream_t stream, const KvPools& pools, const QkvPreprocessArgs& args, int64_t rows,
                      int32_t fused_heads, const int32_t* row_seq, const int32_t* row_tok) {
  const int32_t chunks = args.head_dim / qkv_word_elements(TCache);
  // 8-dim chunks capped at 64 registers (4 CTAs of 256 threads per SM, no
  // spill); 16-dim chunks take ~100 (a cap of 85 put 80 bytes on the stack).
  constexpr int kMinBlocks = qkv_word_elements(TCache) == 8 ? 4 : 1;
  cuda::launch_row_items<kMinBlocks>("qkv_preprocess_write", "qkv_preprocess_word", stream, rows, fused_heads * chunks,
                                     QkvPreprocessWordItem<TIn, TCache>{{pools, args, row_seq, row_tok, chunks}});
}

// The word path for input dtype TIn: the cache is TIn itself or a
// quantized dtype (validation allows no other).
template <CacheDtype TIn>
bool launch_qkv_words_from(cudaStream_t stream, const KvPools& pools, const QkvPreprocessArgs& args, int64_t rows,
                           int32_t fused_heads, const int32_t* row_seq, const int32_t* row_tok) {
  switch (pools.geometry.dtype) {
    case TIn: launch_qkv_words<TIn, TIn>(stream, pools, args, rows, fused_heads, row_seq, row_tok); return true;
    case CacheDtype::fp8_e4m3:
      launch_qkv_words<TIn, CacheDtype::fp8_e4m3>(stream, pools, args, rows, fused_heads, row_seq, row_tok);
      return true;
    case CacheDtype::fp8_e5m2:
      launch_qkv_words<TIn, CacheDtype::fp8_e5m2>(stream, pools, args, rows, fused_heads, row_seq, row_tok);
      return true;
    case CacheDtype::int8:
      launch_qkv_words<TIn, CacheDtype::int8>(stream, pools, args, rows, fused_heads, row_seq, row_tok);
      return true;
    case CacheDtype::nvfp4:
      launch_qkv_words<TIn, CacheDtype::nvfp4>(stream, pools, args, rows, fused_heads, row_seq, row_tok);
      return true;
    default: return false;
  }
}

// (sequence, kv head) of a context step's V-tail zeroing.
struct QkvZeroTailItem {
  KvPools pools;
  QkvPreprocessArgs args;
  int32_t kv_heads;
  __device__ void operator()(int64_t i) const {
    qkv_zero_v_tail_head(pools, args, static_cast<int32_t>(i / kv_heads), static_cast<int32_t>(i % kv_heads));
  }
};

}  // namespace

void CudaBackend::run_qkv_preprocess_write(const KvPools& pools, const QkvPreprocessOp& op) {
  constexpr const char* kOp = "qkv_preprocess_write";
  QkvPreprocessArgs args = make_qkv_preprocess_args(pools, op);
  // (sequence, token in chunk) of every fused-qkv row: rows are packed per sequence.
  std::vector<int32_t> row_sequence, row_token;
  for (size_t b = 0; b < op.seq_lens.size(); ++b)
    for (int32_t t = 0; t < op.seq_lens[b]; ++t) {
      row_sequence.push_back(static_cast<int32_t>(b));
      row_token.push_back(t);
    }
  if (row_sequence.empty()) return;
  const std::vector<const void*> d =
      upload(kOp, {op.seq_lens, op.cache_lens, op.position_offsets, op.block_table, row_sequence, row_token});
  args.seq_lens = static_cast<const int32_t*>(d[0]);
  args.cache_lens = static_cast<const int32_t*>(d[1]);
  args.position_offsets = op.position_offsets.empty() ? nullptr : static_cast<const int32_t*>(d[2]);
  args.table.table = static_cast<const int32_t*>(d[3]);
  const int32_t kv_heads = pools.geometry.kv_heads;
  const int32_t fused_heads = op.num_q_heads + 2 * kv_heads, chunks = qkv_chunks_per_head(pools.geometry.head_dim, pools.geometry.dtype);
  begin_kernels();
  const int64_t rows = static_cast<int64_t>(row_sequence.size());
  const auto* row_seq = static_cast<const int32_t*>(d[4]);
  const auto* row_tok = static_cast<const int32_t*>(d[5]);
  static_assert(qkv_chunk_elements(CacheDtype::bf16) == 4 && qkv_chunk_elements(CacheDtype::nvfp4) == 16);
  bool words = false;
  if (qkv_word_path(args, pools.geometry.dtype) != 0)
    words = args.qkv.dtype == CacheDtype::bf16
                ? launch_qkv_words_from<CacheDtype::bf16>(stream_, pools, args, rows, fused_heads, row_seq, row_tok)
                : launch_qkv_words_from<CacheDtype::fp16>(stream_, pools, args, rows, fused_heads, row_seq, row_tok);
  if (!words && pools.geometry.dtype == CacheDtype::nvfp4)
    cuda::launch_row_items(kOp, "qkv_preprocess_chunk<16>", stream_, rows, fused_heads * chunks,
                           QkvPreprocessItem<16>{{pools, args, row_seq, row_tok, chunks}});
  else if (!words)
    cuda::launch_row_items(kOp, "qkv_preprocess_chunk<4>", stream_, rows, fused_heads * chunks,
                           QkvPreprocessItem<4>{{pools, args, row_seq, row_tok, chunks}});
  if (args.zero_v_tail)  // disjoint from every chunk's bytes (rows no token of the step occupies)
    cuda::launch_items(kOp, "qkv_zero_v_tail_head", stream_, static_cast<int64_t>(op.seq_lens.size()) * kv_heads,
                       QkvZeroTailItem{pools, args, kv_heads});
  finish(kOp);
}

}  // namespace kvsim
