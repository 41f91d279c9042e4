// The exactness-critical warp steps every CUDA attention kernel shares
// (attention.cu's general kernel, attention_staged.cuh, attention_bulk.cuh,
// attention_prefill.cu): the warp forms of core's canonical reductions (the
// butterfly, its two reduce-scatter layouts, the ordered max), and the decoders of stored
// codes a 32-bit word at a time. Written once so that every path adds the same
// pairs in the same order (docs/canonical-arithmetic.md).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include <kvsim/core/attention_math.hpp>
#include <kvsim/core/codecs.hpp>

namespace kvsim::cuda {

inline constexpr unsigned kFullMask = 0xFFFFFFFFu;

// canon::butterfly_sum32 on a warp: level `off` (16, 8, 4, 2, 1) adds
// v[l] + v[l ^ off], so every lane ends with the same float.
__device__ __forceinline__ float warp_butterfly_sum(float v) {
#pragma unroll
  for (int level = 0; level < 5; ++level) v = v + __shfl_xor_sync(kFullMask, v, 16 >> level);
  return v;
}

// canon::butterfly_sum32's lane 0 computed by one thread from the 32 lanes'
// values (levels 16, 8, 4, 2, 1; v is overwritten): the tiled prefill
// kernels' partition sum of 32 lane runs kept in shared memory.
template <int kOff = canon::kWarp / 2>
__device__ __forceinline__ float butterfly_lane0(float (&v)[canon::kWarp]) {
#pragma unroll
  for (int l = 0; l < kOff; ++l) v[l] = v[l] + v[l + kOff];  // compile-time indices: v stays in registers
  if constexpr (kOff == 1) {
    return v[0];
  } else {
    return butterfly_lane0<kOff / 2>(v);
  }
}

// Joins the lanes' run maxima left to right (ties keep the left value): the
// oracle's sequential partition max, the first value equal to the maximum
// (this matters for +0 / -0).
__device__ __forceinline__ float warp_ordered_max(float m, int lane) {
#pragma unroll
  for (int level = 0; level < 5; ++level) {
    const int off = 1 << level;
    const float other = __shfl_xor_sync(kFullMask, m, off);
    const bool right_half = (lane & off) != 0;
    const float left = right_half ? other : m;
    const float right = right_half ? m : other;
    m = right > left ? right : left;
  }
  return m;
}

// Reduce-scatter form of canon::butterfly_sum32 over 32 columns: at level
// `off` lane l adds its value and lane (l ^ off)'s for the half of the
// columns it keeps (the upper half when bit `off` of l is set), exactly the
// pair the full butterfly adds; column `lane` ends in lane `lane`.
__device__ __forceinline__ float reduce_scatter32(float (&v)[canon::kWarp], int lane) {
#pragma unroll
  for (int level = 0; level < 5; ++level) {
    const int off = 16 >> level;
    const bool upper = (lane & off) != 0;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      if (i < off) {
        const float send = upper ? v[i] : v[i + off];
        const float keep = upper ? v[i + off] : v[i];
        v[i] = keep + __shfl_xor_sync(kFullMask, send, off);
      }
    }
  }
  return v[0];
}

// Reduce-scatter of canon::butterfly_sum32 for registers laid out as lane l
// holding column c in register c ^ l: every addition is v_l[c] + v_{l^off}[c]
// of the full butterfly's level `off`; column l ends in lane l.
__device__ __forceinline__ float reduce_scatter_xor(float (&v)[canon::kWarp]) {
#pragma unroll
  for (int level = 0; level < 5; ++level) {
    const int off = 16 >> level;
#pragma unroll
    for (int i = 0; i < 16; ++i)
      if (i < off) v[i] = v[i] + __shfl_xor_sync(kFullMask, v[i + off], off);
  }
  return v[0];
}

// The maximum of m over each group of 16 lanes (lanes 0-15, 16-31), in every
// lane of the group: a max of the same values in any order (a tie of +0 and
// -0 may keep either; exp(s - m) is the same for both), as the tiled prefill
// kernel's pass 1 needs.
__device__ __forceinline__ float group16_max(float m) {
#pragma unroll
  for (int off = 1; off < 16; off <<= 1) {
    const float o = __shfl_xor_sync(kFullMask, m, off);
    m = o > m ? o : m;
  }
  return m;
}

// The canonical softmax of one partition's scores s[0, count) by a warp: lane
// runs of canon::kLaneRun keys for the ordered max, then s[j] becomes p_j and
// the runs' sums meet in the butterfly. Returns (m, l) in every lane.
__device__ __forceinline__ void warp_partition_softmax(float* s, int32_t count, int lane, float& m, float& l) {
  m = canon::neg_inf();
  for (int32_t j = lane * canon::kLaneRun; j < (lane + 1) * canon::kLaneRun && j < count; ++j) m = s[j] > m ? s[j] : m;
  m = warp_ordered_max(m, lane);
  float run = 0.0f;
  for (int32_t j = lane * canon::kLaneRun; j < (lane + 1) * canon::kLaneRun && j < count; ++j) {
    s[j] = canon::probability(s[j], m);
    run = run + s[j];
  }
  l = warp_butterfly_sum(run);
}

// Exact fp32 values of stored codes (per-tensor scales applied by the caller),
// a 32-bit word (4 / kBytes codes) at a time with core's decoders:
//  * decode: every value bit-exact, NaN payloads included;
//  * decode_arith (and decode2_arith, a 16-bit pair of 8-bit codes): core's
//    arithmetic-only decoders (canon::*_arith), for values that only enter
//    fma chains (fewer instructions; the bulk kernel uses these).
template <CacheDtype kDtype> struct Code;
template <> struct Code<CacheDtype::fp32> {
  using T = float;
  static constexpr int kBytes = 4;
  __device__ static void decode(uint32_t w, float* v) { v[0] = bits_float(w); }
  __device__ static void decode_arith(uint32_t w, float* v) { v[0] = bits_float(w); }
};
template <> struct Code<CacheDtype::fp16> {
  using T = uint16_t;
  static constexpr int kBytes = 2;
  __device__ static void decode(uint32_t w, float* v) { canon::decode_f16x2(w, v); }
  __device__ static void decode_arith(uint32_t w, float* v) { canon::decode_f16x2_arith(w, v); }
};
template <> struct Code<CacheDtype::bf16> {
  using T = uint16_t;
  static constexpr int kBytes = 2;
  __device__ static void decode(uint32_t w, float* v) {
    v[0] = codec::bf16_to_f32(static_cast<uint16_t>(w & 0xFFFFu));
    v[1] = codec::bf16_to_f32(static_cast<uint16_t>(w >> 16));
  }
  __device__ static void decode_arith(uint32_t w, float* v) { decode(w, v); }
};
// The two fp8 formats differ only in core's decoders (attention_math.hpp).
template <void (*kDecode4)(uint32_t, float*), void (*kDecode4Arith)(uint32_t, float*),
          void (*kDecode2Arith)(uint16_t, float*)>
struct Fp8Code {
  using T = uint8_t;
  static constexpr int kBytes = 1;
  __device__ static void decode(uint32_t w, float* v) { kDecode4(w, v); }
  __device__ static void decode_arith(uint32_t w, float* v) { kDecode4Arith(w, v); }
  __device__ static void decode2_arith(uint16_t w, float* v) { kDecode2Arith(w, v); }
};
template <> struct Code<CacheDtype::fp8_e4m3>
    : Fp8Code<canon::decode_e4m3x4, canon::decode_e4m3x4_arith, canon::decode_e4m3x2_arith> {};
template <> struct Code<CacheDtype::fp8_e5m2>
    : Fp8Code<canon::decode_e5m2x4, canon::decode_e5m2x4_arith, canon::decode_e5m2x2_arith> {};
template <> struct Code<CacheDtype::int8> {
  using T = uint8_t;
  static constexpr int kBytes = 1;
  __device__ static void decode(uint32_t w, float* v) {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = codec::int8_to_f32(static_cast<int8_t>(w >> (8 * i)));
  }
  __device__ static void decode_arith(uint32_t w, float* v) { decode(w, v); }
  __device__ static void decode2_arith(uint16_t w, float* v) {
#pragma unroll
    for (int i = 0; i < 2; ++i) v[i] = codec::int8_to_f32(static_cast<int8_t>(w >> (8 * i)));
  }
};

// kBytes consecutive bytes at src (aligned to the load's width) as 32-bit
// words: 16-byte loads for a multiple of 16, else one 8- or 4-byte load.
template <int kBytes>
__device__ __forceinline__ void load_words(const uint8_t* src, uint32_t* words) {
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) reinterpret_cast<uint4*>(words)[i] = reinterpret_cast<const uint4*>(src)[i];
  } else if constexpr (kBytes == 8) {
    reinterpret_cast<uint2*>(words)[0] = *reinterpret_cast<const uint2*>(src);
  } else {
    words[0] = *reinterpret_cast<const uint32_t*>(src);
  }
}

// C consecutive 4-byte values (floats or words) of shared memory into
// registers: 16-byte loads where C allows, else 8-byte ones (C even).
template <class T, int C>
__device__ __forceinline__ void load_run(const T* src, T (&out)[C]) {
  static_assert(sizeof(T) == 4 && C % 2 == 0);
  using V4 = std::conditional_t<std::is_same_v<T, float>, float4, uint4>;
  using V2 = std::conditional_t<std::is_same_v<T, float>, float2, uint2>;
  if constexpr (C % 4 == 0) {
#pragma unroll
    for (int c = 0; c < C; c += 4) {
      const V4 x = *reinterpret_cast<const V4*>(src + c);
      out[c] = x.x;
      out[c + 1] = x.y;
      out[c + 2] = x.z;
      out[c + 3] = x.w;
    }
  } else {
#pragma unroll
    for (int c = 0; c < C; c += 2) {
      const V2 x = *reinterpret_cast<const V2*>(src + c);
      out[c] = x.x;
      out[c + 1] = x.y;
    }
  }
}

// 16 bytes from global to shared memory without a register stop (cp.async:
// attention_staged.cuh's ring, attention_prefill_mma.cu's tiles).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
// 16 bytes from global to the shared address `smem`, or 16 zero bytes
// (nothing read) when !copy.
__device__ __forceinline__ void cp_async16_zfill(uint32_t smem, const void* gmem, bool copy) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(copy ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// The head dims the attention kernels are instantiated for, as C = D / 32
// codes per lane: with_c.template operator()<C>() for C = 2, 4 or 8 (D = 64,
// 128, 256), false for any other (the plan then takes another path).
template <class WithC>
inline bool dispatch_lane_codes(int C, WithC&& with_c) {
  switch (C) {
    case 2: return with_c.template operator()<2>();
    case 4: return with_c.template operator()<4>();
    case 8: return with_c.template operator()<8>();
    default: return false;
  }
}

}  // namespace kvsim::cuda
