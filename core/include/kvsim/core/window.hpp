// The window mapping (TensorRT-LLM KVBlockArray::getKVTokenIdx), contract §5.10.
// Sink tokens S stay where they are; every later token cycles through a ring
// of cyclic_len slots that starts after a bubble which pads the sinks to a
// block boundary, so window edges fall on block edges:
//   bubble     = (S mod P == 0) ? 0 : P - S mod P
//   cyclic_len = one_more_block ? W + P - S : W - S
//   t < S      -> t
//   otherwise  -> S + bubble + (t - S) mod cyclic_len
// Reader and writer both call cache_token(); that is the whole safety story.
//
// The linear mapping (make_linear) is vLLM's sliding window: the slot is the
// token's position (no ring, no bubble: cyclic_len is kLinearRing, past any
// sequence), and the window only chooses the keys a query attends (sinks,
// then the last W - S tokens). The block manager then frees the pages that
// left the window (vLLM SlidingWindowManager.remove_skipped_blocks).
#pragma once


#include "config.hpp"

namespace kvsim {

struct WindowMapping {
  int32_t window = 0;  // W; 0 = no window (identity mapping)
  int32_t sinks = 0;   // S
  int32_t tokens_per_block = 1;
  bool one_more_block = false;
  bool linear = false;  // slot = position (vLLM); the window masks keys only
  int32_t bubble = 0;
  int64_t cyclic_len = 0;

  static constexpr int64_t kLinearRing = int64_t{1} << 62;  // a "ring" no sequence wraps

  KVSIM_HD static constexpr WindowMapping make(int32_t window, int32_t sinks, int32_t tokens_per_block,
                                               bool one_more_block) {
    WindowMapping m;
    m.window = window;
    m.sinks = sinks;
    m.tokens_per_block = tokens_per_block;
    m.one_more_block = one_more_block;
    if (window > 0) {
      // Negative sinks or page sizes are validate_window's to reject; here they
      // only must not overflow (P - rem with rem < 0 could pass 2^31).
      const int32_t rem = tokens_per_block > 0 && sinks >= 0 ? sinks % tokens_per_block : 0;
      m.bubble = rem == 0 ? 0 : tokens_per_block - rem;
      m.cyclic_len = one_more_block ? static_cast<int64_t>(window) + tokens_per_block - sinks
                                    : static_cast<int64_t>(window) - sinks;
    }
    return m;
  }
  KVSIM_HD static constexpr WindowMapping make_linear(int32_t window, int32_t sinks, int32_t tokens_per_block) {
    WindowMapping m;
    m.window = window;
    m.sinks = sinks;
    m.tokens_per_block = tokens_per_block;
    m.linear = true;
    if (window > 0) m.cyclic_len = kLinearRing;
    return m;
  }
  // The mapping make() or make_linear() gives for m's parameters.
  KVSIM_HD static constexpr WindowMapping derive(const WindowMapping& m) {
    return m.linear ? make_linear(m.window, m.sinks, m.tokens_per_block)
                    : make(m.window, m.sinks, m.tokens_per_block, m.one_more_block);
  }
  KVSIM_HD constexpr bool enabled() const { return window > 0; }
  KVSIM_HD constexpr bool is_sink(int64_t t) const { return t < sinks; }
  KVSIM_HD constexpr int64_t cache_token(int64_t t) const {
    if (!enabled() || is_sink(t)) return t;
    // 64-bit throughout: S + bubble alone can pass 2^31 for an accepted S.
    return static_cast<int64_t>(sinks) + bubble + (t - sinks) % cyclic_len;
  }
  // Cache slots a sequence of `length` tokens occupies (its table must cover them).
  KVSIM_HD constexpr int64_t cache_length(int64_t length) const {
    if (!enabled() || length <= sinks) return length;
    const int64_t ring = length - sinks < cyclic_len ? length - sinks : cyclic_len;
    return static_cast<int64_t>(sinks) + bubble + ring;
  }
};

}  // namespace kvsim
