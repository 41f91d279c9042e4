// The CPU oracle's fast attention path (decode_attention, prefill_attention).
//
// Same bytes as core's attend_query(): every float is computed by the same
// IEEE operations in the same canonical order (attention_math.hpp,
// docs/canonical-arithmetic.md); only the work is arranged so that the
// independent accumulators of that order run side by side in SIMD registers:
//
//  * score: the 32 butterfly lanes of one query head are one 32-wide vector
//    (the K row is read in the transposed order kt[j][l] = k[l*c + j], an
//    exact permutation); lane l's fma chain runs over j in order. Dims beyond
//    head_dim are fed as fma(-0, +0, acc), which returns acc unchanged for
//    every acc (-0 and NaN included), so padding changes no bit. The xor
//    butterfly is evaluated only for the lanes lane 0 depends on, with the
//    same operand order (v[l] + v[l + off] for l < off), four query heads at
//    once. One decoded K row serves every query head of the GQA group.
//  * softmax: max in key order (maxps is exactly `s > m ? s : m`), core's exp
//    step by step on 16 keys at once, the partition sum in core's lane runs
//    and butterfly, four query heads side by side.
//  * P.V: per output dim acc = fma(p_j, v_j[d], acc) over keys in order, 16
//    or 64 dims per register block, one V decode per key for the group.
//  * prefill: a block of consecutive query rows x the GQA group runs as one
//    item (attention.cpp's attend_tiled): every decoded K/V row serves all of
//    the block's heads, partitions past the block's last key are never read,
//    and partitions are folded in order against the row's global max, found
//    by a first pass over the scores (docs/canonical-arithmetic.md), so there
//    is no per-partition scratch. The first pass reads K rows only, the
//    second V rows only where its scores were kept.
//  * merge: each partition's accumulators folded by the kernels' fma
//    (Kernels::fold), which is correctly rounded at every ISA.
//
// The ISA kernels (avx512, avx2; portable, compiled for baseline x86-64 and
// again for AVX2 + FMA; cpu_isa.hpp chooses at run time) work on one
// partition of one (query row, KV head) item; the driver (attention.cpp) resolves key slots to rows
// with core's element_offset, gathers the codes of rows it cannot read in
// place (split-x and other non-contiguous layouts) into contiguous rows of the
// cache's format (split-x V, [D][page], a page tile of keys at a time), decodes nvfp4 rows through core's load_head_row, and merges partitions exactly as attend_query does. AttentionPath::reference
// runs attend_query itself. tests/oracle/attention_fast_path_test.cpp holds every
// path to attend_query byte for byte.
#pragma once

#include <tbb/task_arena.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "backends/cpu/cpu_isa.hpp"
#include "kvsim/core/ops/attention.hpp"
#include "kvsim/core/ops/mla_attention.hpp"

namespace kvsim::cpu_attention {

// Which attention code runs: core's attend_query per (query row, KV head), or
// the fast path below. Both give the same bytes at every ISA.
enum class AttentionPath : uint8_t { reference, fast };
// The environment variable KVSIM_CPU_ATTENTION: reference or fast (unset or
// empty: fast); another value throws ValidationError (bad_argument). Read
// once per process (a benchmarking knob: same-binary before/after timings).
AttentionPath selected_attention_path();

// How K/V rows are read: in the cache dtype (in place from the pool, or codes
// gathered into a contiguous row), or as staged fp32 (f32 format) decoded by
// core's load_head_row (nvfp4).
enum class RowFormat : uint8_t { f32, f16, bf16, e4m3, e5m2, i8 };

inline constexpr int kQuad = 4;  // query heads reduced side by side

// One partition of one (query row, KV head) item for `group` query heads.
// Scores and probabilities are stored head-minor: s[quad][key][4].
struct PartitionTask {
  int32_t head_dim = 0;
  int32_t lanes_c = 0;  // c = ceil(head_dim / 32)
  int32_t group = 0;    // query heads sharing the KV head
  int32_t quads = 0;    // ceil(group / 4)
  int32_t count = 0;    // keys of the partition (1..kPartitionSize)
  RowFormat format = RowFormat::f32;
  int32_t row_bytes = 0;  // bytes of one row (prefetch hints only)
  const uint8_t* const* k_rows = nullptr;  // [count] first byte of each K row; nullptr = masked key
  const uint8_t* const* v_rows = nullptr;  // [count] V rows (masked keys too: p = 0 still enters P.V)
  // [group][c][32]: qt[(g*c + j)*32 + pos] = q_g[lane(pos)*c + j], -0 beyond D,
  // lane(pos) being the kernel's lane_order for this format and head_dim.
  const float* qt = nullptr;
  const int32_t* kt_source = nullptr;      // [c*32]: kt[j*32 + pos] = k[kt_source[...]], D (a +0 slot) beyond D
  const int32_t* perm = nullptr;           // [c][pairs][16] K transposition indices (avx512, see plan)
  const uint16_t* perm_mask = nullptr;     // [c][pairs]
  float score_scale = 1.0f;
  float* s = nullptr;    // [quads][kPartitionSize][4] scores (out)
  float* p = nullptr;    // [quads][kPartitionSize][4] probabilities (out)
  float* m = nullptr;    // [quads * 4] partition max per head (out)
  float* l = nullptr;    // [quads * 4] partition sum per head (out)
  float* acc = nullptr;  // head g's P.V accumulators at acc + g * acc_stride, head_dim floats (out)
  int64_t acc_stride = 0;
  // [group] keys [0, key_limit[g]) of the partition enter head g's P.V (the
  // rest lie past its row's key list: a tiled prefill block's shorter rows);
  // nullptr = all `count` keys for every head.
  const int32_t* key_limit = nullptr;
  float* kbuf = nullptr;  // scratch of >= 64 * c + 64 floats
};

struct Kernels {
  void (*scores)(const PartitionTask&);
  void (*softmax)(const PartitionTask&);
  void (*pv)(const PartitionTask&);
  // m[4q + i] = the maximum of m[4q + i] and head 4q + i's scores over the
  // partition's t.count keys, for every quad q < t.quads (each step `s > m ?
  // s : m`: a NaN score never wins; only a zero maximum's sign can depend on
  // the order, which no later step sees). The tiled prefill's first pass.
  void (*scores_max)(const PartitionTask& t, float* m);
  // merged[d] = fma(acc[d], w, merged[d]) for d < n: the partition merge's
  // accumulator step (attend_query's loop body), one correctly rounded fma each.
  void (*fold)(const float* acc, float w, int32_t n, float* merged);
  // Whether this kernel set handles a head_dim (the portable one: all).
  bool (*supports_head_dim)(int32_t head_dim);
  // Which butterfly lane the scores kernel keeps at each of the 32 vector
  // positions (a permutation; the identity unless a kernel transposes K rows
  // in another order). The butterfly still adds lane l and lane l + off.
  void (*lane_order)(RowFormat format, int32_t head_dim, int32_t* lane_of_position);
  // Test hooks (and kvsim bench's FMA ceiling) at this kernel set's ISA:
  // core's exp_f32 on n floats; the in-place row decoder on head_dim
  // elements (a multiple of 16); `steps` rounds of x[i] = fma(x[i], a, b)
  // over n floats (a multiple of 256), many independent chains in flight.
  void (*exp)(const float* x, float* y, int64_t n);
  void (*decode_row)(RowFormat format, const uint8_t* row, float* out, int32_t head_dim);
  void (*fma_rounds)(float* x, int64_t n, int32_t steps, float a, float b);
};

// The portable kernels compiled for baseline x86-64, and the same C++ compiled
// for AVX2 + FMA (the head dims the SIMD kernels do not take, where the CPU
// runs AVX2).
const Kernels& portable_kernels();
const Kernels& portable_fma_kernels();
// nullptr when the build has no such kernels (a non-x86 host or compiler).
const Kernels* avx2_kernels();
const Kernels* avx512_kernels();
// The kernel set of an ISA the CPU runs (portable: the baseline one), and the
// one for head dims that set does not support.
const Kernels& kernels_for(CpuIsa isa);
const Kernels& fallback_kernels(CpuIsa isa);

// Runs every (query row, KV head) item of an op: rows[i] = (sequence,
// absolute position) of row i of a.q / a.out. Any thread count, path and ISA
// the CPU runs: the same bytes.
void run_attention_rows(tbb::task_arena& arena, const AttentionArgs& a,
                        const std::vector<std::pair<int32_t, int64_t>>& rows, AttentionPath path, CpuIsa isa);

// core's attend_query_in_order and attend_mla_query at an ISA: at avx2 and
// avx512 a copy compiled for AVX2 + FMA (fma_clones.cpp), else the baseline one.
using AttendQueryFn = void (*)(const AttentionArgs&, int32_t seq, int64_t position, int64_t row, int32_t kv_head,
                               float* scratch);
using AttendMlaFn = void (*)(const MlaAttentionArgs&, int64_t row, int32_t head, float* scratch);
AttendQueryFn attend_query_at(CpuIsa isa);
AttendMlaFn attend_mla_at(CpuIsa isa);

}  // namespace kvsim::cpu_attention
