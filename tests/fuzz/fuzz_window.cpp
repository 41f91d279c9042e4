// libFuzzer target: the window mapping (TensorRT-LLM getKVTokenIdx, core's
// WindowMapping). Any (W, S, P, one_more_block) and any hand-set bubble /
// cyclic_len: validate_window accepts or throws bad_window; when it accepts,
// every token maps in 64 bits exactly as 128-bit arithmetic says, into
// [0, S + bubble + cyclic_len), sinks to themselves, and cache_length is
// the number of slots the first `length` tokens reach.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdlib>

#include "kvsim/validation.hpp"
#include "kvsim/core/window.hpp"

using namespace kvsim;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  WindowMapping m = WindowMapping::make(in.ConsumeIntegral<int32_t>(), in.ConsumeIntegral<int32_t>(),
                                        in.ConsumeIntegral<int32_t>(), in.ConsumeBool());
  if (in.ConsumeIntegralInRange<int>(0, 7) == 0) m.bubble = in.ConsumeIntegral<int32_t>();
  if (in.ConsumeIntegralInRange<int>(0, 7) == 0) m.cyclic_len = in.ConsumeIntegral<int64_t>();
  try {
    validate_window(m);
  } catch (const ValidationError& e) {
    if (e.code() != ErrorCode::bad_window) std::abort();
    return 0;
  }
  if (!m.enabled()) {
    const int64_t t = in.ConsumeIntegralInRange<int64_t>(0, INT64_MAX);
    if (m.cache_token(t) != t || m.cache_length(t) != t) std::abort();
    return 0;
  }
  const __int128 S = m.sinks, P = m.tokens_per_block, W = m.window;
  const __int128 bubble = S % P == 0 ? 0 : P - S % P;
  const __int128 cyclic = m.one_more_block ? W + P - S : W - S;
  if (cyclic <= 0 || m.bubble != bubble || m.cyclic_len != cyclic) std::abort();
  while (in.remaining_bytes() > 0) {
    const int64_t t = in.ConsumeIntegralInRange<int64_t>(0, INT64_MAX - 1);
    const __int128 expected = t < S ? t : S + bubble + (t - S) % cyclic;
    const int64_t slot = m.cache_token(t);
    if (slot != expected || slot < 0 || slot >= S + bubble + cyclic) std::abort();
    const __int128 len = t + 1;
    const __int128 ring = len - S < cyclic ? len - S : cyclic;
    const __int128 expected_len = len <= S ? len : S + bubble + ring;
    const int64_t got_len = m.cache_length(t + 1);
    if (got_len != expected_len || slot >= got_len) std::abort();
  }
  return 0;
}
