// Reads and block copies: gather_paged (TensorRT-LLM _gather_paged_kv),
// partial_copy (cuKVCacheBlockPartialCopy), copy_blocks (vLLM copy_blocks),
// offload / onboard (TensorRT-LLM primary <-> secondary block moves).
//
// Each op: a descriptor and KVSIM_HD work-item functions that both backends
// call unchanged; its host validate_*(), which throws a named ValidationError
// before any byte moves, is in kvsim/validation/ops/. Work items never share an output byte:
//   gather_paged:       one item per (token, head) writes D fp32 outputs;
//   block copies:       one item per (block pair, layer, kv, head, token) row
//                       writes that row's D elements (and, for nvfp4, its D/16
//                       scale bytes); nvfp4 rows are whole bytes because
//                       validation demands byte-aligned nibble strides.
// Every element offset comes from element_offset() / scale_offset() with the
// strides of the pool it addresses (primary and secondary strides differ for
// per_layer placement, so a move computes source and destination offsets
// separately); nothing here assumes a block is one contiguous range.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>

#include "../cache_io.hpp"
#include "../page_table.hpp"
#include "../tensor.hpp"

namespace kvsim {

// ================================================================ descriptors

// contract §5.6 — TensorRT-LLM vanilla _gather_paged_kv: the first num_tokens
// logical tokens of K (kv = 0) or V (kv = 1) of one sequence whose block
// table is block_ids, as an [n, H, D] fp32 tensor. Token t lives in
// block_ids[t / P] at entry t % P. Value of each element:
//   fp32 / fp16 / bf16: the stored value, exactly (scale is not applied);
//   fp8_e4m3 / fp8_e5m2 / int8: decoded code * scale (one fp32 multiply);
//   nvfp4: codec::nvfp4_decode(nibble, scale byte, global_scale) (contract §4;
//          scale is not applied).
// A BAD_PAGE (-1) entry reads as +0.0 for its whole page range (vanilla.py's
// new_zeros): the read side degrades where the write side asserts.
// Only the ceil(n / P) entries the read touches are validated and read;
// entries beyond them (dense-table padding) are ignored. num_tokens == 0 is a
// no-op (out may then be an empty TensorView). `out` may have any
// non-negative, non-overlapping strides (it need not be contiguous) but must
// not overlap the pool it reads. gather_view() below returns the zero-copy
// view of a one-block request where one exists.
struct GatherPagedOp {
  int32_t layer = 0;
  int32_t kv = 0;
  std::span<const int32_t> block_ids;  // one sequence's table (BlockRefs, -1 allowed)
  int64_t num_tokens = 0;
  TensorView out;             // [num_tokens, H, D] fp32
  float scale = 1.0f;         // fp8 / int8 only; must be finite
  float global_scale = 1.0f;  // nvfp4 only; must be finite and > 0
};

// contract §5.9 — cuKVCacheBlockPartialCopy: copy the first num_tokens entries of
// every (layer, kv, head) of src_block to the same entries of dst_block; the
// other entries of dst_block are untouched. num_tokens <= 0 copies the whole
// block (the kernel's sentinel); num_tokens > P is rejected. nvfp4 always
// copies whole blocks, data and block scales, whatever num_tokens says (contract
// §5.9): the packed nibbles and their scale bytes move as one unit, and no
// copy ever has to split a byte that packs two elements. src and dst are
// primary BlockRefs (raw values), distinct and live; entries of dst beyond the
// copied ones keep their bytes.
struct PartialCopyOp {
  int32_t src_block = 0;
  int32_t dst_block = 0;
  int32_t num_tokens = 0;
};

// vLLM copy_blocks: whole-block copies (data and nvfp4 scales) for pairs
// (src, dst) of primary BlockRefs. Decision: the pairs are independent, as in
// vLLM's kernel, which runs every pair at once: a block may be the source of
// several pairs (fork), but no block may be the destination of two pairs, and
// no destination may also be a source of any pair (src == dst included).
// Such a list would make the result depend on execution order, so it is
// rejected rather than given an order the GPU engines do not have.
struct CopyBlocksOp {
  std::span<const std::pair<int32_t, int32_t>> pairs;
};

// TensorRT-LLM offloading: offload copies primary[i] -> secondary[i],
// onboard copies secondary[i] -> primary[i]; whole blocks, data and nvfp4
// scale pools. Both lists hold plain block indices of their pool (not
// BlockRefs: no secondary bit), equal in length. A move is a one-to-one
// pairing: no block appears twice in either list (this rules out two writers
// of one destination in either direction, and validation does not need to
// know the direction).
struct MoveBlocksOp {
  std::span<const int32_t> primary;
  std::span<const int32_t> secondary;
};

// ================================================================ gather_paged work items

// Everything a gather work item needs, trivially copyable (a kernel takes it
// by value). block_ids points into the memory of the backend that runs the
// items: make_gather_paged_args fills it with the op's host table; a device
// backend replaces it with its uploaded copy.
struct GatherPagedArgs {
  KvPools pools;
  int32_t layer = 0;
  int32_t kv = 0;
  const int32_t* block_ids = nullptr;
  int64_t num_tokens = 0;
  TensorView out;
  float scale = 1.0f;
  float global_scale = 1.0f;
  PageDivider page;
};

inline GatherPagedArgs make_gather_paged_args(const KvPools& pools, const GatherPagedOp& op) {
  GatherPagedArgs a;
  a.pools = pools;
  a.layer = op.layer;
  a.kv = op.kv;
  a.block_ids = op.block_ids.data();
  a.num_tokens = op.num_tokens;
  a.out = op.out;
  a.scale = op.scale;
  a.global_scale = op.global_scale;
  a.page = pools.geometry.page_divider();
  return a;
}

// The gathered fp32 value of one stored element of a primary block (see
// GatherPagedOp for the per-dtype rule).
KVSIM_HD inline float gather_element_value(const GatherPagedArgs& a, int64_t block, int32_t head, int32_t entry,
                                           int32_t dim) {
  const CacheDtype t = a.pools.geometry.dtype;
  const PoolStrides& s = a.pools.strides_of(PoolKind::primary);
  const uint8_t* data = a.pools.bytes(PoolKind::primary);
  const int64_t e = element_offset(s, block, a.layer, a.kv, head, entry, dim);
  switch (t) {
    case CacheDtype::fp8_e4m3:
    case CacheDtype::fp8_e5m2:
    case CacheDtype::int8:  // arithmetic: a NaN code's result is canonical (tensor.hpp)
      return canonical_nan(load_cache_code_value(data, t, e) * a.scale);
    case CacheDtype::nvfp4: {
      const int64_t so = scale_offset(a.pools.scale_strides[static_cast<int>(PoolKind::primary)], block, a.layer, a.kv,
                                      head, entry, dim);
      return canonical_nan(
          codec::nvfp4_decode(load_nibble(data, e), a.pools.scale_bytes(PoolKind::primary)[so], a.global_scale));
    }
    default:
      return load_cache_code_value(data, t, e);  // fp32 / fp16 / bf16: exact
  }
}

// gather_element_value of `count` consecutive codes of a T pool from element
// e0 (T known at compile time: no per-element dtype switch or offset), into
// out[0], out[step], ...
template <CacheDtype T>
KVSIM_HD inline float gather_code_value(const uint8_t* codes, int64_t i, float scale) {
  const float v = load_cache_code_value(codes, T, i);
  if constexpr (has_tensor_scale(T))
    return canonical_nan(v * scale);
  else
    return v;
}

template <CacheDtype T>
KVSIM_HD inline void gather_run(const GatherPagedArgs& a, int64_t e0, int32_t count, float* out, int64_t step) {
  const uint8_t* data = a.pools.bytes(PoolKind::primary);
  for (int32_t i = 0; i < count; ++i) out[i * step] = gather_code_value<T>(data, e0 + i, a.scale);
}

#if defined(__CUDA_ARCH__)
// One whole 16-byte chunk of codes of a T pool from element e0 on the
// device: one vector load, gather_code_value per code with the dtype fixed,
// float4 stores where out's dims are unit-stride and aligned (else one store
// per value). false, touching nothing, when the chunk is not 16-byte aligned.
// (Measured on the H200: four chunks per thread, loads first, ran slower:
// gather bf16 60% -> 33% of copy.)
template <CacheDtype T>
__device__ inline bool gather_chunk_word(const GatherPagedArgs& a, int64_t e0, float* out, int64_t step) {
  constexpr int kCodes = 16 / bytes_per_element(T);
  const uint8_t* src = a.pools.bytes(PoolKind::primary) + e0 * bytes_per_element(T);
  if ((reinterpret_cast<uintptr_t>(src) & 15) != 0) return false;
  const uint4 word = *reinterpret_cast<const uint4*>(src);
  uint8_t codes[16];
  memcpy(codes, &word, 16);
  float v[kCodes];
#pragma unroll
  for (int i = 0; i < kCodes; ++i) v[i] = gather_code_value<T>(codes, i, a.scale);
  if (step == 1 && (reinterpret_cast<uintptr_t>(out) & 15) == 0) {
#pragma unroll
    for (int i = 0; i < kCodes; i += 4)
      *reinterpret_cast<float4*>(out + i) = make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]);
  } else {
#pragma unroll
    for (int i = 0; i < kCodes; ++i) out[i * step] = v[i];
  }
  return true;
}
#endif

// Writes out[t, h, dim0 .. dim0 + count).
KVSIM_HD inline void gather_paged_dims(const GatherPagedArgs& a, int64_t t, int32_t h, int32_t dim0, int32_t count) {
  const BlockRef ref{a.block_ids[a.page.div(t)]};
  const int32_t entry = a.page.mod(t);
  float* out = static_cast<float*>(a.out.data);
  for (int32_t d = dim0; d < dim0 + count; ++d)
    out[a.out.offset(t, h, d)] = ref.is_bad() ? 0.0f : gather_element_value(a, ref.block(), h, entry, d);
}

// The gathered value of each of the 256 codes of an fp8/int8 pool under the
// op's scale: table[c] = gather_element_value of an element holding c.
inline void gather_code_values(const GatherPagedArgs& a, float (&table)[256]) {
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    table[c] = canonical_nan(load_cache_code_value(&code, a.pools.geometry.dtype, 0) * a.scale);
  }
}

// gather_paged_token_head for a backend that runs whole rows (the CPU): a row
// the pool holds as one run of codes (NHD, HND, split-x K with x >= D) is
// decoded by gather_run with the dtype known at compile time; any other row
// (split-x V, nvfp4, a bad page) takes gather_paged_dims. The same values.
// code_values (optional, fp8/int8 pools): gather_code_values' table, so a
// run of 8-bit codes is one lookup per element.
KVSIM_HD inline void gather_paged_row(const GatherPagedArgs& a, int64_t t, int32_t h,
                                      const float* code_values = nullptr) {
  const BlockRef ref{a.block_ids[a.page.div(t)]};
  const CacheDtype dtype = a.pools.geometry.dtype;
  const int32_t D = a.pools.geometry.head_dim;
  const PoolStrides& s = a.pools.strides_of(PoolKind::primary);
  if (!ref.is_bad() && dims_contiguous(s.inner[a.kv], 0, D)) {
    const int64_t e0 = element_offset(s, ref.block(), a.layer, a.kv, h, a.page.mod(t), 0);
    float* o = static_cast<float*>(a.out.data) + a.out.offset(t, h, 0);
    const int64_t step = a.out.stride[2];
    if (code_values && bits_per_element(dtype) == 8) {
      const uint8_t* codes = a.pools.bytes(PoolKind::primary) + e0;
      for (int32_t i = 0; i < D; ++i) o[i * step] = code_values[codes[i]];
      return;
    }
    if (with_byte_element_dtype(dtype, [&]<CacheDtype T>() { gather_run<T>(a, e0, D, o, step); })) return;
    // nvfp4: per-element scales
  }
  gather_paged_dims(a, t, h, 0, D);
}

// Work item (token t in [0, num_tokens), head h in [0, H)): writes out[t, h, 0..D).
KVSIM_HD inline void gather_paged_token_head(const GatherPagedArgs& a, int64_t t, int32_t h) {
  gather_paged_dims(a, t, h, 0, a.pools.geometry.head_dim);
}

// Work item of a wide backend (token t, head h, chunk of row_chunk_elements
// dims). On the device a whole chunk of one run of codes (not nvfp4, not a
// bad page) takes gather_chunk_word: the same values, one vector load.
KVSIM_HD inline void gather_paged_chunk(const GatherPagedArgs& a, int64_t t, int32_t h, int32_t chunk) {
  const CacheDtype dtype = a.pools.geometry.dtype;
  const int32_t c = row_chunk_elements(dtype), D = a.pools.geometry.head_dim;
  const int32_t dim0 = chunk * c;
#if defined(__CUDA_ARCH__)
  const PoolStrides& s = a.pools.strides_of(PoolKind::primary);
  if (dtype != CacheDtype::nvfp4 && D - dim0 >= c && dims_contiguous(s.inner[a.kv], dim0, c)) {
    const BlockRef ref{a.block_ids[a.page.div(t)]};
    if (!ref.is_bad()) {
      const int64_t e0 = element_offset(s, ref.block(), a.layer, a.kv, h, a.page.mod(t), dim0);
      float* o = static_cast<float*>(a.out.data) + a.out.offset(t, h, dim0);
      bool done = false;
      with_byte_element_dtype(dtype, [&]<CacheDtype T>() { done = gather_chunk_word<T>(a, e0, o, a.out.stride[2]); });
      if (done) return;
    }
  }
#endif
  gather_paged_dims(a, t, h, dim0, D - dim0 < c ? D - dim0 : c);
}

// ================================================================ block-copy work items

// One block copy between two pools (possibly the same pool). A block is
// addressed row by row: row = ((layer * F + kv) * H + head) * tokens + token,
// tokens being the number of leading entries copied per (layer, kv, head).
// Pointers live in the memory of the backend that runs the items.
struct BlockCopyArgs {
  const uint8_t* src_data = nullptr;
  const uint8_t* src_scales = nullptr;  // nvfp4 only
  uint8_t* dst_data = nullptr;
  uint8_t* dst_scales = nullptr;  // nvfp4 only
  PoolStrides src_strides, src_scale_strides;
  PoolStrides dst_strides, dst_scale_strides;
  CacheDtype dtype = CacheDtype::fp32;
  int32_t layers = 1;
  int32_t kv_factor = 2;
  int32_t heads = 1;
  int32_t tokens = 1;  // entries copied per (layer, kv, head)
  int32_t head_dim = 1;
  // Whole blocks that are one run of bytes in both pools, in the same order
  // (in_block placement, allocate_pools' dense strides on both sides): the
  // copy is then a copy of that run. 0: copy row by row.
  int64_t run_bytes = 0;
  int64_t scale_run_bytes = 0;
  // One (block, layer) slice -- kv_factor * inner elements of the data, and
  // of the scale pool where there is one -- when whole blocks are copied and
  // both pools have allocate_pools' dense strides, either placement (per_layer
  // blocks are one such run per layer); 0 otherwise. in_block: run_bytes is
  // the layers' slices together.
  int64_t layer_run_bytes = 0;
  int64_t scale_layer_run_bytes = 0;

  KVSIM_HD constexpr int64_t rows_per_block() const {
    return static_cast<int64_t>(layers) * kv_factor * heads * tokens;
  }
};

// tokens: entries per (layer, kv, head) to copy, in [1, P].
inline BlockCopyArgs make_block_copy_args(const KvPools& pools, PoolKind src, PoolKind dst, int32_t tokens) {
  const PoolGeometry& g = pools.geometry;
  BlockCopyArgs a;
  a.src_data = pools.bytes(src);
  a.dst_data = pools.bytes(dst);
  a.src_strides = pools.strides_of(src);
  a.dst_strides = pools.strides_of(dst);
  if (g.has_scale_pool()) {
    a.src_scales = pools.scale_bytes(src);
    a.dst_scales = pools.scale_bytes(dst);
    a.src_scale_strides = pools.scale_strides[static_cast<int>(src)];
    a.dst_scale_strides = pools.scale_strides[static_cast<int>(dst)];
  }
  a.dtype = g.dtype;
  a.layers = g.layers;
  a.kv_factor = g.kv_factor;
  a.heads = g.kv_heads;
  a.tokens = tokens;
  a.head_dim = g.head_dim;
  bool dense = tokens == g.tokens_per_block && same_strides(a.src_strides, contiguous_strides(g, src)) &&
               same_strides(a.dst_strides, contiguous_strides(g, dst));
  const PoolGeometry sg = g.has_scale_pool() ? g.scale_geometry() : g;
  if (g.has_scale_pool())
    dense = dense && same_strides(a.src_scale_strides, contiguous_strides(sg, src)) &&
            same_strides(a.dst_scale_strides, contiguous_strides(sg, dst));
  if (!dense) return a;
  auto slice = [](const PoolGeometry& pg) { return pg.bytes_for(static_cast<int64_t>(pg.kv_factor) * pg.inner_elements()); };
  a.layer_run_bytes = slice(g);
  a.scale_layer_run_bytes = g.has_scale_pool() ? slice(sg) : 0;
  if (g.placement == LayerPlacement::in_block) {
    a.run_bytes = g.block_bytes();
    a.scale_run_bytes = g.has_scale_pool() ? sg.block_bytes() : 0;
  }
  return a;
}

// Bytes [byte0, byte0 + n) of a block copy that is one run (run_bytes > 0),
// counted over the data run followed by the scale run.
KVSIM_HD inline void copy_block_run(const BlockCopyArgs& a, int64_t src_block, int64_t dst_block, int64_t byte0,
                                    int64_t n) {
  if (byte0 < a.run_bytes) {
    const int64_t m = a.run_bytes - byte0 < n ? a.run_bytes - byte0 : n;
    const int64_t s = element_byte_offset(element_offset(a.src_strides, src_block, 0, 0, 0, 0, 0), a.dtype);
    const int64_t d = element_byte_offset(element_offset(a.dst_strides, dst_block, 0, 0, 0, 0, 0), a.dtype);
    copy_bytes_run(a.dst_data + d + byte0, a.src_data + s + byte0, m);
    byte0 += m;
    n -= m;
  }
  if (n > 0) {
    const int64_t at = byte0 - a.run_bytes;
    const int64_t s = element_offset(a.src_scale_strides, src_block, 0, 0, 0, 0, 0);  // one byte per scale
    const int64_t d = element_offset(a.dst_scale_strides, dst_block, 0, 0, 0, 0, 0);
    copy_bytes_run(a.dst_scales + d + at, a.src_scales + s + at, n);
  }
}

// The (block, layer) slice of a block copy whose layers are runs
// (layer_run_bytes > 0): the data slice, then the scale slice where the pool
// has one. A narrow backend's item for per_layer pools (a whole in_block
// block is one run_bytes run instead).
KVSIM_HD inline void copy_block_layer_run(const BlockCopyArgs& a, int64_t src_block, int64_t dst_block, int32_t layer) {
  const int64_t s = element_byte_offset(element_offset(a.src_strides, src_block, layer, 0, 0, 0, 0), a.dtype);
  const int64_t d = element_byte_offset(element_offset(a.dst_strides, dst_block, layer, 0, 0, 0, 0), a.dtype);
  copy_bytes_run(a.dst_data + d, a.src_data + s, a.layer_run_bytes);
  if (a.scale_layer_run_bytes > 0) {
    const int64_t ss = element_offset(a.src_scale_strides, src_block, layer, 0, 0, 0, 0);  // one byte per scale
    const int64_t ds = element_offset(a.dst_scale_strides, dst_block, layer, 0, 0, 0, 0);
    copy_bytes_run(a.dst_scales + ds, a.src_scales + ss, a.scale_layer_run_bytes);
  }
}

// Work item of a wide backend for a run copy: 16 bytes of the run.
KVSIM_HD inline void copy_block_run_chunk(const BlockCopyArgs& a, int64_t src_block, int64_t dst_block, int64_t chunk) {
  const int64_t total = a.run_bytes + a.scale_run_bytes, byte0 = chunk * 16;
  copy_block_run(a, src_block, dst_block, byte0, total - byte0 < 16 ? total - byte0 : 16);
}

// Chunks chunk, chunk + stride, ..., chunk + (n - 1) * stride of a run copy
// (n <= kCopyWords), the work item of a wide backend: consecutive threads
// take consecutive `chunk`s, so each of a warp's accesses is one run. On the
// device, chunks wholly inside the data run with both ends 16-byte aligned
// are loaded before any is stored (copy_words16); any other chunk goes
// through copy_block_run_chunk, the same bytes.
KVSIM_HD inline void copy_block_run_chunks(const BlockCopyArgs& a, int64_t src_block, int64_t dst_block, int64_t chunk,
                                           int32_t n, int64_t stride) {
#if defined(__CUDA_ARCH__)
  if (n <= kCopyWords) {
    const int64_t s = element_byte_offset(element_offset(a.src_strides, src_block, 0, 0, 0, 0, 0), a.dtype);
    const int64_t d = element_byte_offset(element_offset(a.dst_strides, dst_block, 0, 0, 0, 0, 0), a.dtype);
    uint8_t* dst[kCopyWords];
    const uint8_t* src[kCopyWords];
    uintptr_t align = 0;
    bool whole = true;
#pragma unroll
    for (int32_t k = 0; k < kCopyWords; ++k) {  // unrolled: the pointers stay in registers
      if (k >= n) break;
      const int64_t byte0 = (chunk + k * stride) * 16;
      whole = whole && byte0 + 16 <= a.run_bytes;
      src[k] = a.src_data + s + byte0;
      dst[k] = a.dst_data + d + byte0;
      align |= reinterpret_cast<uintptr_t>(src[k]) | reinterpret_cast<uintptr_t>(dst[k]);
    }
    if (whole && (align & 15) == 0) {
      copy_words16(dst, src, n);
      return;
    }
  }
#endif
  for (int32_t k = 0; k < n; ++k) copy_block_run_chunk(a, src_block, dst_block, chunk + k * stride);
}

// Copies dims [dim0, dim0 + count) of row `row` (in [0, rows_per_block())) of
// src_block to the same dims of the same row of dst_block, plus their scale
// bytes for nvfp4 (dim0 and count: multiples of 16 there).
KVSIM_HD inline void copy_block_row_dims(const BlockCopyArgs& a, int64_t src_block, int64_t dst_block, int64_t row,
                                         int32_t dim0, int32_t count) {
  const int32_t token = static_cast<int32_t>(row % a.tokens);
  int64_t rest = row / a.tokens;
  const int32_t head = static_cast<int32_t>(rest % a.heads);
  rest /= a.heads;
  const int32_t kv = static_cast<int32_t>(rest % a.kv_factor);
  const int32_t layer = static_cast<int32_t>(rest / a.kv_factor);

  if (a.dtype == CacheDtype::nvfp4) {
    // Nibbles 2i and 2i+1 of a row share one byte (validated: even strides,
    // dim_inner 1), so the row is copied byte by byte with no read-modify-write.
    for (int32_t d = dim0; d < dim0 + count; d += 2) {
      const int64_t s = element_offset(a.src_strides, src_block, layer, kv, head, token, d) >> 1;
      const int64_t t = element_offset(a.dst_strides, dst_block, layer, kv, head, token, d) >> 1;
      a.dst_data[t] = a.src_data[s];
    }
    for (int32_t d = dim0; d < dim0 + count; d += codec::kNvfp4BlockElems) {
      const int64_t s = scale_offset(a.src_scale_strides, src_block, layer, kv, head, token, d);
      const int64_t t = scale_offset(a.dst_scale_strides, dst_block, layer, kv, head, token, d);
      a.dst_scales[t] = a.src_scales[s];
    }
    return;
  }
  const int bytes = bytes_per_element(a.dtype);
  if (dims_contiguous(a.src_strides.inner[kv], dim0, count) && dims_contiguous(a.dst_strides.inner[kv], dim0, count)) {
    copy_bytes_run(a.dst_data + element_offset(a.dst_strides, dst_block, layer, kv, head, token, dim0) * bytes,
                   a.src_data + element_offset(a.src_strides, src_block, layer, kv, head, token, dim0) * bytes,
                   static_cast<int64_t>(count) * bytes);
    return;
  }
  for (int32_t d = dim0; d < dim0 + count; ++d)
    copy_element(a.dst_data, element_offset(a.dst_strides, dst_block, layer, kv, head, token, d), a.src_data,
                 element_offset(a.src_strides, src_block, layer, kv, head, token, d), bytes);
}

// Work item: copies row `row` (in [0, rows_per_block())) of src_block to the
// same row of dst_block: D elements, plus D/16 scale bytes for nvfp4.
KVSIM_HD inline void copy_block_row(const BlockCopyArgs& a, int64_t src_block, int64_t dst_block, int64_t row) {
  copy_block_row_dims(a, src_block, dst_block, row, 0, a.head_dim);
}

// Work item of a wide backend: one chunk (row_chunk_elements dims) of a row.
KVSIM_HD inline void copy_block_row_chunk(const BlockCopyArgs& a, int64_t src_block, int64_t dst_block, int64_t row,
                                          int32_t chunk) {
  const int32_t c = row_chunk_elements(a.dtype);
  copy_block_row_dims(a, src_block, dst_block, row, chunk * c, a.head_dim - chunk * c < c ? a.head_dim - chunk * c : c);
}

}  // namespace kvsim
