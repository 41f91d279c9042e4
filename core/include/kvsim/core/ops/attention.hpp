// decode_attention and prefill_attention (contract §5.7, §5.8) descriptors. The
// arithmetic is core's canonical order (../attention_math.hpp,
// docs/canonical-arithmetic.md); both ops call attend_query() for every
// (query token, KV head) so a one-token prefill chunk is bit-equal to decode.
#pragma once

#include <span>
#include <vector>

#include "../attention_math.hpp"
#include "../attention_mma.hpp"
#include "../cache_io.hpp"
#include "../page_table.hpp"
#include "../tensor.hpp"
#include "../window.hpp"

namespace kvsim {

// Scales: the fp8/int8 per-tensor K scale is folded into the softmax scale
// (score = dot(q, k_code) * (sm_scale * k_scale)); the V scale multiplies the
// normalised output. nvfp4 K/V are fully decoded with their global scales.
struct AttentionScales {
  float sm_scale = 1.0f;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  float k_global_scale = 1.0f;  // nvfp4
  float v_global_scale = 1.0f;  // nvfp4
};

// What decode_attention and prefill_attention share: the layer, the query
// and output rows [rows, Hq, D] (fp32/fp16/bf16), each sequence's length
// (including its queries, whose K/V are already in the cache) and the dense
// block table (TensorRT-LLM / vLLM), -1 padded, that maps cache slots (after
// the window mapping) to blocks.
struct PagedAttentionQuery {
  int32_t layer = 0;
  TensorView q;    // [rows, Hq, D]
  TensorView out;  // [rows, Hq, D]
  std::span<const int32_t> seq_lens;     // [batch]
  std::span<const int32_t> block_table;  // [batch, max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
  AttentionScales scales;
  WindowMapping window;
  TensorView lse;  // optional [rows, Hq] fp32: each query head's natural-log LSE (attention_math.hpp)
  AttentionOrder order = AttentionOrder::fp32;  // arithmetic order (mma: offered for some cache dtypes)
  // This part of an op, so that a caller sets it in one assignment.
  PagedAttentionQuery& query() { return *this; }
};

// One query token per sequence (rows = batch), at position seq_lens[b] - 1.
struct DecodeAttentionOp : PagedAttentionQuery {};

// Causal attention for a chunk of new tokens (rows = nnz): query i of
// sequence b (i in [q_indptr[b], q_indptr[b+1])) is at position seq_lens[b] -
// n_b + (i - q_indptr[b]) and attends to keys at positions <= its own (past +
// chunk); seq_lens counts the tokens after this chunk.
struct PrefillAttentionOp : PagedAttentionQuery {
  std::span<const int32_t> q_indptr;  // [batch + 1]
};

// ---------------------------------------------------------------- key list
// The keys one query at absolute position p attends to, in canonical order:
// sinks [0, n_sinks), then the window [window_start, p] (no window: [0, p]),
// then the masked tail: the cache slots after the query's own slot up to the
// end of its page, read whole as real kernels do (only while the ring has not
// wrapped; once it has, every slot of the page holds a live token).
struct KeyList {
  int64_t position = 0;
  int64_t n_sinks = 0;
  int64_t window_start = 0;
  int64_t n_attended = 0;
  int64_t n_tail = 0;
  int64_t tail_first_slot = 0;

  KVSIM_HD constexpr int64_t size() const { return n_attended + n_tail; }
  // Cache slot of key j; masked keys are the tail.
  KVSIM_HD constexpr int64_t slot(int64_t j, const WindowMapping& w, bool& masked) const {
    masked = j >= n_attended;
    if (masked) return tail_first_slot + (j - n_attended);
    const int64_t t = j < n_sinks ? j : window_start + (j - n_sinks);
    return w.cache_token(t);
  }
};

KVSIM_HD constexpr KeyList make_key_list(int64_t p, const WindowMapping& w, PageDivider page) {
  KeyList k;
  k.position = p;
  if (w.enabled()) {
    k.n_sinks = p + 1 < w.sinks ? p + 1 : w.sinks;
    const int64_t recent = static_cast<int64_t>(w.window) - w.sinks;  // tokens kept besides the sinks
    const int64_t start = p + 1 - recent;
    k.window_start = start > w.sinks ? start : w.sinks;
  }
  const int64_t n_window = p >= k.window_start ? p - k.window_start + 1 : 0;
  k.n_attended = k.n_sinks + n_window;
  const bool wrapped = w.enabled() && p >= w.sinks && (p - w.sinks) >= w.cyclic_len;
  if (!wrapped) {
    const int64_t slot_p = w.cache_token(p);
    k.n_tail = page.page_size - 1 - page.mod(slot_p);
    k.tail_first_slot = slot_p + 1;
  }
  return k;
}

// ---------------------------------------------------------------- work item
// What every paged-attention work item reads (attend_query here,
// attend_mla_query in mla_attention.hpp): the pools, the layer, the query and
// output rows and the dense block table (in the backend's memory).
struct PagedReadArgs {
  KvPools pools;
  int32_t layer = 0;
  TensorView q, out;
  const int32_t* block_table = nullptr;
  int32_t max_blocks_per_seq = 0;
};

// Trivially copyable arguments of attend_query (built on the host from the
// op descriptor).
struct AttentionArgs : PagedReadArgs {
  AttentionScales scales;
  WindowMapping window;
  AttentionOrder order = AttentionOrder::fp32;
  int32_t group = 1;  // query heads per KV head
  TensorView lse;     // optional [rows, Hq] fp32 (empty: not written)
};

// Row `row`, query head qh of the optional LSE output: the natural-log
// log-sum-exp of the head's scores from the merge's global max and sum.
KVSIM_HD inline void store_lse(const AttentionArgs& a, int64_t row, int32_t qh, float global_max, float sum) {
  if (a.lse.empty()) return;
  static_cast<float*>(a.lse.data)[a.lse.offset(row, qh)] = canonical_nan(canon::log_sum_exp(global_max, sum));
}

// Loads one head row (D values) of K (kv = 0) or V (kv = 1) at a cache slot,
// as exact fp32: stored codes for fp32/fp16/bf16/fp8/int8 (per-tensor scales
// are applied by the caller), full contract §4 decode for nvfp4.
// Block and entry of cache slot `slot` of sequence seq in a dense table.
struct TableSlot {
  int64_t block;
  int32_t entry;
};
KVSIM_HD inline TableSlot table_slot(const PoolGeometry& g, const int32_t* table, int32_t max_blocks, int32_t seq,
                                     int64_t slot) {
  const PageDivider page = g.page_divider();
  const BlockRef ref{table[static_cast<int64_t>(seq) * max_blocks + page.div(slot)]};
  return {ref.block(), page.mod(slot)};
}

KVSIM_HD inline void load_head_row(const AttentionArgs& a, int32_t seq, int64_t slot, int32_t kv, int32_t head,
                                   float* row) {
  const PoolGeometry& g = a.pools.geometry;
  const TableSlot at = table_slot(g, a.block_table, a.max_blocks_per_seq, seq, slot);
  const int64_t block = at.block;
  const int32_t entry = at.entry;
  const uint8_t* pool = a.pools.bytes(PoolKind::primary);
  const PoolStrides& st = a.pools.strides[0];
  if (g.dtype == CacheDtype::nvfp4) {
    const uint8_t* scales = a.pools.scale_bytes(PoolKind::primary);
    const float gs = kv == 0 ? a.scales.k_global_scale : a.scales.v_global_scale;
    for (int32_t d = 0; d < g.head_dim; ++d) {
      const int64_t off = element_offset(st, block, a.layer, kv, head, entry, d);
      const uint8_t sf = scales[scale_offset(a.pools.scale_strides[0], block, a.layer, kv, head, entry, d)];
      row[d] = codec::nvfp4_decode(load_nibble(pool, off), sf, gs);
    }
  } else {
    for (int32_t d = 0; d < g.head_dim; ++d)
      row[d] = load_cache_code_value(pool, g.dtype, element_offset(st, block, a.layer, kv, head, entry, d));
  }
}

// Scratch floats attend_query needs for `num_keys` keys.
KVSIM_HD constexpr int64_t attention_scratch_floats(int32_t group, int32_t head_dim, int64_t num_keys) {
  const int64_t parts = (num_keys + canon::kPartitionSize - 1) / canon::kPartitionSize;
  return static_cast<int64_t>(group) * head_dim      // q
         + 2 * static_cast<int64_t>(head_dim)          // k row, v row
         + static_cast<int64_t>(group) * canon::kPartitionSize * 2  // scores, probabilities
         + static_cast<int64_t>(group) * parts * (2 + head_dim)     // m_p, l_p, acc_p
         + static_cast<int64_t>(head_dim);             // merged O
}

// The merge of both orders: per query head of the group, M = max m_p, then
// L and O folded in partition order, out = (O / L) * v_scale, and the LSE
// when asked for.
KVSIM_HD inline void merge_partitions(const AttentionArgs& a, int64_t row, int32_t kv_head, int64_t parts,
                                      const float* part_m, const float* part_l, const float* part_acc, float* merged) {
  using namespace canon;
  const int32_t D = a.pools.geometry.head_dim;
  for (int32_t g = 0; g < a.group; ++g) {
    float global_max = neg_inf();
    for (int64_t part = 0; part < parts; ++part)
      global_max = part_m[g * parts + part] > global_max ? part_m[g * parts + part] : global_max;
    float L = 0.0f;
    for (int32_t d = 0; d < D; ++d) merged[d] = 0.0f;
    for (int64_t part = 0; part < parts; ++part) {
      const float w = merge_weight(part_m[g * parts + part], global_max);
      L = fma_f32(part_l[g * parts + part], w, L);
      const float* acc = part_acc + (static_cast<int64_t>(g) * parts + part) * D;
      for (int32_t d = 0; d < D; ++d) merged[d] = fma_f32(acc[d], w, merged[d]);
    }
    for (int32_t d = 0; d < D; ++d) {
      const float o = (merged[d] / L) * a.scales.v_scale;
      store_float(a.out.data, a.out.dtype, a.out.offset(row, kv_head * a.group + g, d), o);
    }
    store_lse(a, row, kv_head * a.group + g, global_max, L);
  }
}

// Scores of one partition's keys for the group's query heads (both orders):
// -inf for a masked key, else score(g) * scale after load(slot) brought the
// key's K row.
template <class LoadRow, class Score>
KVSIM_HD inline void partition_scores(const AttentionArgs& a, const KeyList& keys, int64_t first, int32_t count,
                                      float score_scale, float* s, LoadRow load, Score score) {
  for (int32_t j = 0; j < count; ++j) {
    bool masked = false;
    const int64_t slot = keys.slot(first + j, a.window, masked);
    if (!masked) load(slot);
    for (int32_t g = 0; g < a.group; ++g)
      s[g * canon::kPartitionSize + j] = masked ? canon::neg_inf() : score(g) * score_scale;
  }
}

// Max, probabilities and sum of one partition's scores for each query head of
// the group (the canonical steps; both orders).
KVSIM_HD inline void partition_softmax(int32_t G, int32_t count, int64_t parts, int64_t part, const float* s, float* p,
                                       float* part_m, float* part_l) {
  using namespace canon;
  for (int32_t g = 0; g < G; ++g) {
    const float m = partition_max(s + g * kPartitionSize, count);
    for (int32_t j = 0; j < count; ++j) p[g * kPartitionSize + j] = probability(s[g * kPartitionSize + j], m);
    part_m[g * parts + part] = m;
    part_l[g * parts + part] = partition_sum(p + g * kPartitionSize, count);
  }
}

// One query token (sequence seq, absolute position `position`, row `row` of
// q/out) against KV head kv_head, for the group of query heads sharing it.
KVSIM_HD inline void attend_query(const AttentionArgs& a, int32_t seq, int64_t position, int64_t row, int32_t kv_head,
                                  float* scratch) {
  using namespace canon;
  const int32_t D = a.pools.geometry.head_dim;
  const int32_t G = a.group;
  const KeyList keys = make_key_list(position, a.window, a.pools.geometry.page_divider());
  const int64_t n = keys.size();
  const int64_t parts = (n + kPartitionSize - 1) / kPartitionSize;
  const float score_scale = a.scales.sm_scale * a.scales.k_scale;

  float* q = scratch;
  float* krow = q + static_cast<int64_t>(G) * D;
  float* vrow = krow + D;
  float* s = vrow + D;                                   // [G][kPartitionSize]
  float* p = s + static_cast<int64_t>(G) * kPartitionSize;  // [G][kPartitionSize]
  float* part_m = p + static_cast<int64_t>(G) * kPartitionSize;  // [G][parts]
  float* part_l = part_m + static_cast<int64_t>(G) * parts;      // [G][parts]
  float* part_acc = part_l + static_cast<int64_t>(G) * parts;    // [G][parts][D]
  float* merged = part_acc + static_cast<int64_t>(G) * parts * D;

  for (int32_t g = 0; g < G; ++g)
    for (int32_t d = 0; d < D; ++d)
      q[g * D + d] = load_float(a.q.data, a.q.dtype, a.q.offset(row, kv_head * G + g, d));

  for (int64_t part = 0; part < parts; ++part) {
    const int64_t first = part * kPartitionSize;
    const int32_t count = static_cast<int32_t>(n - first < kPartitionSize ? n - first : kPartitionSize);
    partition_scores(
        a, keys, first, count, score_scale, s, [&](int64_t slot) { load_head_row(a, seq, slot, 0, kv_head, krow); },
        [&](int32_t g) { return dot(q + g * D, krow, D); });
    // Max, probabilities, sum.
    partition_softmax(G, count, parts, part, s, p, part_m, part_l);
    for (int64_t i = 0; i < static_cast<int64_t>(G) * D; ++i) part_acc[(i / D * parts + part) * D + i % D] = 0.0f;
    // P.V: every key of the partition, masked ones included (p = 0).
    for (int32_t j = 0; j < count; ++j) {
      bool masked = false;
      const int64_t slot = keys.slot(first + j, a.window, masked);
      load_head_row(a, seq, slot, 1, kv_head, vrow);
      for (int32_t g = 0; g < G; ++g) {
        const float pj = p[g * kPartitionSize + j];
        float* acc = part_acc + (static_cast<int64_t>(g) * parts + part) * D;
        for (int32_t d = 0; d < D; ++d) acc[d] = fma_f32(pj, vrow[d], acc[d]);
      }
    }
  }
  merge_partitions(a, row, kv_head, parts, part_m, part_l, part_acc, merged);
}

// Scratch floats attend_query_mma needs for `num_keys` keys (operand codes
// are kept as 32-bit words in the same buffer).
KVSIM_HD constexpr int64_t attention_mma_scratch_floats(int32_t group, int32_t head_dim, int64_t num_keys) {
  const int64_t parts = (num_keys + canon::kPartitionSize - 1) / canon::kPartitionSize;
  return static_cast<int64_t>(group) * head_dim                              // q codes
         + static_cast<int64_t>(1 + mma_order::kKeysPerStep) * head_dim      // k codes, 8 rows of v codes
         + static_cast<int64_t>(group) * canon::kPartitionSize * 4           // scores, p, hi, lo
         + static_cast<int64_t>(group) * parts * (2 + head_dim)              // m_p, l_p, acc_p
         + static_cast<int64_t>(head_dim);                                   // merged O
}

// The operand codes of one head row of K (kv = 0) or V (kv = 1) at a cache slot.
KVSIM_HD inline void load_head_row_codes(const AttentionArgs& a, int32_t seq, int64_t slot, int32_t kv, int32_t head,
                                         uint32_t* row) {
  const PoolGeometry& g = a.pools.geometry;
  const TableSlot at = table_slot(g, a.block_table, a.max_blocks_per_seq, seq, slot);
  const uint8_t* pool = a.pools.bytes(PoolKind::primary);
  for (int32_t d = 0; d < g.head_dim; ++d)
    row[d] = mma_order::load_cache_operand(pool, g.dtype,
                                           element_offset(a.pools.strides[0], at.block, a.layer, kv, head, at.entry, d));
}

// attend_query in the mma order (docs/canonical-arithmetic.md, "The mma
// order"): the same keys, partitions, softmax and merge; q.k and P.V are
// chains of modelled mma.sync instructions (attention_mma.hpp).
KVSIM_HD inline void attend_query_mma(const AttentionArgs& a, int32_t seq, int64_t position, int64_t row,
                                      int32_t kv_head, float* scratch) {
  using namespace canon;
  using mma_order::kKeysPerStep;
  const int32_t D = a.pools.geometry.head_dim;
  const int32_t G = a.group;
  const mma::Operand f = mma_order::operand_for(a.pools.geometry.dtype);
  const KeyList keys = make_key_list(position, a.window, a.pools.geometry.page_divider());
  const int64_t n = keys.size();
  const int64_t parts = (n + kPartitionSize - 1) / kPartitionSize;
  const float score_scale = a.scales.sm_scale * a.scales.k_scale;

  uint32_t* q = reinterpret_cast<uint32_t*>(scratch);
  uint32_t* krow = q + static_cast<int64_t>(G) * D;
  uint32_t* vrows = krow + D;                                         // [kKeysPerStep][D]
  float* s = reinterpret_cast<float*>(vrows + kKeysPerStep * D);      // [G][kPartitionSize]
  float* p = s + static_cast<int64_t>(G) * kPartitionSize;            // [G][kPartitionSize]
  uint32_t* hi = reinterpret_cast<uint32_t*>(p + static_cast<int64_t>(G) * kPartitionSize);
  uint32_t* lo = hi + static_cast<int64_t>(G) * kPartitionSize;
  float* part_m = reinterpret_cast<float*>(lo + static_cast<int64_t>(G) * kPartitionSize);
  float* part_l = part_m + static_cast<int64_t>(G) * parts;
  float* part_acc = part_l + static_cast<int64_t>(G) * parts;
  float* merged = part_acc + static_cast<int64_t>(G) * parts * D;

  for (int32_t g = 0; g < G; ++g)
    for (int32_t d = 0; d < D; ++d)
      q[g * D + d] = mma_order::operand_code(f, load_float(a.q.data, a.q.dtype, a.q.offset(row, kv_head * G + g, d)));

  for (int64_t part = 0; part < parts; ++part) {
    const int64_t first = part * kPartitionSize;
    const int32_t count = static_cast<int32_t>(n - first < kPartitionSize ? n - first : kPartitionSize);
    partition_scores(
        a, keys, first, count, score_scale, s, [&](int64_t slot) { load_head_row_codes(a, seq, slot, 0, kv_head, krow); },
        [&](int32_t g) { return mma_order::score_chain(f, q + g * D, krow, D); });
    partition_softmax(G, count, parts, part, s, p, part_m, part_l);
    // Keys past the partition's end are zeros in the last group of 8.
    const int32_t padded = (count + kKeysPerStep - 1) / kKeysPerStep * kKeysPerStep;
    for (int32_t g = 0; g < G; ++g)
      for (int32_t j = 0; j < padded; ++j) {
        const mma_order::SplitProbability sp =
            j < count ? mma_order::split_probability(f, p[g * kPartitionSize + j]) : mma_order::SplitProbability{0u, 0u};
        hi[g * kPartitionSize + j] = sp.hi;
        lo[g * kPartitionSize + j] = sp.lo;
      }
    for (int64_t i = 0; i < static_cast<int64_t>(G) * D; ++i) part_acc[(i / D * parts + part) * D + i % D] = 0.0f;
    // P.V: every key of the partition, masked ones included (p = 0), 8 per instruction.
    for (int32_t j0 = 0; j0 < count; j0 += kKeysPerStep) {
      for (int32_t i = 0; i < kKeysPerStep; ++i) {
        bool masked = false;
        if (j0 + i < count) {
          load_head_row_codes(a, seq, keys.slot(first + j0 + i, a.window, masked), 1, kv_head, vrows + i * D);
        } else {
          for (int32_t d = 0; d < D; ++d) vrows[i * D + d] = 0u;
        }
      }
      for (int32_t d = 0; d < D; ++d) {
        uint32_t v[kKeysPerStep];
        for (int32_t i = 0; i < kKeysPerStep; ++i) v[i] = vrows[i * D + d];
        for (int32_t g = 0; g < G; ++g) {
          float* acc = part_acc + (static_cast<int64_t>(g) * parts + part) * D + d;
          *acc = mma_order::pv_step(f, hi + g * kPartitionSize + j0, lo + g * kPartitionSize + j0, v, *acc);
        }
      }
    }
  }
  merge_partitions(a, row, kv_head, parts, part_m, part_l, part_acc, merged);
}

// The op's order: attend_query or attend_query_mma, and its scratch.
KVSIM_HD constexpr int64_t attention_order_scratch_floats(AttentionOrder o, int32_t group, int32_t head_dim,
                                                          int64_t num_keys) {
  return o == AttentionOrder::mma ? attention_mma_scratch_floats(group, head_dim, num_keys)
                                  : attention_scratch_floats(group, head_dim, num_keys);
}
KVSIM_HD inline void attend_query_in_order(const AttentionArgs& a, int32_t seq, int64_t position, int64_t row,
                                           int32_t kv_head, float* scratch) {
  if (a.order == AttentionOrder::mma) return attend_query_mma(a, seq, position, row, kv_head, scratch);
  attend_query(a, seq, position, row, kv_head, scratch);
}

// Position of prefill query row i of sequence b.
KVSIM_HD constexpr int64_t prefill_position(int32_t seq_len, int32_t q_begin, int32_t q_end, int64_t row) {
  return static_cast<int64_t>(seq_len) - (q_end - q_begin) + (row - q_begin);
}

// ---------------------------------------------------------------- host set-up
// Sequence and position of every query row of an op, in q/out row order:
// decode's row b is sequence b's last token; prefill's rows are each
// sequence's chunk (prefill_position).
struct AttentionRows {
  std::vector<int32_t> seq;
  std::vector<int64_t> position;
};
inline AttentionRows make_attention_rows(const DecodeAttentionOp& op) {
  AttentionRows r;
  for (size_t b = 0; b < op.seq_lens.size(); ++b) {
    r.seq.push_back(static_cast<int32_t>(b));
    r.position.push_back(static_cast<int64_t>(op.seq_lens[b]) - 1);
  }
  return r;
}
inline AttentionRows make_attention_rows(const PrefillAttentionOp& op) {
  AttentionRows r;
  for (size_t b = 0; b + 1 < op.q_indptr.size(); ++b)
    for (int32_t i = op.q_indptr[b]; i < op.q_indptr[b + 1]; ++i) {
      r.seq.push_back(static_cast<int32_t>(b));
      r.position.push_back(prefill_position(op.seq_lens[b], op.q_indptr[b], op.q_indptr[b + 1], i));
    }
  return r;
}

// The fields every paged attention's arguments take from its op as they are
// (AttentionArgs, MlaAttentionArgs): pools, layer, q, out and the dense block
// table (the op's, in host memory; a device backend points it at its copy).
template <class Args, class Op>
inline void set_paged_query_fields(Args& a, const KvPools& pools, const Op& op) {
  a.pools = pools;
  a.layer = op.layer;
  a.q = op.q;
  a.out = op.out;
  a.block_table = op.block_table.data();
  a.max_blocks_per_seq = op.max_blocks_per_seq;
}

// attend_query's arguments for a decode or prefill op.
template <class Op>
inline AttentionArgs make_attention_args(const KvPools& pools, const Op& op) {
  AttentionArgs a;
  set_paged_query_fields(a, pools, op);
  a.scales = op.scales;
  a.window = op.window;
  a.order = op.order;
  a.group = static_cast<int32_t>(op.q.shape[1] / pools.geometry.kv_heads);
  a.lse = op.lse;
  return a;
}

}  // namespace kvsim
