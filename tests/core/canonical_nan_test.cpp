// Computed fp32 outputs hold one NaN, 0x7FFFFFFF (what GPU f32 arithmetic
// produces), whatever payload or sign x86 arithmetic propagated; finite
// values, infinities and signed zeros are stored unchanged.
#include <doctest/doctest.h>

#include <cstring>

#include <kvsim/core.hpp>
#include <kvsim/core/tensor.hpp>

using namespace kvsim;

TEST_CASE("store_float fp32 stores every NaN as the canonical 0x7FFFFFFF and everything else as is") {
  for (uint32_t nan : {0x7FC00000u, 0xFFC00000u, 0x7FC01234u, 0x7F800001u, 0xFFFFFFFFu, 0x7FFFFFFFu}) {
    float out = 0.0f;
    store_float(&out, CacheDtype::fp32, 0, bits_float(nan));
    CHECK(float_bits(out) == kCanonicalF32NaN);
  }
  for (uint32_t x : {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x3F800000u, 0x00000001u, 0x7F7FFFFFu}) {
    float out = 1.0f;
    store_float(&out, CacheDtype::fp32, 0, bits_float(x));
    CHECK(float_bits(out) == x);
  }
}

TEST_CASE("16-bit outputs were canonical already: fp16 and bf16 NaN -> 0x7FFF") {
  for (uint32_t nan : {0x7FC00000u, 0xFFC01234u}) {
    uint16_t h = 0, b = 0;
    store_float(&h, CacheDtype::fp16, 0, bits_float(nan));
    store_float(&b, CacheDtype::bf16, 0, bits_float(nan));
    CHECK(h == 0x7FFF);
    CHECK(b == 0x7FFF);
  }
}
