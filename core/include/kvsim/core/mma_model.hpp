// A bit-accurate model of one Hopper tensor-core instruction's inner product:
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 and
// mma.sync.aligned.m16n8k32.row.col.f32.{e4m3,e5m2}.{e4m3,e5m2}.f32, fp32
// accumulation. Each output element d = c + sum_k a[k] * b[k] of one
// instruction is what mma_inner_product() returns, bit for bit, for every
// input (zeros, subnormals, Inf, NaN included), on sm_90 (H100, H200).
//
// The 16-bit instruction (HMMA.16816.F32), in order:
//   1. specials: a NaN, Inf * 0 or +Inf - Inf anywhere gives NaN 0x7FFFFFFF;
//      else an Inf product or accumulator gives that Inf;
//   2. products exact (a 16-bit significand product, nominal exponent ea + eb;
//      subnormal inputs kept, exponent 1 - bias);
//   3. e_max = the largest exponent among the nonzero products and c;
//   4. every term truncated toward zero onto the grid 2^max(e_max - 25, -158);
//   5. the grid sum is exact (no carry is lost);
//   6. normalised and rounded toward zero to fp32 (subnormals too), overflow
//      to Inf; a zero result is +0 whatever the signs.
// fp8 (m16n8k32) is not a tensor-core fp8 operation on sm_90: ptxas emits
// exact fp8 -> fp16 conversions and two 16-bit HMMAs from +0 (elements with
// k % 4 < 2 first), then adds c with one IEEE fp32 addition.
//
// Integer arithmetic except that last fp32 addition (one IEEE operation, the
// same on host and device), so host and device compute the same bits.
//
// Every step is one of MmaRules' fields. The hardware's rule is kHopperMma;
// `kvsim mma-check` runs the real instruction against kHopperMma and against
// each alternative (mma_rule_alternative() below: kHopperMma with one field
// changed) on the same inner products and reports how many each gets wrong. A
// field is established when kHopperMma has 0 differences and its alternative
// is caught; docs/canonical-arithmetic.md ("Tensor-core inner product") has
// the counts measured on the H200.
//
// The papers this started from (read, not copied): MMA-Sim (Xie et al.,
// arXiv 2511.10909) and Khattak & Mikaitis, "Accurate Models of NVIDIA Tensor
// Cores" (arXiv 2512.07004). Both describe Hopper's 16-bit mma as one fused
// multi-operand addition with products aligned to the largest exponent,
// truncated to a fixed number of bits and rounded toward zero at the end;
// the -158 floor of the grid, the +0 rule and the fp8 path were found here.
#pragma once

#include "bits.hpp"
#include "config.hpp"

namespace kvsim::mma {

// Input element types of the modelled instructions.
enum class Operand : uint8_t { bf16, fp16, e4m3, e5m2 };

inline constexpr Operand kAllOperands[] = {Operand::bf16, Operand::fp16, Operand::e4m3, Operand::e5m2};

constexpr const char* operand_name(Operand f) {
  switch (f) {
    case Operand::bf16: return "bf16";
    case Operand::fp16: return "fp16";
    case Operand::e4m3: return "e4m3";
    case Operand::e5m2: return "e5m2";
  }
  return "?";
}

// k of one instruction: m16n8k16 for the 16-bit types, m16n8k32 for fp8.
KVSIM_HD constexpr int instruction_k(Operand f) { return (f == Operand::e4m3 || f == Operand::e5m2) ? 32 : 16; }

// Bits of one stored element (the code's width in memory and in registers).
KVSIM_HD constexpr int operand_bits(Operand f) { return (f == Operand::e4m3 || f == Operand::e5m2) ? 8 : 16; }

struct OperandFormat {
  int exponent_bits, fraction_bits, bias;
  bool has_infinity;  // e4m3 has none: S.1111.111 is its only NaN, S.1111.110 = 448 is finite
};

KVSIM_HD constexpr OperandFormat operand_format(Operand f) {
  switch (f) {
    case Operand::bf16: return {8, 7, 127, true};
    case Operand::fp16: return {5, 10, 15, true};
    case Operand::e4m3: return {4, 3, 7, false};
    case Operand::e5m2: return {5, 2, 15, true};
  }
  return {8, 7, 127, true};
}

// How each named step of the hardware's arithmetic behaves. kHopperMma holds
// the measured rule; every other value is an alternative that the check tool
// shows the hardware does not follow (docs/canonical-arithmetic.md has the
// counts).
struct MmaRules {
  // Alignment: every nonzero term (each exact product and the accumulator c)
  // is placed on one fixed-point grid whose unit is 2^(e_max - kept_bits),
  // e_max the largest exponent among the terms, and the bits below the unit
  // are dropped. Measured: 25 (24 and 26 each differ from the hardware).
  int kept_bits = 25;
  // The grid's unit never goes below 2^lowest_unit: a product far below the
  // fp32 range loses its bits under it even when e_max is small.
  int lowest_unit = -158;
  // Which exponent a product brings to e_max: its nominal exponent ea + eb
  // (the significand product in [1, 4) is not renormalised first), or the
  // exponent of the normalised product (one more when that product is >= 2).
  bool normalised_product_exponent = false;
  // Dropped bits of a negative term: truncated toward zero (sign-magnitude,
  // like the positive ones) or toward minus infinity (two's complement).
  bool negative_terms_floor = false;
  // Does c join the same alignment as the products (one fused addition), or
  // is the products' sum formed first (aligned to the products' own e_max)
  // and then added to c with the same grid rule?
  bool accumulator_after_products = false;
  // The exact grid sum, normalised, is rounded to fp32 toward zero (false) or
  // to nearest even (true).
  bool final_round_nearest = false;
  // A finite sum beyond the fp32 range: +-Inf (false) or +-FLT_MAX (true).
  bool overflow_saturates = false;
  // Significand bits the result keeps: 23 (fp32) or fewer (an e8m13 result,
  // what MMA-Sim reports for Hopper's fp8 wgmma).
  int result_fraction_bits = 23;
  // Subnormal inputs and accumulator: kept as they are (false) or read as
  // zero (true).
  bool flush_subnormal_inputs = false;
  // fp8 (m16n8k32) on sm_90 is no tensor-core fp8 instruction: ptxas turns
  // it into F2FP.F16.E4M3/E5M2.UNPACK conversions (exact: every fp8 value is
  // an fp16 value) and two HMMA.16816.F32, seen in the check binary's SASS.
  // fp8_pairs_interleaved: the first HMMA takes the elements k with
  // k % 4 < 2 (the low halves of each thread's 4-byte registers), the second
  // the others; false: k < 16 first, then k >= 16.
  bool fp8_pairs_interleaved = true;
  // fp8_accumulator_added_last: the two HMMAs start from +0 and c is added
  // to their result by one IEEE fp32 addition (round to nearest even);
  // false: c is the first HMMA's accumulator.
  bool fp8_accumulator_added_last = true;
};

// The rules of Hopper's mma.sync (sm_90), as measured on the H200.
inline constexpr MmaRules kHopperMma{};

// A decoded element: zero, a finite nonzero value sig * 2^(exp - fraction_bits)
// (exp the nominal exponent: 1 - bias for subnormals, whose sig has no hidden
// bit), Inf or NaN.
enum class Kind : uint8_t { zero, finite, inf, nan };

struct Decoded {
  Kind kind = Kind::zero;
  bool negative = false;
  int32_t exp = 0;
  uint32_t sig = 0;
};

KVSIM_HD constexpr Decoded decode_fields(uint32_t code, int exponent_bits, int fraction_bits, int bias,
                                         bool has_infinity, bool flush_subnormal) {
  const uint32_t exp_all_ones = (1u << exponent_bits) - 1;
  const uint32_t fraction_mask = (1u << fraction_bits) - 1;
  Decoded d;
  d.negative = ((code >> (exponent_bits + fraction_bits)) & 1u) != 0;
  const uint32_t field = (code >> fraction_bits) & exp_all_ones;
  const uint32_t fraction = code & fraction_mask;
  if (field == exp_all_ones && has_infinity) {
    d.kind = fraction == 0 ? Kind::inf : Kind::nan;
  } else if (field == exp_all_ones && fraction == fraction_mask) {  // e4m3's only NaN
    d.kind = Kind::nan;
  } else if (field == 0) {
    d.kind = (fraction == 0 || flush_subnormal) ? Kind::zero : Kind::finite;
    d.exp = 1 - bias;
    d.sig = fraction;
  } else {
    d.kind = Kind::finite;
    d.exp = static_cast<int32_t>(field) - bias;
    d.sig = fraction | (1u << fraction_bits);
  }
  return d;
}

KVSIM_HD constexpr Decoded decode_operand(Operand f, uint32_t code, const MmaRules& rules = MmaRules{}) {
  const OperandFormat fmt = operand_format(f);
  return decode_fields(code, fmt.exponent_bits, fmt.fraction_bits, fmt.bias, fmt.has_infinity,
                       rules.flush_subnormal_inputs);
}

KVSIM_HD constexpr Decoded decode_f32(float c, const MmaRules& rules = MmaRules{}) {
  return decode_fields(float_bits(c), 8, 23, 127, true, rules.flush_subnormal_inputs);
}

// The NaN every NaN-producing inner product returns (measured: the sign and
// payload of NaN inputs are not propagated).
inline constexpr uint32_t kMmaNanBits = 0x7FFFFFFFu;

namespace detail {

inline constexpr int32_t kNoExponent = -2147483647;

KVSIM_HD constexpr int highest_bit(uint64_t v) {  // v > 0
  int p = 0;
  while (v >> 1) {
    v >>= 1;
    ++p;
  }
  return p;
}

// The grid's unit for a largest exponent e_max.
KVSIM_HD constexpr int32_t grid_unit(int32_t e_max, const MmaRules& rules) {
  const int32_t unit = e_max - rules.kept_bits;
  return unit < rules.lowest_unit ? rules.lowest_unit : unit;
}

// One term on the grid: magnitude sig * 2^(exp - frac) in units of 2^unit,
// the bits below the unit dropped.
KVSIM_HD constexpr int64_t on_grid(bool negative, uint64_t sig, int32_t exp, int frac, int32_t unit,
                                   const MmaRules& rules) {
  const int32_t shift = exp - frac - unit;
  uint64_t magnitude = 0;
  bool dropped = false;
  if (shift >= 0) {
    magnitude = sig << shift;  // shift <= kept_bits: no bit leaves 64
  } else if (shift > -64) {
    magnitude = sig >> -shift;
    dropped = (magnitude << -shift) != sig;
  } else {
    dropped = sig != 0;
  }
  if (negative && dropped && rules.negative_terms_floor) ++magnitude;
  return negative ? -static_cast<int64_t>(magnitude) : static_cast<int64_t>(magnitude);
}

// sum * 2^unit rounded to fp32 by the rules' final rounding. Zero, and a
// nonzero sum that rounds to zero, give +0: the hardware returned +0 for
// every zero result, whatever the signs of the terms (measured).
KVSIM_HD constexpr uint32_t grid_to_f32(int64_t sum, int32_t unit, const MmaRules& rules) {
  if (sum == 0) return 0u;
  const uint32_t sign = sum < 0 ? 0x80000000u : 0u;
  const uint64_t magnitude = sum < 0 ? static_cast<uint64_t>(-sum) : static_cast<uint64_t>(sum);
  // The result's last kept bit: 2^(leading exponent - result_fraction_bits),
  // never below fp32's subnormal unit 2^-149.
  int32_t last = unit + highest_bit(magnitude) - rules.result_fraction_bits;
  if (last < -149) last = -149;
  const int32_t drop = last - unit;  // bits of the sum below the last kept bit
  uint64_t kept = 0;
  if (drop <= 0) {
    kept = magnitude << -drop;
  } else if (drop < 64) {
    kept = magnitude >> drop;
    if (rules.final_round_nearest) {
      const uint64_t rest = magnitude - (kept << drop);
      const uint64_t half = uint64_t{1} << (drop - 1);
      if (rest > half || (rest == half && (kept & 1u))) ++kept;
    }
  }
  if (kept == 0) return 0u;
  const int q = highest_bit(kept);  // rounding may carry into a new bit
  const int32_t exponent = last + q;
  if (exponent > 127) return sign | (rules.overflow_saturates ? 0x7F7FFFFFu : 0x7F800000u);
  if (exponent < -126) return sign | static_cast<uint32_t>(kept);  // subnormal: last == -149
  const uint64_t significand = q >= 23 ? (kept >> (q - 23)) : (kept << (23 - q));
  return sign | (static_cast<uint32_t>(exponent + 127) << 23) | (static_cast<uint32_t>(significand) & 0x7FFFFFu);
}

// c + sum of n products of 16-bit operands as one fused addition: one
// HMMA.16816.F32's output element.
KVSIM_HD constexpr uint32_t fused_dot_add(Operand f, const uint32_t* a, const uint32_t* b, int n, uint32_t c_bits,
                                          const MmaRules& rules) {
  const int frac = 2 * operand_format(f).fraction_bits;
  const Decoded c = decode_fields(c_bits, 8, 23, 127, true, rules.flush_subnormal_inputs);
  // Special values first: any NaN, Inf * 0 or Inf - Inf gives NaN; otherwise
  // an Inf operand or accumulator gives Inf of its sign. Finite products
  // never become Inf before the final rounding (bf16 products up to 2^256
  // that cancel give their finite difference).
  bool nan = c.kind == Kind::nan, pos_inf = c.kind == Kind::inf && !c.negative,
       neg_inf = c.kind == Kind::inf && c.negative;
  int32_t e_products = kNoExponent;
  for (int k = 0; k < n; ++k) {
    const Decoded x = decode_operand(f, a[k], rules), y = decode_operand(f, b[k], rules);
    const bool negative = x.negative != y.negative;
    if (x.kind == Kind::nan || y.kind == Kind::nan) {
      nan = true;
    } else if (x.kind == Kind::inf || y.kind == Kind::inf) {
      if (x.kind == Kind::zero || y.kind == Kind::zero) nan = true;
      else if (negative) neg_inf = true;
      else pos_inf = true;
    } else if (x.kind == Kind::finite && y.kind == Kind::finite) {
      int32_t e = x.exp + y.exp;
      if (rules.normalised_product_exponent && ((uint64_t{x.sig} * y.sig) >> frac) >= 2) ++e;
      if (e > e_products) e_products = e;
    }
  }
  if (nan || (pos_inf && neg_inf)) return kMmaNanBits;
  if (pos_inf) return 0x7F800000u;
  if (neg_inf) return 0xFF800000u;
  const bool c_finite = c.kind == Kind::finite;
  if (e_products == kNoExponent) return c_finite ? c_bits : 0u;  // only zero products (+0 for -0 too)
  const bool c_joins = c_finite && !rules.accumulator_after_products;
  const int32_t unit = grid_unit((c_joins && c.exp > e_products) ? c.exp : e_products, rules);
  int64_t sum = 0;
  for (int k = 0; k < n; ++k) {
    const Decoded x = decode_operand(f, a[k], rules), y = decode_operand(f, b[k], rules);
    if (x.kind == Kind::finite && y.kind == Kind::finite)
      sum += on_grid(x.negative != y.negative, uint64_t{x.sig} * y.sig, x.exp + y.exp, frac, unit, rules);
  }
  if (c_joins) return grid_to_f32(sum + on_grid(c.negative, c.sig, c.exp, 23, unit, rules), unit, rules);
  if (!c_finite || sum == 0) return c_finite ? c_bits : grid_to_f32(sum, unit, rules);
  // Alternative: the products' exact sum as one term, then c on a new grid.
  const bool negative = sum < 0;
  const uint64_t magnitude = negative ? static_cast<uint64_t>(-sum) : static_cast<uint64_t>(sum);
  const int top = highest_bit(magnitude);
  const int32_t e_sum = unit + top;
  const int32_t unit2 = grid_unit(c.exp > e_sum ? c.exp : e_sum, rules);
  return grid_to_f32(on_grid(negative, magnitude, e_sum, top, unit2, rules) + on_grid(c.negative, c.sig, c.exp, 23, unit2, rules),
                     unit2, rules);
}

// fp8 code as the fp16 code of the same value (exact; NaN stays NaN).
KVSIM_HD constexpr uint32_t fp8_as_fp16(Operand f, uint32_t code, const MmaRules& rules = MmaRules{}) {
  if (f == Operand::e5m2) return (code & 0xFFu) << 8;  // e5m2 is fp16's top byte (flushing: fp16's rule)
  const Decoded d = decode_operand(Operand::e4m3, code, rules);
  const uint32_t sign = d.negative ? 0x8000u : 0u;
  if (d.kind == Kind::nan) return 0x7FFFu;
  if (d.kind == Kind::zero) return sign;
  // sig * 2^(exp - 3), sig < 16: normalise into fp16 (every e4m3 value is normal there).
  int32_t e = d.exp;
  uint32_t sig = d.sig;
  while (sig < 8u) {
    sig <<= 1;
    --e;
  }
  return sign | (static_cast<uint32_t>(e + 15) << 10) | ((sig & 7u) << 7);
}

// The IEEE fp32 addition (round to nearest even) the fp8 path ends with;
// every NaN comes out as kMmaNanBits.
KVSIM_HD inline uint32_t add_f32_rn(uint32_t x, uint32_t y) {
#if defined(__CUDA_ARCH__)
  const float r = __fadd_rn(bits_float(x), bits_float(y));
#else
  volatile float vx = bits_float(x), vy = bits_float(y);  // one IEEE addition, never contracted
  const float r = vx + vy;
#endif
  return is_nan(r) ? kMmaNanBits : float_bits(r);
}

}  // namespace detail

// One output element of one mma.sync: c + a . b over instruction_k(f)
// elements, a and b as stored codes (bf16/fp16 bit patterns, fp8 bytes) in
// k order, c and the result as fp32.
KVSIM_HD inline float mma_inner_product(Operand f, const uint32_t* a, const uint32_t* b, float c,
                                        const MmaRules& rules = MmaRules{}) {
  if (instruction_k(f) == 16) return bits_float(detail::fused_dot_add(f, a, b, 16, float_bits(c), rules));
  uint32_t ha[32] = {}, hb[32] = {};
  int n = 0;
  for (int half = 0; half < 2; ++half)
    for (int k = 0; k < 32; ++k) {
      const bool first = rules.fp8_pairs_interleaved ? (k % 4) < 2 : k < 16;
      if (first == (half == 0)) {
        ha[n] = detail::fp8_as_fp16(f, a[k], rules);
        hb[n] = detail::fp8_as_fp16(f, b[k], rules);
        ++n;
      }
    }
  const uint32_t start = rules.fp8_accumulator_added_last ? 0u : float_bits(c);
  const uint32_t products =
      detail::fused_dot_add(Operand::fp16, ha + 16, hb + 16, 16, detail::fused_dot_add(Operand::fp16, ha, hb, 16, start, rules), rules);
  return bits_float(rules.fp8_accumulator_added_last ? detail::add_f32_rn(products, float_bits(c)) : products);
}

// One alternative to kHopperMma per named step: the check tool's evidence.
struct MmaRuleAlternative {
  const char* step;
  MmaRules rules;
};

inline constexpr int kMmaRuleAlternatives = 12;

KVSIM_HD constexpr MmaRuleAlternative mma_rule_alternative(int i) {
  MmaRules r{};
  switch (i) {
    case 0: r.kept_bits = 24; return {"alignment keeps 24 bits", r};
    case 1: r.kept_bits = 26; return {"alignment keeps 26 bits", r};
    case 2: r.lowest_unit = -1000; return {"grid unit unbounded below", r};
    case 3: r.normalised_product_exponent = true; return {"e_max from normalised products", r};
    case 4: r.negative_terms_floor = true; return {"negative terms floored", r};
    case 5: r.accumulator_after_products = true; return {"c added after the products", r};
    case 6: r.final_round_nearest = true; return {"final rounding to nearest", r};
    case 7: r.overflow_saturates = true; return {"overflow saturates", r};
    case 8: r.kept_bits = 13; r.result_fraction_bits = 13; return {"e8m13 (13 kept bits, 13-bit result)", r};
    case 9: r.flush_subnormal_inputs = true; return {"subnormal inputs flushed", r};
    case 10: r.fp8_pairs_interleaved = false; return {"fp8: k < 16 in the first HMMA", r};
    default: r.fp8_accumulator_added_last = false; return {"fp8: c is the first HMMA's accumulator", r};
  }
}

}  // namespace kvsim::mma
