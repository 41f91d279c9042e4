// qkv_preprocess_write — TensorRT-LLM applyBiasRopeUpdateKVCache (contract §5.3).
//
// What one step does, per sequence b (tokens packed at cumsum(seq_lens)[b],
// TensorRT-LLM's remove_padding):
//
//   past      = cache_len[b] - seq_len[b]          (tokens already in the pool)
//   position  = past + t                           (token t of this chunk)
//   rotary    = position + position_offsets[b]     (optional offset)
//
//   fused qkv row:  [ Q head 0 .. Hq-1 | K head 0 .. H-1 | V head 0 .. H-1 ], D each
//
//   x[d] = float(qkv[row, col]) (+ float(bias[col]))    one fp32 add, one rounding
//   Q, K: x[0 .. rotary_dim) rotated by core rope_rotate() with cos_sin row
//         `rotary` (dims >= rotary_dim pass through); V is never rotated
//   Q  -> q_out[row, q_head, d], rounded once to q_out's dtype (store_float)
//   K/V -> slot = window.cache_token(position), page = slot / P (PageDivider),
//          block = block_table[b][page] (a BlockRef), entry = slot % P,
//          element offset = element_offset(strides, block, layer, kv, head, entry, d)
//
// Cache conversions (TensorRT-LLM convention, encode scales multiply):
//   fp32/fp16/bf16 cache: dtype must equal the input dtype; value rounded to it
//   fp8 e4m3 / e5m2:      f32_to_e4m3/e5m2(x * scale_orig_quant[1 (K) | 2 (V)], satfinite)
//                         (e5m2 follows the e4m3 rule; TensorRT-LLM itself only has e4m3)
//   int8:                 f32_to_int8(x * scale_orig_quant[1 | 2])
//   nvfp4:                16-element groups, nvfp4_quantize16 with the decode scale
//                         g = nvfp4_global_scale[1] (K) | [2] (V); scale byte to the
//                         scale pool at scale_offset()
// scale_orig_quant[0] and nvfp4_global_scale[0] (Q) are unused: Q leaves in a
// float dtype.
//
// Sliding window (contract §5.10): like TensorRT-LLM, only the tokens that are
// still in the ring after this step reach the cache: sinks (position < S)
// and position >= cache_len - cyclic_len. Those map to distinct slots, so
// every cache byte has exactly one writer even when a chunk wraps the ring.
// Q is produced for every token.
//
// Work items: qkv_preprocess_chunk writes 4 dims (16 for nvfp4) of one fused
// head of one row (Q to q_out, K/V to the cache); qkv_zero_v_tail_head zeroes one
// sequence's V tail for one kv head. Every output byte has one writer. The
// narrow item qkv_preprocess_token_head (row, kv head h) runs the chunks of
// the q heads [h*G, (h+1)*G), G = Hq / H, of K and V of head h, then the tail.
//
// V-tail zeroing (zeroPagedVCacheTail): paged attention reads whole pages of
// V and 0 * NaN = NaN, so in a context step (context_phase) with zero_v_tail
// the V rows of this layer that no token occupies but a whole-page reader
// meets are zeroed, for every kv head and dim:
//   (a) the tail: rows after the sequence's highest occupied cache slot
//       (window.cache_length(cache_len) - 1), up to the end of its block.
//       Without a window, or before the ring wraps, that slot is the one of
//       token cache_len - 1: TensorRT-LLM's rule. After the ring wraps, the
//       slots after the newest token hold older tokens still inside the
//       window and are kept; the rows zeroed are the ones past the ring's end.
//   (b) the bubble: with a window whose sinks leave a bubble and once the
//       sequence is past its sinks (cache_len > S), slots [S, S + bubble) of
//       the last sink block, which no token ever occupies.
// Both sets depend only on cache_len, so prefilling in chunks leaves the
// same bytes as one chunk (a chunk that ends inside the sinks zeroes its
// block's tail, which later chunks overwrite or (b) zeroes again).
// "Zero" is the all-zero-bits code, which is +0.0 in every cache dtype (fp8
// 0x00, int8 0, e2m1 nibble 0) plus, for nvfp4, scale byte 0x00 (decodes to
// 0 * 0 * g = 0). The writer is the work item of the chunk's last token
// (t = seq_len - 1) for each kv head, after its own K/V; a sequence with
// seq_len = 0 writes nothing and zeroes nothing. Quantized caches are zeroed
// too (TensorRT-LLM zeroes only when the cache dtype equals the input dtype;
// kvsim zeroes every dtype so a whole-page reader never meets a stale code).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "../cache_io.hpp"
#include "../nvfp4_rows.hpp"
#include "../page_table.hpp"
#include "../rope.hpp"
#include "../tensor.hpp"
#include "../window.hpp"

namespace kvsim {

struct QkvPreprocessOp {
  int32_t layer = 0;
  int32_t num_q_heads = 1;
  TensorView qkv;     // [num_tokens, (Hq + 2H) * D], fp32/fp16/bf16, any strides
  TensorView bias;    // optional [(Hq + 2H) * D], same dtype as qkv
  TensorView q_out;   // [num_tokens, Hq, D], fp32/fp16/bf16 (usually qkv's dtype); must not overlap qkv or the pools
  RopeStyle rope_style = RopeStyle::none;  // none requires rotary_dim = 0
  int32_t rotary_dim = 0;                  // even, 2..D when rope_style != none
  TensorView cos_sin;  // [max_position, rotary_dim] fp32 (rows contiguous), from build_rope_table
  std::span<const int32_t> seq_lens;          // new tokens per sequence
  std::span<const int32_t> cache_lens;        // tokens per sequence after this step
  std::span<const int32_t> position_offsets;  // optional, per sequence; shifts the rotary position only
  std::span<const int32_t> block_table;       // dense [batch, max_blocks_per_seq], -1 padded
  int32_t max_blocks_per_seq = 0;
  WindowMapping window;  // disabled (window = 0) or made by WindowMapping::make with P of the pool
  bool context_phase = true;
  bool zero_v_tail = true;
  float scale_orig_quant[3] = {1.0f, 1.0f, 1.0f};    // [Q, K, V] fp8/int8 encode scales (finite, > 0)
  float nvfp4_global_scale[3] = {1.0f, 1.0f, 1.0f};  // [Q, K, V] nvfp4 decode scales g (finite, > 0)
};

// Largest head_dim the op accepts: a work item holds one head in registers
// (a local float[kQkvMaxHeadDim]).
inline constexpr int32_t kQkvMaxHeadDim = 512;

// ---------------------------------------------------------------- work items
// Everything a work item needs, as raw pointers and scalars (trivially
// copyable, so a kernel takes it by value). Built on the host by
// make_qkv_preprocess_args(); a device backend swaps in device pointers.
struct QkvPreprocessArgs {
  int32_t layer = 0;
  int32_t num_q_heads = 1;
  int32_t kv_heads = 1;
  int32_t head_dim = 0;
  TensorView qkv, bias, q_out;
  RopeStyle rope_style = RopeStyle::none;
  int32_t rotary_dim = 0;
  const float* cos_sin = nullptr;  // row r starts at cos_sin + r * cos_sin_row_stride
  int64_t cos_sin_row_stride = 0;
  const int32_t* seq_lens = nullptr;
  const int32_t* cache_lens = nullptr;
  const int32_t* position_offsets = nullptr;  // nullptr: no offsets
  DenseBlockTable table;
  WindowMapping window;
  PageDivider page;
  bool zero_v_tail = false;  // context_phase && zero_v_tail
  float k_encode_scale = 1.0f, v_encode_scale = 1.0f;  // fp8 / int8
  float k_global_scale = 1.0f, v_global_scale = 1.0f;  // nvfp4
};

inline QkvPreprocessArgs make_qkv_preprocess_args(const KvPools& pools, const QkvPreprocessOp& op) {
  const PoolGeometry& g = pools.geometry;
  QkvPreprocessArgs a;
  a.layer = op.layer;
  a.num_q_heads = op.num_q_heads;
  a.kv_heads = g.kv_heads;
  a.head_dim = g.head_dim;
  a.qkv = op.qkv;
  a.bias = op.bias;
  a.q_out = op.q_out;
  a.rope_style = op.rope_style;
  a.rotary_dim = op.rope_style == RopeStyle::none ? 0 : op.rotary_dim;
  a.cos_sin = static_cast<const float*>(op.cos_sin.data);
  a.cos_sin_row_stride = op.cos_sin.stride[0];
  a.seq_lens = op.seq_lens.data();
  a.cache_lens = op.cache_lens.data();
  a.position_offsets = op.position_offsets.empty() ? nullptr : op.position_offsets.data();
  a.table = DenseBlockTable{op.block_table.data(), static_cast<int32_t>(op.seq_lens.size()), op.max_blocks_per_seq};
  a.window = op.window;
  a.page = g.page_divider();
  a.zero_v_tail = op.context_phase && op.zero_v_tail;
  a.k_encode_scale = op.scale_orig_quant[1];
  a.v_encode_scale = op.scale_orig_quant[2];
  a.k_global_scale = op.nvfp4_global_scale[1];
  a.v_global_scale = op.nvfp4_global_scale[2];
  return a;
}

// Whether the token at `position` of a sequence that holds cache_len tokens
// after this step is written to the cache (TensorRT-LLM's valid_kv_cache_pos:
// sinks, and the last cyclic_len tokens; without a window, every token).
KVSIM_HD constexpr bool qkv_token_reaches_cache(const WindowMapping& w, int64_t cache_len, int64_t position) {
  if (!w.enabled() || w.is_sink(position)) return true;
  return position >= cache_len - w.cyclic_len;
}

// The V rows a context step zeroes (header comment), as two runs of cache
// slots [begin, end), each inside one block; an empty run has begin == end.
struct QkvVTail {
  int64_t tail_begin, tail_end;      // (a) after the highest occupied slot
  int64_t bubble_begin, bubble_end;  // (b) the window's bubble
};
KVSIM_HD constexpr QkvVTail qkv_v_tail(const WindowMapping& w, PageDivider page, int64_t cache_len) {
  QkvVTail z{0, 0, 0, 0};
  if (cache_len < 1) return z;
  const int64_t last_slot = w.cache_length(cache_len) - 1;
  z.tail_begin = last_slot + 1;
  z.tail_end = (page.div(last_slot) + 1) * page.page_size;
  if (w.enabled() && w.bubble > 0 && cache_len > w.sinks) {
    z.bubble_begin = w.sinks;
    z.bubble_end = static_cast<int64_t>(w.sinks) + w.bubble;
  }
  return z;
}

// float(qkv[row, col0 + e]) (+ float(bias[col0 + e])): one fp32 add, one rounding.
KVSIM_HD inline float qkv_input(const QkvPreprocessArgs& a, int64_t row, int64_t col0, int32_t e) {
  float v = load_float(a.qkv.data, a.qkv.dtype, a.qkv.offset(row, col0 + e));
  if (!a.bias.empty()) v = v + load_float(a.bias.data, a.bias.dtype, a.bias.offset(col0 + e));
  return v;
}

// One rotated dim from its own value and its pair partner's, rope_rotate's
// products and add in its operand order: first of the pair a*c - b*s,
// second b*c + a*s.
KVSIM_HD inline float qkv_rotate_dim(float own, float partner, float c, float s, bool first) {
  const float own_c = own * c, partner_s = partner * s;
  return first ? own_c - partner_s : own_c + partner_s;
}

// out[0..count) = dims [dim0, dim0 + count) of fused head `fused_head` of row
// `row` after bias and RoPE (count <= kMax): the values rope_rotate leaves in
// the head. Each rotated dim comes from its own value and its pair partner's
// with rope_rotate's products and add, in its operand order:
//   first of the pair (a):  a*c - b*s     second (b):  b*c + a*s
// Own values, partners and the rotation run as separate loops over the
// chunk, so a CPU vectorizes them; no value depends on the chunking.
template <int kMax>
KVSIM_HD inline void qkv_head_dims(const QkvPreprocessArgs& a, int64_t row, int32_t fused_head, int32_t dim0,
                                   int32_t count, const float* cos_sin_row, float* out) {
  const int64_t col0 = static_cast<int64_t>(fused_head) * a.head_dim;
  KVSIM_UNROLL
  for (int32_t d = 0; d < kMax; ++d)
    if (d < count) out[d] = qkv_input(a, row, col0, dim0 + d);
  if (cos_sin_row == nullptr) return;
  const int32_t half = a.rotary_dim / 2;
  const bool gptj = a.rope_style == RopeStyle::gptj;
  const int32_t rotated = a.rotary_dim - dim0 < count ? (a.rotary_dim - dim0 > 0 ? a.rotary_dim - dim0 : 0) : count;
  float partner[kMax];
  KVSIM_UNROLL
  for (int32_t d = 0; d < kMax; ++d) {
    if (d >= rotated) break;
    const int32_t e = dim0 + d;
    const int32_t other = gptj ? (e ^ 1) : (e < half ? e + half : e - half);
    partner[d] = qkv_input(a, row, col0, other);
  }
  KVSIM_UNROLL
  for (int32_t d = 0; d < kMax; ++d) {
    if (d >= rotated) break;
    const int32_t e = dim0 + d;
    const bool first = gptj ? (e % 2 == 0) : e < half;
    const int32_t i = gptj ? e / 2 : (first ? e : e - half);
    out[d] = qkv_rotate_dim(out[d], partner[d], cos_sin_row[i], cos_sin_row[half + i], first);
  }
}

// The code of x in a one-byte cache dtype T (fp8 e4m3 / e5m2, int8): x times
// the encode scale, then the codec's rounding (fp8 satfinite).
template <CacheDtype T>
KVSIM_HD inline uint8_t qkv_cache_code(float x, float encode_scale) {
  static_assert(bytes_per_element(T) == 1, "one-byte codes only");
  if constexpr (T == CacheDtype::fp8_e4m3)
    return codec::f32_to_e4m3(x * encode_scale, codec::Saturation::finite);
  else if constexpr (T == CacheDtype::fp8_e5m2)
    return codec::f32_to_e5m2(x * encode_scale, codec::Saturation::finite);
  else
    return static_cast<uint8_t>(codec::f32_to_int8(x * encode_scale));
}

// qkv_cache_code of two values (x0 in the low byte): fp8 by the pair codec
// (one conversion instruction on the device: f32x2_to_fp8x2_satfinite), int8
// one value at a time.
template <CacheDtype T>
KVSIM_HD inline uint16_t qkv_cache_code_pair(float x0, float x1, float encode_scale) {
  if constexpr (T == CacheDtype::fp8_e4m3 || T == CacheDtype::fp8_e5m2)
    return codec::f32x2_to_fp8x2_satfinite<T == CacheDtype::fp8_e5m2>(x0 * encode_scale, x1 * encode_scale);
  else
    return static_cast<uint16_t>(qkv_cache_code<T>(x0, encode_scale) | (qkv_cache_code<T>(x1, encode_scale) << 8));
}

// nvfp4 dims [dim0, dim0 + count) (multiples of 16) of one head's cache row
// from x[0..count): each block quantized (nvfp4_quantize_blocks, kNvfp4RowBlocks
// at a time: nvfp4_quantize16 per block; on a host, by nvfp4_rows, which
// gives the same bytes: nvfp4_rows.hpp), its scale byte
// stored at scale_offset, its 8 packed bytes handed to store(d0, packed) --
// nibble by nibble through element_offset, or as 8 bytes where the row is
// one run from a whole byte; on a host, that run may come as packed_run, and
// the quantizer writes the row's bytes there itself.
template <class StorePacked, class Nvfp4Rows = CoreNvfp4Rows>
KVSIM_HD inline void qkv_store_nvfp4_blocks(const KvPools& pools, int32_t layer, int64_t block, int32_t entry,
                                            int32_t kv, int32_t head, int32_t dim0, int32_t count, const float* x,
                                            float global_scale, StorePacked store,
                                            [[maybe_unused]] Nvfp4Rows nvfp4_rows = {},
                                            [[maybe_unused]] uint8_t* packed_run = nullptr) {
  uint8_t* scales = pools.scale_bytes(PoolKind::primary);
  const PoolStrides& ss = pools.scale_strides[static_cast<int>(PoolKind::primary)];
  constexpr int kBlocks = codec::kNvfp4RowBlocks, kElems = codec::kNvfp4BlockElems;
  if constexpr (kBlocks == 1) {  // the device: a block at a time, no array of a run-time length (registers)
    for (int32_t d0 = 0; d0 < count; d0 += kElems) {
      uint8_t packed[kElems / 2];
      const uint8_t scale_code = codec::nvfp4_quantize16(x + d0, global_scale, packed);
      store(d0, packed);
      scales[scale_offset(ss, block, layer, kv, head, entry, dim0 + d0)] = scale_code;
    }
  } else {
    // kNvfp4CallBlocks blocks a call; the scale bytes straight into the pool
    // where they are one run; packed_run, where given, takes the packed bytes
    // of the row as one run from a whole byte (else store() per block).
    for (int32_t g0 = 0; g0 < count; g0 += kNvfp4CallBlocks * kElems) {
      const int32_t blocks = (count - g0 < kNvfp4CallBlocks * kElems ? count - g0 : kNvfp4CallBlocks * kElems) / kElems;
      uint8_t packed[kNvfp4CallBlocks * kElems / 2], scale_codes[kNvfp4CallBlocks];
      const bool scale_run = dims_contiguous(ss.inner[kv], (dim0 + g0) / kElems, blocks);
      Nvfp4Row row;
      row.x = x + g0;
      row.global_scale = global_scale;
      row.packed = packed_run ? packed_run + g0 / 2 : packed;
      row.scales = scale_run ? scales + scale_offset(ss, block, layer, kv, head, entry, dim0 + g0) : scale_codes;
      nvfp4_rows(&row, 1, blocks);
      for (int32_t b = 0; b < blocks; ++b) {
        const int32_t d0 = g0 + b * kElems;
        if (!packed_run) store(d0, packed + b * kElems / 2);
        if (!scale_run) scales[scale_offset(ss, block, layer, kv, head, entry, dim0 + d0)] = scale_codes[b];
      }
    }
  }
}

// Dims [dim0, dim0 + count) of one head's row of this layer's K (kv = 0) or V
// (kv = 1) into the primary pool at (block, entry), from x[0..count),
// converted per the cache dtype (header comment). nvfp4: dim0 and count are
// multiples of 16.
template <int kMax>
KVSIM_HD inline void qkv_store_cache_dims(const KvPools& pools, int32_t layer, int64_t block, int32_t entry, int32_t kv,
                                          int32_t head, int32_t dim0, int32_t count, const float* x,
                                          float encode_scale, float global_scale) {
  const PoolGeometry& g = pools.geometry;
  const PoolStrides& s = pools.strides[static_cast<int>(PoolKind::primary)];
  uint8_t* pool = pools.bytes(PoolKind::primary);
  auto at = [&](int32_t d) { return element_offset(s, block, layer, kv, head, entry, dim0 + d); };
  switch (g.dtype) {
    case CacheDtype::fp32:
    case CacheDtype::fp16:
    case CacheDtype::bf16:
      KVSIM_UNROLL
      for (int32_t d = 0; d < kMax; ++d)
        if (d < count) store_float(pool, g.dtype, at(d), x[d]);
      break;
    case CacheDtype::fp8_e4m3:
      KVSIM_UNROLL
      for (int32_t d = 0; d < kMax; ++d)
        if (d < count) store_byte(pool, at(d), qkv_cache_code<CacheDtype::fp8_e4m3>(x[d], encode_scale));
      break;
    case CacheDtype::fp8_e5m2:
      KVSIM_UNROLL
      for (int32_t d = 0; d < kMax; ++d)
        if (d < count) store_byte(pool, at(d), qkv_cache_code<CacheDtype::fp8_e5m2>(x[d], encode_scale));
      break;
    case CacheDtype::int8:
      KVSIM_UNROLL
      for (int32_t d = 0; d < kMax; ++d)
        if (d < count) store_byte(pool, at(d), qkv_cache_code<CacheDtype::int8>(x[d], encode_scale));
      break;
    case CacheDtype::nvfp4:
      qkv_store_nvfp4_blocks(pools, layer, block, entry, kv, head, dim0, count, x, global_scale,
                             [&](int32_t d0, const uint8_t* packed) {
                               for (int32_t i = 0; i < codec::kNvfp4BlockElems; ++i)
                                 store_nibble(pool, at(d0 + i), codec::nibble_at(packed, i));
                             });
      break;
  }
}

// The all-zero-bits code (+0.0) in one head's row of the primary pool, and
// zero scale bytes for nvfp4.
KVSIM_HD inline void qkv_zero_cache_row(const KvPools& pools, int32_t layer, int64_t block, int32_t entry, int32_t kv,
                                        int32_t head) {
  const PoolGeometry& g = pools.geometry;
  const PoolStrides& s = pools.strides[static_cast<int>(PoolKind::primary)];
  uint8_t* pool = pools.bytes(PoolKind::primary);
  const int32_t D = g.head_dim;
  if (g.dtype == CacheDtype::nvfp4) {
    uint8_t* scales = pools.scale_bytes(PoolKind::primary);
    const PoolStrides& ss = pools.scale_strides[static_cast<int>(PoolKind::primary)];
    for (int32_t d = 0; d < D; ++d) store_nibble(pool, element_offset(s, block, layer, kv, head, entry, d), 0);
    for (int32_t d0 = 0; d0 < D; d0 += codec::kNvfp4BlockElems) scales[scale_offset(ss, block, layer, kv, head, entry, d0)] = 0;
    return;
  }
  const int bytes = bytes_per_element(g.dtype);
  for (int32_t d = 0; d < D; ++d) {
    uint8_t* e = pool + element_offset(s, block, layer, kv, head, entry, d) * bytes;
    for (int i = 0; i < bytes; ++i) e[i] = 0;
  }
}

// Dims of one chunk of a head, the unit a wide backend gives one thread: 4
// (a warp then reads and writes 128 consecutive dims), 16 for an nvfp4 cache
// (one scale block); the last chunk of a head may be short.
KVSIM_HD constexpr int32_t qkv_chunk_elements(CacheDtype cache) { return cache == CacheDtype::nvfp4 ? codec::kNvfp4BlockElems : 4; }
KVSIM_HD constexpr int32_t qkv_chunks_per_head(int32_t head_dim, CacheDtype cache) {
  return (head_dim + qkv_chunk_elements(cache) - 1) / qkv_chunk_elements(cache);
}

// The cache row that K or V fused head `fused_head` (>= num_q_heads) of the
// token at `position` of sequence b writes: kv (0 K, 1 V), kv head, and the
// block and entry of the token's slot under the window.
struct QkvCacheRow {
  int64_t block;
  int32_t entry, kv, head;
};
KVSIM_HD inline QkvCacheRow qkv_cache_row(const QkvPreprocessArgs& a, int32_t b, int64_t position, int32_t fused_head) {
  QkvCacheRow r;
  r.kv = fused_head >= a.num_q_heads + a.kv_heads ? 1 : 0;
  r.head = fused_head - a.num_q_heads - r.kv * a.kv_heads;
  const int64_t slot = a.window.cache_token(position);
  r.block = a.table.block_at(b, a.page.div(slot)).block();
  r.entry = a.page.mod(slot);
  return r;
}

// Dims [dim0, dim0 + count) (count <= kMax) of fused head `fused_head` of
// token t of sequence b (fused qkv row `row`): fused heads [0, Hq) are Q
// (written to q_out), [Hq, Hq + H) K and [Hq + H, Hq + 2H) V (written to the
// cache when the token reaches it). nvfp4: dim0 and count multiples of 16.
template <int kMax>
KVSIM_HD inline void qkv_preprocess_dims(const KvPools& pools, const QkvPreprocessArgs& a, int32_t b, int32_t t,
                                         int64_t row, int32_t fused_head, int32_t dim0, int32_t count) {
  const int64_t cache_len = a.cache_lens[b];
  const int64_t position = cache_len - a.seq_lens[b] + t;
  const bool is_q = fused_head < a.num_q_heads;
  const bool is_v = fused_head >= a.num_q_heads + a.kv_heads;
  if (!is_q && !qkv_token_reaches_cache(a.window, cache_len, position)) return;
  // V is never rotated (TensorRT-LLM rotates Q and K).
  const int64_t rotary_position = position + (a.position_offsets ? a.position_offsets[b] : 0);
  const float* cos_sin_row =
      a.rope_style != RopeStyle::none && !is_v ? a.cos_sin + rotary_position * a.cos_sin_row_stride : nullptr;
  float x[kMax];
  qkv_head_dims<kMax>(a, row, fused_head, dim0, count, cos_sin_row, x);
  if (is_q) {
    KVSIM_UNROLL
    for (int32_t d = 0; d < kMax; ++d)
      if (d < count) store_float(a.q_out.data, a.q_out.dtype, a.q_out.offset(row, fused_head, dim0 + d), x[d]);
    return;
  }
  const QkvCacheRow r = qkv_cache_row(a, b, position, fused_head);
  qkv_store_cache_dims<kMax>(pools, a.layer, r.block, r.entry, r.kv, r.head, dim0, count, x,
                             is_v ? a.v_encode_scale : a.k_encode_scale, is_v ? a.v_global_scale : a.k_global_scale);
}

// Work item of a wide backend: chunk `chunk` of a fused head (qkv_chunk_elements
// dims; kMax >= that, a backend may instantiate the exact chunk size).
template <int kMax = 16>
KVSIM_HD inline void qkv_preprocess_chunk(const KvPools& pools, const QkvPreprocessArgs& a, int32_t b, int32_t t,
                                          int64_t row, int32_t fused_head, int32_t chunk) {
  const int32_t c = qkv_chunk_elements(pools.geometry.dtype);
  const int32_t dim0 = chunk * c;
  qkv_preprocess_dims<kMax>(pools, a, b, t, row, fused_head, dim0, a.head_dim - dim0 < c ? a.head_dim - dim0 : c);
}

// ---------------------------------------------------------------- the device's word path
// A chunk of qkv_word_elements dims moved as words: 8 dims (one 16-byte word
// of inputs; one 16-byte word of 2-byte codes, or 8 bytes of one-byte codes),
// or 16 for nvfp4 (one scale block: 8 bytes of nibbles and its scale byte).
// The inputs are 2-byte floats, so a chunk's own values, bias and NeoX
// partner are one or two 16-byte loads each instead of a load and a dtype
// switch per element. One-byte caches took 16 dims until session 26: ~101
// registers, 2 CTAs per SM, latency-bound by ncu (docs/benchmarks.md).
KVSIM_HD constexpr int32_t qkv_word_elements(CacheDtype cache) { return cache == CacheDtype::nvfp4 ? 16 : 8; }

// The chunk size of qkv_preprocess_word for an op (0: it does not apply and
// every chunk takes qkv_preprocess_chunk): fp16/bf16 input, Q out and bias
// (the input's dtype, unit dim stride), a cache other than fp32, head_dim a
// multiple of the chunk, and a rotary_dim for which each chunk is wholly
// rotated or not and its NeoX partner is one whole chunk. Alignment and the
// pool's runs are checked per chunk on the device.
KVSIM_HD constexpr int32_t qkv_word_path(const QkvPreprocessArgs& a, CacheDtype cache) {
  const CacheDtype in = a.qkv.dtype;
  if ((in != CacheDtype::fp16 && in != CacheDtype::bf16) || cache == CacheDtype::fp32) return 0;
  if (a.q_out.dtype != in || (!a.bias.empty() && a.bias.dtype != in)) return 0;
  if (a.qkv.stride[1] != 1 || a.q_out.stride[2] != 1 || (!a.bias.empty() && a.bias.stride[0] != 1)) return 0;
  const int32_t n = qkv_word_elements(cache);
  if (a.head_dim % n != 0) return 0;
  if (a.rope_style == RopeStyle::neox && (a.rotary_dim / 2) % n != 0) return 0;
  if (a.rope_style == RopeStyle::gptj && a.rotary_dim % n != 0) return 0;
  return n;
}

#if defined(__CUDA_ARCH__)
// Those words' values as fp32 (load_float of TIn per element), plus the
// bias words' when there is a bias: qkv_input's values.
template <CacheDtype TIn, int kN>
__device__ inline void qkv_word_values(const uint4* w, const uint4* bias_w, float* x) {
  uint16_t h[kN];
  memcpy(h, w, sizeof(h));
#pragma unroll
  for (int d = 0; d < kN; ++d) x[d] = load_float(h, TIn, d);
  if (bias_w == nullptr) return;
  memcpy(h, bias_w, sizeof(h));
#pragma unroll
  for (int d = 0; d < kN; ++d) x[d] = x[d] + load_float(h, TIn, d);
}

// kCount consecutive fp32 values from p (16-byte aligned) by float4 loads.
template <int kCount>
__device__ inline void qkv_load_floats4(const float* p, float* v) {
#pragma unroll
  for (int k = 0; k < kCount; k += 4) {
    const float4 f = *reinterpret_cast<const float4*>(p + k);
    v[k] = f.x, v[k + 1] = f.y, v[k + 2] = f.z, v[k + 3] = f.w;
  }
}

// qkv_preprocess_dims(dim0, count = kN) for an op qkv_word_path accepted,
// with the input dtype TIn and the cache dtype TCache fixed (a 2-byte cache
// is TIn, as validation requires): the same values in the same order
// (qkv_input, qkv_rotate_dim, store_float / qkv_cache_code /
// nvfp4_quantize16) and the same bytes, moved by words. A chunk whose
// addresses are not aligned, or whose pool dims are not one run (split-x V),
// takes qkv_preprocess_dims itself before anything is stored.
template <CacheDtype TIn, CacheDtype TCache>
__device__ inline void qkv_preprocess_word(const KvPools& pools, const QkvPreprocessArgs& a, int32_t b, int32_t t,
                                           int64_t row, int32_t fused_head, int32_t dim0) {
  static_assert(bits_per_element(TIn) == 16 && (bits_per_element(TCache) != 16 || TCache == TIn));
  constexpr int kN = qkv_word_elements(TCache);
  constexpr bool kNvfp4 = TCache == CacheDtype::nvfp4;
  // One store of the chunk's codes: 16 bytes (2-byte codes), 8 (one-byte
  // codes, or nvfp4's nibbles beside the scale byte).
  constexpr int kStoreBytes = kNvfp4 ? 8 : kN * bytes_per_element(TCache);
  const bool is_q = fused_head < a.num_q_heads;
  const bool is_v = fused_head >= a.num_q_heads + a.kv_heads;
  const int32_t col0 = fused_head * a.head_dim;
  const uint8_t* row_in = static_cast<const uint8_t*>(a.qkv.data) + a.qkv.offset(row) * 2;
  const uint8_t* bias = a.bias.empty() ? nullptr : static_cast<const uint8_t*>(a.bias.data);
  const bool rotated = a.rope_style != RopeStyle::none && !is_v && dim0 < a.rotary_dim;  // then the whole chunk is
  const bool neox = a.rope_style == RopeStyle::neox;
  const int32_t half = a.rotary_dim / 2;
  const bool neox_first = dim0 < half;
  const int32_t partner_col = col0 + (neox_first ? dim0 + half : dim0 - half);
  // The input words first: their addresses need no table, so they are in
  // flight while the sequence's lengths and block are looked up.
  uintptr_t align = reinterpret_cast<uintptr_t>(row_in + (col0 + dim0) * 2) |
                    (bias ? reinterpret_cast<uintptr_t>(bias + (col0 + dim0) * 2) : 0) |
                    (rotated && neox ? reinterpret_cast<uintptr_t>(row_in + partner_col * 2) |
                                           (bias ? reinterpret_cast<uintptr_t>(bias + partner_col * 2) : 0)
                                     : 0);
  uint4 own[kN / 8], own_bias[kN / 8], partner_in[kN / 8], partner_bias[kN / 8];
  if ((align & 15) == 0) {
    load_words16<kN / 8>(row_in + (col0 + dim0) * 2, own);
    if (bias) load_words16<kN / 8>(bias + (col0 + dim0) * 2, own_bias);
    if (rotated && neox) {
      load_words16<kN / 8>(row_in + partner_col * 2, partner_in);
      if (bias) load_words16<kN / 8>(bias + partner_col * 2, partner_bias);
    }
  }
  const int64_t cache_len = a.cache_lens[b];
  const int64_t position = cache_len - a.seq_lens[b] + t;
  if (!is_q && !qkv_token_reaches_cache(a.window, cache_len, position)) return;
  // The chunk's cos and sin: dims i0 .. of the table row (NeoX), or
  // dim0 / 2 .. for GPT-J's pairs.
  const int32_t i0 = !neox ? dim0 / 2 : (neox_first ? dim0 : dim0 - half);
  const float* cs = nullptr;
  if (rotated) {
    cs = a.cos_sin + (position + (a.position_offsets ? a.position_offsets[b] : 0)) * a.cos_sin_row_stride;
    align |= reinterpret_cast<uintptr_t>(cs + i0) | reinterpret_cast<uintptr_t>(cs + half + i0);
  }
  // Where the chunk goes: Q's row of q_out, or the cache row's run of codes.
  uint8_t* dst = nullptr;
  uint8_t* scale_dst = nullptr;
  if (is_q) {
    dst = static_cast<uint8_t*>(a.q_out.data) + a.q_out.offset(row, fused_head, dim0) * 2;
    align |= reinterpret_cast<uintptr_t>(dst);
  } else {
    const QkvCacheRow r = qkv_cache_row(a, b, position, fused_head);
    const PoolStrides& s = pools.strides[static_cast<int>(PoolKind::primary)];
    const int64_t e0 = element_offset(s, r.block, a.layer, r.kv, r.head, r.entry, dim0);
    if (!dims_contiguous(s.inner[r.kv], dim0, kN) || (kNvfp4 && (e0 & 1) != 0)) align |= 1;
    dst = pools.bytes(PoolKind::primary) + (kNvfp4 ? e0 >> 1 : e0 * bytes_per_element(TCache));
    align |= reinterpret_cast<uintptr_t>(dst) & (kStoreBytes - 1);
    if constexpr (kNvfp4)
      scale_dst = pools.scale_bytes(PoolKind::primary) +
                  scale_offset(pools.scale_strides[static_cast<int>(PoolKind::primary)], r.block, a.layer, r.kv,
                               r.head, r.entry, dim0);
  }
  if ((align & 15) != 0) return qkv_preprocess_dims<kN>(pools, a, b, t, row, fused_head, dim0, kN);

  float x[kN];
  qkv_word_values<TIn, kN>(own, bias ? own_bias : nullptr, x);
  if (rotated) {
    float partner[kN];
    if (!neox) {  // GPT-J: pairs (2i, 2i + 1) inside the chunk
      float c[kN / 2], sn[kN / 2];
      qkv_load_floats4<kN / 2>(cs + i0, c);
      qkv_load_floats4<kN / 2>(cs + half + i0, sn);
#pragma unroll
      for (int d = 0; d < kN; ++d) partner[d] = x[d ^ 1];
#pragma unroll
      for (int d = 0; d < kN; ++d) x[d] = qkv_rotate_dim(x[d], partner[d], c[d / 2], sn[d / 2], d % 2 == 0);
    } else {  // NeoX: the partner chunk is half a rotary row away
      float c[kN], sn[kN];
      qkv_load_floats4<kN>(cs + i0, c);
      qkv_load_floats4<kN>(cs + half + i0, sn);
      qkv_word_values<TIn, kN>(partner_in, bias ? partner_bias : nullptr, partner);
#pragma unroll
      for (int d = 0; d < kN; ++d) x[d] = qkv_rotate_dim(x[d], partner[d], c[d], sn[d], neox_first);
    }
  }
  if (is_q || bits_per_element(TCache) == 16) {  // 2-byte floats: Q, or a cache of the input's dtype
    uint16_t h[kN];
#pragma unroll
    for (int d = 0; d < kN; ++d) store_float(h, TIn, d, x[d]);
    store_bytes_by_words<sizeof(h)>(dst, h);
    return;
  }
  if constexpr (kNvfp4) {
    uint8_t packed[codec::kNvfp4BlockElems / 2];
    const uint8_t scale_code = codec::nvfp4_quantize16(x, is_v ? a.v_global_scale : a.k_global_scale, packed);
    store_bytes_by_words<sizeof(packed)>(dst, packed);
    *scale_dst = scale_code;
  } else if constexpr (bytes_per_element(TCache) == 1) {
    const float scale = is_v ? a.v_encode_scale : a.k_encode_scale;
    uint16_t codes[kN / 2];
#pragma unroll
    for (int d = 0; d < kN; d += 2) codes[d / 2] = qkv_cache_code_pair<TCache>(x[d], x[d + 1], scale);
    store_bytes_by_words<sizeof(codes)>(dst, codes);
  }
}
#endif

// Work item (sequence b, kv head) of a context step with zero_v_tail: the
// zeroed V rows of the chunk's last token (header comment).
KVSIM_HD inline void qkv_zero_v_tail_head(const KvPools& pools, const QkvPreprocessArgs& a, int32_t b, int32_t kv_head) {
  if (!a.zero_v_tail || a.seq_lens[b] < 1) return;
  const QkvVTail z = qkv_v_tail(a.window, a.page, a.cache_lens[b]);
  for (int64_t slot = z.tail_begin; slot < z.tail_end; ++slot)
    qkv_zero_cache_row(pools, a.layer, a.table.block_at(b, a.page.div(slot)).block(), a.page.mod(slot), 1, kv_head);
  for (int64_t slot = z.bubble_begin; slot < z.bubble_end; ++slot)
    qkv_zero_cache_row(pools, a.layer, a.table.block_at(b, a.page.div(slot)).block(), a.page.mod(slot), 1, kv_head);
}

// Fused head `fused_head` of token t in chunks of kChunk dims (the last one
// may be short; nvfp4: kChunk a multiple of 16). No value depends on the
// chunking; a CPU runs the chunk's loops at their exact length.
template <int kChunk>
KVSIM_HD inline void qkv_preprocess_head(const KvPools& pools, const QkvPreprocessArgs& a, int32_t b, int32_t t,
                                         int64_t row, int32_t fused_head) {
  for (int32_t d0 = 0; d0 < a.head_dim; d0 += kChunk)
    qkv_preprocess_dims<kChunk>(pools, a, b, t, row, fused_head, d0, a.head_dim - d0 < kChunk ? a.head_dim - d0 : kChunk);
}

// qkv_preprocess_head for a backend that runs whole heads (the CPU): the same
// values and bytes, with the head's inputs and bias loaded once as rows,
// rotated by rope_rotate in place, the dtype switches outside the loops and
// one element_offset per cache row the pool holds as one run.
template <CacheDtype T>
KVSIM_HD inline void qkv_store_cache_run(uint8_t* pool, int64_t e0, int32_t n, const float* x, float encode_scale) {
  for (int32_t d = 0; d < n; ++d) {
    if constexpr (bytes_per_element(T) == 1)
      store_byte(pool, e0 + d, qkv_cache_code<T>(x[d], encode_scale));
    else
      store_float(pool, T, e0 + d, x[d]);
  }
}

// One head's row as qkv_preprocess_head_row writes it: qkv_input (+ bias),
// rotated for Q and K, into in[0..D).
KVSIM_HD inline void qkv_head_row_values(const QkvPreprocessArgs& a, int32_t b, int64_t position, int64_t row,
                                         int32_t fused_head, float* in) {
  const bool is_v = fused_head >= a.num_q_heads + a.kv_heads;
  const int32_t D = a.head_dim;
  const int64_t col0 = static_cast<int64_t>(fused_head) * D;
  float bias[kQkvMaxHeadDim];
  load_floats(a.qkv.data, a.qkv.dtype, a.qkv.offset(row, col0), a.qkv.stride[1], D, in);  // qkv_input
  if (!a.bias.empty()) {
    load_floats(a.bias.data, a.bias.dtype, a.bias.offset(col0), a.bias.stride[0], D, bias);
    for (int32_t d = 0; d < D; ++d) in[d] = in[d] + bias[d];
  }
  const int64_t rotary_position = position + (a.position_offsets ? a.position_offsets[b] : 0);
  // V is never rotated; Q and K by core's rope_rotate itself (validated: 2 <= rotary_dim <= D, even).
  if (a.rope_style != RopeStyle::none && !is_v)
    rope_rotate(in, a.cos_sin + rotary_position * a.cos_sin_row_stride, a.rotary_dim, a.rope_style);
}

template <class Nvfp4Rows = CoreNvfp4Rows>
KVSIM_HD inline void qkv_preprocess_head_row(const KvPools& pools, const QkvPreprocessArgs& a, int32_t b, int32_t t,
                                             int64_t row, int32_t fused_head, Nvfp4Rows nvfp4_rows = {}) {
  const int64_t cache_len = a.cache_lens[b];
  const int64_t position = cache_len - a.seq_lens[b] + t;
  const bool is_q = fused_head < a.num_q_heads;
  const bool is_v = fused_head >= a.num_q_heads + a.kv_heads;
  if (!is_q && !qkv_token_reaches_cache(a.window, cache_len, position)) return;
  const int32_t D = a.head_dim;
  float in[kQkvMaxHeadDim];
  qkv_head_row_values(a, b, position, row, fused_head, in);
  const float* x = in;
  if (is_q) return store_floats(a.q_out.data, a.q_out.dtype, a.q_out.offset(row, fused_head, 0), a.q_out.stride[2], D, x);
  const QkvCacheRow r = qkv_cache_row(a, b, position, fused_head);
  const int32_t kv = r.kv, head = r.head, entry = r.entry;
  const int64_t block = r.block;
  const float scale = is_v ? a.v_encode_scale : a.k_encode_scale;
  const PoolStrides& s = pools.strides[static_cast<int>(PoolKind::primary)];
  if (dims_contiguous(s.inner[kv], 0, D)) {
    uint8_t* pool = pools.bytes(PoolKind::primary);
    const int64_t e0 = element_offset(s, block, a.layer, kv, head, entry, 0);
    if (with_byte_element_dtype(pools.geometry.dtype,
                                [&]<CacheDtype T>() { qkv_store_cache_run<T>(pool, e0, D, x, scale); }))
      return;
    if ((e0 & 1) == 0) {  // nvfp4 from a whole byte: each scale block's nibbles are 8 bytes of the run
      uint8_t* bytes = pool + (e0 >> 1);  // element 2i: the low nibble of byte i (store_nibble's rule)
      qkv_store_nvfp4_blocks(pools, a.layer, block, entry, kv, head, 0, D, x,
                             is_v ? a.v_global_scale : a.k_global_scale, [&](int32_t d0, const uint8_t* packed) {
                               for (int32_t i = 0; i < codec::kNvfp4BlockElems / 2; ++i) bytes[d0 / 2 + i] = packed[i];
                             }, nvfp4_rows, bytes);
      return;
    }
  }
  qkv_store_cache_dims<kQkvMaxHeadDim>(pools, a.layer, block, entry, kv, head, 0, D, x, scale,
                                       is_v ? a.v_global_scale : a.k_global_scale);
}

#if !defined(__CUDA_ARCH__)
// A host's K and V rows of one (token, kv head) into an nvfp4 cache in one
// quantizer call (16 blocks at D = 128: the call's fixed work once per item,
// as write_kv_rows does; docs/benchmarks.md, session 31), the packed bytes
// straight into the pool. Only where both rows are runs from a whole byte and
// 2D <= kNvfp4CallBlocks * 16; false (nothing written) otherwise, and the
// caller writes the heads one by one. The values and bytes are
// qkv_preprocess_head_row's.
template <class Nvfp4Rows>
KVSIM_HD inline bool qkv_nvfp4_kv_pair(const KvPools& pools, const QkvPreprocessArgs& a, int32_t b, int32_t t, int64_t row,
                                       int32_t kv_head, Nvfp4Rows nvfp4_rows) {
  constexpr int32_t kElems = codec::kNvfp4BlockElems;
  const int32_t D = a.head_dim;
  if (pools.geometry.dtype != CacheDtype::nvfp4 || 2 * D > kNvfp4CallBlocks * kElems) return false;
  const int64_t cache_len = a.cache_lens[b];
  const int64_t position = cache_len - a.seq_lens[b] + t;
  if (!qkv_token_reaches_cache(a.window, cache_len, position)) return true;  // neither row is written
  const PoolStrides& s = pools.strides[static_cast<int>(PoolKind::primary)];
  const PoolStrides& ss = pools.scale_strides[static_cast<int>(PoolKind::primary)];
  QkvCacheRow r[2];
  int64_t e0[2];
  for (int32_t kv = 0; kv < 2; ++kv) {
    r[kv] = qkv_cache_row(a, b, position, a.num_q_heads + kv * a.kv_heads + kv_head);
    e0[kv] = element_offset(s, r[kv].block, a.layer, r[kv].kv, r[kv].head, r[kv].entry, 0);
    if (!dims_contiguous(s.inner[r[kv].kv], 0, D) || (e0[kv] & 1) != 0) return false;
  }
  float in[2][kQkvMaxHeadDim];
  uint8_t scale_codes[2][kNvfp4CallBlocks];
  Nvfp4Row rows[2];
  bool scale_run[2];
  for (int32_t kv = 0; kv < 2; ++kv) {
    qkv_head_row_values(a, b, position, row, a.num_q_heads + kv * a.kv_heads + kv_head, in[kv]);
    rows[kv].x = in[kv];
    rows[kv].global_scale = kv ? a.v_global_scale : a.k_global_scale;
    rows[kv].packed = pools.bytes(PoolKind::primary) + (e0[kv] >> 1);  // element 2i: the low nibble of byte i
    scale_run[kv] = dims_contiguous(ss.inner[r[kv].kv], 0, D / kElems);
    rows[kv].scales = scale_run[kv] ? pools.scale_bytes(PoolKind::primary) +
                                          scale_offset(ss, r[kv].block, a.layer, r[kv].kv, r[kv].head, r[kv].entry, 0)
                                    : scale_codes[kv];
  }
  nvfp4_rows(rows, 2, D / kElems);
  for (int32_t kv = 0; kv < 2; ++kv)
    if (!scale_run[kv])
      for (int32_t j = 0; j < D / kElems; ++j)
        pools.scale_bytes(PoolKind::primary)[scale_offset(ss, r[kv].block, a.layer, r[kv].kv, r[kv].head,
                                                          r[kv].entry, j * kElems)] = scale_codes[kv][j];
  return true;
}
#endif

// The work item of a narrow backend: token t of sequence b (fused qkv row
// `row`) and kv head `kv_head` -- the whole heads of the kv head's query
// group, its K and V heads, and, for the chunk's last token in a context
// step, its zeroed V tail. The default is one chunk per head; kChunk = 0 runs
// whole heads as rows (qkv_preprocess_head_row), what the CPU backend takes,
// with its nvfp4 quantizer (nvfp4_rows.hpp).
template <int kChunk = kQkvMaxHeadDim, class Nvfp4Rows = CoreNvfp4Rows>
KVSIM_HD inline void qkv_preprocess_token_head(const KvPools& pools, const QkvPreprocessArgs& a, int32_t b, int32_t t,
                                               int64_t row, int32_t kv_head, Nvfp4Rows nvfp4_rows = {}) {
  static_assert(kChunk % codec::kNvfp4BlockElems == 0, "chunks hold whole nvfp4 scale blocks");
  auto head = [&](int32_t fused_head) {
    if constexpr (kChunk == 0) qkv_preprocess_head_row(pools, a, b, t, row, fused_head, nvfp4_rows);
    else qkv_preprocess_head<kChunk>(pools, a, b, t, row, fused_head);
  };
  const int32_t group = a.num_q_heads / a.kv_heads;
  for (int32_t q = kv_head * group; q < (kv_head + 1) * group; ++q) head(q);
  bool kv_done = false;
#if !defined(__CUDA_ARCH__)
  if constexpr (kChunk == 0) kv_done = qkv_nvfp4_kv_pair(pools, a, b, t, row, kv_head, nvfp4_rows);
#endif
  if (!kv_done) {
    head(a.num_q_heads + kv_head);
    head(a.num_q_heads + a.kv_heads + kv_head);
  }
  if (t == a.seq_lens[b] - 1) qkv_zero_v_tail_head(pools, a, b, kv_head);
}

}  // namespace kvsim
