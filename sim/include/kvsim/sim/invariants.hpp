// The comparison invariants of contract §6 (chunking, reuse, window, layout,
// quantization, batch): replay() runs the scenario again with one setting
// changed (ReplayOptions::comparison_invariants = false for that run) and
// compares the two RunRecords here (by content digests, bytes only where
// kept: docs/invariants.md, "Memory"). Outputs are keyed by (request, layer,
// kind, position), so runs cut into different chunks, batches or blocks
// line up; keys only one run has (a prefix hit skips the prefill output of
// the reused positions; a window drops tokens from the cache) are not
// compared, and a comparison with nothing in common says so.
// docs/invariants.md lists each invariant with the code and the test.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "replay_run.hpp"

namespace kvsim::sim {

struct Comparison {
  int64_t compared = 0;            // outputs present in both runs and compared
  std::string first_difference;    // "" = every compared output bit-equal
  // The first differing row in key order; `located` when both records kept
  // its bytes and first_difference names the element, else replay() runs
  // both scenarios again capturing that row (describe_difference).
  std::optional<OutputKey> differing_key;
  bool located = false;
};

// Equality of the content digests of every output both runs hold (and
// `include` accepts).
Comparison compare_outputs(const RunRecord& test, const RunRecord& reference,
                           const std::function<bool(const OutputKey&)>& include = {});
// "attention output of request r, layer 0, position 5, element 1: a vs b"
// (the first 4-byte element that differs).
std::string describe_difference(const OutputKey& key, const std::vector<uint8_t>& test,
                                const std::vector<uint8_t>& reference);

// quantization: relative RMS error of the attention outputs of a quantized
// cache against the bf16 run, sqrt(sum (o - r)^2 / sum r^2), must stay within
// quantization_bound(dtype): twice the format's relative rounding step
// (e4m3: 3 mantissa bits, 2 * 2^-4; e5m2: 2 * 2^-3; int8 at a scale that maps
// the values' range onto +-127: 0.125; nvfp4: e2m1's worst relative half-step
// (1/5) plus the e4m3 block scale's (2^-4), doubled, rounded to 0.5). K errors
// move the softmax weights and V errors the values, hence the factor 2.
// A V dequantized with K's scale is off by |k_scale / v_scale - 1| in every
// output, so fault scenarios set scales that differ by 4x or more.
double quantization_bound(CacheDtype t);
struct QuantizationError {
  int64_t compared = 0;
  double rel_rms = 0.0;
  double max_abs = 0.0;
  // Where the largest |diff| is (the first such element): the row, the element, both values.
  OutputKey worst;
  int64_t worst_element = -1;
  float worst_value = 0.0f, worst_reference = 0.0f;
};
QuantizationError quantization_error(const RunRecord& test, const RunRecord& bf16_reference);

}  // namespace kvsim::sim
