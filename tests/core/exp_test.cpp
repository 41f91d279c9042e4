// core's fp32 exp (canon::exp_f32) against double exp over a dense sweep of
// its input range: every 8th fp32 bit pattern in [-104, 89] (about 270
// million inputs), and core's fp32 log (canon::log_f32, the attention LSE)
// against double log over every 16th positive finite input. The measured
// maximum errors are quoted in docs/canonical-arithmetic.md; the bounds
// asserted here are those numbers.
#include <doctest/doctest.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_reduce.h>

#include <cmath>
#include <cstdio>
#include <limits>

#include <kvsim/core/attention_math.hpp>

using namespace kvsim;

namespace {
// Error in units of the last place of the correctly rounded result.
double ulp_error(float got, double exact) {
  const float rounded = static_cast<float>(exact);
  if (rounded == 0.0f) return got == 0.0f ? 0.0 : std::fabs(got) / std::ldexp(1.0, -149);
  const double ulp = std::fabs(static_cast<double>(std::nextafter(rounded, std::numeric_limits<float>::infinity())) -
                               static_cast<double>(rounded));
  return std::fabs(static_cast<double>(got) - exact) / ulp;
}

struct Worst {
  double err = 0.0;
  float x = 0.0f;
};
}  // namespace

TEST_CASE("exp_f32 stays within 1.01 ulp of double exp over [-104, 89] (every 8th fp32 input)") {
  auto sweep = [](uint32_t lo_bits, uint32_t hi_bits) {
    return tbb::parallel_reduce(
        tbb::blocked_range<uint64_t>(lo_bits, static_cast<uint64_t>(hi_bits) + 1, 1 << 16), Worst{},
        [](const tbb::blocked_range<uint64_t>& r, Worst w) {
          for (uint64_t b = r.begin(); b < r.end(); b += 8) {
            const float x = bits_float(static_cast<uint32_t>(b));
            const double e = ulp_error(canon::exp_f32(x), std::exp(static_cast<double>(x)));
            if (e > w.err) w = Worst{e, x};
          }
          return w;
        },
        [](Worst a, Worst b) { return a.err >= b.err ? a : b; });
  };
  // Positive inputs [0, 89) and negative inputs (-104, 0].
  const Worst pos = sweep(0x00000000u, float_bits(88.72283935546875f));
  const Worst neg = sweep(0x80000000u, float_bits(-103.97208404541015625f));
  const Worst worst = pos.err >= neg.err ? pos : neg;
  std::printf("exp_f32: max error %.3f ulp at x = %.9g\n", worst.err, static_cast<double>(worst.x));
  MESSAGE("exp_f32 max error " << worst.err << " ulp at x = " << worst.x);
  CHECK(worst.err <= 1.01);  // measured: 1.008 ulp at x = -59.919
}

// exp_f32's one-multiply path for |x| <= 87 against the two-step scaling it
// replaces (written out here as the definition), for every float it takes.
namespace {
float exp_two_step(float x) {
  const float t = x * 1.44269504088896341f;
  const float kf = (t + 12582912.0f) - 12582912.0f;
  float r = canon::fma_f32(-kf, 0.693359375f, x);
  r = canon::fma_f32(-kf, -2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = canon::fma_f32(p, r, 1.3981999507e-3f);
  p = canon::fma_f32(p, r, 8.3334519073e-3f);
  p = canon::fma_f32(p, r, 4.1665795894e-2f);
  p = canon::fma_f32(p, r, 1.6666665459e-1f);
  p = canon::fma_f32(p, r, 5.0000001201e-1f);
  float y = canon::fma_f32(p, r * r, r) + 1.0f;
  const int k = static_cast<int>(kf), k1 = k / 2;
  return (y * canon::pow2i(k1)) * canon::pow2i(k - k1);
}
}  // namespace

TEST_CASE("exp_f32's one-multiply path equals the two-step scaling for every float of [-103.97, 88.72]") {
  // Every float of the two-step form's domain: both sides of the |x| <= 87 cut.
  const uint64_t pos_last = float_bits(88.72283935546875f);
  const uint64_t neg_last = float_bits(103.97208404541015625f);
  const uint64_t wrong = tbb::parallel_reduce(
      tbb::blocked_range<uint64_t>(0, pos_last + 1 + neg_last + 1, 1 << 16), uint64_t{0},
      [&](const tbb::blocked_range<uint64_t>& r, uint64_t n) {
        for (uint64_t i = r.begin(); i < r.end(); ++i) {
          const float x = bits_float(static_cast<uint32_t>(i <= pos_last ? i : 0x80000000u + (i - pos_last - 1)));
          n += float_bits(canon::exp_f32(x)) != float_bits(exp_two_step(x));
        }
        return n;
      },
      [](uint64_t a, uint64_t b) { return a + b; });
  CHECK(wrong == 0);
  CHECK(float_bits(canon::exp_f32(-87.0f)) == float_bits(exp_two_step(-87.0f)));
  CHECK(canon::exp_f32(-87.5f) > 0.0f);  // past the fast path: the two steps
  CHECK(canon::exp_f32(-103.0f) > 0.0f);  // a subnormal result
  CHECK(float_bits(canon::exp_f32(-103.0f)) == float_bits(exp_two_step(-103.0f)));
}

TEST_CASE("log_f32 stays within 1 ulp of double log over every 16th positive finite fp32 input") {
  const Worst worst = tbb::parallel_reduce(
      tbb::blocked_range<uint64_t>(1, 0x7F800000ull, 1 << 16), Worst{},
      [](const tbb::blocked_range<uint64_t>& r, Worst w) {
        for (uint64_t b = (r.begin() + 15) / 16 * 16 + 1; b < r.end(); b += 16) {
          const float x = bits_float(static_cast<uint32_t>(b));
          const double e = ulp_error(canon::log_f32(x), std::log(static_cast<double>(x)));
          if (e > w.err) w = Worst{e, x};
        }
        return w;
      },
      [](Worst a, Worst b) { return a.err >= b.err ? a : b; });
  std::printf("log_f32: max error %.3f ulp at x = %.9g\n", worst.err, static_cast<double>(worst.x));
  MESSAGE("log_f32 max error " << worst.err << " ulp at x = " << worst.x);
  CHECK(worst.err <= 1.0);  // measured: 0.996 ulp at x = 1.6038e-28 (99.36% of inputs correctly rounded)
}

TEST_CASE("log_f32 special values and the LSE helpers") {
  CHECK(canon::log_f32(1.0f) == 0.0f);
  CHECK(canon::log_f32(0.0f) == canon::neg_inf());
  CHECK(canon::log_f32(-0.0f) == canon::neg_inf());
  CHECK(canon::log_f32(canon::pos_inf()) == canon::pos_inf());
  CHECK(is_nan(canon::log_f32(-1.0f)));
  CHECK(is_nan(canon::log_f32(bits_float(0x7FC00000u))));
  CHECK(canon::log_f32(bits_float(1u)) == static_cast<float>(std::log(std::ldexp(1.0, -149))));  // smallest subnormal
  CHECK(canon::log_f32(2.0f) == static_cast<float>(std::log(2.0)));
  // lse = M + log(L), then base 2 by one multiply.
  CHECK(canon::log_sum_exp(3.0f, 1.0f) == 3.0f);
  CHECK(canon::log_sum_exp(-1.5f, 2.0f) == -1.5f + canon::log_f32(2.0f));
  CHECK(canon::lse_base2(2.0f) == 2.0f * 1.44269504088896341f);
}

TEST_CASE("exp_f32 special values") {
  CHECK(canon::exp_f32(0.0f) == 1.0f);
  CHECK(canon::exp_f32(-0.0f) == 1.0f);
  CHECK(canon::exp_f32(canon::neg_inf()) == 0.0f);
  CHECK(canon::exp_f32(canon::pos_inf()) == canon::pos_inf());
  CHECK(canon::exp_f32(89.0f) == canon::pos_inf());
  CHECK(canon::exp_f32(-105.0f) == 0.0f);
  CHECK(is_nan(canon::exp_f32(bits_float(0x7FC00000u))));
  // Subnormal results round once: exp(-100) ~ 3.72e-44 is a subnormal.
  CHECK(canon::exp_f32(-100.0f) == static_cast<float>(std::exp(-100.0)));
}

TEST_CASE("butterfly gives every lane the same sum, so the device shuffle matches") {
  float v[32];
  for (int l = 0; l < 32; ++l) v[l] = 1.0f / static_cast<float>(l + 3) * ((l % 3) ? 1.0f : -1e3f);
  // Emulate all 32 lanes and check they agree bit for bit.
  float lanes[32];
  for (int l = 0; l < 32; ++l) lanes[l] = v[l];
  for (int off = 16; off >= 1; off >>= 1) {
    float next[32];
    for (int l = 0; l < 32; ++l) next[l] = lanes[l ^ off] + lanes[l];  // the other operand order
    for (int l = 0; l < 32; ++l) lanes[l] = next[l];
  }
  const float s = canon::butterfly_sum32(v);
  for (int l = 0; l < 32; ++l) CHECK(float_bits(lanes[l]) == float_bits(s));
}
