// decode_attention / prefill_attention on oneTBB: one work item per (query
// rows, KV head). Each item runs the fast path of attention_fast.hpp (the
// canonical order of core's attend_query, arranged for SIMD, same bytes) or,
// with AttentionPath::reference (KVSIM_CPU_ATTENTION=reference), attend_query itself
// per (query row, KV head). A decode item is one row; a prefill item is a
// block of consecutive rows of one sequence sharing their K/V reads
// (RowGroup, attend_tiled below).
// Work items write disjoint output rows and every reduction stays inside one
// item in the canonical order, so the bytes are the same for any thread
// count, ISA and grouping.
#include <tbb/blocked_range2d.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "backends/cpu/attention_fast.hpp"
#include "backends/cpu/cpu_backend.hpp"
#include "backends/cpu/cpu_target.hpp"

#if KVSIM_CPU_X86
#include <emmintrin.h>  // SSE2, part of baseline x86-64
#endif

namespace kvsim {
namespace cpu_attention {
namespace {

using canon::kPartitionSize;
using canon::kWarp;

// Everything about an op that is the same for all its items.
struct Plan {
  const Kernels* kernels = nullptr;
  RowFormat format = RowFormat::f32;
  // Where the kernel's K/V rows come from: the pool in place (contiguous
  // rows), the row's element codes gathered into a contiguous staging row of
  // the cache's own format (split-x and other strided rows: the same codes,
  // so the same bytes out, without a per-element decode), or load_head_row's
  // full fp32 decode (nvfp4, whose values need the block scales).
  enum class RowSource : uint8_t { in_place, gathered, decoded };
  RowSource source = RowSource::decoded;
  bool direct = false;  // source == in_place
  int32_t D = 0, c = 0, G = 0, pairs = 0;
  int bytes = 0;  // bytes per element (in place and gathered rows)
  // Gathered rows: byte offset of dim d from the row's dim 0 (element_offset's
  // dim part, which no other coordinate changes), per kv; and whether each
  // row is runs of x consecutive elements (split-x K) copied run by run.
  std::vector<int64_t> dim_byte[2];
  int32_t run_elements[2] = {1, 1};
  // Gathered V rows whose dims are a constant step apart and whose page
  // entries are adjacent elements (vLLM's split-x V, [D][page]): the keys of
  // a run of entries in one page are one tile, transposed (bytes between dims;
  // 0: no tile path).
  int64_t v_tile_dim_step = 0;
  std::vector<int32_t> perm;
  std::vector<uint16_t> perm_mask;
  int32_t lane_of_position[kWarp] = {};
  std::vector<int32_t> kt_source;
};

bool row_is_contiguous(const PoolStrides& st, int32_t kv, int32_t D) {
  const int64_t base = element_offset(st, 0, 0, kv, 0, 0, 0);
  for (int32_t d = 0; d < D; ++d)
    if (element_offset(st, 0, 0, kv, 0, 0, d) - base != d) return false;
  return true;
}

Plan make_plan(const AttentionArgs& a, CpuIsa isa) {
  const PoolGeometry& g = a.pools.geometry;
  Plan p;
  p.D = g.head_dim;
  p.c = (p.D + kWarp - 1) / kWarp;
  p.G = a.group;
  p.pairs = (p.c + 1) / 2;
  p.kernels = &kernels_for(isa);
  if (!p.kernels->supports_head_dim(p.D)) p.kernels = &fallback_kernels(isa);
  const PoolStrides& st = a.pools.strides[0];
  p.direct = g.dtype != CacheDtype::nvfp4 && row_is_contiguous(st, 0, p.D) && row_is_contiguous(st, 1, p.D);
  p.source = p.direct ? Plan::RowSource::in_place
                      : (g.dtype == CacheDtype::nvfp4 ? Plan::RowSource::decoded : Plan::RowSource::gathered);
  p.format = RowFormat::f32;
  if (p.source != Plan::RowSource::decoded) {
    switch (g.dtype) {
      case CacheDtype::fp32: p.format = RowFormat::f32; break;
      case CacheDtype::fp16: p.format = RowFormat::f16; break;
      case CacheDtype::bf16: p.format = RowFormat::bf16; break;
      case CacheDtype::fp8_e4m3: p.format = RowFormat::e4m3; break;
      case CacheDtype::fp8_e5m2: p.format = RowFormat::e5m2; break;
      case CacheDtype::int8: p.format = RowFormat::i8; break;
      case CacheDtype::nvfp4: break;
    }
    p.bytes = bits_per_element(g.dtype) / 8;
  }
  if (p.source == Plan::RowSource::gathered)
    for (int32_t kv = 0; kv < 2; ++kv) {
      const int64_t base = element_offset(st, 0, 0, kv, 0, 0, 0);
      p.dim_byte[kv].resize(static_cast<size_t>(p.D));
      for (int32_t d = 0; d < p.D; ++d) p.dim_byte[kv][d] = (element_offset(st, 0, 0, kv, 0, 0, d) - base) * p.bytes;
      // The longest run length r dividing D with every run of r dims consecutive bytes.
      for (int32_t r = p.D; r > 1; --r) {
        if (p.D % r != 0) continue;
        bool runs = true;
        for (int32_t d = 0; d < p.D && runs; ++d)
          runs = d % r == 0 || p.dim_byte[kv][d] == p.dim_byte[kv][d - 1] + p.bytes;
        if (runs) {
          p.run_elements[kv] = r;
          break;
        }
      }
    }
  if (p.source == Plan::RowSource::gathered && p.run_elements[1] == 1 && g.tokens_per_block > 1 && p.D > 1) {
    const std::vector<int64_t>& dim_byte = p.dim_byte[1];
    const int64_t entry_step = (element_offset(st, 0, 0, 1, 0, 1, 0) - element_offset(st, 0, 0, 1, 0, 0, 0)) * p.bytes;
    bool tile = entry_step == p.bytes;
    for (int32_t d = 0; d < p.D && tile; ++d) tile = dim_byte[d] == d * dim_byte[1];
    if (tile) p.v_tile_dim_step = dim_byte[1];
  }
  p.kernels->lane_order(p.format, p.D, p.lane_of_position);
  p.kt_source.resize(static_cast<size_t>(p.c) * kWarp);
  for (int32_t j = 0; j < p.c; ++j)
    for (int pos = 0; pos < kWarp; ++pos) {
      const int32_t d = p.lane_of_position[pos] * p.c + j;
      p.kt_source[static_cast<size_t>(j) * kWarp + pos] = d < p.D ? d : p.D;
    }
  // K transposition: output (j, half h) lane i is dim (16h + i) * c + j, i.e.
  // element s = i * c + j of the 16c natural floats from vector h * c on;
  // vector pair s / 32, index s % 32 within the pair.
  p.perm.assign(static_cast<size_t>(p.c) * p.pairs * 16, 0);
  p.perm_mask.assign(static_cast<size_t>(p.c) * p.pairs, 0);
  for (int32_t j = 0; j < p.c; ++j)
    for (int i = 0; i < 16; ++i) {
      const int32_t s = i * p.c + j;
      const int32_t pair = s / 32;
      p.perm[(static_cast<size_t>(j) * p.pairs + pair) * 16 + i] = s % 32;
      p.perm_mask[static_cast<size_t>(j) * p.pairs + pair] |= static_cast<uint16_t>(1u << i);
    }
  return p;
}

// Per-thread scratch, 64-byte aligned sub-arrays in one allocation.
struct Workspace {
  std::vector<float> storage;
  std::vector<float> fold;  // attend_tiled: accumulators, maxima and kept scores of one block
  std::vector<const uint8_t*> k_rows, v_rows;
  float *qt = nullptr, *s = nullptr, *p = nullptr, *m = nullptr, *l = nullptr, *part_m = nullptr, *part_l = nullptr,
        *part_acc = nullptr, *merged = nullptr, *kbuf = nullptr, *kstage = nullptr, *vstage = nullptr;

  // Scratch for `heads` query heads (a row group's rows x the GQA group).
  void layout(const Plan& pl, int64_t parts, int32_t heads) {
    const auto round16 = [](int64_t n) { return (n + 15) / 16 * 16; };
    const int64_t G = heads, D = pl.D, quads = (heads + kQuad - 1) / kQuad;
    const int64_t sizes[] = {
        G * pl.c * kWarp,                          // qt
        quads * int64_t{kPartitionSize} * kQuad,   // s
        quads * int64_t{kPartitionSize} * kQuad,   // p
        quads * int64_t{kQuad},                    // m
        quads * int64_t{kQuad},                    // l
        G * parts,                                 // part_m
        G * parts,                                 // part_l
        G * parts * D,                             // part_acc
        D + 1,                                     // merged (prepare_item: a q row and its -0 pad)
        2 * int64_t{kWarp} * pl.c + 64,            // kbuf
        pl.direct ? 0 : int64_t{kPartitionSize} * D,  // kstage (fp32 rows, or gathered codes of <= 4 bytes)
        pl.direct ? 0 : int64_t{kPartitionSize} * D,  // vstage
    };
    int64_t total = 16;
    for (int64_t n : sizes) total += round16(n);
    if (static_cast<int64_t>(storage.size()) < total) storage.resize(static_cast<size_t>(total));
    float* base = storage.data();
    base += (16 - (reinterpret_cast<uintptr_t>(base) / 4) % 16) % 16;
    float** slots[] = {&qt, &s, &p, &m, &l, &part_m, &part_l, &part_acc, &merged, &kbuf, &kstage, &vstage};
    for (int i = 0; i < 12; ++i) {
      *slots[i] = base;
      base += round16(sizes[i]);
    }
    std::memset(kbuf, 0, static_cast<size_t>(round16(sizes[9])) * 4);
    if (k_rows.size() < static_cast<size_t>(kPartitionSize)) {
      k_rows.resize(kPartitionSize);
      v_rows.resize(kPartitionSize);
    }
  }
};

using Rows = std::vector<std::pair<int32_t, int64_t>>;  // (sequence, position) of each q/out row

// Query rows [first, first + count) of one sequence run as one item: their
// count x G query heads share every decoded K/V row. Without a window the
// rows are consecutive positions of one sequence (a prefill block, run by
// attend_tiled when it holds more than one row); key j is slot j for all of
// them, and each row's keys past its own position get score -inf exactly
// where attend_query masks them. With a window a group is a single row.
struct RowGroup {
  int64_t first = 0;
  int32_t count = 1;
};
inline constexpr int32_t kMaxGroupHeads = 32;

std::vector<RowGroup> group_rows(const AttentionArgs& a, const Rows& rows) {
  std::vector<RowGroup> groups;
  const int32_t max_rows = std::max<int32_t>(1, kMaxGroupHeads / a.group);
  for (int64_t i = 0; i < static_cast<int64_t>(rows.size()); ++i) {
    if (!a.window.enabled() && !groups.empty() && groups.back().count < max_rows &&
        rows[i - 1].first == rows[i].first && rows[i - 1].second + 1 == rows[i].second) {
      ++groups.back().count;
    } else {
      groups.push_back(RowGroup{i, 1});
    }
  }
  return groups;
}

// One item's key lists: the row attending the most keys resolves the slots
// (`keys`); every row's own attended count and list length.
struct GroupKeys {
  int32_t seq = 0;
  int64_t parts = 0;  // partitions of the resolving list
  KeyList keys;
  int64_t n_attended[kMaxGroupHeads];
  int64_t n_keys[kMaxGroupHeads];
};

GroupKeys group_keys(const AttentionArgs& a, const Rows& rows, RowGroup grp) {
  const PageDivider page = a.pools.geometry.page_divider();
  GroupKeys k;
  k.keys = make_key_list(rows[grp.first].second, a.window, page);
  for (int32_t r = 0; r < grp.count; ++r) {
    const KeyList kr = make_key_list(rows[grp.first + r].second, a.window, page);
    k.n_attended[r] = kr.n_attended;
    k.n_keys[r] = kr.size();
    if (kr.n_attended > k.keys.n_attended) k.keys = kr;
  }
  k.seq = rows[grp.first].first;
  k.parts = (k.keys.size() + kPartitionSize - 1) / kPartitionSize;
  return k;
}

// Row `row`, head `head` of a fp32/fp16/bf16 view as fp32: load_float's
// conversions with the dtype switch hoisted out of the loop.
void load_head(const TensorView& v, int64_t row, int32_t head, int32_t D, float* out) {
  const int64_t base = v.offset(row, head, 0), step = v.stride[2];
  const auto* h16 = static_cast<const uint16_t*>(v.data);
  switch (v.dtype) {
    case CacheDtype::fp32:
      for (int32_t d = 0; d < D; ++d) out[d] = static_cast<const float*>(v.data)[base + d * step];
      return;
    case CacheDtype::fp16:
      for (int32_t d = 0; d < D; ++d) out[d] = codec::f16_to_f32(h16[base + d * step]);
      return;
    case CacheDtype::bf16:
      for (int32_t d = 0; d < D; ++d) out[d] = codec::bf16_to_f32(h16[base + d * step]);
      return;
    default:
      for (int32_t d = 0; d < D; ++d) out[d] = load_float(v.data, v.dtype, base + d * step);
  }
}

// q of each head of the item (h = r * G + g) transposed into the kernel's
// lane order, and the partition task every partition of the item reuses.
PartitionTask prepare_item(const AttentionArgs& a, const Plan& pl, RowGroup grp, int32_t kv_head, Workspace& ws,
                           int64_t acc_stride) {
  const int32_t D = pl.D, G = pl.G, c = pl.c, H = grp.count * G;
  float* qrow = ws.merged;  // D + 1 floats: the row, then the -0 every padding position reads
  qrow[D] = -0.0f;
  for (int32_t h = 0; h < H; ++h) {
    load_head(a.q, grp.first + h / G, kv_head * G + h % G, D, qrow);
    float* qt = ws.qt + static_cast<int64_t>(h) * c * kWarp;
    for (int32_t i = 0; i < c * kWarp; ++i) qt[i] = qrow[pl.kt_source[i]];  // K's transposition, D -> -0
  }
  return {.head_dim = D,
          .lanes_c = c,
          .group = H,
          .quads = (H + kQuad - 1) / kQuad,
          .format = pl.format,
          .row_bytes = pl.source == Plan::RowSource::decoded ? D * 4 : D * pl.bytes,
          .k_rows = ws.k_rows.data(),
          .v_rows = ws.v_rows.data(),
          .qt = ws.qt,
          .kt_source = pl.kt_source.data(),
          .perm = pl.perm.data(),
          .perm_mask = pl.perm_mask.data(),
          .score_scale = a.scales.sm_scale * a.scales.k_scale,
          .s = ws.s, .p = ws.p, .m = ws.m, .l = ws.l,  // the workspace's score, probability, max and sum rows
          .acc_stride = acc_stride,
          .kbuf = ws.kbuf};
}

// One strided row's element codes into a contiguous row of the same format:
// runs of `run` elements (split-x K's x-groups) by memcpy, single elements
// (split-x V's page-strided dims) by a fixed-size load per element.
template <int kBytes>
void gather_elements(const uint8_t* src, const int64_t* dim_byte, int32_t D, uint8_t* dst) {
  for (int32_t d = 0; d < D; ++d) std::memcpy(dst + static_cast<int64_t>(d) * kBytes, src + dim_byte[d], kBytes);
}
// Runs of kRunBytes (a size the compiler knows: one vector move, not a call
// to memmove per run, which cost the 8B slice's split-x re-run ~5%).
template <int kRunBytes>
void gather_runs(const uint8_t* src, const int64_t* dim_byte, int32_t D, int32_t run, int32_t bytes, uint8_t* dst) {
  for (int32_t d = 0; d < D; d += run) std::memcpy(dst + static_cast<int64_t>(d) * bytes, src + dim_byte[d], kRunBytes);
}

// Rows of r keys from a [D][entry] tile of kBytes codes: dst row e (e < r)
// gets dims [0, D) of entry e, dim d at src + d * dim_step + e * kBytes. The
// same codes as gather_row_codes row by row; 2-byte codes go 8 x 8 at a time
// through SSE2 unpacks (baseline x86-64), a quarter of the instructions of an
// element at a time (split-x V's gather was ~7% of the 8B slice, session 28).
template <int kBytes>
void transpose_tile(const uint8_t* src, int64_t dim_step, int32_t D, int32_t r, uint8_t* dst, int64_t dst_step) {
  const auto element = [&](int32_t e, int32_t d) {
    std::memcpy(dst + e * dst_step + d * kBytes, src + d * dim_step + e * kBytes, kBytes);
  };
  int32_t e = 0;
#if KVSIM_CPU_X86
  if constexpr (kBytes == 2) {
    for (; e + 8 <= r; e += 8) {
      int32_t d = 0;
      for (; d + 8 <= D; d += 8) {
        __m128i a[8], b[8], c[8];
        for (int i = 0; i < 8; ++i)  // a[i]: entries e..e+7 of dim d+i
          a[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + (d + i) * dim_step + e * 2));
        for (int i = 0; i < 8; i += 2) {
          b[i] = _mm_unpacklo_epi16(a[i], a[i + 1]);  // dims d+i, d+i+1 of entries 0..3
          b[i + 1] = _mm_unpackhi_epi16(a[i], a[i + 1]);  // ... of entries 4..7
        }
        for (int i = 0; i < 8; i += 4)
          for (int h = 0; h < 2; ++h) {  // four dims of entries 4h..4h+1, 4h+2..4h+3
            c[i + 2 * h] = _mm_unpacklo_epi32(b[i + h], b[i + h + 2]);
            c[i + 2 * h + 1] = _mm_unpackhi_epi32(b[i + h], b[i + h + 2]);
          }
        for (int k = 0; k < 4; ++k) {  // c[k]: dims d..d+3 of entries 2k, 2k+1; c[k + 4]: dims d+4..d+7
          _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (e + 2 * k) * dst_step + d * 2), _mm_unpacklo_epi64(c[k], c[k + 4]));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (e + 2 * k + 1) * dst_step + d * 2),
                           _mm_unpackhi_epi64(c[k], c[k + 4]));
        }
      }
      for (; d < D; ++d)
        for (int32_t k = 0; k < 8; ++k) element(e + k, d);
    }
  }
#endif
  for (; e < r; ++e)
    for (int32_t d = 0; d < D; ++d) element(e, d);
}

void gather_tile(const Plan& pl, const uint8_t* src, int32_t r, uint8_t* dst, int64_t dst_step) {
  switch (pl.bytes) {
    case 1: return transpose_tile<1>(src, pl.v_tile_dim_step, pl.D, r, dst, dst_step);
    case 2: return transpose_tile<2>(src, pl.v_tile_dim_step, pl.D, r, dst, dst_step);
    default: return transpose_tile<4>(src, pl.v_tile_dim_step, pl.D, r, dst, dst_step);
  }
}

void gather_row_codes(const Plan& pl, int32_t kv, const uint8_t* row0, uint8_t* dst) {
  const int64_t* dim_byte = pl.dim_byte[kv].data();
  const int32_t run = pl.run_elements[kv];
  if (run > 1) {
    const int32_t run_bytes = run * pl.bytes;
    switch (run_bytes) {  // split-x groups are 16 bytes (vLLM's x = 16 / element bytes)
      case 16: return gather_runs<16>(row0, dim_byte, pl.D, run, pl.bytes, dst);
      case 32: return gather_runs<32>(row0, dim_byte, pl.D, run, pl.bytes, dst);
      default:
        for (int32_t d = 0; d < pl.D; d += run)
          std::memcpy(dst + static_cast<int64_t>(d) * pl.bytes, row0 + dim_byte[d], static_cast<size_t>(run_bytes));
        return;
    }
  }
  switch (pl.bytes) {
    case 1: gather_elements<1>(row0, dim_byte, pl.D, dst); break;
    case 2: gather_elements<2>(row0, dim_byte, pl.D, dst); break;
    default: gather_elements<4>(row0, dim_byte, pl.D, dst); break;
  }
}

// Which rows a pass reads: the tiled prefill's first pass scores only (K), its
// second pass over kept scores P.V only (V). Rows not wanted are not gathered
// or decoded (their pointers still name a staging row: kernels prefetch them).
enum class RowsWanted : uint8_t { k_and_v, k, v };

// Keys [first, first + count) of the resolving list: K rows (nullptr for a
// masked key) and V rows, in place, gathered as codes, or decoded through
// load_head_row.
void resolve_keys(const AttentionArgs& a, const Plan& pl, const KeyList& keys, int32_t seq, int32_t kv_head,
                  int64_t first, int32_t count, Workspace& ws, RowsWanted wanted = RowsWanted::k_and_v) {
  const bool want_k = wanted != RowsWanted::v, want_v = wanted != RowsWanted::k;
  const bool v_tiles = want_v && pl.source == Plan::RowSource::gathered && pl.v_tile_dim_step != 0;
  const uint8_t* v_src[kPartitionSize];  // v_tiles: each key's V dim 0 and page entry
  int32_t v_entry[kPartitionSize];
  const PageDivider page = a.pools.geometry.page_divider();
  const int32_t D = pl.D;
  const uint8_t* pool = a.pools.bytes(PoolKind::primary);
  const PoolStrides& st = a.pools.strides[0];
  const int32_t* table = a.block_table + static_cast<int64_t>(seq) * a.max_blocks_per_seq;
  if (pl.direct && !a.window.enabled()) {
    // Without a window key j's slot is j itself (attended keys 0..p, then
    // the tail p+1.. of the same page), so the keys walk whole pages.
    for (int32_t j = 0; j < count;) {
      const int64_t slot = first + j;
      const int64_t block = BlockRef{table[page.div(slot)]}.block();
      const int32_t entry0 = page.mod(slot);
      const int32_t run = std::min<int32_t>(count - j, page.page_size - entry0);
      for (int32_t e = 0; e < run; ++e, ++j) {
        const bool masked = first + j >= keys.n_attended;
        ws.k_rows[j] =
            masked ? nullptr : pool + element_offset(st, block, a.layer, 0, kv_head, entry0 + e, 0) * pl.bytes;
        ws.v_rows[j] = pool + element_offset(st, block, a.layer, 1, kv_head, entry0 + e, 0) * pl.bytes;
      }
    }
    return;
  }
  for (int32_t j = 0; j < count; ++j) {
    bool masked = false;
    const int64_t slot = keys.slot(first + j, a.window, masked);
    if (pl.source != Plan::RowSource::decoded) {
      const BlockRef ref{table[page.div(slot)]};
      const int64_t block = ref.block();
      const int32_t entry = page.mod(slot);
      const uint8_t* k0 = pool + element_offset(st, block, a.layer, 0, kv_head, entry, 0) * pl.bytes;
      const uint8_t* v0 = pool + element_offset(st, block, a.layer, 1, kv_head, entry, 0) * pl.bytes;
      if (pl.direct) {
        ws.k_rows[j] = masked ? nullptr : k0;
        ws.v_rows[j] = v0;
      } else {
        auto* krow = reinterpret_cast<uint8_t*>(ws.kstage + static_cast<int64_t>(j) * D);
        auto* vrow = reinterpret_cast<uint8_t*>(ws.vstage + static_cast<int64_t>(j) * D);
        if (!masked && want_k) gather_row_codes(pl, 0, k0, krow);
        if (v_tiles) {
          v_src[j] = v0;
          v_entry[j] = entry;
        } else if (want_v) {
          gather_row_codes(pl, 1, v0, vrow);
        }
        ws.k_rows[j] = masked ? nullptr : krow;
        ws.v_rows[j] = vrow;
      }
    } else {
      float* krow = ws.kstage + static_cast<int64_t>(j) * D;
      float* vrow = ws.vstage + static_cast<int64_t>(j) * D;
      if (!masked && want_k) load_head_row(a, seq, slot, 0, kv_head, krow);
      if (want_v) load_head_row(a, seq, slot, 1, kv_head, vrow);
      ws.k_rows[j] = masked ? nullptr : reinterpret_cast<const uint8_t*>(krow);
      ws.v_rows[j] = reinterpret_cast<const uint8_t*>(vrow);
    }
  }
  // Runs of adjacent entries of one page (each key's entry one more, its V one
  // element further: the same block and head), one tile each.
  for (int32_t j = 0; v_tiles && j < count;) {
    int32_t r = 1;
    while (j + r < count && v_entry[j + r] == v_entry[j] + r && v_src[j + r] == v_src[j] + r * pl.bytes) ++r;
    gather_tile(pl, v_src[j], r, reinterpret_cast<uint8_t*>(ws.vstage + static_cast<int64_t>(j) * D),
                static_cast<int64_t>(D) * sizeof(float));
    j += r;
  }
}

// Rows that stop attending earlier than the resolving row: their keys from
// n_attended on are masked (score -inf), as in their own key list.
void mask_short_rows(const GroupKeys& k, int32_t rows, int32_t G, int64_t first, int32_t count, float* s) {
  for (int32_t r = 0; r < rows; ++r) {
    const int64_t from = std::max<int64_t>(k.n_attended[r] - first, 0);
    for (int64_t j = from; j < count; ++j)
      for (int32_t g = 0; g < G; ++g) {
        const int32_t h = r * G + g;
        s[((h / kQuad) * int64_t{kPartitionSize} + j) * kQuad + h % kQuad] = canon::neg_inf();
      }
  }
}

// The merge's steps for one partition of one head: attend_query's loop body
// (the accumulators' fmas at the kernels' ISA: glibc's fmaf per element cost
// the 8B slice ~10% of its cycles, session 28).
void fold_partition(const Kernels& k, float m, float l, const float* acc, float global_max, int32_t D, float& L,
                    float* merged) {
  const float w = canon::merge_weight(m, global_max);
  L = canon::fma_f32(l, w, L);
  k.fold(acc, w, D, merged);
}

void store_output(const AttentionArgs& a, int64_t row, int32_t qh, int32_t D, float L, float* merged) {
  const float v_scale = a.scales.v_scale;
  for (int32_t d = 0; d < D; ++d) merged[d] = (merged[d] / L) * v_scale;
  const int64_t base = a.out.offset(row, qh, 0), step = a.out.stride[2];
  // store_float's conversions with the dtype switch hoisted out of the loop.
  switch (a.out.dtype) {
    case CacheDtype::fp32:
      for (int32_t d = 0; d < D; ++d) static_cast<float*>(a.out.data)[base + d * step] = canonical_nan(merged[d]);
      return;
    case CacheDtype::fp16:
      for (int32_t d = 0; d < D; ++d) static_cast<uint16_t*>(a.out.data)[base + d * step] = codec::f32_to_f16(merged[d]);
      return;
    case CacheDtype::bf16:
      for (int32_t d = 0; d < D; ++d) static_cast<uint16_t*>(a.out.data)[base + d * step] = codec::f32_to_bf16(merged[d]);
      return;
    default:
      for (int32_t d = 0; d < D; ++d) store_float(a.out.data, a.out.dtype, base + d * step, merged[d]);
  }
}

// attend_query's work items (rows of the group x KV head) through the fast
// kernels: same inputs, same bytes. Decode rows and windowed prefill rows.
void attend_fast(const AttentionArgs& a, const Plan& pl, const Rows& rows, RowGroup grp, int32_t kv_head,
                 Workspace& ws) {
  const GroupKeys gk = group_keys(a, rows, grp);
  const int32_t seq = gk.seq, R = grp.count, D = pl.D, G = pl.G, H = R * G;
  const int64_t n = gk.keys.size(), parts = gk.parts;
  ws.layout(pl, parts, H);
  PartitionTask t = prepare_item(a, pl, grp, kv_head, ws, parts * D);
  for (int64_t part = 0; part < parts; ++part) {
    const int64_t first = part * kPartitionSize;
    const int32_t count = static_cast<int32_t>(n - first < kPartitionSize ? n - first : kPartitionSize);
    resolve_keys(a, pl, gk.keys, seq, kv_head, first, count, ws);
    t.count = count;
    t.acc = ws.part_acc + part * D;
    pl.kernels->scores(t);
    mask_short_rows(gk, R, G, first, count, ws.s);
    pl.kernels->softmax(t);
    for (int32_t h = 0; h < H; ++h) {
      ws.part_m[h * parts + part] = ws.m[h];
      ws.part_l[h * parts + part] = ws.l[h];
    }
    pl.kernels->pv(t);
  }

  // Merge in partition order: attend_query's loop, operation for operation.
  float* merged = ws.merged;
  for (int32_t h = 0; h < H; ++h) {
    const float* part_m = ws.part_m + static_cast<int64_t>(h) * parts;
    const float* part_l = ws.part_l + static_cast<int64_t>(h) * parts;
    float global_max = canon::neg_inf();
    for (int64_t part = 0; part < parts; ++part) global_max = part_m[part] > global_max ? part_m[part] : global_max;
    float L = 0.0f;
    for (int32_t d = 0; d < D; ++d) merged[d] = 0.0f;
    for (int64_t part = 0; part < parts; ++part)
      fold_partition(*pl.kernels, part_m[part], part_l[part], ws.part_acc + (static_cast<int64_t>(h) * parts + part) * D,
                     global_max, D, L, merged);
    store_output(a, grp.first + h / G, kv_head * G + h % G, D, L, merged);
    store_lse(a, grp.first + h / G, kv_head * G + h % G, global_max, L);
  }
}

// A prefill block of R consecutive rows x G query heads (R * G <= 32) for one
// KV head, without a window. Every K and V row is decoded once per pass for
// all R * G heads, keys past the block's last row are never read, and there
// is no per-partition scratch: attend_query's merge folds partition p with
// w_p = exp(m_p - M), so M (each row's global max) must be known first.
//  * the last partition runs first, in full: its m and l, its accumulators
//    kept (one partition's, R * G * D floats) until its turn in the fold;
//  * pass 1: scores of the other partitions, for M only (the max is
//    order-free: docs/canonical-arithmetic.md); the scores of the first
//    kCachedPartitions are kept, so rows up to 4,352 keys compute each score once;
//  * pass 2: each other partition in order (scores again past the cached
//    ones), softmax, P.V, folded at once; then the last partition is folded.
// A row whose key list ends before a partition is not folded there, and keys
// past its list enter none of its P.V chains (key_limit): a NaN V row there
// is not its business. Same floats as attend_query, partition by partition.
inline constexpr int64_t kCachedPartitions = 16;  // 512 KiB a thread at 32 heads

void attend_tiled(const AttentionArgs& a, const Plan& pl, const Rows& rows, RowGroup grp, int32_t kv_head,
                  Workspace& ws) {
  const GroupKeys gk = group_keys(a, rows, grp);
  const int32_t seq = gk.seq, R = grp.count, D = pl.D, G = pl.G, H = R * G;
  const int64_t n = gk.keys.size(), parts = gk.parts;
  ws.layout(pl, 1, H);
  const int64_t quads = (H + kQuad - 1) / kQuad, score_floats = quads * kPartitionSize * kQuad;
  const int64_t cached = std::min<int64_t>(parts - 1, kCachedPartitions);
  // M has a slot for every head of the last quad (scores_max writes them).
  ws.fold.resize(static_cast<size_t>(2 * H * D + quads * kQuad + 3 * H + cached * score_floats));
  float* acc_last = ws.fold.data();
  float* merged = acc_last + H * D;
  float *M = merged + H * D, *L = M + quads * kQuad, *m_last = L + H, *l_last = m_last + H;
  float* score_cache = l_last + H;
  PartitionTask t = prepare_item(a, pl, grp, kv_head, ws, D);
  int32_t limit[kMaxGroupHeads];
  t.key_limit = limit;

  // Partition `part`: K/V rows, scores (unless kept from pass 1), masks.
  // keep: pass 1 or the last partition (scores computed, kept if cached);
  // else pass 2 (scores kept from pass 1 where cached). with_v: P.V follows.
  const auto scores_of = [&](int64_t part, bool keep, bool with_v) {
    const int64_t first = part * kPartitionSize;
    const int32_t count = static_cast<int32_t>(std::min<int64_t>(n - first, kPartitionSize));
    const bool in_cache = part < cached, with_k = !in_cache || keep;
    resolve_keys(a, pl, gk.keys, seq, kv_head, first, count, ws,
                 !with_v ? RowsWanted::k : with_k ? RowsWanted::k_and_v : RowsWanted::v);
    t.count = count;
    t.s = in_cache ? score_cache + part * score_floats : ws.s;
    if (!in_cache || keep) {
      pl.kernels->scores(t);
      mask_short_rows(gk, R, G, first, count, t.s);
    }
    for (int32_t h = 0; h < H; ++h)
      limit[h] = static_cast<int32_t>(std::clamp<int64_t>(gk.n_keys[h / G] - first, 0, count));
  };
  const auto rows_parts = [&](int32_t h) { return (gk.n_keys[h / G] + kPartitionSize - 1) / kPartitionSize; };

  scores_of(parts - 1, true, true);
  t.acc = acc_last;
  pl.kernels->softmax(t);
  pl.kernels->pv(t);
  for (int32_t h = 0; h < quads * kQuad; ++h) {
    if (h < H) {
      m_last[h] = ws.m[h];
      l_last[h] = ws.l[h];
    }
    M[h] = ws.m[h];
  }
  for (int64_t part = 0; part + 1 < parts; ++part) {
    scores_of(part, true, false);
    pl.kernels->scores_max(t, M);
  }
  for (int32_t h = 0; h < H; ++h) {
    L[h] = 0.0f;
    for (int32_t d = 0; d < D; ++d) merged[h * D + d] = 0.0f;
  }
  t.acc = ws.part_acc;
  for (int64_t part = 0; part + 1 < parts; ++part) {
    scores_of(part, false, true);
    pl.kernels->softmax(t);
    pl.kernels->pv(t);
    for (int32_t h = 0; h < H; ++h)
      if (part < rows_parts(h)) fold_partition(*pl.kernels, ws.m[h], ws.l[h], ws.part_acc + h * D, M[h], D, L[h], merged + h * D);
  }
  for (int32_t h = 0; h < H; ++h) {
    if (rows_parts(h) == parts) fold_partition(*pl.kernels, m_last[h], l_last[h], acc_last + h * D, M[h], D, L[h], merged + h * D);
    store_output(a, grp.first + h / G, kv_head * G + h % G, D, L[h], merged + h * D);
    store_lse(a, grp.first + h / G, kv_head * G + h % G, M[h], L[h]);
  }
}

void run_reference(tbb::task_arena& arena, const AttentionArgs& a, const std::vector<std::pair<int32_t, int64_t>>& rows,
                   CpuIsa isa) {
  const AttendQueryFn attend = attend_query_at(isa);
  tbb::enumerable_thread_specific<std::vector<float>> scratch;
  const int32_t heads = a.pools.geometry.kv_heads;
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range2d<int64_t, int32_t>(0, static_cast<int64_t>(rows.size()), 0, heads),
                      [&](const tbb::blocked_range2d<int64_t, int32_t>& r) {
                        std::vector<float>& buf = scratch.local();
                        for (int64_t i = r.rows().begin(); i < r.rows().end(); ++i) {
                          const auto [seq, position] = rows[i];
                          const KeyList keys = make_key_list(position, a.window, a.pools.geometry.page_divider());
                          const int64_t need =
                              attention_order_scratch_floats(a.order, a.group, a.pools.geometry.head_dim, keys.size());
                          if (static_cast<int64_t>(buf.size()) < need) buf.resize(need);
                          for (int32_t h = r.cols().begin(); h < r.cols().end(); ++h)
                            attend(a, seq, position, i, h, buf.data());
                        }
                      });
  });
}

}  // namespace

const Kernels& kernels_for(CpuIsa isa) {
  if (isa == CpuIsa::avx512 && avx512_kernels() != nullptr) return *avx512_kernels();
  if (isa == CpuIsa::avx2 && avx2_kernels() != nullptr) return *avx2_kernels();
  return fallback_kernels(isa);
}

const Kernels& fallback_kernels(CpuIsa isa) {
  return isa == CpuIsa::portable ? portable_kernels() : portable_fma_kernels();
}

AttentionPath selected_attention_path() {
  static const AttentionPath chosen = [] {
    const char* env = std::getenv("KVSIM_CPU_ATTENTION");
    if (env == nullptr || *env == '\0' || std::string_view(env) == "fast") return AttentionPath::fast;
    if (std::string_view(env) == "reference") return AttentionPath::reference;
    throw ValidationError(ErrorCode::bad_argument, std::string("KVSIM_CPU_ATTENTION = '") + clipped(env) +
                                                       "': expected reference or fast (or unset: fast); the ISA is "
                                                       "KVSIM_CPU_ISA's");
  }();  // a throw leaves it unset: the next call throws again
  return chosen;
}

void run_attention_rows(tbb::task_arena& arena, const AttentionArgs& a,
                        const std::vector<std::pair<int32_t, int64_t>>& rows, AttentionPath path, CpuIsa isa) {
  // The mma order runs core's attend_query_mma itself (the SIMD kernels are
  // the fp32 order's).
  if (path == AttentionPath::reference || a.order == AttentionOrder::mma) return run_reference(arena, a, rows, isa);
  const Plan plan = make_plan(a, isa);
  const std::vector<RowGroup> groups = group_rows(a, rows);
  const int32_t heads = a.pools.geometry.kv_heads;
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range2d<int64_t, int32_t>(0, static_cast<int64_t>(groups.size()), 0, heads),
                      [&](const tbb::blocked_range2d<int64_t, int32_t>& r) {
                        // Kept by each thread across ops: no allocation or first touch per op. An
                        // item runs start to finish on one thread (it never waits on other tasks).
                        thread_local Workspace ws;
                        for (int64_t i = r.rows().begin(); i < r.rows().end(); ++i)
                          for (int32_t h = r.cols().begin(); h < r.cols().end(); ++h) {
                            if (groups[i].count > 1)
                              attend_tiled(a, plan, rows, groups[i], h, ws);
                            else
                              attend_fast(a, plan, rows, groups[i], h, ws);
                          }
                      });
  });
}

}  // namespace cpu_attention

namespace {

AttentionArgs make_args(const KvPools& pools, int32_t layer, const TensorView& q, const TensorView& out,
                        const int32_t* table, int32_t max_blocks, const AttentionScales& scales,
                        const WindowMapping& window, const TensorView& lse, AttentionOrder order) {
  AttentionArgs a;
  a.order = order;
  a.pools = pools;
  a.layer = layer;
  a.q = q;
  a.out = out;
  a.block_table = table;
  a.max_blocks_per_seq = max_blocks;
  a.scales = scales;
  a.window = window;
  a.group = static_cast<int32_t>(q.shape[1] / pools.geometry.kv_heads);
  a.lse = lse;
  return a;
}

}  // namespace

void CpuBackend::run_decode_attention(const KvPools& pools, const DecodeAttentionOp& op) {
  const AttentionArgs a = make_args(pools, op.layer, op.q, op.out, op.block_table.data(), op.max_blocks_per_seq,
                                    op.scales, op.window, op.lse, op.order);
  std::vector<std::pair<int32_t, int64_t>> rows;
  for (size_t b = 0; b < op.seq_lens.size(); ++b) rows.emplace_back(static_cast<int32_t>(b), op.seq_lens[b] - 1);
  cpu_attention::run_attention_rows(
      arena_, a, rows, reference_attention_ ? cpu_attention::AttentionPath::reference : cpu_attention::AttentionPath::fast,
      isa_);
}

void CpuBackend::run_prefill_attention(const KvPools& pools, const PrefillAttentionOp& op) {
  const AttentionArgs a = make_args(pools, op.layer, op.q, op.out, op.block_table.data(), op.max_blocks_per_seq,
                                    op.scales, op.window, op.lse, op.order);
  std::vector<std::pair<int32_t, int64_t>> rows;
  for (size_t b = 0; b + 1 < op.q_indptr.size(); ++b)
    for (int32_t i = op.q_indptr[b]; i < op.q_indptr[b + 1]; ++i)
      rows.emplace_back(static_cast<int32_t>(b), prefill_position(op.seq_lens[b], op.q_indptr[b], op.q_indptr[b + 1], i));
  cpu_attention::run_attention_rows(
      arena_, a, rows, reference_attention_ ? cpu_attention::AttentionPath::reference : cpu_attention::AttentionPath::fast,
      isa_);
}

// MLA attention: core's attend_mla_query for every (row, query head), in any
// order and on any thread (each item writes its own output row).
void CpuBackend::run_mla_attention(const KvPools& pools, const MlaAttentionOp& op) {
  const MlaRows rows = make_mla_rows(op);
  MlaAttentionArgs a = make_mla_attention_args(pools, op);
  a.row_seq = rows.seq.data();
  a.row_position = rows.position.data();
  tbb::enumerable_thread_specific<std::vector<float>> scratch;
  const cpu_attention::AttendMlaFn attend = cpu_attention::attend_mla_at(isa_);
  arena_.execute([&] {
    tbb::parallel_for(tbb::blocked_range2d<int64_t, int32_t>(0, a.rows, 0, a.heads),
                      [&](const tbb::blocked_range2d<int64_t, int32_t>& r) {
                        std::vector<float>& buf = scratch.local();
                        for (int64_t i = r.rows().begin(); i < r.rows().end(); ++i) {
                          const int64_t need = mla_scratch_floats(a.d_ckv, a.d_kpe, a.row_position[i]);
                          if (static_cast<int64_t>(buf.size()) < need) buf.resize(static_cast<size_t>(need));
                          for (int32_t h = r.cols().begin(); h < r.cols().end(); ++h) attend(a, i, h, buf.data());
                        }
                      });
  });
}

}  // namespace kvsim
