// Pieces the AVX2 and AVX-512 kernels share (attention_avx2.cpp,
// attention_avx512.cpp). Baseline x86-64 code defined before either file's
// target region: inlined into the kernels, and any out-of-line copy is
// baseline code, safe on every CPU (cpu_target.hpp).
#pragma once

#include <xmmintrin.h>

#include "backends/cpu/attention_fast.hpp"

namespace kvsim::cpu_attention {

// softmax's partition sum of four query heads side by side (p[key][4]):
// lane l adds keys [8l, 8l + 8) in order, then lane 0 of the butterfly (lane
// l < off adds lane l + off, own lane first), as attend_query does per head.
inline void quad_partition_sum(const float* p, int32_t n, float* l_out) {
  __m128 part[canon::kWarp];
  for (int l = 0; l < canon::kWarp; ++l) {
    __m128 acc = _mm_setzero_ps();
    for (int32_t j = l * canon::kLaneRun; j < (l + 1) * canon::kLaneRun && j < n; ++j)
      acc = _mm_add_ps(acc, _mm_loadu_ps(p + j * kQuad));
    part[l] = acc;
  }
  for (int off = canon::kWarp / 2; off >= 1; off >>= 1)
    for (int l = 0; l < off; ++l) part[l] = _mm_add_ps(part[l], part[l + off]);
  _mm_storeu_ps(l_out, part[0]);
}

// P.V's view of heads [h0, h0 + count): head g's probabilities pcol[g][j *
// kQuad], its accumulators out[g] and its key limit (keys [0, limit[g]) enter).
inline void pv_head_columns(const PartitionTask& t, int32_t h0, int count, const float** pcol, float** out,
                            int32_t* limit) {
  for (int g = 0; g < count; ++g) {
    const int32_t h = h0 + g;
    pcol[g] = t.p + static_cast<int64_t>(h / kQuad) * canon::kPartitionSize * kQuad + h % kQuad;
    out[g] = t.acc + h * t.acc_stride;
    limit[g] = t.key_limit != nullptr ? t.key_limit[h] : t.count;
  }
}

}  // namespace kvsim::cpu_attention
