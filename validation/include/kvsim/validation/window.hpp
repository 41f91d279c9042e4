// Host validation of a window mapping (contract §5.10): a descriptor built by
// hand must carry exactly what WindowMapping::make derives.
#pragma once

#include <string>

#include "errors.hpp"
#include "kvsim/core/window.hpp"

namespace kvsim {

inline void validate_window(const WindowMapping& m) {
  if (m.window < 0) fail(ErrorCode::bad_window, "window = " + std::to_string(m.window) + " must be >= 0 (0 = none)");
  if (m.sinks < 0) fail(ErrorCode::bad_window, "sinks = " + std::to_string(m.sinks) + " must be >= 0");
  if (m.window > 0 && m.sinks >= m.window)
    fail(ErrorCode::bad_window, "sinks = " + std::to_string(m.sinks) + " must be < window = " +
                                    std::to_string(m.window) + ": rule: cyclic_len = W - S > 0");
  if (m.window == 0 && m.sinks > 0)
    fail(ErrorCode::bad_window, "sinks = " + std::to_string(m.sinks) + " given without a window");
  if (m.window > 0 && (m.tokens_per_block < 1 || m.tokens_per_block > 1024))
    fail(ErrorCode::bad_window, "tokens_per_block = " + std::to_string(m.tokens_per_block) +
                                    ": rule: a window mapping is built for a page size in 1..1024");
  // bubble and cyclic_len are derived: a descriptor assembled by hand must
  // carry exactly what make() computes (a zero cyclic_len would divide by 0).
  if (m.linear && m.one_more_block)
    fail(ErrorCode::bad_window, "one_more_block with a linear window: rule: one more block extends TensorRT-LLM's ring");
  const WindowMapping derived = WindowMapping::derive(m);
  if (m.bubble != derived.bubble || m.cyclic_len != derived.cyclic_len)
    fail(ErrorCode::bad_window, "bubble = " + std::to_string(m.bubble) + ", cyclic_len = " + std::to_string(m.cyclic_len) +
                                    " but W = " + std::to_string(m.window) + ", S = " + std::to_string(m.sinks) +
                                    ", P = " + std::to_string(m.tokens_per_block) + " give bubble = " +
                                    std::to_string(derived.bubble) + ", cyclic_len = " +
                                    std::to_string(derived.cyclic_len) + ": rule: build it with WindowMapping::make (or make_linear)");
}

}  // namespace kvsim
