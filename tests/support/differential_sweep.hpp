// The `...IsEquivalentToRef` sweeps (Ginkgo's idea: every backend held to a
// reference by one suite), shared by the fast CPU backend against the
// reference (tests/oracle/cpu_is_equivalent_to_ref_test.cpp) and CUDA
// against it (tests/cuda/ops_differential_test.cpp): generated ops through a
// DifferentialBackend(reference, candidate), which compares after every op the
// whole primary (and, for offload, secondary) pool, its nvfp4 scale pool and
// every output tensor byte for byte. Axes: cache dtype x layout x placement x
// page size (odd and even) x GQA group x head dim x ragged batch size x input
// dtype x window; the product is sampled deterministically (case i takes value
// (i * stride_k + k) mod |axis_k| of axis k, strides coprime to the axis
// lengths) so every value of every axis runs. Page tables are shuffled
// non-contiguous block ids, inputs are strided, and pools are refilled with
// random codes before each op. Each op is swept twice: finite values only,
// then with NaN (with payloads), +-Inf and fp8 NaN codes, so a NaN-payload
// divergence is told apart from an indexing bug.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>

#include "backends/differential_backend.hpp"
#include "backends/op_generator.hpp"
#include "tests/support/mla_attention_fixture.hpp"

namespace kvsim::test {

// A fresh DifferentialBackend for each sweep (nullptr: skipped, said why).
using DiffFactory = std::function<std::unique_ptr<DifferentialBackend>()>;

// DifferentialBackend(reference, candidate), or nullptr after printing
// "SKIPPED (differential test needs a GPU): ..." when one is not available.
inline std::unique_ptr<DifferentialBackend> make_diff_or_skip(const std::string& reference,
                                                              const std::string& candidate) {
  try {
    return std::make_unique<DifferentialBackend>(make_backend(reference, BackendOptions{2}),
                                                 make_backend(candidate, BackendOptions{2}));
  } catch (const BackendUnavailable& e) {
    MESSAGE("SKIPPED (differential test needs a GPU): " << e.what());
    std::printf("SKIPPED (differential test needs a GPU): %s\n", e.what());
    return nullptr;
  }
}

inline constexpr CacheDtype kSweepDtypes[] = {CacheDtype::fp32,     CacheDtype::fp16, CacheDtype::bf16,
                                              CacheDtype::fp8_e4m3, CacheDtype::fp8_e5m2, CacheDtype::int8,
                                              CacheDtype::nvfp4};
inline constexpr BlockLayout kSweepLayouts[] = {BlockLayout::nhd, BlockLayout::hnd, BlockLayout::split_x};
inline constexpr LayerPlacement kSweepPlacements[] = {LayerPlacement::in_block, LayerPlacement::per_layer};
inline constexpr int32_t kSweepPageSizes[] = {1, 3, 7, 16, 17};
inline constexpr int32_t kSweepGroups[] = {1, 4, 8};
inline constexpr int32_t kSweepHeadDims[] = {64, 80, 128, 256};
inline constexpr int32_t kSweepBatches[] = {1, 3, 5, 2};
inline constexpr CacheDtype kSweepInputs[] = {CacheDtype::fp32, CacheDtype::fp16, CacheDtype::bf16};

template <class T, size_t N>
T sweep_axis(const T (&values)[N], int i, int stride, int k) {
  return values[static_cast<size_t>(i * stride + k) % N];
}

struct SweepCase {
  PoolGeometry geometry;
  OpKnobs knobs;
};

// Case i of the sampled product for `op`; geometry adjusted to what the op supports.
inline SweepCase sweep_case(GeneratedOp op, int i) {
  SweepCase c;
  PoolGeometry& g = c.geometry;
  g.dtype = sweep_axis(kSweepDtypes, i, 1, 0);
  g.layout = sweep_axis(kSweepLayouts, i, 2, 1);
  g.placement = sweep_axis(kSweepPlacements, i, 1, i / 2);
  g.tokens_per_block = sweep_axis(kSweepPageSizes, i, 3, 2);
  g.head_dim = sweep_axis(kSweepHeadDims, i, 3, 1);
  g.layers = 2;
  g.kv_factor = 2;
  g.kv_heads = 2;
  g.primary_blocks = 14;
  g.secondary_blocks = 5;
  if (op == GeneratedOp::append_mla) {
    g.kv_factor = 1;
    g.kv_heads = 1;
  }
  if (g.layout == BlockLayout::split_x && (g.dtype == CacheDtype::nvfp4 || op == GeneratedOp::append_mla))
    g.layout = BlockLayout::hnd;
  c.knobs.group = sweep_axis(kSweepGroups, i, 1, 0);
  c.knobs.batch = sweep_axis(kSweepBatches, i, 3, 0);
  c.knobs.input_dtype = sweep_axis(kSweepInputs, i, 1, 1);
  c.knobs.window = i % 2;
  return c;
}

// One sweep of `cases` cases through a fresh DifferentialBackend;
// `special_values` adds NaN (with payloads), +-Inf and fp8 NaN codes to inputs
// and pools. With order mma, only the cases whose cache dtype offers it run.
inline void sweep(const DiffFactory& make, GeneratedOp op, int cases, bool special_values,
                  AttentionOrder order = AttentionOrder::fp32) {
  std::unique_ptr<DifferentialBackend> diff = make();
  if (!diff) return;
  const std::string values = special_values ? "with NaN/Inf" : "finite";
  int ran = 0;
  for (int i = 0; i < cases; ++i) {
    SweepCase c = sweep_case(op, i);
    c.knobs.order = order;
    if (!op_supports_geometry(op, c.geometry)) continue;  // e.g. reshape_and_cache never writes nvfp4
    if (order == AttentionOrder::mma && !mma_order::offered_for(c.geometry.dtype)) continue;
    OpGenerator gen(*diff, 1000003u * static_cast<uint64_t>(op) + static_cast<uint64_t>(i), special_values);
    gen.set_geometry(c.geometry);
    for (int rep = 0; rep < 2; ++rep) {
      gen.poison();
      diff->set_context(values + " case " + std::to_string(i) + " rep " + std::to_string(rep));
      const std::string what = gen.run(op, c.knobs);
      if (diff->first_difference()) {
        FAIL_CHECK(diff->first_difference()->text() << "\n  op: " << what);
        return;
      }
      ++ran;
    }
  }
  MESSAGE(generated_op_name(op) << " (" << values << ", " << diff->reference().name() << " against "
                                << diff->candidate().name() << "): " << ran << " ops, "
                                << diff->counters().bytes_compared << " bytes compared, 0 differ");
  CHECK(ran > 0);
  CHECK(diff->counters().ops == ran);
}

inline void check_op_is_equivalent(const DiffFactory& make, GeneratedOp op, int cases,
                                   AttentionOrder order = AttentionOrder::fp32) {
  sweep(make, op, cases, /*special_values=*/false, order);
  sweep(make, op, cases, /*special_values=*/true, order);
}

// 84 cases give every pair of dtype and page size; KVSIM_SWEEP_CASES (>= 7,
// so every value of every axis still appears) shortens the sweep (e.g. under
// compute-sanitizer).
inline int sweep_cases() {
  const char* env = std::getenv("KVSIM_SWEEP_CASES");
  return env ? std::max(7, std::atoi(env)) : 84;
}

// Generated op sequences (every op in a shuffled order on one random geometry
// each), finite and with NaN/Inf.
inline void check_generated_sequences_are_equivalent(const DiffFactory& make) {
  for (bool special_values : {false, true}) {
    std::unique_ptr<DifferentialBackend> diff = make();
    if (!diff) return;
    const int64_t ops = run_generated_sequences(
        *diff, 12, 2026, 20, [&](const std::string& s) { diff->set_context(s); }, special_values);
    if (diff->first_difference()) FAIL_CHECK(diff->first_difference()->text());
    CHECK(ops == 12 * 21);
    CHECK(diff->counters().ops == ops);
  }
}


// mla_attention (not drawn by the generator: its own fixture,
// tests/support/mla_attention_fixture.hpp) over 30 cases: latent dtype (bf16,
// fp16, fp32, fp8 e4m3, nvfp4) x page size (1, 7, 16, 64) x query heads (1, 16,
// 128) x decode / chunked prefill, sequences past a partition (the split-KV
// merge) and DeepSeek-V3's 512 + 64 latent; the latent pool written by
// append_mla and every output byte compared.
inline void check_mla_attention_is_equivalent(DifferentialBackend& diff) {
  const CacheDtype dtypes[] = {CacheDtype::bf16, CacheDtype::fp16, CacheDtype::fp32, CacheDtype::fp8_e4m3,
                               CacheDtype::nvfp4};
  const int32_t pages[] = {1, 7, 16, 64};
  const int32_t heads[] = {1, 16, 128};
  int ran = 0;
  for (int i = 0; i < 30; ++i) {
    MlaCase c;
    c.dtype = dtypes[i % 5];
    c.page_size = pages[(i * 3) % 4];
    c.heads = heads[(i * 7) % 3];
    c.chunk = i % 2 == 0 ? 0 : (i % 4 == 1 ? 5 : 400);
    c.lens = {1 + i, 300 - i, 17};
    c.scale = c.dtype == CacheDtype::fp8_e4m3 ? 0.01f : 1.0f;
    c.q_dtype = i % 3 == 0 ? CacheDtype::bf16 : CacheDtype::fp32;
    c.seed = static_cast<uint64_t>(i + 1);
    if (i >= 25) {  // DeepSeek-V3's latent row
      c.d_ckv = 512;
      c.d_kpe = 64;
      c.heads = 128;
      c.lens = {70 + i, 9};
    }
    MlaSetup s;
    mla_setup(diff, c, s);
    diff.mla_attention(s.pools, s.op);
    ++ran;
    INFO("case " << i << ": " << dtype_name(c.dtype) << " P " << c.page_size << " heads " << c.heads << " chunk " << c.chunk);
    if (diff.first_difference()) {
      FAIL_CHECK(diff.first_difference()->text());
      break;
    }
  }
  CHECK(ran == 30);
  CHECK(diff.counters().ops >= 30 * 3);  // two append_mla and the attention op per case
}

}  // namespace kvsim::test

// The suite itself, one doctest case per op and order plus the generated
// sequences, against `make` (a DiffFactory): one line in each backend's test.
#define KVSIM_SWEEP_CASE(name, op, ...) \
  TEST_CASE(name) { ::kvsim::test::check_op_is_equivalent(make, ::kvsim::GeneratedOp::op, __VA_ARGS__); }
#define KVSIM_IS_EQUIVALENT_TO_REF_TEST_CASES(make_diff)                                                      \
  namespace {                                                                                                 \
  const ::kvsim::test::DiffFactory make = make_diff;                                                          \
  const int kCases = ::kvsim::test::sweep_cases();                                                            \
  }                                                                                                           \
  KVSIM_SWEEP_CASE("AppendPagedIsEquivalentToRef", append_paged, kCases)                                      \
  KVSIM_SWEEP_CASE("ReshapeAndCacheIsEquivalentToRef", reshape_and_cache, kCases)                             \
  KVSIM_SWEEP_CASE("QkvPreprocessWriteIsEquivalentToRef", qkv_preprocess_write, kCases)                       \
  KVSIM_SWEEP_CASE("AppendMlaIsEquivalentToRef", append_mla, kCases)                                          \
  KVSIM_SWEEP_CASE("IndexerKScatterIsEquivalentToRef", indexer_k_scatter, std::min(kCases, 24))               \
  KVSIM_SWEEP_CASE("GatherPagedIsEquivalentToRef", gather_paged, kCases)                                      \
  KVSIM_SWEEP_CASE("PartialCopyIsEquivalentToRef", partial_copy, kCases)                                      \
  KVSIM_SWEEP_CASE("CopyBlocksIsEquivalentToRef", copy_blocks, kCases)                                        \
  KVSIM_SWEEP_CASE("OffloadIsEquivalentToRef", offload, kCases)                                               \
  KVSIM_SWEEP_CASE("OnboardIsEquivalentToRef", onboard, kCases)                                               \
  KVSIM_SWEEP_CASE("DecodeAttentionThroughBackendIsEquivalentToRef", decode_attention, kCases)                \
  KVSIM_SWEEP_CASE("PrefillAttentionThroughBackendIsEquivalentToRef", prefill_attention, kCases)              \
  KVSIM_SWEEP_CASE("DecodeAttentionMmaOrderIsEquivalentToRef", decode_attention, kCases,                      \
                   ::kvsim::AttentionOrder::mma)                                                              \
  KVSIM_SWEEP_CASE("PrefillAttentionMmaOrderIsEquivalentToRef", prefill_attention, kCases,                    \
                   ::kvsim::AttentionOrder::mma)                                                              \
  TEST_CASE("GeneratedOpSequencesAreEquivalentToRef") {                                                       \
    ::kvsim::test::check_generated_sequences_are_equivalent(make);                                            \
  }
