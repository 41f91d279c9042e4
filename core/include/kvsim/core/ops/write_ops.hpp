// Write ops: append_paged (FlashInfer), reshape_and_cache (vLLM), append_mla
// (FlashInfer MLA), indexer_k_scatter (DeepSeek sparse-attention indexer).
// Each op: a descriptor and KVSIM_HD work-item functions that both backends
// call unchanged; its host validate_*(), which throws a named ValidationError
// before any byte moves, is in kvsim/validation/ops/.
//
// Work items and writers. append_paged and reshape_and_cache run one work
// item per (token, KV head): it writes the head's D elements of K and of V
// (and, for nvfp4, their D/16 scale bytes). append_mla runs one work item per
// token (its whole latent row). indexer_k_scatter runs one work item per
// token (its D data bytes and 4 scale bytes). Validation proves that no two
// work items touch one byte: distinct tokens land in distinct (block, entry)
// slots, nvfp4 rows occupy whole bytes, indexer bytes are pairwise distinct.
// Hence results do not depend on the thread count or on scheduling.
//
// Work-item functions take only trivially copyable arguments (KvPools and
// the *Args structs below hold raw pointers and sizes). make_*_args() builds
// them from a descriptor with the descriptor's host pointers; a device
// backend copies the index arrays (batch_indices, positions, indptr,
// indices, last_page_len, slot mappings) to device memory and replaces those
// pointers before launching. Every pool offset comes from element_offset() /
// scale_offset().
#pragma once

#include <algorithm>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "../cache_io.hpp"
#include "../nvfp4_rows.hpp"
#include "../page_table.hpp"
#include "../tensor.hpp"

namespace kvsim {

// FlashInfer's append coordinates, the five arrays append_paged_kv_cache
// and append_paged_mla_kv_cache both take: input token i goes to request
// batch_indices[i] at position positions[i] of the CSR page table (indptr,
// indices, last_page_len), which already includes the appended tokens.
// AppendPagedOp and AppendMlaOp are these plus their rows.
struct AppendCoordinates {
  std::span<const int32_t> batch_indices;   // [nnz]
  std::span<const int32_t> positions;       // [nnz]
  std::span<const int32_t> indptr;          // [batch + 1]
  std::span<const int32_t> indices;         // [indptr[batch]]
  std::span<const int32_t> last_page_len;   // [batch]
  // This part of an op, so that a caller sets all five in one assignment.
  AppendCoordinates& coordinates() { return *this; }
};

// contract §5.1 — FlashInfer append_paged_kv_cache. Token i of sequence
// b = batch_indices[i] at position positions[i] goes to
//   (page_slot, entry) = divmod(indptr[b] * P + positions[i], P),  block = indices[page_slot].
// Inputs [nnz, H, D] with arbitrary strides (K/V sliced from a fused QKV);
// input dtype == cache dtype (bytes copied, NaN payloads kept; this includes
// fp8/int8 caches, whose inputs must already be codes), except nvfp4 caches,
// which take fp32/fp16/bf16 and quantize per 16 elements with the layer's K/V
// global decode scales (contract §4); the scale byte of elements [16j, 16j+16)
// goes to the scale pool at scale_offset(..., dim = 16j).
// Any layout the geometry allows (NHD, HND, split-x); kv_factor must be 2.
// Rejected before any byte moves: a position outside [0, length(b)) of the
// CSR table, a written page that is BAD_PAGE, any secondary or out-of-range
// reference in the table, two sequences writing one block, two tokens
// writing one (block, entry) slot, a non-finite or non-positive nvfp4
// global scale, shape/dtype mismatches, a layer out of range.
struct AppendPagedOp : AppendCoordinates {
  int32_t layer = 0;
  TensorView k, v;                          // [nnz, H, D]
  float k_global_scale = 1.0f;              // nvfp4 only
  float v_global_scale = 1.0f;
};

// contract §5.2 — vLLM reshape_and_cache(_flash). Token t goes to
// slot_mapping[t] = block * P + offset (negative: skipped), any layout
// including split-x; kv_factor must be 2. Accepted dtype pairs:
//   cache dtype == input dtype (fp32, fp16, bf16, fp8_e4m3, fp8_e5m2, int8):
//     bytes copied, NaN payloads kept;
//   fp8_e4m3 / fp8_e5m2 cache, fp32/fp16/bf16 input:
//     code = f32_to_e4m3/e5m2(x / k_scale, satfinite) — x is the exact fp32
//     value of the input, `/` IEEE division (vLLM's scaled_convert divides);
//     k_scale / v_scale must then be finite and > 0.
// Everything else is rejected (nvfp4 caches are written by append_paged /
// qkv_preprocess_write; int8 caches take int8 codes). Two tokens with one
// non-negative slot are rejected (one writer per byte).
struct ReshapeAndCacheOp {
  int32_t layer = 0;
  TensorView key, value;                 // [num_tokens, H, D]
  std::span<const int64_t> slot_mapping; // [num_tokens]
  float k_scale = 1.0f;
  float v_scale = 1.0f;
};

// contract §5.4 — FlashInfer append_paged_mla_kv_cache into a latent pool
// (kv_factor 1, kv_heads 1): row = [ckv (d_ckv) | kpe (d_kpe)]. Page table,
// coordinates and rejections as append_paged.
//
// Row layout, by pool dtype:
//  * fp32 / fp16 / bf16 / fp8_e4m3 / fp8_e5m2 / int8 pool:
//      head_dim == d_ckv + d_kpe; ckv and kpe inputs have the pool's dtype and
//      are copied as bytes: ckv to dims [0, d_ckv), kpe to [d_ckv, head_dim).
//  * nvfp4 pool (the supported mix: nvfp4 ckv with fp8 e4m3 kpe):
//      head_dim is counted in 4-bit units and head_dim == d_ckv + 2 * d_kpe.
//      Nibbles [0, d_ckv): ckv, fp32/fp16/bf16 input quantized per 16
//        elements (contract §4) with ckv_global_scale; the scale byte of group j
//        goes to the scale pool at scale_offset(..., dim = 16 j), i.e. scale
//        entries [0, d_ckv / 16) of the row.
//      Nibbles [d_ckv, head_dim): kpe as fp8 e4m3 bytes, byte j stored as the
//        nibble pair (d_ckv + 2j: low nibble = code & 0xF, d_ckv + 2j + 1:
//        high nibble = code >> 4). Since d_ckv is a multiple of 16 and rows
//        start on whole bytes, that is exactly byte j of the kpe part. kpe
//        input is either fp8_e4m3 codes (copied) or fp32/fp16/bf16, encoded
//        as e4m3_satfinite(x / kpe_scale) (decode: code * kpe_scale).
//      The row's remaining scale entries [d_ckv / 16, head_dim / 16) cover
//        kpe nibbles; they are never written (a reader must not use them).
//      Requirements: d_ckv % 16 == 0 (else unsupported_head_dim); the
//      geometry's head_dim % 16 == 0 then makes d_kpe a multiple of 8.
struct AppendMlaOp : AppendCoordinates {
  int32_t layer = 0;
  TensorView ckv;  // [nnz, d_ckv]
  TensorView kpe;  // [nnz, d_kpe]
  float ckv_global_scale = 1.0f;  // nvfp4 ckv
  float kpe_scale = 1.0f;         // fp8 kpe in the nvfp4 mix, when kpe is fp32/fp16/bf16
};

// contract §5.5 — DeepSeek indexer K cache scatter (TensorRT-LLM
// indexerKCacheScatter): fp8 bytes [T, D] and 4-byte scales [T] go into a
// 4-D strided byte cache [blocks, block_size, 1, bytes_per_token] addressed
// by flat element indices; a negative slot in either mapping skips the
// whole token (as the kernel's early return does).
// Data byte j of token t is written at indexer_flat_to_offset(cache,
// slot_mapping_fp8[t] + j); scale byte j at indexer_flat_to_offset(cache,
// slot_mapping_scale[t] + j). Each byte is addressed on its own: the real
// kernel's 4-byte vector stores give the same bytes whenever they are legal
// (stride 3 == 1 and no vector crossing a d3 row), and this definition stays
// meaningful where they are not. Validation: every written flat index lies
// inside the cache's d0*d1*d2*d3 elements, the cache strides are >= 0 and all
// written bytes (data and scales of all tokens) are pairwise distinct.
struct IndexerKScatterOp {
  TensorView k_fp8;    // [T, D] bytes (any 8-bit dtype)
  TensorView k_scale;  // [T, 4] bytes
  std::span<const int64_t> slot_mapping_fp8;    // flat element index of the token's first data byte
  std::span<const int64_t> slot_mapping_scale;  // flat element index of the token's scale bytes
  TensorView cache;    // rank 4, 8-bit dtype, explicit strides
};

inline constexpr int32_t kIndexerScaleBytes = 4;

// ================================================================ device-side work items

// How one run of input elements becomes pool bytes (decided on the host).
enum class RowEncoding : uint8_t {
  copy_bytes,        // input dtype == pool dtype (>= 8 bits): raw bytes, NaN payloads kept
  nvfp4,             // fp32/fp16/bf16 -> e2m1 nibbles + e4m3 block scales (contract §4); scale = global decode scale
  fp8_divide,        // fp32/fp16/bf16 -> pool fp8 code of (x / scale), satfinite
  fp8_pairs_copy,    // nvfp4 pool: fp8 input bytes stored as nibble pairs (MLA kpe)
  fp8_pairs_divide,  // nvfp4 pool: e4m3_satfinite(x / scale) stored as nibble pairs (MLA kpe)
};

// The pool coordinates of one row (all dims of one head of one token).
struct PoolRow {
  int64_t block = 0;
  int32_t layer = 0;
  int32_t kv = 0;
  int32_t head = 0;
  int32_t entry = 0;
};

// A run of input elements along a tensor's last dimension: element d lives
// at data[base + d * stride] (in elements of dtype).
struct InputRow {
  const void* data = nullptr;
  CacheDtype dtype = CacheDtype::fp32;
  int64_t base = 0;
  int64_t stride = 1;

  KVSIM_HD constexpr int64_t at(int64_t d) const { return base + d * stride; }
};

// Row (i0, i1) of a rank-3 tensor, or row i0 of a rank-2 tensor (i1 ignored).
KVSIM_HD constexpr InputRow input_row(const TensorView& t, int64_t i0, int64_t i1) {
  InputRow r;
  r.data = t.data;
  r.dtype = t.dtype;
  r.base = i0 * t.stride[0] + (t.rank == 3 ? i1 * t.stride[1] : 0);
  r.stride = t.stride[t.rank - 1];
  return r;
}

KVSIM_HD constexpr int64_t pool_row_offset(const PoolStrides& s, const PoolRow& r, int32_t dim) {
  return element_offset(s, r.block, r.layer, r.kv, r.head, r.entry, dim);
}

// fp8 code of x / scale (IEEE division, then round-to-nearest-even, satfinite).
KVSIM_HD inline uint8_t fp8_encode_divided(float x, float scale, CacheDtype fp8) {
  const float y = x / scale;
  return fp8 == CacheDtype::fp8_e5m2 ? codec::f32_to_e5m2(y, codec::Saturation::finite)
                                     : codec::f32_to_e4m3(y, codec::Saturation::finite);
}

// fp8_encode_divided of two values (x0 in the low byte) by the pair codec:
// one conversion instruction on the device (codec::f32x2_to_fp8x2_satfinite).
KVSIM_HD inline uint16_t fp8_encode_divided_pair(float x0, float x1, float scale, CacheDtype fp8) {
  const float y0 = x0 / scale, y1 = x1 / scale;
  return fp8 == CacheDtype::fp8_e5m2 ? codec::f32x2_to_fp8x2_satfinite<true>(y0, y1)
                                     : codec::f32x2_to_fp8x2_satfinite<false>(y0, y1);
}

// Calls visit(j0, n, e, step) for the pieces of dims [dim0, dim0 + count) of
// row r that are one evenly spaced run of pool elements each: dims dim0 + j0
// .. dim0 + j0 + n - 1 at elements e + j * step. A piece is one x-group: the
// whole row for NHD and HND (step 1) and split-x V (step = the page size),
// x dims for split-x K. One element_offset per piece instead of one per
// element (the CPU's split-x writes spent their time there).
template <class Visit>
KVSIM_HD inline void for_each_row_piece(const PoolStrides& s, const PoolRow& r, int32_t dim0, int32_t count,
                                        Visit&& visit) {
  const InnerStrides& in = s.inner[r.kv];
  for (int32_t d = dim0; d < dim0 + count;) {
    int32_t outer = 0, inner = 0;
    split_dim(d, in.x, outer, inner);
    const int32_t n = in.x - inner < dim0 + count - d ? in.x - inner : dim0 + count - d;
    visit(d - dim0, n, pool_row_offset(s, r, d), in.dim_inner);
    d += n;
  }
}

// The pool fp8 codes of x[0..n) / scale (fp8_encode_divided), the dtype
// switch outside the loop so that a CPU compiles the loop as vector code.
KVSIM_HD inline void fp8_encode_divided_run(const float* x, int32_t n, float scale, CacheDtype fp8, uint8_t* codes) {
  if (fp8 == CacheDtype::fp8_e5m2)
    for (int32_t d = 0; d < n; ++d) codes[d] = codec::f32_to_e5m2(x[d] / scale, codec::Saturation::finite);
  else
    for (int32_t d = 0; d < n; ++d) codes[d] = codec::f32_to_e4m3(x[d] / scale, codec::Saturation::finite);
}

// write_pool_row's fp8_pairs_* rows (both forms): each input byte (an fp8
// code, or the code of x / scale) as two nibbles, low nibble first.
KVSIM_HD inline void write_fp8_pairs_row(uint8_t* pool, const PoolStrides& s, const PoolRow& r, int32_t dim0,
                                         int32_t count, const InputRow& in, RowEncoding encoding, float scale) {
  for (int32_t j = 0; j < count; ++j) {
    const uint8_t code = encoding == RowEncoding::fp8_pairs_copy
                             ? static_cast<const uint8_t*>(in.data)[in.at(j)]
                             : fp8_encode_divided(load_float(in.data, in.dtype, in.at(j)), scale, CacheDtype::fp8_e4m3);
    store_nibble(pool, pool_row_offset(s, r, dim0 + 2 * j), static_cast<uint8_t>(code & 0xFu));
    store_nibble(pool, pool_row_offset(s, r, dim0 + 2 * j + 1), static_cast<uint8_t>(code >> 4));
  }
}

// Writes `count` elements of the input row to dims [dim0, dim0 + count) of
// the primary pool's row `r`. nvfp4: count and dim0 are multiples of 16.
// fp8_pairs_*: count input bytes go to 2 * count nibbles from dim0 (even).
// Inputs are read as rows (load_floats: one dtype switch per row) and pool
// bytes stored by pieces (for_each_row_piece); every value is the element's
// own expression, so the bytes do not depend on the pieces.
//
// Two forms, one per side, with the same values and bytes (both call the same
// codec functions per element). The device's goes element by element with no
// array of a run-time length: a GPU thread's arrays stay in registers only when
// their indexing is known at compile time, and the host's row form put 160
// bytes of stack in every write kernel and took their items from 104 to 164
// registers (session 27, ptxas -v). The device's word paths
// (write_quantized_chunks, copy_words16) are its fast case anyway. The host's
// takes its nvfp4 quantizer as a parameter (nvfp4_rows.hpp: core's by default,
// or a backend's of the same bytes).
#if defined(__CUDA_ARCH__)
template <class Nvfp4Rows = CoreNvfp4Rows>  // unused here: the device quantizes a block at a time
KVSIM_HD inline void write_pool_row(const KvPools& pools, const PoolRow& r, int32_t dim0, int32_t count,
                                    const InputRow& in, RowEncoding encoding, float scale, Nvfp4Rows = {}) {
  const PoolStrides& s = pools.strides_of(PoolKind::primary);
  uint8_t* pool = pools.bytes(PoolKind::primary);
  const CacheDtype pool_dtype = pools.geometry.dtype;
  // Whether the row's dims [dim0, dim0 + count) are one run of pool bytes
  // (NHD, HND, and split-x K inside one x-group).
  const bool pool_run = dims_contiguous(s.inner[r.kv], dim0, count);
  switch (encoding) {
    case RowEncoding::copy_bytes: {
      const int nbytes = bytes_per_element(pool_dtype);
      if (pool_run && in.stride == 1) {  // the same bytes, moved as one run
        copy_bytes_run(pool + pool_row_offset(s, r, dim0) * nbytes,
                       static_cast<const uint8_t*>(in.data) + in.at(0) * nbytes, static_cast<int64_t>(count) * nbytes);
        break;
      }
      for (int32_t d = 0; d < count; ++d) copy_element(pool, pool_row_offset(s, r, dim0 + d), in.data, in.at(d), nbytes);
      break;
    }
    case RowEncoding::nvfp4: {
      uint8_t* scale_pool = pools.scale_bytes(PoolKind::primary);
      const PoolStrides& ss = pools.scale_strides[static_cast<int>(PoolKind::primary)];
      for (int32_t g0 = 0; g0 < count; g0 += codec::kNvfp4BlockElems) {
        float x[codec::kNvfp4BlockElems];
        for (int e = 0; e < codec::kNvfp4BlockElems; ++e) x[e] = load_float(in.data, in.dtype, in.at(g0 + e));
        uint8_t packed[codec::kNvfp4BlockElems / 2];
        const uint8_t scale_code = codec::nvfp4_quantize16(x, scale, packed);
        for (int e = 0; e < codec::kNvfp4BlockElems; ++e)
          store_nibble(pool, pool_row_offset(s, r, dim0 + g0 + e), codec::nibble_at(packed, e));
        scale_pool[scale_offset(ss, r.block, r.layer, r.kv, r.head, r.entry, dim0 + g0)] = scale_code;
      }
      break;
    }
    case RowEncoding::fp8_divide:
      if (pool_run) {  // codes of 16 elements at a time, stored as one run
        uint8_t* run = pool + pool_row_offset(s, r, dim0);
        for (int32_t d0 = 0; d0 < count; d0 += 16) {
          uint8_t codes[16];
          const int32_t n = count - d0 < 16 ? count - d0 : 16;
          for (int32_t d = 0; d < n; ++d)
            codes[d] = fp8_encode_divided(load_float(in.data, in.dtype, in.at(d0 + d)), scale, pool_dtype);
          copy_bytes_run(run + d0, codes, n);
        }
        break;
      }
      for (int32_t d = 0; d < count; ++d)
        store_byte(pool, pool_row_offset(s, r, dim0 + d),
                   fp8_encode_divided(load_float(in.data, in.dtype, in.at(d)), scale, pool_dtype));
      break;
    case RowEncoding::fp8_pairs_copy:
    case RowEncoding::fp8_pairs_divide:
      write_fp8_pairs_row(pool, s, r, dim0, count, in, encoding, scale);
      break;
  }
}
#else
// One row's part of a quantizer call (nvfp4_rows.hpp) for dims [dim0, dim0 +
// n) of pool row r, from input elements j0.. of `in`: the input read in place
// where its elements are consecutive floats (no fp32 copy on the stack), the
// packed bytes and the scale bytes written straight into the pools where
// each is one run (one store per row, not a memcpy per row and a
// scale_offset per block); else through this object's buffers, which start()
// fills and finish() scatters element by element as before.
struct Nvfp4RowTarget {
  Nvfp4Row row;
  bool packed_run = false, scales_run = false;
  float x[kNvfp4CallBlocks * codec::kNvfp4BlockElems];
  uint8_t packed[kNvfp4CallBlocks * codec::kNvfp4BlockElems / 2], scales[kNvfp4CallBlocks];

  KVSIM_HD void start(const KvPools& pools, const PoolRow& r, int32_t dim0, int32_t n, const InputRow& in, int32_t j0,
                      float global_scale) {
    row.global_scale = global_scale;
    if (in.stride == 1 && is_float_input(in.dtype)) {
      row.x = static_cast<const uint8_t*>(in.data) + in.at(j0) * bytes_per_element(in.dtype);
      row.dtype = in.dtype;
    } else {
      load_floats(in.data, in.dtype, in.at(j0), in.stride, n, x);
      row.x = x;
      row.dtype = CacheDtype::fp32;
    }
    const PoolStrides& s = pools.strides_of(PoolKind::primary);
    const int64_t e0 = pool_row_offset(s, r, dim0);
    packed_run = dims_contiguous(s.inner[r.kv], dim0, n) && (e0 & 1) == 0;  // element 2i: the low nibble of byte i
    row.packed = packed_run ? pools.bytes(PoolKind::primary) + (e0 >> 1) : packed;
    const PoolStrides& ss = pools.scale_strides[static_cast<int>(PoolKind::primary)];
    constexpr int32_t kElems = codec::kNvfp4BlockElems;
    scales_run = dims_contiguous(ss.inner[r.kv], dim0 / kElems, n / kElems);
    row.scales = scales_run ? pools.scale_bytes(PoolKind::primary) +
                                  scale_offset(ss, r.block, r.layer, r.kv, r.head, r.entry, dim0)
                            : scales;
  }

  KVSIM_HD void finish(const KvPools& pools, const PoolRow& r, int32_t dim0, int32_t n) const {
    if (!packed_run) {
      const PoolStrides& s = pools.strides_of(PoolKind::primary);
      for (int32_t e = 0; e < n; ++e)
        store_nibble(pools.bytes(PoolKind::primary), pool_row_offset(s, r, dim0 + e), codec::nibble_at(packed, e));
    }
    if (!scales_run) {
      const PoolStrides& ss = pools.scale_strides[static_cast<int>(PoolKind::primary)];
      for (int32_t b = 0; b < n / codec::kNvfp4BlockElems; ++b)
        pools.scale_bytes(PoolKind::primary)[scale_offset(ss, r.block, r.layer, r.kv, r.head, r.entry,
                                                          dim0 + b * codec::kNvfp4BlockElems)] = scales[b];
    }
  }
};

template <class Nvfp4Rows = CoreNvfp4Rows>
KVSIM_HD inline void write_pool_row(const KvPools& pools, const PoolRow& r, int32_t dim0, int32_t count,
                                    const InputRow& in, RowEncoding encoding, float scale, Nvfp4Rows nvfp4_rows = {}) {
  const PoolStrides& s = pools.strides_of(PoolKind::primary);
  uint8_t* pool = pools.bytes(PoolKind::primary);
  const CacheDtype pool_dtype = pools.geometry.dtype;
  switch (encoding) {
    case RowEncoding::copy_bytes: {
      const int nbytes = bytes_per_element(pool_dtype);
      for_each_row_piece(s, r, dim0, count, [&](int32_t j0, int32_t n, int64_t e, int64_t step) {
        if (step == 1 && in.stride == 1) {  // the same bytes, moved as one run
          copy_bytes_run(pool + e * nbytes, static_cast<const uint8_t*>(in.data) + in.at(j0) * nbytes,
                         static_cast<int64_t>(n) * nbytes);
          return;
        }
        auto copy_each = [&]<typename Word>() {  // one typed move per element (split-x V: step = page size)
          const Word* src = static_cast<const Word*>(in.data);
          Word* dst = reinterpret_cast<Word*>(pool);
          for (int32_t j = 0; j < n; ++j) dst[e + j * step] = src[in.at(j0 + j)];
        };
        if (nbytes == 4) copy_each.template operator()<uint32_t>();
        else if (nbytes == 2) copy_each.template operator()<uint16_t>();
        else copy_each.template operator()<uint8_t>();
      });
      break;
    }
    case RowEncoding::nvfp4: {
      // Up to kNvfp4CallBlocks blocks a quantizer call (nvfp4_rows: core's by default).
      constexpr int32_t kElems = codec::kNvfp4BlockElems, kCall = kNvfp4CallBlocks * kElems;
      for (int32_t g0 = 0; g0 < count; g0 += kCall) {
        const int32_t n = count - g0 < kCall ? count - g0 : kCall;
        Nvfp4RowTarget t;
        t.start(pools, r, dim0 + g0, n, in, g0, scale);
        nvfp4_rows(&t.row, 1, n / kElems);
        t.finish(pools, r, dim0 + g0, n);
      }
      break;
    }
    case RowEncoding::fp8_divide: {
      // Codes of up to kChunk elements at a time, stored as one run where the
      // row is one (a whole chunk: sizes a compiler knows), else piece by piece.
      uint8_t* run = dims_contiguous(s.inner[r.kv], dim0, count) ? pool + pool_row_offset(s, r, dim0) : nullptr;
      constexpr int32_t kChunk = 64;  // a CPU's vector loops: 64 codes, four registers of floats
      auto encode = [&](int32_t d0, int32_t n) {
        float x[kChunk];
        uint8_t codes[kChunk];
        load_floats(in.data, in.dtype, in.at(d0), in.stride, n, x);
        fp8_encode_divided_run(x, n, scale, pool_dtype, codes);
        if (run) return copy_bytes_run(run + d0, codes, n);
        for_each_row_piece(s, r, dim0 + d0, n, [&](int32_t j0, int32_t m, int64_t e, int64_t step) {
          if (step == 1) return copy_bytes_run(pool + e, codes + j0, m);
          for (int32_t j = 0; j < m; ++j) store_byte(pool, e + j * step, codes[j0 + j]);
        });
      };
      for (int32_t d0 = 0; d0 < count; d0 += kChunk) {
        if (count - d0 >= kChunk) encode(d0, kChunk);
        else encode(d0, count - d0);
      }
      break;
    }
    case RowEncoding::fp8_pairs_copy:
    case RowEncoding::fp8_pairs_divide:
      write_fp8_pairs_row(pool, s, r, dim0, count, in, encoding, scale);
      break;
  }
}
#endif

// ---------------------------------------------------------------- append_paged
// Where an append's tokens go, as its work items read them (on CUDA the
// pointers are swapped for device copies): the part of AppendPagedArgs and
// AppendMlaArgs that AppendCoordinates and the layer give.
struct AppendTargets {
  int32_t layer = 0;
  const int32_t* batch_indices = nullptr;
  const int32_t* positions = nullptr;
  int64_t nnz = 0;
  CsrPageTable table;
  AppendTargets& targets() { return *this; }
};

inline AppendTargets make_append_targets(const KvPools& pools, int32_t layer, const AppendCoordinates& at) {
  AppendTargets t;
  t.layer = layer;
  t.batch_indices = at.batch_indices.data();
  t.positions = at.positions.data();
  t.nnz = static_cast<int64_t>(at.batch_indices.size());
  t.table = make_csr_view(at.indptr, at.indices, at.last_page_len, pools.geometry);
  return t;
}

struct AppendPagedArgs : AppendTargets {
  TensorView k, v;
  RowEncoding encoding = RowEncoding::copy_bytes;
  float k_global_scale = 1.0f;
  float v_global_scale = 1.0f;
};

inline AppendPagedArgs make_append_paged_args(const KvPools& pools, const AppendPagedOp& op) {
  AppendPagedArgs a;
  a.targets() = make_append_targets(pools, op.layer, op);
  a.k = op.k;
  a.v = op.v;
  a.encoding = pools.geometry.dtype == CacheDtype::nvfp4 ? RowEncoding::nvfp4 : RowEncoding::copy_bytes;
  a.k_global_scale = op.k_global_scale;
  a.v_global_scale = op.v_global_scale;
  return a;
}

// FlashInfer's block: divmod(indptr[b] * P + position, P) -> indices[page].
KVSIM_HD inline PoolRow append_target(const CsrPageTable& table, int32_t layer, int32_t b, int64_t position) {
  int64_t page_slot = 0;
  int32_t entry = 0;
  table.locate(b, position, page_slot, entry);
  PoolRow r;
  r.block = table.block_at(page_slot).block();
  r.layer = layer;
  r.entry = entry;
  return r;
}

// Chunk `chunk` of row r -- dims [chunk * c, chunk * c + c), c =
// row_chunk_elements, the last chunk possibly short -- from input row `in`.
// Chunks own disjoint bytes (nvfp4 chunks are whole 16-element blocks, so no
// byte is shared between two of them), so any grouping of a row's chunks
// into work items writes the same bytes.
KVSIM_HD inline void write_pool_row_chunk(const KvPools& pools, const PoolRow& r, int32_t chunk, InputRow in,
                                          RowEncoding encoding, float scale) {
  const int32_t c = row_chunk_elements(pools.geometry.dtype), D = pools.geometry.head_dim;
  const int32_t dim0 = chunk * c;
  in.base = in.at(dim0);
  write_pool_row(pools, r, dim0, D - dim0 < c ? D - dim0 : c, in, encoding, scale);
}

// Chunks chunk, chunk + stride, ..., chunk + (n - 1) * stride of row r, n <=
// kCopyWords: the work item of a wide backend (consecutive threads take
// consecutive `chunk`s, so each of a warp's accesses is one run of bytes).
// On the device a copy of whole 16-byte chunks loads all n before storing
// any (copy_words16); every other case writes chunk by chunk, the same bytes.
KVSIM_HD inline void write_pool_row_chunks(const KvPools& pools, const PoolRow& r, int32_t chunk, int32_t n,
                                           int32_t stride, const InputRow& in, RowEncoding encoding, float scale) {
#if defined(__CUDA_ARCH__)
  if (encoding == RowEncoding::copy_bytes && in.stride == 1 && n <= kCopyWords) {
    const PoolStrides& s = pools.strides_of(PoolKind::primary);
    const int32_t c = row_chunk_elements(pools.geometry.dtype), D = pools.geometry.head_dim;
    const int nbytes = bytes_per_element(pools.geometry.dtype);
    uint8_t* dst[kCopyWords];
    const uint8_t* src[kCopyWords];
    uintptr_t align = 0;
    bool whole = true;
#pragma unroll
    for (int32_t k = 0; k < kCopyWords; ++k) {  // unrolled: the pointers stay in registers, not on a stack
      if (k >= n) break;
      const int32_t dim0 = (chunk + k * stride) * c;
      whole = whole && D - dim0 >= c && c * nbytes == 16 && dims_contiguous(s.inner[r.kv], dim0, c);
      dst[k] = pools.bytes(PoolKind::primary) + pool_row_offset(s, r, dim0) * nbytes;
      src[k] = static_cast<const uint8_t*>(in.data) + in.at(dim0) * nbytes;
      align |= reinterpret_cast<uintptr_t>(dst[k]) | reinterpret_cast<uintptr_t>(src[k]);
    }
    if (whole && (align & 15) == 0) {
      copy_words16(dst, src, n);
      return;
    }
  }
#endif
  for (int32_t k = 0; k < n; ++k) write_pool_row_chunk(pools, r, chunk + k * stride, in, encoding, scale);
}

// The most chunks one item of a quantizing write's word path holds.
inline constexpr int kQuantizedChunks = 2;

#if defined(__CUDA_ARCH__)
// The device's word path of a quantizing write (fp8_divide, nvfp4: pools of
// 16-element chunks): chunks chunk, chunk + stride, ... (n <= kQuantizedChunks)
// of a unit-stride input row of the float dtype TIn, all loaded by 16-byte
// words before the target row is known -- target(r) is the item's dependent
// load (a slot, a page), false: the token is skipped -- then write_pool_row's
// arithmetic per element (load_float, fp8_encode_divided by pairs / nvfp4_quantize16),
// the codes stored as a 16-byte word (fp8) or an 8-byte word of nibbles and
// the scale byte (nvfp4). false, having stored nothing, when a chunk is short,
// an address unaligned or a chunk's pool dims not one run: the caller then
// writes chunk by chunk.
template <CacheDtype TIn, class Target>
__device__ inline bool write_quantized_chunks(const KvPools& pools, int32_t chunk, int32_t n, int32_t stride,
                                              const InputRow& in, RowEncoding encoding, float scale, Target target) {
  constexpr int kN = 16, kWords = kN * bytes_per_element(TIn) / 16;
  if (encoding != RowEncoding::fp8_divide && encoding != RowEncoding::nvfp4) return false;
  const int32_t D = pools.geometry.head_dim;
  const uint8_t* row = static_cast<const uint8_t*>(in.data) + in.at(0) * bytes_per_element(TIn);
  bool whole = in.stride == 1 && n <= kQuantizedChunks;
  uintptr_t align = 0;
#pragma unroll
  for (int k = 0; k < kQuantizedChunks; ++k) {
    if (k >= n) break;
    const int32_t dim0 = (chunk + k * stride) * kN;
    whole = whole && D - dim0 >= kN;
    align |= reinterpret_cast<uintptr_t>(row + dim0 * bytes_per_element(TIn));
  }
  if (!whole || (align & 15) != 0) return false;
  uint4 w[kQuantizedChunks][kWords];
#pragma unroll
  for (int k = 0; k < kQuantizedChunks; ++k) {
    if (k >= n) break;
    load_words16<kWords>(row + (chunk + k * stride) * kN * bytes_per_element(TIn), w[k]);
  }
  PoolRow r;
  if (!target(r)) return true;
  const PoolStrides& s = pools.strides_of(PoolKind::primary);
  const bool nvfp4 = encoding == RowEncoding::nvfp4;
  int64_t e0[kQuantizedChunks];
#pragma unroll
  for (int k = 0; k < kQuantizedChunks; ++k) {
    if (k >= n) break;
    const int32_t dim0 = (chunk + k * stride) * kN;
    e0[k] = pool_row_offset(s, r, dim0);
    if (!dims_contiguous(s.inner[r.kv], dim0, kN) || (nvfp4 && (e0[k] & 1) != 0)) return false;
    align |= reinterpret_cast<uintptr_t>(pools.bytes(PoolKind::primary) + (nvfp4 ? e0[k] >> 1 : e0[k])) &
             (nvfp4 ? 7 : 15);
  }
  if ((align & 15) != 0) return false;
#pragma unroll
  for (int k = 0; k < kQuantizedChunks; ++k) {
    if (k >= n) break;
    uint8_t bytes[kN * bytes_per_element(TIn)];
    memcpy(bytes, w[k], sizeof(bytes));
    float x[kN];
#pragma unroll
    for (int d = 0; d < kN; ++d) x[d] = load_float(bytes, TIn, d);
    if (nvfp4) {
      uint8_t packed[kN / 2];
      const uint8_t scale_code = codec::nvfp4_quantize16(x, scale, packed);
      store_bytes_by_words<sizeof(packed)>(pools.bytes(PoolKind::primary) + (e0[k] >> 1), packed);
      pools.scale_bytes(PoolKind::primary)[scale_offset(pools.scale_strides[static_cast<int>(PoolKind::primary)],
                                                        r.block, r.layer, r.kv, r.head, r.entry,
                                                        (chunk + k * stride) * kN)] = scale_code;
    } else {
      uint16_t codes[kN / 2];
#pragma unroll
      for (int d = 0; d < kN; d += 2)
        codes[d / 2] = fp8_encode_divided_pair(x[d], x[d + 1], scale, pools.geometry.dtype);
      store_bytes_by_words<sizeof(codes)>(pools.bytes(PoolKind::primary) + e0[k], codes);
    }
  }
  return true;
}
#endif

// Both rows of one (token, KV head) target: K (kv 0) from `k`, V (kv 1) from
// `v`; nvfp4 rows quantized by nvfp4_rows (host only: nvfp4_rows.hpp).
template <class Nvfp4Rows = CoreNvfp4Rows>
KVSIM_HD inline void write_kv_rows(const KvPools& pools, PoolRow r, InputRow k, RowEncoding k_encoding, float k_scale,
                                   InputRow v, RowEncoding v_encoding, float v_scale, Nvfp4Rows nvfp4_rows = {}) {
  const int32_t D = pools.geometry.head_dim;
#if !defined(__CUDA_ARCH__)
  // nvfp4 K and V rows of D <= 128 in one quantizer call (16 blocks): its
  // fixed work once per item, not once per row (docs/benchmarks.md, session 31).
  if (k_encoding == RowEncoding::nvfp4 && v_encoding == RowEncoding::nvfp4 &&
      2 * D <= kNvfp4CallBlocks * codec::kNvfp4BlockElems) {
    PoolRow rv = r;
    r.kv = 0;
    rv.kv = 1;
    Nvfp4RowTarget t[2];
    t[0].start(pools, r, 0, D, k, 0, k_scale);
    t[1].start(pools, rv, 0, D, v, 0, v_scale);
    const Nvfp4Row rows[2] = {t[0].row, t[1].row};
    nvfp4_rows(rows, 2, D / codec::kNvfp4BlockElems);
    t[0].finish(pools, r, 0, D);
    t[1].finish(pools, rv, 0, D);
    return;
  }
#endif
  r.kv = 0;
  write_pool_row(pools, r, 0, D, k, k_encoding, k_scale, nvfp4_rows);
  r.kv = 1;
  write_pool_row(pools, r, 0, D, v, v_encoding, v_scale, nvfp4_rows);
}

// Work item (token i, KV head, kv, chunks chunk + k * stride for k < n): chunks of the K (kv 0) or V (kv 1) row.
KVSIM_HD inline void append_paged_chunks(const KvPools& pools, const AppendPagedArgs& a, int64_t i, int32_t head,
                                         int32_t kv, int32_t chunk, int32_t n, int32_t stride) {
  PoolRow r = append_target(a.table, a.layer, a.batch_indices[i], a.positions[i]);
  r.head = head;
  r.kv = kv;
  write_pool_row_chunks(pools, r, chunk, n, stride, input_row(kv == 0 ? a.k : a.v, i, head), a.encoding,
                        kv == 0 ? a.k_global_scale : a.v_global_scale);
}

#if defined(__CUDA_ARCH__)
// append_paged_chunks of a quantizing append (nvfp4) whose inputs are TIn:
// the input words loaded before the page lookup (write_quantized_chunks).
template <CacheDtype TIn>
__device__ inline void append_paged_chunks_quantized(const KvPools& pools, const AppendPagedArgs& a, int64_t i,
                                                     int32_t head, int32_t kv, int32_t chunk, int32_t n,
                                                     int32_t stride) {
  if (write_quantized_chunks<TIn>(pools, chunk, n, stride, input_row(kv == 0 ? a.k : a.v, i, head), a.encoding,
                                  kv == 0 ? a.k_global_scale : a.v_global_scale, [&](PoolRow& r) {
                                    r = append_target(a.table, a.layer, a.batch_indices[i], a.positions[i]);
                                    r.head = head;
                                    r.kv = kv;
                                    return true;
                                  }))
    return;
  append_paged_chunks(pools, a, i, head, kv, chunk, n, stride);
}
#endif

// Work item (token i, KV head): K and V rows of that head (nvfp4 rows
// quantized by nvfp4_rows, a host backend's choice: nvfp4_rows.hpp).
template <class Nvfp4Rows = CoreNvfp4Rows>
KVSIM_HD inline void append_paged_token_head(const KvPools& pools, const AppendPagedArgs& a, int64_t i, int32_t head,
                                             Nvfp4Rows nvfp4_rows = {}) {
  PoolRow r = append_target(a.table, a.layer, a.batch_indices[i], a.positions[i]);
  r.head = head;
  write_kv_rows(pools, r, input_row(a.k, i, head), a.encoding, a.k_global_scale, input_row(a.v, i, head), a.encoding,
                a.v_global_scale, nvfp4_rows);
}

// ---------------------------------------------------------------- reshape_and_cache
struct ReshapeAndCacheArgs {
  int32_t layer = 0;
  TensorView key, value;
  const int64_t* slot_mapping = nullptr;
  int64_t num_tokens = 0;
  RowEncoding key_encoding = RowEncoding::copy_bytes;
  RowEncoding value_encoding = RowEncoding::copy_bytes;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
};

inline RowEncoding reshape_encoding(CacheDtype cache, CacheDtype input) {
  return cache == input ? RowEncoding::copy_bytes : RowEncoding::fp8_divide;
}

inline ReshapeAndCacheArgs make_reshape_and_cache_args(const KvPools& pools, const ReshapeAndCacheOp& op) {
  ReshapeAndCacheArgs a;
  a.layer = op.layer;
  a.key = op.key;
  a.value = op.value;
  a.slot_mapping = op.slot_mapping.data();
  a.num_tokens = static_cast<int64_t>(op.slot_mapping.size());
  a.key_encoding = reshape_encoding(pools.geometry.dtype, op.key.dtype);
  a.value_encoding = reshape_encoding(pools.geometry.dtype, op.value.dtype);
  a.k_scale = op.k_scale;
  a.v_scale = op.v_scale;
  return a;
}

// vLLM's slot -> (block, entry) of token t's row of `head`.
KVSIM_HD inline PoolRow reshape_target(const KvPools& pools, const ReshapeAndCacheArgs& a, int64_t slot, int32_t head) {
  const SlotLocation loc = locate_slot(slot, pools.geometry.page_divider());
  PoolRow r;
  r.block = loc.block;
  r.layer = a.layer;
  r.head = head;
  r.entry = loc.entry;
  return r;
}

// Work item (token t, KV head, kv, chunks chunk + k * stride for k < n), as
// append_paged_chunks; a negative slot writes nothing.
KVSIM_HD inline void reshape_and_cache_chunks(const KvPools& pools, const ReshapeAndCacheArgs& a, int64_t t,
                                              int32_t head, int32_t kv, int32_t chunk, int32_t n, int32_t stride) {
  const int64_t slot = a.slot_mapping[t];
  if (slot < 0) return;
  PoolRow r = reshape_target(pools, a, slot, head);
  r.kv = kv;
  write_pool_row_chunks(pools, r, chunk, n, stride, input_row(kv == 0 ? a.key : a.value, t, head),
                        kv == 0 ? a.key_encoding : a.value_encoding, kv == 0 ? a.k_scale : a.v_scale);
}

#if defined(__CUDA_ARCH__)
// reshape_and_cache_chunks of a quantizing write (fp8_divide) whose inputs
// are TIn: the input words loaded before the slot (write_quantized_chunks).
template <CacheDtype TIn>
__device__ inline void reshape_and_cache_chunks_quantized(const KvPools& pools, const ReshapeAndCacheArgs& a,
                                                          int64_t t, int32_t head, int32_t kv, int32_t chunk,
                                                          int32_t n, int32_t stride) {
  if (write_quantized_chunks<TIn>(pools, chunk, n, stride, input_row(kv == 0 ? a.key : a.value, t, head),
                                  kv == 0 ? a.key_encoding : a.value_encoding, kv == 0 ? a.k_scale : a.v_scale,
                                  [&](PoolRow& r) {
                                    const int64_t slot = a.slot_mapping[t];
                                    if (slot < 0) return false;
                                    r = reshape_target(pools, a, slot, head);
                                    r.kv = kv;
                                    return true;
                                  }))
    return;
  reshape_and_cache_chunks(pools, a, t, head, kv, chunk, n, stride);
}
#endif

// Work item (token t, KV head); a negative slot writes nothing.
KVSIM_HD inline void reshape_and_cache_token_head(const KvPools& pools, const ReshapeAndCacheArgs& a, int64_t t,
                                                  int32_t head) {
  const int64_t slot = a.slot_mapping[t];
  if (slot < 0) return;
  write_kv_rows(pools, reshape_target(pools, a, slot, head), input_row(a.key, t, head), a.key_encoding, a.k_scale,
                input_row(a.value, t, head), a.value_encoding, a.v_scale);
}

// ---------------------------------------------------------------- append_mla
struct AppendMlaArgs : AppendTargets {
  TensorView ckv, kpe;
  int32_t d_ckv = 0;
  int32_t d_kpe = 0;
  int32_t kpe_dim0 = 0;  // first pool dim of kpe: d_ckv (nibbles for nvfp4 too)
  RowEncoding ckv_encoding = RowEncoding::copy_bytes;
  RowEncoding kpe_encoding = RowEncoding::copy_bytes;
  float ckv_global_scale = 1.0f;
  float kpe_scale = 1.0f;
};

inline AppendMlaArgs make_append_mla_args(const KvPools& pools, const AppendMlaOp& op) {
  AppendMlaArgs a;
  a.targets() = make_append_targets(pools, op.layer, op);
  a.ckv = op.ckv;
  a.kpe = op.kpe;
  a.d_ckv = static_cast<int32_t>(op.ckv.shape[1]);
  a.d_kpe = static_cast<int32_t>(op.kpe.shape[1]);
  a.kpe_dim0 = a.d_ckv;
  if (pools.geometry.dtype == CacheDtype::nvfp4) {
    a.ckv_encoding = RowEncoding::nvfp4;
    a.kpe_encoding = op.kpe.dtype == CacheDtype::fp8_e4m3 ? RowEncoding::fp8_pairs_copy : RowEncoding::fp8_pairs_divide;
  }
  a.ckv_global_scale = op.ckv_global_scale;
  a.kpe_scale = op.kpe_scale;
  return a;
}

// Work item: token i's whole latent row (kv 0, head 0).
KVSIM_HD inline void append_mla_token(const KvPools& pools, const AppendMlaArgs& a, int64_t i) {
  const PoolRow r = append_target(a.table, a.layer, a.batch_indices[i], a.positions[i]);
  write_pool_row(pools, r, 0, a.d_ckv, input_row(a.ckv, i, 0), a.ckv_encoding, a.ckv_global_scale);
  write_pool_row(pools, r, a.kpe_dim0, a.d_kpe, input_row(a.kpe, i, 0), a.kpe_encoding, a.kpe_scale);
}

// The op's work items (op_list.hpp's items form): one per token.
struct AppendMlaItems {
  KvPools pools;
  AppendMlaArgs args;
  int64_t count = 0;
  KVSIM_HD void operator()(int64_t i) const { append_mla_token(pools, args, i); }
};
inline AppendMlaItems make_append_mla_items(const KvPools& pools, const AppendMlaOp& op) {
  const AppendMlaArgs args = make_append_mla_args(pools, op);
  return {pools, args, args.nnz};
}

// ---------------------------------------------------------------- indexer_k_scatter
// TensorRT-LLM flatIndexToMemoryOffset: row-major decomposition of a flat
// element index over shape [d0, d1, d2, d3], then the caller's strides.
KVSIM_HD constexpr int64_t indexer_flat_to_offset(const TensorView& cache, int64_t flat) {
  const int64_t i3 = flat % cache.shape[3];
  flat /= cache.shape[3];
  const int64_t i2 = flat % cache.shape[2];
  flat /= cache.shape[2];
  const int64_t i1 = flat % cache.shape[1];
  flat /= cache.shape[1];
  const int64_t i0 = flat;
  return i0 * cache.stride[0] + i1 * cache.stride[1] + i2 * cache.stride[2] + i3 * cache.stride[3];
}

struct IndexerKScatterArgs {
  TensorView k_fp8, k_scale, cache;
  const int64_t* slot_mapping_fp8 = nullptr;
  const int64_t* slot_mapping_scale = nullptr;
  int64_t num_tokens = 0;
  int64_t head_dim = 0;  // data bytes per token
};

inline IndexerKScatterArgs make_indexer_k_scatter_args(const IndexerKScatterOp& op) {
  IndexerKScatterArgs a;
  a.k_fp8 = op.k_fp8;
  a.k_scale = op.k_scale;
  a.cache = op.cache;
  a.slot_mapping_fp8 = op.slot_mapping_fp8.data();
  a.slot_mapping_scale = op.slot_mapping_scale.data();
  a.num_tokens = static_cast<int64_t>(op.slot_mapping_fp8.size());
  a.head_dim = op.k_fp8.rank == 2 ? op.k_fp8.shape[1] : 0;
  return a;
}

// The cache offsets of flat indices flat .. flat + n - 1 as runs: flat indices
// in one d3 row differ only in i3, so their offsets are indexer_flat_to_offset
// of the row's first one plus k * stride[3] -- one decomposition (three
// divisions) per d3 row the bytes touch, not per byte. visit_run(j, first,
// count, step) gets flat indices flat + j .. + count - 1 at first, first +
// step, ..., in order, until it returns false (then false).
KVSIM_HD_TEMPLATE
template <class VisitRun>
KVSIM_HD inline bool indexer_for_each_run(const TensorView& cache, int64_t flat, int64_t n, VisitRun&& visit_run) {
  for (int64_t j = 0; j < n;) {
    const int64_t left_in_row = cache.shape[3] - (flat + j) % cache.shape[3];
    const int64_t run = n - j < left_in_row ? n - j : left_in_row;
    if (!visit_run(j, indexer_flat_to_offset(cache, flat + j), run, cache.stride[3])) return false;
    j += run;
  }
  return true;
}

// Bytes [0, n) of row t of src to flat indices [flat, flat + n) of the cache.
KVSIM_HD inline void indexer_scatter_bytes(const TensorView& cache, int64_t flat, const TensorView& src, int64_t t,
                                           int64_t n) {
  uint8_t* out = static_cast<uint8_t*>(cache.data);
  const uint8_t* in = static_cast<const uint8_t*>(src.data);
  const bool src_run = src.stride[src.rank - 1] == 1;
  indexer_for_each_run(cache, flat, n, [&](int64_t j, int64_t first, int64_t count, int64_t step) {
    if (step == 1 && src_run) {  // both sides one run of bytes: moved as one
      copy_bytes_run(out + first, in + src.offset(t, j), count);
      return true;
    }
    for (int64_t k = 0; k < count; ++k) out[first + k * step] = in[src.offset(t, j + k)];
    return true;
  });
}

// Work item: token t's data bytes and scale bytes; skipped if either slot < 0.
KVSIM_HD inline void indexer_k_scatter_token(const IndexerKScatterArgs& a, int64_t t) {
  const int64_t data_base = a.slot_mapping_fp8[t];
  const int64_t scale_base = a.slot_mapping_scale[t];
  if (data_base < 0 || scale_base < 0) return;
  indexer_scatter_bytes(a.cache, data_base, a.k_fp8, t, a.head_dim);
  indexer_scatter_bytes(a.cache, scale_base, a.k_scale, t, kIndexerScaleBytes);
}

// The op's work items (op_list.hpp's items form): one per token; no pool.
struct IndexerKScatterItems {
  IndexerKScatterArgs args;
  int64_t count = 0;
  KVSIM_HD void operator()(int64_t t) const { indexer_k_scatter_token(args, t); }
};
inline IndexerKScatterItems make_indexer_k_scatter_items(const KvPools&, const IndexerKScatterOp& op) {
  const IndexerKScatterArgs args = make_indexer_k_scatter_args(op);
  return {args, args.num_tokens};
}

}  // namespace kvsim
