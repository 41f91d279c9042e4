// The tensor-core check (mma_check.hpp): tiles of A (16 x k), B (k x 8) and C
// (16 x 8) are drawn on the device from a counter-based generator, one warp
// runs the real mma.sync per tile, and one thread per output element runs
// core's model and compares bits.
#include "backends/cuda/mma_check.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "backends/backend.hpp"
#include "backends/cuda/cuda_check.hpp"

namespace kvsim::cuda {

namespace {

using mma::Operand;

constexpr int kTileOutputs = 16 * 8;
constexpr int kMaxK = 32;
constexpr int kSampleTilesPerFamily = 16;  // dumped whatever the result
constexpr uint32_t kMaxDumpedDifferences = 1 << 16;
constexpr int kFirstDifferences = 8;

const char* const kFamilyNames[kMmaFamilies] = {
    "random: any finite codes",
    "random: typical magnitudes",
    "any bit pattern (NaN, Inf, subnormal)",
    "exponent spread",
    "massive cancellation of products",
    "accumulator cancels a product",
    "exponent gaps at the kept-bit boundary",
    "subnormal inputs and results",
    "carries (all-ones significands)",
    "zeros of both signs",
    "Inf and NaN among finite values",
    "overflow and huge products",
    "accumulator larger or smaller than products",
    "accumulator at the kept-bit boundary",
};

// ---------------------------------------------------------------- generator
struct Rng {
  uint64_t state;
  KVSIM_HD uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  KVSIM_HD uint32_t below(uint32_t n) { return static_cast<uint32_t>(next() % n); }
  KVSIM_HD int range(int lo, int hi) { return lo + static_cast<int>(below(static_cast<uint32_t>(hi - lo + 1))); }
  KVSIM_HD bool chance(uint32_t one_in) { return below(one_in) == 0; }
};

struct Format {
  int eb, mb, bias, max_field;  // max_field: largest exponent field of a finite value
  bool has_inf;
};

KVSIM_HD Format format_of(Operand f) {
  const mma::OperandFormat o = mma::operand_format(f);
  return {o.exponent_bits, o.fraction_bits, o.bias, o.has_infinity ? (1 << o.exponent_bits) - 2 : (1 << o.exponent_bits) - 1,
          o.has_infinity};
}

// A finite code with unbiased exponent e (clamped to the format's range: below
// it the field is 0, a subnormal) and the given fraction bits.
KVSIM_HD uint32_t code_with(const Format& f, bool negative, int e, uint32_t fraction) {
  int field = e + f.bias;
  if (field < 0) field = 0;
  if (field > f.max_field) field = f.max_field;
  fraction &= (1u << f.mb) - 1;
  if (!f.has_inf && field == f.max_field && fraction == (1u << f.mb) - 1) fraction -= 1;  // e4m3: not NaN
  return (static_cast<uint32_t>(negative) << (f.eb + f.mb)) | (static_cast<uint32_t>(field) << f.mb) | fraction;
}

KVSIM_HD uint32_t nan_code(const Format& f, Rng& r) {
  const uint32_t exp_ones = ((1u << f.eb) - 1) << f.mb;
  uint32_t fraction = f.has_inf ? (1u + r.below((1u << f.mb) - 1)) : (1u << f.mb) - 1;
  return (static_cast<uint32_t>(r.below(2)) << (f.eb + f.mb)) | exp_ones | fraction;
}

KVSIM_HD uint32_t inf_code(const Format& f, bool negative) {
  return (static_cast<uint32_t>(negative) << (f.eb + f.mb)) | (((1u << f.eb) - 1) << f.mb);
}

KVSIM_HD bool is_special(const Format& f, uint32_t code) {
  const uint32_t field = (code >> f.mb) & ((1u << f.eb) - 1);
  const uint32_t fraction = code & ((1u << f.mb) - 1);
  if (f.has_inf) return field == (1u << f.eb) - 1;
  return field == (1u << f.eb) - 1 && fraction == (1u << f.mb) - 1;
}

KVSIM_HD uint32_t any_finite_code(const Format& f, Rng& r) {
  for (;;) {
    const uint32_t code = static_cast<uint32_t>(r.next()) & ((1u << (1 + f.eb + f.mb)) - 1);
    if (!is_special(f, code)) return code;
  }
}

KVSIM_HD uint32_t random_fraction(const Format& f, Rng& r) {
  switch (r.below(8)) {
    case 0: return (1u << f.mb) - 1;  // all ones
    case 1: return 0;
    default: return static_cast<uint32_t>(r.next());
  }
}

KVSIM_HD uint32_t f32_with(bool negative, int e, uint32_t mantissa) {
  int field = e + 127;
  if (field < 0) field = 0;
  if (field > 254) field = 254;
  return (static_cast<uint32_t>(negative) << 31) | (static_cast<uint32_t>(field) << 23) | (mantissa & 0x7FFFFFu);
}

KVSIM_HD uint32_t random_f32_mantissa(Rng& r) {
  switch (r.below(8)) {
    case 0: return 0x7FFFFFu;
    case 1: return 0;
    default: return static_cast<uint32_t>(r.next());
  }
}

// The exact value of a finite code as fp32 (every operand type is a subset of fp32).
KVSIM_HD float code_value(Operand op, uint32_t code) {
  const mma::Decoded d = mma::decode_operand(op, code);
  if (d.kind != mma::Kind::finite) return d.negative ? -0.0f : 0.0f;
  const float magnitude = static_cast<float>(d.sig) * bits_float(static_cast<uint32_t>(127 + d.exp - mma::operand_format(op).fraction_bits) << 23);
  return d.negative ? -magnitude : magnitude;
}

struct Tile {
  uint32_t* a;  // [16][k]
  uint32_t* b;  // [k][8]
  uint32_t* c;  // [16][8] fp32 bits
};

KVSIM_HD void generate_tile(Operand op, int family, uint64_t seed, uint64_t tile, Tile t) {
  const Format f = format_of(op);
  const int k = mma::instruction_k(op);
  Rng r{seed * 0x2545F4914F6CDD1Dull ^ (tile + 1) * 0x9E3779B97F4A7C15ull};
  r.next();
  // Exponents a typical operand of this type has: bf16 and fp16 around 1,
  // fp8 across most of its range.
  const int lo = op == Operand::e4m3 ? -6 : (op == Operand::e5m2 ? -10 : -6);
  const int hi = op == Operand::e4m3 ? 6 : (op == Operand::e5m2 ? 10 : 3);
  auto typical = [&](Rng& g) { return code_with(f, g.below(2) != 0, g.range(lo, hi), random_fraction(f, g)); };
  auto a_at = [&](int i, int kk) -> uint32_t& { return t.a[i * k + kk]; };
  auto b_at = [&](int kk, int j) -> uint32_t& { return t.b[kk * 8 + j]; };
  auto c_at = [&](int i, int j) -> uint32_t& { return t.c[i * 8 + j]; };
  auto fill = [&](auto&& element, auto&& accumulator) {
    for (int i = 0; i < 16; ++i)
      for (int kk = 0; kk < k; ++kk) a_at(i, kk) = element();
    for (int kk = 0; kk < k; ++kk)
      for (int j = 0; j < 8; ++j) b_at(kk, j) = element();
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 8; ++j) c_at(i, j) = accumulator();
  };
  const int product_e = lo + hi;  // around the typical product's exponent
  switch (family) {
    case 0:  // any finite codes, any finite accumulator
      fill([&] { return any_finite_code(f, r); },
           [&] { return r.chance(8) ? 0u : f32_with(r.below(2), r.range(-40, 40), random_f32_mantissa(r)); });
      break;
    case 1:  // typical attention magnitudes
      fill([&] { return typical(r); },
           [&] { return r.chance(8) ? 0u : f32_with(r.below(2), r.range(lo, hi + 4), random_f32_mantissa(r)); });
      break;
    case 2: {  // any bit pattern
      fill([&] { return static_cast<uint32_t>(r.next()) & ((1u << (1 + f.eb + f.mb)) - 1); },
           [&] { return static_cast<uint32_t>(r.next()); });
      break;
    }
    case 3: {  // exponents spread over a window of random width
      const int width = r.range(0, 2 * f.max_field);
      const int base = r.range(1 - f.bias - 2, f.max_field - f.bias - width / 2);
      fill([&] { return code_with(f, r.below(2), base + r.range(0, width / 2), random_fraction(f, r)); },
           [&] { return r.chance(4) ? 0u : f32_with(r.below(2), 2 * base + r.range(-30, width + 30), random_f32_mantissa(r)); });
      break;
    }
    case 4: {  // pairs of products that cancel exactly or nearly
      fill([&] { return typical(r); }, [&] {
        return r.chance(2) ? (r.below(2) ? 0x80000000u : 0u) : f32_with(r.below(2), product_e - r.range(0, 40), random_f32_mantissa(r));
      });
      for (int kk = 0; kk + 1 < k; kk += 2)
        for (int j = 0; j < 8; ++j) b_at(kk + 1, j) = b_at(kk, j);
      for (int i = 0; i < 16; ++i)
        for (int kk = 0; kk + 1 < k; kk += 2) {
          uint32_t partner = a_at(i, kk) ^ (1u << (f.eb + f.mb));  // the same value, the other sign
          if (r.chance(2)) partner ^= r.below(1u << (f.mb > 3 ? 3 : f.mb));  // a few low bits off
          a_at(i, kk + 1) = partner;
        }
      for (int i = 0; i < 16; ++i)  // a small survivor somewhere
        if (r.chance(2)) a_at(i, r.below(k)) = code_with(f, r.below(2), lo - r.range(0, 12), random_fraction(f, r));
      break;
    }
    case 5: {  // c = -(one product), perturbed; B column j nonzero only at j (and maybe one tiny term)
      fill([&] { return typical(r); }, [&] { return 0u; });
      for (int kk = 0; kk < k; ++kk)
        for (int j = 0; j < 8; ++j)
          if (kk != j) b_at(kk, j) = r.below(2) ? (1u << (f.eb + f.mb)) : 0u;  // +-0
      for (int j = 0; j < 8; ++j) {
        const int kk = 8 + static_cast<int>(r.below(static_cast<uint32_t>(k - 8)));
        if (r.chance(2)) b_at(kk, j) = code_with(f, r.below(2), lo - r.range(0, 20), random_fraction(f, r));
      }
      for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 8; ++j) {
          const float p = code_value(op, a_at(i, j)) * code_value(op, b_at(j, j));  // exact
          uint32_t cb = float_bits(-p);
          if (r.chance(2) && (cb & 0x7FFFFFFFu) != 0) cb ^= r.below(4);
          c_at(i, j) = cb;
        }
      break;
    }
    case 6: {  // terms placed 22..28 exponents below the largest one
      const int top = r.range(lo, hi);
      fill([&] {
        const int gap = r.chance(3) ? 0 : r.range(11, 15);  // per factor: products 22..30 apart
        return code_with(f, r.below(2), top - gap, random_fraction(f, r));
      }, [&] {
        if (r.chance(3)) return 0u;
        return f32_with(r.below(2), 2 * top - r.range(20, 28), random_f32_mantissa(r));
      });
      break;
    }
    case 7: {  // subnormal operands, subnormal fp32 results
      fill([&] {
        if (r.chance(2)) return code_with(f, r.below(2), -f.bias - 1, static_cast<uint32_t>(r.next()));  // field 0
        return code_with(f, r.below(2), 1 - f.bias + r.range(0, 3), random_fraction(f, r));
      }, [&] {
        switch (r.below(4)) {
          case 0: return static_cast<uint32_t>(r.next()) & 0x807FFFFFu;  // subnormal fp32
          case 1: return 0u;
          default: return f32_with(r.below(2), 2 * (1 - f.bias) - r.range(-4, 24), random_f32_mantissa(r));
        }
      });
      if (op == Operand::bf16)  // tiny x moderate: products below 2^-126
        for (int kk = 0; kk < k; ++kk)
          for (int j = 0; j < 8; ++j)
            if (r.chance(2)) b_at(kk, j) = code_with(f, r.below(2), r.range(-30, 2), random_fraction(f, r));
      break;
    }
    case 8: {  // carries: equal signs, all-ones significands, equal exponents
      const bool negative = r.below(2);
      const int e = r.range(lo, hi);
      fill([&] {
        const uint32_t fraction = r.chance(4) ? static_cast<uint32_t>(r.next()) : (1u << f.mb) - 1;
        return code_with(f, negative != r.chance(16), e - static_cast<int>(r.below(2)), fraction);
      }, [&] {
        return r.chance(4) ? 0u : f32_with(negative, 2 * e + r.range(-2, 6), r.chance(2) ? 0x7FFFFFu : random_f32_mantissa(r));
      });
      break;
    }
    case 9: {  // zeros of both signs
      const uint32_t zero_in = 1 + r.below(4);
      fill([&] { return r.below(zero_in + 1) != 0 ? (r.below(2) ? (1u << (f.eb + f.mb)) : 0u) : typical(r); },
           [&] { return r.chance(4) ? f32_with(r.below(2), r.range(lo, hi), random_f32_mantissa(r)) : (r.below(2) ? 0x80000000u : 0u); });
      break;
    }
    case 10: {  // Inf and NaN among finite values
      fill([&] {
        switch (r.below(24)) {
          case 0: return f.has_inf ? inf_code(f, r.below(2)) : nan_code(f, r);
          case 1: return nan_code(f, r);
          case 2: case 3: return r.below(2) ? (1u << (f.eb + f.mb)) : 0u;
          default: return typical(r);
        }
      }, [&] {
        switch (r.below(8)) {
          case 0: return r.below(2) ? 0xFF800000u : 0x7F800000u;
          case 1: return 0x7F800000u | (1u + r.below(0x7FFFFF)) | (r.below(2) << 31);
          default: return f32_with(r.below(2), r.range(lo, hi), random_f32_mantissa(r));
        }
      });
      break;
    }
    case 11: {  // huge products (beyond fp32 for bf16), accumulator near FLT_MAX
      const int top = f.max_field - f.bias;
      fill([&] { return code_with(f, r.below(2), top - r.range(0, 3), random_fraction(f, r)); }, [&] {
        switch (r.below(3)) {
          case 0: return f32_with(r.below(2), 127, r.chance(2) ? 0x7FFFFFu : random_f32_mantissa(r));
          case 1: return 0u;
          default: return f32_with(r.below(2), 2 * top - r.range(0, 8), random_f32_mantissa(r));
        }
      });
      break;
    }
    case 12: {  // the accumulator 40 exponents above to 40 below the products
      fill([&] { return typical(r); },
           [&] { return f32_with(r.below(2), product_e + r.range(-40, 40), random_f32_mantissa(r)); });
      break;
    }
    default: {  // the accumulator is e_max and products sit at its kept-bit boundary
      const int top = r.range(lo, hi);
      fill([&] { return code_with(f, r.below(2), top + r.range(-1, 1), random_fraction(f, r)); },
           [&] { return f32_with(r.below(2), 2 * top + r.range(22, 28), random_f32_mantissa(r)); });
      break;
    }
  }
}

struct TileRange {
  uint64_t random_tiles, targeted_tiles;
};

KVSIM_HD int family_of(uint64_t tile, uint64_t random_tiles, uint64_t* index_in_family) {
  if (tile < random_tiles) {
    *index_in_family = tile / kMmaRandomFamilies;
    return static_cast<int>(tile % kMmaRandomFamilies);
  }
  const uint64_t u = tile - random_tiles;
  constexpr int targeted = kMmaFamilies - kMmaRandomFamilies;
  *index_in_family = u / targeted;
  return kMmaRandomFamilies + static_cast<int>(u % targeted);
}

// ---------------------------------------------------------------- kernels
__global__ void generate_kernel(Operand op, uint64_t seed, uint64_t first_tile, uint64_t tiles, uint64_t random_tiles,
                                uint32_t* a, uint32_t* b, uint32_t* c) {
  const int k = mma::instruction_k(op);
  for (uint64_t t = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; t < tiles; t += uint64_t{gridDim.x} * blockDim.x) {
    uint64_t index = 0;
    const int family = family_of(first_tile + t, random_tiles, &index);
    generate_tile(op, family, seed, first_tile + t, Tile{a + t * 16 * k, b + t * k * 8, c + t * kTileOutputs});
  }
}

__device__ __forceinline__ uint32_t pack2(uint32_t lo, uint32_t hi) { return (lo & 0xFFFFu) | (hi << 16); }
__device__ __forceinline__ uint32_t pack4(const uint32_t* v, int stride) {
  return (v[0] & 0xFFu) | ((v[stride] & 0xFFu) << 8) | ((v[2 * stride] & 0xFFu) << 16) | (v[3 * stride] << 24);
}

// One warp per tile; fragment layouts of the PTX ISA's mma.m16n8k16 (16-bit)
// and mma.m16n8k32 (8-bit) sections.
__global__ void mma_kernel(Operand op, uint64_t tiles, const uint32_t* a, const uint32_t* b, const uint32_t* c, uint32_t* d) {
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const uint64_t warps = uint64_t{gridDim.x} * (blockDim.x / 32);
  for (uint64_t tile = (blockIdx.x * uint64_t{blockDim.x} + threadIdx.x) / 32; tile < tiles; tile += warps) {
    const int k = mma::instruction_k(op);
    const uint32_t* A = a + tile * 16 * k;
    const uint32_t* B = b + tile * k * 8;
    const uint32_t* C = c + tile * kTileOutputs;
    uint32_t ra[4], rb[2];
    if (k == 16) {
      ra[0] = pack2(A[g * 16 + 2 * t4], A[g * 16 + 2 * t4 + 1]);
      ra[1] = pack2(A[(g + 8) * 16 + 2 * t4], A[(g + 8) * 16 + 2 * t4 + 1]);
      ra[2] = pack2(A[g * 16 + 2 * t4 + 8], A[g * 16 + 2 * t4 + 9]);
      ra[3] = pack2(A[(g + 8) * 16 + 2 * t4 + 8], A[(g + 8) * 16 + 2 * t4 + 9]);
      rb[0] = pack2(B[(2 * t4) * 8 + g], B[(2 * t4 + 1) * 8 + g]);
      rb[1] = pack2(B[(2 * t4 + 8) * 8 + g], B[(2 * t4 + 9) * 8 + g]);
    } else {
      ra[0] = pack4(A + g * 32 + 4 * t4, 1);
      ra[1] = pack4(A + (g + 8) * 32 + 4 * t4, 1);
      ra[2] = pack4(A + g * 32 + 4 * t4 + 16, 1);
      ra[3] = pack4(A + (g + 8) * 32 + 4 * t4 + 16, 1);
      rb[0] = pack4(B + (4 * t4) * 8 + g, 8);
      rb[1] = pack4(B + (4 * t4 + 16) * 8 + g, 8);
    }
    const uint32_t c0 = C[g * 8 + 2 * t4], c1 = C[g * 8 + 2 * t4 + 1], c2 = C[(g + 8) * 8 + 2 * t4],
                   c3 = C[(g + 8) * 8 + 2 * t4 + 1];
    uint32_t d0, d1, d2, d3;
#define KVSIM_MMA_SYNC(shape_and_types)                                                                          \
  asm volatile("mma.sync.aligned." shape_and_types " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};" \
               : "=r"(d0), "=r"(d1), "=r"(d2), "=r"(d3)                                                          \
               : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(rb[0]), "r"(rb[1]), "r"(c0), "r"(c1), "r"(c2), \
                 "r"(c3))
    switch (op) {
      case Operand::bf16: KVSIM_MMA_SYNC("m16n8k16.row.col.f32.bf16.bf16.f32"); break;
      case Operand::fp16: KVSIM_MMA_SYNC("m16n8k16.row.col.f32.f16.f16.f32"); break;
      case Operand::e4m3: KVSIM_MMA_SYNC("m16n8k32.row.col.f32.e4m3.e4m3.f32"); break;
      case Operand::e5m2: KVSIM_MMA_SYNC("m16n8k32.row.col.f32.e5m2.e5m2.f32"); break;
    }
#undef KVSIM_MMA_SYNC
    uint32_t* D = d + tile * kTileOutputs;
    D[g * 8 + 2 * t4] = d0;
    D[g * 8 + 2 * t4 + 1] = d1;
    D[(g + 8) * 8 + 2 * t4] = d2;
    D[(g + 8) * 8 + 2 * t4 + 1] = d3;
  }
}

struct Counters {
  unsigned long long products[kMmaFamilies];
  unsigned long long differences[kMmaFamilies];
  unsigned long long alternative_products;
  unsigned long long alternative_differences[mma::kMmaRuleAlternatives];
  unsigned int dumped;  // differing vectors recorded (may exceed the buffer)
};

struct DumpRecord {  // 16-bit codes keep the dump small
  uint16_t family, k;
  uint16_t a[kMaxK], b[kMaxK];
  uint32_t c, hardware, model;
};

KVSIM_HD void gather(Operand op, const uint32_t* A, const uint32_t* B, int i, int j, uint32_t* a, uint32_t* b) {
  const int k = mma::instruction_k(op);
  for (int kk = 0; kk < k; ++kk) {
    a[kk] = A[i * k + kk];
    b[kk] = B[kk * 8 + j];
  }
}

KVSIM_HD DumpRecord make_record(int family, Operand op, const uint32_t* a, const uint32_t* b, uint32_t c, uint32_t hw,
                                uint32_t model) {
  DumpRecord rec{};
  rec.family = static_cast<uint16_t>(family);
  rec.k = static_cast<uint16_t>(mma::instruction_k(op));
  for (int kk = 0; kk < rec.k; ++kk) {
    rec.a[kk] = static_cast<uint16_t>(a[kk]);
    rec.b[kk] = static_cast<uint16_t>(b[kk]);
  }
  rec.c = c;
  rec.hardware = hw;
  rec.model = model;
  return rec;
}

__global__ void compare_kernel(Operand op, uint64_t first_tile, uint64_t tiles, uint64_t random_tiles,
                               int alternatives_every, const uint32_t* A, const uint32_t* B, const uint32_t* C,
                               const uint32_t* D, Counters* counters, DumpRecord* differing, DumpRecord* samples) {
  const uint64_t outputs = tiles * kTileOutputs;
  for (uint64_t o = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; o < outputs; o += uint64_t{gridDim.x} * blockDim.x) {
    const uint64_t t = o / kTileOutputs;
    const int i = static_cast<int>(o % kTileOutputs) / 8, j = static_cast<int>(o % 8);
    const int k = mma::instruction_k(op);
    uint64_t index = 0;
    const int family = family_of(first_tile + t, random_tiles, &index);
    uint32_t a[kMaxK], b[kMaxK];
    gather(op, A + t * 16 * k, B + t * k * 8, i, j, a, b);
    const uint32_t c = C[t * kTileOutputs + i * 8 + j], hw = D[t * kTileOutputs + i * 8 + j];
    const uint32_t model = float_bits(mma::mma_inner_product(op, a, b, bits_float(c)));
    atomicAdd(&counters->products[family], 1ull);
    if (model != hw) {
      atomicAdd(&counters->differences[family], 1ull);
      const unsigned slot = atomicAdd(&counters->dumped, 1u);
      if (slot < kMaxDumpedDifferences) differing[slot] = make_record(family, op, a, b, c, hw, model);
    }
    if (index < kSampleTilesPerFamily)
      samples[(family * kSampleTilesPerFamily + index) * kTileOutputs + i * 8 + j] = make_record(family, op, a, b, c, hw, model);
    if ((first_tile + t) % static_cast<uint64_t>(alternatives_every) == 0) {
      atomicAdd(&counters->alternative_products, 1ull);
      for (int alt = 0; alt < mma::kMmaRuleAlternatives; ++alt) {
        const uint32_t other = float_bits(mma::mma_inner_product(op, a, b, bits_float(c), mma::mma_rule_alternative(alt).rules));
        if (other != hw) atomicAdd(&counters->alternative_differences[alt], 1ull);
      }
    }
  }
}

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  explicit DeviceBuffer(size_t n) { KVSIM_CUDA_CHECK("mma_check", cudaMalloc(&ptr, n * sizeof(T) + 16)); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

MmaVector to_vector(const DumpRecord& rec) {
  MmaVector v;
  v.family = rec.family;
  for (int kk = 0; kk < rec.k; ++kk) {
    v.a[kk] = rec.a[kk];
    v.b[kk] = rec.b[kk];
  }
  v.c = rec.c;
  v.hardware = rec.hardware;
  v.model = rec.model;
  return v;
}

}  // namespace

const char* mma_family_name(int family) {
  return family >= 0 && family < kMmaFamilies ? kFamilyNames[family] : "?";
}

uint64_t MmaCheckReport::total_products() const {
  uint64_t n = 0;
  for (uint64_t p : products) n += p;
  return n;
}

uint64_t MmaCheckReport::total_differences() const {
  uint64_t n = 0;
  for (uint64_t p : differences) n += p;
  return n;
}

MmaCheckReport run_mma_check(const MmaCheckOptions& options) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    throw BackendUnavailable("no CUDA device: mma-check runs the tensor cores' instruction");
  }
  const Operand op = options.operand;
  const int k = mma::instruction_k(op);
  const uint64_t random_tiles = (options.random_count + kTileOutputs - 1) / kTileOutputs;
  const uint64_t targeted_tiles = (options.targeted_count + kTileOutputs - 1) / kTileOutputs;
  const uint64_t all_tiles = random_tiles + targeted_tiles;
  const uint64_t batch = std::min<uint64_t>(all_tiles, uint64_t{1} << 17);
  const int alternatives_every = options.alternatives_every < 1 ? 1 : options.alternatives_every;

  DeviceBuffer<uint32_t> a(batch * 16 * k), b(batch * k * 8), c(batch * kTileOutputs), d(batch * kTileOutputs);
  DeviceBuffer<Counters> counters(1);
  DeviceBuffer<DumpRecord> differing(kMaxDumpedDifferences);
  const size_t sample_records = size_t{kMmaFamilies} * kSampleTilesPerFamily * kTileOutputs;
  DeviceBuffer<DumpRecord> samples(sample_records);
  KVSIM_CUDA_CHECK("mma_check", cudaMemset(counters.ptr, 0, sizeof(Counters)));
  KVSIM_CUDA_CHECK("mma_check", cudaMemset(samples.ptr, 0xFF, sample_records * sizeof(DumpRecord)));

  MmaCheckReport report;
  report.operand = op;
  for (uint64_t first = 0; first < all_tiles; first += batch) {
    const uint64_t tiles = std::min(batch, all_tiles - first);
    generate_kernel<<<1024, 128>>>(op, options.seed, first, tiles, random_tiles, a.ptr, b.ptr, c.ptr);
    check_launch("mma_check", "generate_kernel");
    mma_kernel<<<1024, 256>>>(op, tiles, a.ptr, b.ptr, c.ptr, d.ptr);
    check_launch("mma_check", "mma_kernel");
    compare_kernel<<<4096, 256>>>(op, first, tiles, random_tiles, alternatives_every, a.ptr, b.ptr, c.ptr, d.ptr,
                                  counters.ptr, differing.ptr, samples.ptr);
    check_launch("mma_check", "compare_kernel", nullptr, true);
    if (first == 0 && options.host_count > 0) {
      // The host's build of the model on the hardware's results: the oracle
      // runs this code, not the device's.
      const uint64_t host_tiles = std::min<uint64_t>(tiles, (options.host_count + kTileOutputs - 1) / kTileOutputs);
      std::vector<uint32_t> ha(host_tiles * 16 * k), hb(host_tiles * k * 8), hc(host_tiles * kTileOutputs),
          hd(host_tiles * kTileOutputs);
      KVSIM_CUDA_CHECK("mma_check", cudaMemcpy(ha.data(), a.ptr, ha.size() * 4, cudaMemcpyDeviceToHost));
      KVSIM_CUDA_CHECK("mma_check", cudaMemcpy(hb.data(), b.ptr, hb.size() * 4, cudaMemcpyDeviceToHost));
      KVSIM_CUDA_CHECK("mma_check", cudaMemcpy(hc.data(), c.ptr, hc.size() * 4, cudaMemcpyDeviceToHost));
      KVSIM_CUDA_CHECK("mma_check", cudaMemcpy(hd.data(), d.ptr, hd.size() * 4, cudaMemcpyDeviceToHost));
      for (uint64_t t = 0; t < host_tiles; ++t)
        for (int i = 0; i < 16; ++i)
          for (int j = 0; j < 8; ++j) {
            uint32_t va[kMaxK], vb[kMaxK];
            gather(op, ha.data() + t * 16 * k, hb.data() + t * k * 8, i, j, va, vb);
            const uint32_t cbits = hc[t * kTileOutputs + i * 8 + j];
            const uint32_t model = float_bits(mma::mma_inner_product(op, va, vb, bits_float(cbits)));
            ++report.host_products;
            if (model != hd[t * kTileOutputs + i * 8 + j]) ++report.host_differences;
          }
    }
  }
  Counters host{};
  KVSIM_CUDA_CHECK("mma_check", cudaMemcpy(&host, counters.ptr, sizeof(Counters), cudaMemcpyDeviceToHost));
  for (int f = 0; f < kMmaFamilies; ++f) {
    report.products[f] = host.products[f];
    report.differences[f] = host.differences[f];
  }
  report.alternative_products = host.alternative_products;
  for (int alt = 0; alt < mma::kMmaRuleAlternatives; ++alt) report.alternative_differences[alt] = host.alternative_differences[alt];
  const uint32_t recorded = std::min<uint32_t>(host.dumped, kMaxDumpedDifferences);
  std::vector<DumpRecord> records(recorded);
  if (recorded > 0)
    KVSIM_CUDA_CHECK("mma_check", cudaMemcpy(records.data(), differing.ptr, recorded * sizeof(DumpRecord), cudaMemcpyDeviceToHost));
  for (uint32_t r = 0; r < recorded && r < static_cast<uint32_t>(kFirstDifferences); ++r)
    report.first_differences.push_back(to_vector(records[r]));
  if (!options.dump_path.empty()) {
    // [u32 differing count][records...][u32 sample count][records...]
    std::vector<DumpRecord> sample(sample_records);
    KVSIM_CUDA_CHECK("mma_check", cudaMemcpy(sample.data(), samples.ptr, sample_records * sizeof(DumpRecord), cudaMemcpyDeviceToHost));
    std::ofstream out(options.dump_path, std::ios::binary);
    const uint32_t n_sample = static_cast<uint32_t>(sample_records);
    out.write(reinterpret_cast<const char*>(&recorded), 4);
    out.write(reinterpret_cast<const char*>(records.data()), static_cast<std::streamsize>(records.size() * sizeof(DumpRecord)));
    out.write(reinterpret_cast<const char*>(&n_sample), 4);
    out.write(reinterpret_cast<const char*>(sample.data()), static_cast<std::streamsize>(sample.size() * sizeof(DumpRecord)));
  }
  return report;
}

}  // namespace kvsim::cuda
