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

#include <type_traits>

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

// ---------------------------------------------------------------- split-x, through shared memory
// vLLM's split-x cache: key_cache [block][head][dim/x][token][x], value_cache
// [block][head][dim][token]. A row item (token, head, chunk) stores a K chunk
// 256 bytes from its neighbour lane's and a V row element by element (one
// 2-byte store per bf16 element, each in its own 32-byte sector), so a
// copy-only reshape_and_cache on split-x runs this kernel instead: a CTA takes
// kSplitTileTokens consecutive tokens of one head, loads their K and V rows
// into shared memory by 16-byte loads, and stores along tokens -- K chunk c of
// consecutive tokens (consecutive entries of a page: adjacent 16-byte runs),
// and per V dim the 16 / E tokens of a group whose slots are consecutive
// entries of one page as one 16-byte store. A chunk that is not one aligned
// run, and a group that is not (a negative slot, a run broken or crossing a
// page), stores element by element. Every address is pool_row_offset of
// reshape_target's row, so the bytes are write_pool_row's.
constexpr int kSplitTileTokens = 32;

template <int kE>
__global__ void __launch_bounds__(256) reshape_split_x_kernel(KvPools pools, ReshapeAndCacheArgs a) {
  using Elem = std::conditional_t<kE == 1, uint8_t, std::conditional_t<kE == 2, uint16_t, uint32_t>>;
  constexpr int kRun = 16 / kE;  // elements per 16-byte store: a K chunk's dims, a V group's tokens
  constexpr int kGroups = kSplitTileTokens / kRun;
  extern __shared__ uint32_t tiles[];  // [kv][token][pitch words]
  __shared__ int64_t token_block[kSplitTileTokens];
  __shared__ int32_t token_entry[kSplitTileTokens];  // -1: nothing to store (negative slot)
  __shared__ bool group_run[kGroups];
  const PoolStrides& s = pools.strides_of(PoolKind::primary);
  const int32_t D = pools.geometry.head_dim, P = pools.geometry.tokens_per_block, head = blockIdx.y;
  // One word of padding: rows kRun apart (a V group) and rows next to each
  // other (K) start in other banks; a 16-byte multiple would stack a V
  // group's rows in the same banks.
  const int32_t row_words = D * kE / 4, pitch = row_words + 1, row_chunks = row_words / 4;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kSplitTileTokens;
  const int32_t tokens =
      a.num_tokens - t0 < kSplitTileTokens ? static_cast<int32_t>(a.num_tokens - t0) : kSplitTileTokens;

  // A thread keeps one chunk c and steps over rows (row_chunks divides the
  // 256 threads: D * E a power of two) or, otherwise, divides per chunk.
  const bool fixed_chunk = 256 % row_chunks == 0;
  const int32_t rows_per_step = fixed_chunk ? 256 / row_chunks : 0;
#pragma unroll
  for (int32_t kv = 0; kv < 2; ++kv) {
    const TensorView& t = kv == 0 ? a.key : a.value;
    for (int32_t w = threadIdx.x; w < tokens * row_chunks; w += blockDim.x) {
      const int32_t j = fixed_chunk ? threadIdx.x / row_chunks + (w - threadIdx.x) / 256 * rows_per_step : w / row_chunks;
      const int32_t c = w - j * row_chunks;
      const InputRow in = input_row(t, t0 + j, head);
      const uint4 v = *reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(in.data) + in.at(c * kRun) * kE);
      uint32_t* row = tiles + (kv * kSplitTileTokens + j) * pitch + c * 4;
      row[0] = v.x, row[1] = v.y, row[2] = v.z, row[3] = v.w;
    }
  }
  if (threadIdx.x < kSplitTileTokens) {
    const int32_t j = threadIdx.x;
    const int64_t slot = j < tokens ? a.slot_mapping[t0 + j] : -1;
    int32_t entry = -1;
    if (slot >= 0) {
      const PoolRow r = reshape_target(pools, a, slot, head);
      token_block[j] = r.block;
      entry = r.entry;
    }
    token_entry[j] = entry;
  }
  __syncthreads();
  if (threadIdx.x < kGroups) {  // a V group is one run: one page, consecutive entries, unit token stride
    const int32_t j0 = threadIdx.x * kRun, e0 = token_entry[j0];
    bool run = e0 >= 0 && j0 + kRun <= tokens && entries_contiguous(s.inner[1], e0, kRun, P);
    for (int32_t i = 1; i < kRun && run; ++i)
      run = token_entry[j0 + i] == e0 + i && token_block[j0 + i] == token_block[j0];
    group_run[threadIdx.x] = run;
  }
  __syncthreads();

  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(tiles);
  auto elem = [&](int32_t kv, int32_t j, int32_t d) {
    return *reinterpret_cast<const Elem*>(bytes + (kv * kSplitTileTokens + j) * pitch * 4 + d * kE);
  };
  uint8_t* pool = pools.bytes(PoolKind::primary);
  // K: token fastest, so a warp's 16-byte stores of chunk c are adjacent entries.
  for (int32_t w = threadIdx.x; w < kSplitTileTokens * row_chunks; w += blockDim.x) {
    const int32_t j = w % kSplitTileTokens, c = w / kSplitTileTokens, d0 = c * kRun;
    if (j >= tokens || token_entry[j] < 0) continue;
    const PoolRow r{token_block[j], a.layer, 0, head, token_entry[j]};
    uint8_t* dst = pool + pool_row_offset(s, r, d0) * kE;
    if (dims_contiguous(s.inner[0], d0, kRun) && (reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
      const uint32_t* src = tiles + j * pitch + c * 4;
      *reinterpret_cast<uint4*>(dst) = make_uint4(src[0], src[1], src[2], src[3]);
      continue;
    }
    for (int32_t i = 0; i < kRun; ++i) *reinterpret_cast<Elem*>(pool + pool_row_offset(s, r, d0 + i) * kE) = elem(0, j, d0 + i);
  }
  // V: group fastest, so a warp's stores for one dim are the adjacent runs of
  // its groups. A thread takes the kPerWord dims of one shared-memory word:
  // each of its kRun word loads (one per token) feeds kPerWord stores.
  constexpr int kPerWord = 4 / kE;
  for (int32_t w = threadIdx.x; w < kGroups * (D / kPerWord); w += blockDim.x) {
    const int32_t gi = w % kGroups, d0 = w / kGroups * kPerWord, j0 = gi * kRun;
    if (group_run[gi]) {
      const PoolRow r{token_block[j0], a.layer, 1, head, token_entry[j0]};
      uint8_t* dst[kPerWord];
      bool aligned = true;
#pragma unroll
      for (int32_t k = 0; k < kPerWord; ++k) {
        dst[k] = pool + pool_row_offset(s, r, d0 + k) * kE;
        aligned = aligned && (reinterpret_cast<uintptr_t>(dst[k]) & 15) == 0;
      }
      if (aligned) {
        uint32_t word[kRun];
#pragma unroll
        for (int32_t i = 0; i < kRun; ++i) word[i] = tiles[(kSplitTileTokens + j0 + i) * pitch + d0 * kE / 4];
#pragma unroll
        for (int32_t k = 0; k < kPerWord; ++k) {
          Elem e[kRun];
#pragma unroll
          for (int32_t i = 0; i < kRun; ++i) e[i] = static_cast<Elem>(word[i] >> (8 * kE * k));  // dim d0 + k
          store_bytes_by_words<16>(dst[k], e);
        }
        continue;
      }
    }
    for (int32_t k = 0; k < kPerWord; ++k)
      for (int32_t i = 0; i < kRun && j0 + i < tokens; ++i) {
        if (token_entry[j0 + i] < 0) continue;
        const PoolRow r{token_block[j0 + i], a.layer, 1, head, token_entry[j0 + i]};
        *reinterpret_cast<Elem*>(pool + pool_row_offset(s, r, d0 + k) * kE) = elem(1, j0 + i, d0 + k);
      }
  }
}

bool rows_aligned16(const TensorView& t, int nbytes) {
  auto words = [&](int64_t elements) { return (elements * nbytes) % 16 == 0; };
  return (reinterpret_cast<uintptr_t>(t.data) & 15) == 0 && t.stride[t.rank - 1] == 1 && words(t.stride[0]) &&
         (t.rank != 3 || words(t.stride[1]));
}

// The split-x path of a copy-only reshape_and_cache: V's dims are not one
// run but its tokens are (unit token stride), 1-, 2- or 4-byte elements,
// whole 16-byte input rows (unit dim stride, aligned token and head strides)
// and tiles that fit the default shared memory. False, launching nothing,
// otherwise.
bool launch_split_x(CudaBackend& b, const char* op, const KvPools& pools, const ReshapeAndCacheArgs& a) {
  const PoolGeometry& g = pools.geometry;
  const PoolStrides& s = pools.strides_of(PoolKind::primary);
  const int e = bytes_per_element(g.dtype), D = g.head_dim;
  if (g.kv_factor != 2 || bits_per_element(g.dtype) % 8 != 0 || (e != 1 && e != 2 && e != 4)) return false;
  if (dims_contiguous(s.inner[1], 0, D) || !entries_contiguous(s.inner[1], 0, 16 / e, g.tokens_per_block) ||
      (D * e) % 16 != 0 || g.kv_heads > 65535)
    return false;
  const size_t smem = 2 * static_cast<size_t>(kSplitTileTokens) * (D * e / 4 + 1) * 4;
  if (smem > 48 * 1024 || !rows_aligned16(a.key, e) || !rows_aligned16(a.value, e)) return false;
  const dim3 grid(static_cast<unsigned>((a.num_tokens + kSplitTileTokens - 1) / kSplitTileTokens),
                  static_cast<unsigned>(g.kv_heads));
  b.begin_kernels();
  switch (e) {
    case 1: reshape_split_x_kernel<1><<<grid, 256, smem, b.stream()>>>(pools, a); break;
    case 2: reshape_split_x_kernel<2><<<grid, 256, smem, b.stream()>>>(pools, a); break;
    default: reshape_split_x_kernel<4><<<grid, 256, smem, b.stream()>>>(pools, a); break;
  }
  cuda::check_launch(op, "reshape_split_x", b.stream());
  b.finish(op);
  return true;
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
  const bool copy = args.key_encoding == RowEncoding::copy_bytes && args.value_encoding == RowEncoding::copy_bytes;
  if (copy && launch_split_x(*this, kOp, pools, args)) return;
  launch_kv_chunks<ReshapeAndCacheItem>(*this, kOp, pools, args, args.num_tokens, copy,
                                        "reshape_and_cache_chunks<copy>", "reshape_and_cache_chunks");
}

}  // namespace kvsim
