// Every non-attention op of the CUDA backend (and the attention entry points
// through the Backend interface) against the CPU oracle, byte for byte,
// through a DifferentialBackend(cpu, cuda): after every op the whole primary
// (and, for offload, secondary) pool, its nvfp4 scale pool and every output
// tensor are compared. Axes: cache dtype × layout × placement × page size (odd
// and even) × GQA group × head dim × ragged batch size; the product is sampled
// deterministically (case i takes value (i * stride_k + k) mod |axis_k| of axis
// k, strides coprime to the axis lengths) so every value of every axis runs.
// Page tables are shuffled non-contiguous block ids, inputs are strided, and
// pools are refilled with random codes before each op. Each op is swept twice:
// finite values only, then with NaN (with payloads), +-Inf and fp8 NaN codes,
// so a NaN-payload divergence is told apart from an indexing bug.
// Skips without a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "backends/differential_backend.hpp"
#include "backends/op_generator.hpp"

using namespace kvsim;

namespace {

// KVSIM_DIFF_CANDIDATE=cpu runs the same sweep cpu against cpu: a check of the
// sweep itself (every generated case valid) on a machine without a GPU.
std::unique_ptr<DifferentialBackend> make_diff_or_skip() {
  const char* candidate = std::getenv("KVSIM_DIFF_CANDIDATE");
  try {
    return std::make_unique<DifferentialBackend>(make_backend("cpu", BackendOptions{2}),
                                                 make_backend(candidate ? candidate : "cuda"));
  } catch (const BackendUnavailable& e) {
    MESSAGE("SKIPPED (differential test needs a GPU): " << e.what());
    std::printf("SKIPPED (differential test needs a GPU): %s\n", e.what());
    return nullptr;
  }
}

constexpr CacheDtype kDtypes[] = {CacheDtype::fp32,     CacheDtype::fp16, CacheDtype::bf16, CacheDtype::fp8_e4m3,
                                  CacheDtype::fp8_e5m2, CacheDtype::int8, CacheDtype::nvfp4};
constexpr BlockLayout kLayouts[] = {BlockLayout::nhd, BlockLayout::hnd, BlockLayout::split_x};
constexpr LayerPlacement kPlacements[] = {LayerPlacement::in_block, LayerPlacement::per_layer};
constexpr int32_t kPageSizes[] = {1, 3, 7, 16, 17};
constexpr int32_t kGroups[] = {1, 4, 8};
constexpr int32_t kHeadDims[] = {64, 80, 128, 256};
constexpr int32_t kBatches[] = {1, 3, 5, 2};
constexpr CacheDtype kInputs[] = {CacheDtype::fp32, CacheDtype::fp16, CacheDtype::bf16};

template <class T, size_t N>
T axis(const T (&values)[N], int i, int stride, int k) {
  return values[static_cast<size_t>(i * stride + k) % N];
}

struct SweepCase {
  PoolGeometry geometry;
  OpKnobs knobs;
};

// Case i of the sampled product for `op`; geometry adjusted to what the op supports.
SweepCase sweep_case(GeneratedOp op, int i) {
  SweepCase c;
  PoolGeometry& g = c.geometry;
  g.dtype = axis(kDtypes, i, 1, 0);
  g.layout = axis(kLayouts, i, 2, 1);
  g.placement = axis(kPlacements, i, 1, i / 2);
  g.tokens_per_block = axis(kPageSizes, i, 3, 2);
  g.head_dim = axis(kHeadDims, i, 3, 1);
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
  c.knobs.group = axis(kGroups, i, 1, 0);
  c.knobs.batch = axis(kBatches, i, 3, 0);
  c.knobs.input_dtype = axis(kInputs, i, 1, 1);
  c.knobs.window = i % 2;
  return c;
}

// One sweep through a fresh DifferentialBackend; `special_values` adds NaN
// (with payloads), +-Inf and fp8 NaN codes to inputs and pools.
void sweep(GeneratedOp op, int cases, bool special_values) {
  std::unique_ptr<DifferentialBackend> diff = make_diff_or_skip();
  if (!diff) return;
  const std::string values = special_values ? "with NaN/Inf" : "finite";
  int ran = 0;
  for (int i = 0; i < cases; ++i) {
    const SweepCase c = sweep_case(op, i);
    if (!op_supports_geometry(op, c.geometry)) continue;  // e.g. reshape_and_cache never writes nvfp4
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
  MESSAGE(generated_op_name(op) << " (" << values << "): " << ran << " ops, " << diff->counters().bytes_compared
                                << " bytes compared, 0 differ");
  CHECK(ran > 0);
  CHECK(diff->counters().ops == ran);
}

void check_op_is_equivalent(GeneratedOp op, int cases) {
  sweep(op, cases, /*special_values=*/false);
  sweep(op, cases, /*special_values=*/true);
}

// 84 cases give every pair of dtype and page size; KVSIM_SWEEP_CASES (>= 7,
// so every value of every axis still appears) shortens the sweep under
// compute-sanitizer.
const int kCases = [] {
  const char* env = std::getenv("KVSIM_SWEEP_CASES");
  return env ? std::max(7, std::atoi(env)) : 84;
}();

}  // namespace

TEST_CASE("AppendPagedIsEquivalentToRef") { check_op_is_equivalent(GeneratedOp::append_paged, kCases); }
TEST_CASE("ReshapeAndCacheIsEquivalentToRef") { check_op_is_equivalent(GeneratedOp::reshape_and_cache, kCases); }
TEST_CASE("QkvPreprocessWriteIsEquivalentToRef") { check_op_is_equivalent(GeneratedOp::qkv_preprocess_write, kCases); }
TEST_CASE("AppendMlaIsEquivalentToRef") { check_op_is_equivalent(GeneratedOp::append_mla, kCases); }
TEST_CASE("IndexerKScatterIsEquivalentToRef") { check_op_is_equivalent(GeneratedOp::indexer_k_scatter, std::min(kCases, 24)); }
TEST_CASE("GatherPagedIsEquivalentToRef") { check_op_is_equivalent(GeneratedOp::gather_paged, kCases); }
TEST_CASE("PartialCopyIsEquivalentToRef") { check_op_is_equivalent(GeneratedOp::partial_copy, kCases); }
TEST_CASE("CopyBlocksIsEquivalentToRef") { check_op_is_equivalent(GeneratedOp::copy_blocks, kCases); }
TEST_CASE("OffloadIsEquivalentToRef") { check_op_is_equivalent(GeneratedOp::offload, kCases); }
TEST_CASE("OnboardIsEquivalentToRef") { check_op_is_equivalent(GeneratedOp::onboard, kCases); }
TEST_CASE("DecodeAttentionThroughBackendIsEquivalentToRef") {
  check_op_is_equivalent(GeneratedOp::decode_attention, kCases);
}
TEST_CASE("PrefillAttentionThroughBackendIsEquivalentToRef") {
  check_op_is_equivalent(GeneratedOp::prefill_attention, kCases);
}

TEST_CASE("GeneratedOpSequencesAreEquivalentToRef") {
  std::unique_ptr<DifferentialBackend> diff = make_diff_or_skip();
  if (!diff) return;
  for (bool special_values : {false, true}) {
    diff = make_diff_or_skip();
    const int64_t ops = run_generated_sequences(
        *diff, 12, 2026, 20, [&](const std::string& s) { diff->set_context(s); }, special_values);
    if (diff->first_difference()) FAIL_CHECK(diff->first_difference()->text());
    CHECK(ops == 12 * 21);
    CHECK(diff->counters().ops == ops);
  }
}

TEST_CASE("CudaBackendPutsTheSecondaryPoolInHostMemory") {
  std::unique_ptr<Backend> cuda;
  try {
    cuda = make_backend("cuda");
  } catch (const BackendUnavailable& e) {
    std::printf("SKIPPED (differential test needs a GPU): %s\n", e.what());
    return;
  }
  PoolGeometry g{.head_dim = 32, .dtype = CacheDtype::nvfp4, .primary_blocks = 3, .secondary_blocks = 2};
  KvPools pools = cuda->allocate_pools(g, 0x5A);
  // Pinned host memory is readable by the host directly; the fill reached it.
  const uint8_t* secondary = static_cast<const uint8_t*>(pools.data[1]);
  const uint8_t* secondary_scales = static_cast<const uint8_t*>(pools.scales[1]);
  CHECK(secondary[0] == 0x5A);
  CHECK(secondary[g.pool_bytes(PoolKind::secondary) - 1] == 0x5A);
  CHECK(secondary_scales[0] == 0x5A);
  cuda->release_pools(pools);
}
