// Portable kernels of the fast attention path (attention_fast.hpp): plain
// C++ in core's canonical order, for any host. Rows are decoded with core's
// codecs; the score keeps core's lane loop (dims beyond head_dim skipped) and
// evaluates the butterfly only for the lanes lane 0 depends on, with the same
// operand order; P.V runs per key over contiguous dims (the compiler may
// vectorise it: every element is one correctly rounded fma either way).
#include <cstring>

#include "backends/cpu/attention_fast.hpp"

namespace kvsim::cpu_attention {
namespace {

using canon::kPartitionSize;
using canon::kWarp;

void decode_row(RowFormat f, const uint8_t* row, float* out, int32_t D) {
  switch (f) {
    case RowFormat::f32: std::memcpy(out, row, static_cast<size_t>(D) * 4); return;
    case RowFormat::bf16:
      for (int32_t d = 0; d < D; ++d) {
        uint16_t h;
        std::memcpy(&h, row + 2 * d, 2);
        out[d] = codec::bf16_to_f32(h);
      }
      return;
    case RowFormat::f16:
      for (int32_t d = 0; d < D; ++d) {
        uint16_t h;
        std::memcpy(&h, row + 2 * d, 2);
        out[d] = codec::f16_to_f32(h);
      }
      return;
    case RowFormat::e4m3:
      for (int32_t d = 0; d < D; ++d) out[d] = codec::e4m3_to_f32(row[d]);
      return;
    case RowFormat::e5m2:
      for (int32_t d = 0; d < D; ++d) out[d] = codec::e5m2_to_f32(row[d]);
      return;
    case RowFormat::i8:
      for (int32_t d = 0; d < D; ++d) out[d] = codec::int8_to_f32(static_cast<int8_t>(row[d]));
      return;
  }
}

// Lane 0 of core's butterfly_sum32: at level `off` lane l < off computes
// v[l] + v[l ^ off] = v[l] + v[l + off], the only values later levels read.
float butterfly_lane0(float* v) {
  for (int off = kWarp / 2; off >= 1; off >>= 1)
    for (int l = 0; l < off; ++l) v[l] = v[l] + v[l + off];
  return v[0];
}

// kbuf: [0, 32c) the K row transposed (kt[j*32 + l] = k[l*c + j], +0 beyond
// D, through the plan's kt_source table), then the decoded row and a +0. Dims beyond D meet q = -0 (qt's padding):
// fma(-0, +0, acc) is acc for every acc, so the lane loops need no branch.
void scores(const PartitionTask& t) {
  const int32_t D = t.head_dim, c = t.lanes_c;
  float* kt = t.kbuf;
  float* k = t.kbuf + c * kWarp;
  for (int32_t j = 0; j < t.count; ++j) {
    if (t.k_rows[j] == nullptr) {
      for (int32_t q = 0; q < t.quads; ++q)
        for (int g = 0; g < kQuad; ++g) t.s[(static_cast<int64_t>(q) * kPartitionSize + j) * kQuad + g] = canon::neg_inf();
      continue;
    }
    decode_row(t.format, t.k_rows[j], k, D);
    k[D] = 0.0f;
    for (int32_t i = 0; i < c * kWarp; ++i) kt[i] = k[t.kt_source[i]];
    for (int32_t q = 0; q < t.quads; ++q)
      for (int gi = 0; gi < kQuad; ++gi) {
        const int32_t g = q * kQuad + gi;
        float score = 0.0f;
        if (g < t.group) {
          float partial[kWarp];
          for (int l = 0; l < kWarp; ++l) partial[l] = 0.0f;
          const float* qt = t.qt + static_cast<int64_t>(g) * c * kWarp;
          for (int32_t jj = 0; jj < c; ++jj)
            for (int l = 0; l < kWarp; ++l) partial[l] = canon::fma_f32(qt[jj * kWarp + l], kt[jj * kWarp + l], partial[l]);
          score = butterfly_lane0(partial) * t.score_scale;
        }
        t.s[(static_cast<int64_t>(q) * kPartitionSize + j) * kQuad + gi] = score;
      }
  }
}

void softmax(const PartitionTask& t) {
  for (int32_t q = 0; q < t.quads; ++q) {
    const float* s = t.s + static_cast<int64_t>(q) * kPartitionSize * kQuad;
    float* p = t.p + static_cast<int64_t>(q) * kPartitionSize * kQuad;
    for (int g = 0; g < kQuad; ++g) {
      float m = canon::neg_inf();
      for (int32_t j = 0; j < t.count; ++j) m = s[j * kQuad + g] > m ? s[j * kQuad + g] : m;
      for (int32_t j = 0; j < t.count; ++j) p[j * kQuad + g] = canon::probability(s[j * kQuad + g], m);
      float partial[kWarp];
      for (int l = 0; l < kWarp; ++l) {
        float acc = 0.0f;
        for (int32_t j = l * canon::kLaneRun; j < (l + 1) * canon::kLaneRun && j < t.count; ++j) acc = acc + p[j * kQuad + g];
        partial[l] = acc;
      }
      t.m[q * kQuad + g] = m;
      t.l[q * kQuad + g] = butterfly_lane0(partial);
    }
  }
}

void pv(const PartitionTask& t) {
  const int32_t D = t.head_dim;
  for (int32_t g = 0; g < t.group; ++g) {
    float* acc = t.acc + g * t.acc_stride;
    for (int32_t d = 0; d < D; ++d) acc[d] = 0.0f;
  }
  float* v = t.kbuf + t.lanes_c * kWarp;
  for (int32_t j = 0; j < t.count; ++j) {
    decode_row(t.format, t.v_rows[j], v, D);
    for (int32_t g = 0; g < t.group; ++g) {
      if (t.key_limit != nullptr && j >= t.key_limit[g]) continue;
      const float pj = t.p[(static_cast<int64_t>(g / kQuad) * kPartitionSize + j) * kQuad + g % kQuad];
      float* acc = t.acc + g * t.acc_stride;
      for (int32_t d = 0; d < D; ++d) acc[d] = canon::fma_f32(pj, v[d], acc[d]);
    }
  }
}

bool any_head_dim(int32_t) { return true; }

void identity_lanes(RowFormat, int32_t, int32_t* lane_of_position) {
  for (int pos = 0; pos < kWarp; ++pos) lane_of_position[pos] = pos;
}

}  // namespace

const Kernels& portable_kernels() {
  static const Kernels k{&scores, &softmax, &pv, &any_head_dim, &identity_lanes};
  return k;
}

}  // namespace kvsim::cpu_attention
