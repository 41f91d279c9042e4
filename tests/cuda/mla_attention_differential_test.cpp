// mla_attention on the CUDA backend against the CPU oracle, byte for byte,
// through a DifferentialBackend(cpu, cuda): the latent pool written by
// append_mla and every output byte of the op compared. Axes: latent dtype
// (bf16, fp16, fp32, fp8 e4m3, nvfp4) x page size (1, 7, 16, 64) x query heads
// (1, 16, 128) x decode / chunked prefill, sequences past a partition (the
// split-KV merge) and DeepSeek-V3's 512 + 64 latent. Skips without a GPU.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "backends/differential_backend.hpp"
#include "tests/support/mla_attention_fixture.hpp"

using namespace kvsim;
using namespace kvsim::test;

TEST_CASE("mla_attention: CUDA equals the CPU oracle byte for byte") {
  const char* candidate = std::getenv("KVSIM_DIFF_CANDIDATE");
  std::unique_ptr<DifferentialBackend> diff;
  try {
    diff = std::make_unique<DifferentialBackend>(make_backend("cpu", BackendOptions{2}),
                                                 make_backend(candidate ? candidate : "cuda"));
  } catch (const BackendUnavailable& e) {
    MESSAGE("SKIPPED (differential test needs a GPU): " << e.what());
    std::printf("SKIPPED (differential test needs a GPU): %s\n", e.what());
    return;
  }
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
    mla_setup(*diff, c, s);
    diff->mla_attention(s.pools, s.op);
    ++ran;
    INFO("case " << i << ": " << dtype_name(c.dtype) << " P " << c.page_size << " heads " << c.heads << " chunk " << c.chunk);
    if (diff->first_difference()) {
      FAIL_CHECK(diff->first_difference()->text());
      break;
    }
  }
  CHECK(ran == 30);
  CHECK(diff->counters().ops >= 30 * 3);  // two append_mla and the attention op per case
}
