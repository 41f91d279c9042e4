// Exhaustive checks of core's codecs (contract §4): every fp32 bit pattern through
// every fp32 -> narrow conversion, every 16-bit pattern through the bf16/fp16
// round trips, and every code of every narrow format through its decoder.
//
// The reference here is deliberately built differently from core, so that a
// shared mistake is unlikely:
//  * core rounds by shifting the fp32 significand; the reference decodes every
//    code of the target format to an exact double (std::ldexp on the code's
//    fields), and picks the nearest one by binary search plus an exact midpoint
//    comparison (2|x| against lo + hi, both exact in double), ties to the even
//    code.
//  * Overflow is found the IEEE way: the code after the largest finite one is
//    given the value the format would have with an unbounded exponent (480 for
//    e4m3, 2^16 for e5m2/fp16, 8 for e2m1, 2^128 for bf16); rounding to it is
//    an overflow, then codecs.hpp's rules (saturate, NaN, Inf) decide the code.
//  * Specials (NaN, Inf, signs) are classified with std::isnan / std::isinf and
//    std::signbit instead of bit masks.
// The 2^31 fp32 magnitudes are split over oneTBB; each magnitude is checked with
// both signs, so the reference runs once per magnitude.
#include <doctest/doctest.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_reduce.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <kvsim/core/codecs.hpp>
#include <string>
#include <vector>

namespace {

using namespace kvsim::codec;

// ---------------------------------------------------------------- mismatch tally

// Mismatches of one function over a sweep; keeps the smallest mismatching input
// so the report is the same for any thread count.
struct Mismatch {
  uint64_t count = 0;
  uint32_t input = 0;
  uint32_t expected = 0;
  uint32_t got = 0;

  void note(uint32_t in, uint32_t want, uint32_t have) {
    if (want == have) return;
    if (count == 0 || in < input) {
      input = in;
      expected = want;
      got = have;
    }
    ++count;
  }
  void merge(const Mismatch& other) {
    if (other.count == 0) return;
    if (count == 0 || other.input < input) {
      input = other.input;
      expected = other.expected;
      got = other.got;
    }
    count += other.count;
  }
};

std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", v);
  return buf;
}

void report(const std::string& what, const Mismatch& m) {
  CHECK_MESSAGE(m.count == 0, what << ": " << m.count << " mismatches; first at input " << hex(m.input)
                                   << " expected " << hex(m.expected) << " got " << hex(m.got));
}

// Runs body(first, last, tally) over chunks [first, last) covering every fp32
// magnitude bit pattern 0..0x7FFFFFFF in parallel; body checks +magnitude and
// -magnitude of each and notes into tally[i] for the i-th function it checks.
// Magnitudes rise within a chunk, which the references exploit.
template <size_t N, class Body>
std::array<Mismatch, N> sweep_all_fp32(const std::string& label, Body body) {
  using Tally = std::array<Mismatch, N>;
  const auto start = std::chrono::steady_clock::now();
  const Tally total = tbb::parallel_reduce(
      tbb::blocked_range<uint64_t>(0, uint64_t{1} << 31, uint64_t{1} << 18), Tally{},
      [&](const tbb::blocked_range<uint64_t>& r, Tally tally) {
        body(static_cast<uint32_t>(r.begin()), static_cast<uint32_t>(r.end()), tally);
        return tally;
      },
      [](Tally a, const Tally& b) {
        for (size_t i = 0; i < N; ++i) a[i].merge(b[i]);
        return a;
      });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MESSAGE(label << ": all 2^32 inputs checked in " << seconds << " s");
  return total;
}

constexpr uint32_t kSignBit = 0x80000000u;

float as_float(uint32_t bits) { return std::bit_cast<float>(bits); }
uint32_t as_bits(float f) { return std::bit_cast<uint32_t>(f); }

// ---------------------------------------------------------------- reference formats

// Exact value of a sign-less code of a binary format with EB exponent bits, MB
// mantissa bits and bias 2^(EB-1)-1, read as if the exponent were unbounded
// (so the code just past the largest finite one yields the overflow neighbour).
double exact_value(int exponent_bits, int mantissa_bits, uint32_t code) {
  const int bias = (1 << (exponent_bits - 1)) - 1;
  const uint32_t e = code >> mantissa_bits;
  const uint32_t m = code & ((1u << mantissa_bits) - 1u);
  if (e == 0) return std::ldexp(static_cast<double>(m), 1 - bias - mantissa_bits);
  return std::ldexp(static_cast<double>((1u << mantissa_bits) + m),
                    static_cast<int>(e) - bias - mantissa_bits);
}

// Value of every finite non-negative code 0..max_code, plus the overflow
// neighbour at index max_code + 1.
struct FormatTable {
  uint32_t max_code;
  std::vector<double> values;
};

FormatTable make_table(int exponent_bits, int mantissa_bits, uint32_t max_code) {
  FormatTable t{max_code, {}};
  for (uint32_t c = 0; c <= max_code + 1; ++c)
    t.values.push_back(exact_value(exponent_bits, mantissa_bits, c));
  return t;
}

const FormatTable& e4m3_table() {
  static const FormatTable t = make_table(4, 3, 0x7E);
  return t;
}
const FormatTable& e5m2_table() {
  static const FormatTable t = make_table(5, 2, 0x7B);
  return t;
}
const FormatTable& e2m1_table() {
  static const FormatTable t = make_table(2, 1, 0x7);
  return t;
}
const FormatTable& fp16_table() {
  static const FormatTable t = make_table(5, 10, 0x7BFF);
  return t;
}

// Nearest code to the non-negative finite value a, ties to the even code, given
// hi = index of the first table value >= a. Returns max_code + 1 for an overflow.
uint32_t pick_nearest(const FormatTable& t, size_t hi, double a) {
  const auto& v = t.values;
  if (hi == v.size()) return t.max_code + 1;  // beyond even the overflow neighbour
  const auto code_hi = static_cast<uint32_t>(hi);
  if (v[hi] == a || hi == 0) return code_hi;
  const uint32_t code_lo = code_hi - 1;
  // Both sides exact: 2a scales a float, v[lo] + v[hi] adds two neighbours of
  // at most 11 significant bits.
  const double twice = 2.0 * a;
  const double sum = v[code_lo] + v[code_hi];
  if (twice < sum) return code_lo;
  if (twice > sum) return code_hi;
  return (code_lo % 2 == 0) ? code_lo : code_hi;
}

// Stand-alone form: binary search for the bracketing pair.
uint32_t nearest_code(const FormatTable& t, double a) {
  const auto it = std::lower_bound(t.values.begin(), t.values.end(), a);
  return pick_nearest(t, static_cast<size_t>(it - t.values.begin()), a);
}

// Sweep form for non-decreasing arguments: the bracketing index only moves
// forward, so a chunk of 2^18 inputs costs one binary search plus a walk.
class NearestCodeCursor {
 public:
  NearestCodeCursor(const FormatTable& t, double first) : table_(t) {
    hi_ = static_cast<size_t>(std::lower_bound(t.values.begin(), t.values.end(), first) - t.values.begin());
  }
  uint32_t operator()(double a) {
    const auto& v = table_.values;
    while (hi_ < v.size() && v[hi_] < a) ++hi_;
    return pick_nearest(table_, hi_, a);
  }

 private:
  const FormatTable& table_;
  size_t hi_;
};

// Reference codes for +a and -a, where a is a non-negative fp32 magnitude.
struct SignedPair {
  uint32_t positive;
  uint32_t negative;
};

// fp8 magnitude code of a (NaN excluded): max_code + 1 for overflow and Inf.
uint32_t fp8_magnitude(const FormatTable& t, NearestCodeCursor& nearest, float a) {
  return std::isinf(a) ? t.max_code + 1 : nearest(static_cast<double>(a));
}

// fp8 codes for +a and -a: 0x7F for NaN (any sign); overflow -> overflow_code | sign.
SignedPair fp8_codes(const FormatTable& t, float a, uint32_t magnitude_code, uint32_t overflow_code) {
  if (std::isnan(a)) return {kFp8NaN, kFp8NaN};
  const uint32_t code = magnitude_code > t.max_code ? overflow_code : magnitude_code;
  return {code, code | 0x80u};
}

// ---------------------------------------------------------------- reference sanity

TEST_CASE("reference tables agree with hand-worked values") {
  // The reference itself must be right before it can judge core.
  const auto& e4 = e4m3_table();
  CHECK(e4.values[0x7E] == 448.0);
  CHECK(e4.values[0x7F] == 480.0);  // overflow neighbour
  CHECK(e4.values[0x01] == std::ldexp(1.0, -9));
  CHECK(e4.values[0x38] == 1.0);
  CHECK(nearest_code(e4, 464.0) == 0x7E);  // tie, 0x7E even
  CHECK(nearest_code(e4, 465.0) == 0x7F);  // overflow
  CHECK(nearest_code(e4, std::ldexp(1.0, -10)) == 0x00);
  CHECK(nearest_code(e4, 3 * std::ldexp(1.0, -10)) == 0x02);
  const auto& e5 = e5m2_table();
  CHECK(e5.values[0x7B] == 57344.0);
  CHECK(e5.values[0x7C] == 65536.0);
  CHECK(nearest_code(e5, 61440.0) == 0x7C);  // tie, 0x7C even: overflow
  const auto& e2 = e2m1_table();
  const double e2m1_values[] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, 8};
  for (uint32_t c = 0; c <= 8; ++c) CHECK(e2.values[c] == e2m1_values[c]);
  CHECK(nearest_code(e2, 0.75) == 2);
  CHECK(nearest_code(e2, 5.0) == 6);
  const auto& h = fp16_table();
  CHECK(h.values[0x7BFF] == 65504.0);
  CHECK(nearest_code(h, 65519.0) == 0x7BFF);
  CHECK(nearest_code(h, 65520.0) == 0x7C00);
  for (const FormatTable* t : {&e4, &e5, &e2, &h})
    for (size_t i = 1; i < t->values.size(); ++i) REQUIRE(t->values[i - 1] < t->values[i]);
}

// ---------------------------------------------------------------- decoders

// Checks decoded == reference bit for bit (sign of zero included).
void check_decode(const char* what, uint32_t code, float decoded, double reference, bool negative) {
  const double signed_ref = negative ? -reference : reference;
  const auto want = static_cast<float>(signed_ref);
  REQUIRE(static_cast<double>(want) == signed_ref);  // every narrow value is exact in fp32
  INFO(what << " code " << hex(code));
  CHECK(as_bits(decoded) == as_bits(want));  // -0 for the negative zero code
}

TEST_CASE("decoders: every code of e4m3, e5m2, e2m1, fp16, bf16") {
  for (uint32_t c = 0; c < 256; ++c) {
    const bool negative = (c & 0x80u) != 0;
    const uint32_t mag = c & 0x7Fu;
    const float got = e4m3_to_f32(static_cast<uint8_t>(c));
    if (mag == 0x7F) {
      CHECK_MESSAGE(std::isnan(got), "e4m3 NaN code " << hex(c));
    } else {
      check_decode("e4m3", c, got, exact_value(4, 3, mag), negative);
    }
  }
  for (uint32_t c = 0; c < 256; ++c) {
    const bool negative = (c & 0x80u) != 0;
    const uint32_t mag = c & 0x7Fu;
    const float got = e5m2_to_f32(static_cast<uint8_t>(c));
    if (mag == 0x7C) {
      CHECK_MESSAGE(std::isinf(got), "e5m2 Inf code " << hex(c));
      CHECK(std::signbit(got) == negative);
    } else if (mag > 0x7C) {
      CHECK_MESSAGE(std::isnan(got), "e5m2 NaN code " << hex(c));
    } else {
      check_decode("e5m2", c, got, exact_value(5, 2, mag), negative);
    }
  }
  for (uint32_t c = 0; c < 16; ++c)
    check_decode("e2m1", c, e2m1_to_f32(static_cast<uint8_t>(c)), exact_value(2, 1, c & 0x7u),
                 (c & 0x8u) != 0);
  for (uint32_t c = 0; c < 65536; ++c) {
    const bool negative = (c & 0x8000u) != 0;
    const uint32_t mag = c & 0x7FFFu;
    for (int is_bf16 = 0; is_bf16 < 2; ++is_bf16) {
      const int eb = is_bf16 ? 8 : 5;
      const int mb = is_bf16 ? 7 : 10;
      const uint32_t inf_code = is_bf16 ? 0x7F80u : 0x7C00u;
      const float got =
          is_bf16 ? bf16_to_f32(static_cast<uint16_t>(c)) : f16_to_f32(static_cast<uint16_t>(c));
      if (mag == inf_code) {
        CHECK_MESSAGE(std::isinf(got), (is_bf16 ? "bf16" : "fp16") << " Inf code " << hex(c));
        CHECK(std::signbit(got) == negative);
      } else if (mag > inf_code) {
        CHECK_MESSAGE(std::isnan(got), (is_bf16 ? "bf16" : "fp16") << " NaN code " << hex(c));
      } else {
        check_decode(is_bf16 ? "bf16" : "fp16", c, got, exact_value(eb, mb, mag), negative);
      }
    }
  }
}

TEST_CASE("16-bit round trips: bf16 -> f32 -> bf16 and fp16 -> f32 -> fp16") {
  // Identity on every non-NaN pattern (both signs, subnormals, Inf); every NaN
  // comes back as the canonical 0x7FFF.
  Mismatch bf16, fp16;
  for (uint32_t c = 0; c < 65536; ++c) {
    const auto h = static_cast<uint16_t>(c);
    const bool bf16_nan = (c & 0x7F80u) == 0x7F80u && (c & 0x7Fu) != 0;
    const bool fp16_nan = (c & 0x7C00u) == 0x7C00u && (c & 0x3FFu) != 0;
    bf16.note(c, bf16_nan ? kCanonicalNaN16 : c, f32_to_bf16(bf16_to_f32(h)));
    fp16.note(c, fp16_nan ? kCanonicalNaN16 : c, f32_to_f16(f16_to_f32(h)));
  }
  report("bf16 round trip", bf16);
  report("fp16 round trip", fp16);
}

// ---------------------------------------------------------------- fp32 -> narrow, all 2^32 inputs

TEST_CASE("f32_to_e4m3: all 2^32 inputs, saturating and non-saturating") {
  const FormatTable& t = e4m3_table();
  const auto tally =
      sweep_all_fp32<2>("e4m3", [&](uint32_t first, uint32_t last, std::array<Mismatch, 2>& out) {
        NearestCodeCursor nearest(t, static_cast<double>(as_float(first)));
        for (uint32_t m = first; m != last; ++m) {
          const float a = as_float(m);
          const float neg = as_float(m | kSignBit);
          const uint32_t mag = std::isnan(a) ? 0 : fp8_magnitude(t, nearest, a);
          // Saturating: overflow and Inf clamp to 448 (0x7E).
          const SignedPair sat = fp8_codes(t, a, mag, kE4m3MaxCode);
          out[0].note(m, sat.positive, f32_to_e4m3(a, Saturation::finite));
          out[0].note(m | kSignBit, sat.negative, f32_to_e4m3(neg, Saturation::finite));
          // Non-saturating: overflow and Inf go to S.1111.111 (NaN, sign kept).
          const SignedPair raw = fp8_codes(t, a, mag, 0x7F);
          out[1].note(m, raw.positive, f32_to_e4m3(a, Saturation::none));
          out[1].note(m | kSignBit, raw.negative, f32_to_e4m3(neg, Saturation::none));
        }
      });
  report("f32_to_e4m3 satfinite", tally[0]);
  report("f32_to_e4m3 non-saturating", tally[1]);
}

TEST_CASE("f32_to_e5m2: all 2^32 inputs, saturating and non-saturating") {
  const FormatTable& t = e5m2_table();
  const auto tally =
      sweep_all_fp32<2>("e5m2", [&](uint32_t first, uint32_t last, std::array<Mismatch, 2>& out) {
        NearestCodeCursor nearest(t, static_cast<double>(as_float(first)));
        for (uint32_t m = first; m != last; ++m) {
          const float a = as_float(m);
          const float neg = as_float(m | kSignBit);
          const uint32_t mag = std::isnan(a) ? 0 : fp8_magnitude(t, nearest, a);
          const SignedPair sat = fp8_codes(t, a, mag, kE5m2MaxCode);  // clamp to 57344
          out[0].note(m, sat.positive, f32_to_e5m2(a, Saturation::finite));
          out[0].note(m | kSignBit, sat.negative, f32_to_e5m2(neg, Saturation::finite));
          const SignedPair raw = fp8_codes(t, a, mag, kE5m2InfCode);  // overflow to +-Inf
          out[1].note(m, raw.positive, f32_to_e5m2(a, Saturation::none));
          out[1].note(m | kSignBit, raw.negative, f32_to_e5m2(neg, Saturation::none));
        }
      });
  report("f32_to_e5m2 satfinite", tally[0]);
  report("f32_to_e5m2 non-saturating", tally[1]);
}

TEST_CASE("f32_to_e2m1: all 2^32 inputs") {
  const FormatTable& t = e2m1_table();
  const auto tally =
      sweep_all_fp32<1>("e2m1", [&](uint32_t first, uint32_t last, std::array<Mismatch, 1>& out) {
        NearestCodeCursor nearest(t, static_cast<double>(as_float(first)));
        for (uint32_t m = first; m != last; ++m) {
          const float a = as_float(m);
          SignedPair want{0x7, 0x7};  // NaN -> +6 whatever its sign
          if (!std::isnan(a)) {
            uint32_t code = std::isinf(a) ? 0x7 : nearest(static_cast<double>(a));
            if (code > t.max_code) code = 0x7;  // saturate at 6
            want = {code, code | 0x8u};         // sign in bit 3, zero included
          }
          out[0].note(m, want.positive, f32_to_e2m1(a));
          out[0].note(m | kSignBit, want.negative, f32_to_e2m1(as_float(m | kSignBit)));
        }
      });
  report("f32_to_e2m1", tally[0]);
}

TEST_CASE("f32_to_f16: all 2^32 inputs") {
  const FormatTable& t = fp16_table();
  const auto tally =
      sweep_all_fp32<1>("fp16", [&](uint32_t first, uint32_t last, std::array<Mismatch, 1>& out) {
        NearestCodeCursor nearest(t, static_cast<double>(as_float(first)));
        for (uint32_t m = first; m != last; ++m) {
          const float a = as_float(m);
          SignedPair want{kCanonicalNaN16, kCanonicalNaN16};
          if (!std::isnan(a)) {
            uint32_t code = std::isinf(a) ? 0x7C00u : nearest(static_cast<double>(a));
            if (code > t.max_code) code = 0x7C00u;  // IEEE overflow: Inf
            want = {code, code | 0x8000u};
          }
          out[0].note(m, want.positive, f32_to_f16(a));
          out[0].note(m | kSignBit, want.negative, f32_to_f16(as_float(m | kSignBit)));
        }
      });
  report("f32_to_f16", tally[0]);
}

TEST_CASE("f32_to_bf16: all 2^32 inputs") {
  // bf16 shares fp32's exponent range, so the two candidates are the bf16 codes
  // just below and above |x|: the truncation of the magnitude and the next code.
  // Their values come from a table built with ldexp over codes 0..0x7F80; the
  // last, read with an unbounded exponent, is the overflow neighbour 2^128.
  std::vector<double> bf16_value(0x7F81);
  for (uint32_t c = 0; c < bf16_value.size(); ++c) bf16_value[c] = exact_value(8, 7, c);
  auto nearest_bf16 = [&](uint32_t magnitude_bits) -> uint32_t {
    const uint32_t below = magnitude_bits >> 16;
    const double twice = 2.0 * static_cast<double>(as_float(magnitude_bits));
    const double sum = bf16_value[below] + bf16_value[below + 1];  // exact: 8-bit neighbours
    if (twice < sum) return below;
    if (twice > sum) return below + 1;
    return (below % 2 == 0) ? below : below + 1;
  };
  const auto tally =
      sweep_all_fp32<1>("bf16", [&](uint32_t first, uint32_t last, std::array<Mismatch, 1>& out) {
        for (uint32_t m = first; m != last; ++m) {
          const float a = as_float(m);
          SignedPair want{kCanonicalNaN16, kCanonicalNaN16};
          if (!std::isnan(a)) {
            uint32_t code = std::isinf(a) ? 0x7F80u : nearest_bf16(m);
            if (code > 0x7F7Fu) code = 0x7F80u;  // overflow: Inf
            want = {code, code | 0x8000u};
          }
          out[0].note(m, want.positive, f32_to_bf16(a));
          out[0].note(m | kSignBit, want.negative, f32_to_bf16(as_float(m | kSignBit)));
        }
      });
  report("f32_to_bf16", tally[0]);
}

TEST_CASE("f32_to_int8: all 2^32 inputs") {
  // Reference: clamp to [-128, 127] in double, then round half to even with
  // floor and an exact fractional part. Clamping first is equivalent because
  // both bounds are integers and rounding is monotone.
  auto reference = [](float f) -> int32_t {
    if (std::isnan(f)) return 0;
    const double d = std::clamp(static_cast<double>(f), -128.0, 127.0);
    const double below = std::floor(d);
    const double frac = d - below;  // exact: |d| <= 128
    if (frac > 0.5) return static_cast<int32_t>(below) + 1;
    if (frac < 0.5) return static_cast<int32_t>(below);
    const auto b = static_cast<int32_t>(below);
    return (b % 2 == 0) ? b : b + 1;
  };
  const auto tally =
      sweep_all_fp32<1>("int8", [&](uint32_t first, uint32_t last, std::array<Mismatch, 1>& out) {
        for (uint32_t m = first; m != last; ++m) {
          for (const uint32_t bits : {m, m | kSignBit}) {
            const float f = as_float(bits);
            out[0].note(bits, static_cast<uint8_t>(reference(f)), static_cast<uint8_t>(f32_to_int8(f)));
          }
        }
      });
  report("f32_to_int8", tally[0]);
}

}  // namespace
