// CUDA write ops (contract §5.1, §5.2, §5.4; append_mla and indexer_k_scatter
// are items-form ops, item_ops.cu): core's work items
// (core/ops/write_ops.hpp), one thread each, after the op's host index arrays
// are uploaded and swapped into the *Args struct make_*_args() built.
// append_paged and reshape_and_cache run the 16-byte chunk items (the CPU
// oracle runs whole rows through the same write_pool_row); a quantizing one
// (nvfp4 append, fp8 reshape) with unit-stride inputs runs the quantized
// word items.
#include "backends/cuda/cuda_backend.hpp"
#include "backends/cuda/launch.cuh"

namespace kvsim {

namespace {

// Row = (token, kv), i = (head, chunk), chunk fastest: a warp's lanes take
// consecutive 16-byte chunks of the same rows, so loads and stores coalesce.
// kCopy: the op only copies bytes (the host checked the encodings), told to
// the compiler so the kernel carries no quantizing path: fewer registers,
// more threads per SM, more 16-byte loads in flight.
// An item is n chunks of one (token, kv, head) row, `groups` = chunks / n
// apart: item j of a head takes chunks j, j + groups, ...; consecutive
// threads take consecutive chunks, so every access of a warp is coalesced.
template <bool kCopy>
struct AppendPagedItem {
  KvPools pools;
  AppendPagedArgs args;
  int32_t groups, n;
  __device__ void operator()(int64_t row, int32_t i) const {
    if (kCopy) __builtin_assume(args.encoding == RowEncoding::copy_bytes);
    append_paged_chunks(pools, args, row >> 1, i / groups, static_cast<int32_t>(row & 1), i % groups, n, groups);
  }
};

template <bool kCopy>
struct ReshapeAndCacheItem {
  KvPools pools;
  ReshapeAndCacheArgs args;
  int32_t groups, n;
  __device__ void operator()(int64_t row, int32_t i) const {
    if (kCopy) {
      __builtin_assume(args.key_encoding == RowEncoding::copy_bytes);
      __builtin_assume(args.value_encoding == RowEncoding::copy_bytes);
    }
    reshape_and_cache_chunks(pools, args, row >> 1, i / groups, static_cast<int32_t>(row & 1), i % groups, n, groups);
  }
};

// A quantizing write (nvfp4 append, fp8 reshape) of TIn inputs: the input
// words of n chunks loaded before the item's page or slot lookup
// (write_quantized_chunks).
template <CacheDtype TIn>
struct AppendPagedQuantizedItem {
  KvPools pools;
  AppendPagedArgs args;
  int32_t groups, n;
  __device__ void operator()(int64_t row, int32_t i) const {
    append_paged_chunks_quantized<TIn>(pools, args, row >> 1, i / groups, static_cast<int32_t>(row & 1), i % groups,
                                       n, groups);
  }
};

template <CacheDtype TIn>
struct ReshapeAndCacheQuantizedItem {
  KvPools pools;
  ReshapeAndCacheArgs args;
  int32_t groups, n;
  __device__ void operator()(int64_t row, int32_t i) const {
    reshape_and_cache_chunks_quantized<TIn>(pools, args, row >> 1, i / groups, static_cast<int32_t>(row & 1),
                                            i % groups, n, groups);
  }
};

bool is_quantizing(RowEncoding e) { return e == RowEncoding::fp8_divide || e == RowEncoding::nvfp4; }

// The quantized item for K and V inputs of one float dtype with unit dim
// stride whose rows both quantize; false, launching nothing, otherwise.
template <template <CacheDtype> class Item, class Args>
bool launch_quantized_chunks(CudaBackend& b, const char* op, const KvPools& pools, const Args& args, int64_t tokens,
                             const TensorView& k, const TensorView& v, bool quantizing, const char* kernel) {
  if (!quantizing || k.dtype != v.dtype || k.stride[k.rank - 1] != 1 || v.stride[v.rank - 1] != 1) return false;
  const int32_t heads = pools.geometry.kv_heads, chunks = row_chunks(pools.geometry.head_dim, pools.geometry.dtype);
  const int32_t n = chunks % kQuantizedChunks == 0 ? kQuantizedChunks : 1;
  auto launch = [&]<CacheDtype T>() {
    b.begin_kernels();
    cuda::launch_row_items(op, kernel, b.stream(), tokens * 2, heads * (chunks / n), Item<T>{pools, args, chunks / n, n});
    b.finish(op);
    return true;
  };
  switch (k.dtype) {
    case CacheDtype::fp32: return launch.template operator()<CacheDtype::fp32>();
    case CacheDtype::fp16: return launch.template operator()<CacheDtype::fp16>();
    case CacheDtype::bf16: return launch.template operator()<CacheDtype::bf16>();
    default: return false;
  }
}

// The CSR table and append coordinates on the device.
void upload_append_table(CudaBackend& b, const char* op, const AppendCoordinates& at, AppendTargets& dev) {
  const std::vector<const void*> d =
      b.upload(op, {at.batch_indices, at.positions, at.indptr, at.indices, at.last_page_len});
  dev.batch_indices = static_cast<const int32_t*>(d[0]);
  dev.positions = static_cast<const int32_t*>(d[1]);
  dev.table.indptr = static_cast<const int32_t*>(d[2]);
  dev.table.indices = static_cast<const int32_t*>(d[3]);
  dev.table.last_page_len = static_cast<const int32_t*>(d[4]);
}

// Chunks per item of a copy: up to kCopyWords 16-byte chunks, all loaded
// before any is stored (copy_words16), when a K and a V row's dims are one
// run of pool bytes (NHD, HND; a split-x V row is not: its chunks go element
// by element either way) and the count divides the row's chunks; else 1.
int32_t copy_chunks_per_item(const KvPools& pools, int32_t chunks) {
  const PoolStrides& s = pools.strides_of(PoolKind::primary);
  const int32_t D = pools.geometry.head_dim;
  if (!dims_contiguous(s.inner[0], 0, D) || !dims_contiguous(s.inner[1], 0, D)) return 1;
  for (int32_t n = kCopyWords; n > 1; n /= 2)
    if (chunks % n == 0) return n;
  return 1;
}

// Rows (token, kv) of (head, chunks) items. An op that only moves bytes gets
// the copy-only instantiation: several chunks per item where the row allows,
// each item's loads in flight together (64 registers, 4 CTAs of 256 per SM:
// 64 KB in flight per SM).
template <template <bool> class Item, class Args>
void launch_kv_chunks(CudaBackend& b, const char* op, const KvPools& pools, const Args& args, int64_t tokens,
                      bool copy, const char* copy_kernel, const char* kernel) {
  const int32_t heads = pools.geometry.kv_heads, chunks = row_chunks(pools.geometry.head_dim, pools.geometry.dtype);
  b.begin_kernels();
  const int32_t n = copy ? copy_chunks_per_item(pools, chunks) : 1;
  const Item<true> copy_item{pools, args, chunks / n, n};
  if (copy)  // 64 registers: the one-chunk form spilled ~180 bytes a thread under the 32-register cap of 8 CTAs
    cuda::launch_row_items<4>(op, copy_kernel, b.stream(), tokens * 2, heads * (chunks / n), copy_item);
  else
    cuda::launch_row_items(op, kernel, b.stream(), tokens * 2, heads * chunks, Item<false>{pools, args, chunks, 1});
  b.finish(op);
}

}  // namespace

void CudaBackend::run_append_paged(const KvPools& pools, const AppendPagedOp& op) {
  constexpr const char* kOp = "append_paged";
  AppendPagedArgs args = make_append_paged_args(pools, op);
  if (args.nnz == 0) return;
  upload_append_table(*this, kOp, op, args);
  if (launch_quantized_chunks<AppendPagedQuantizedItem>(*this, kOp, pools, args, args.nnz, args.k, args.v,
                                                        is_quantizing(args.encoding), "append_paged_chunks_quantized"))
    return;
  launch_kv_chunks<AppendPagedItem>(*this, kOp, pools, args, args.nnz, args.encoding == RowEncoding::copy_bytes,
                                    "append_paged_chunks<copy>", "append_paged_chunks");
}

void CudaBackend::run_reshape_and_cache(const KvPools& pools, const ReshapeAndCacheOp& op) {
  constexpr const char* kOp = "reshape_and_cache";
  ReshapeAndCacheArgs args = make_reshape_and_cache_args(pools, op);
  if (args.num_tokens == 0) return;
  args.slot_mapping = static_cast<const int64_t*>(upload(kOp, {op.slot_mapping})[0]);
  if (launch_quantized_chunks<ReshapeAndCacheQuantizedItem>(
          *this, kOp, pools, args, args.num_tokens, args.key, args.value,
          is_quantizing(args.key_encoding) && is_quantizing(args.value_encoding), "reshape_and_cache_chunks_quantized"))
    return;
  launch_kv_chunks<ReshapeAndCacheItem>(
      *this, kOp, pools, args, args.num_tokens,
      args.key_encoding == RowEncoding::copy_bytes && args.value_encoding == RowEncoding::copy_bytes,
      "reshape_and_cache_chunks<copy>", "reshape_and_cache_chunks");
}

}  // namespace kvsim
