// The window mapping (contract §5.10, TensorRT-LLM getKVTokenIdx) against examples
// worked by hand, then as a property over odd and power-of-two page sizes,
// every sink count up to two blocks and a range of windows.
//   bubble     = (S mod P == 0) ? 0 : P - S mod P
//   cyclic_len = one_more_block ? W + P - S : W - S
//   t < S -> t;  otherwise -> S + bubble + (t - S) mod cyclic_len
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

// window.hpp uses KVSIM_HD without including config.hpp (reported); include it first.
#include "kvsim/core/config.hpp"
#include "kvsim/core/window.hpp"
#include "kvsim/core/ops/attention.hpp"

#include "../support/validation.hpp"

using namespace kvsim;
using kvsim::test::catch_validation;

namespace {

struct Slot {
  int64_t token, slot;
};

void check_slots(const WindowMapping& m, std::initializer_list<Slot> expected) {
  for (const Slot& e : expected) {
    CAPTURE(e.token);
    CHECK(m.cache_token(e.token) == e.slot);
  }
}

}  // namespace

TEST_CASE("sinks a multiple of P: no bubble") {
  // S = 4, P = 4, W = 8, one_more_block off:
  //   bubble = 0 (4 mod 4 = 0), cyclic_len = 8 - 4 = 4, ring = slots 4..7.
  const WindowMapping m = WindowMapping::make(8, 4, 4, false);
  CHECK(m.enabled());
  CHECK(m.bubble == 0);
  CHECK(m.cyclic_len == 4);
  check_slots(m, {
                     {0, 0}, {3, 3},             // sinks stay
                     {4, 4}, {7, 7},             // 4 + 0 + (t - 4) mod 4
                     {8, 4}, {11, 7}, {12, 4},   // wrap: 8 -> (8 - 4) mod 4 = 0 -> slot 4
                     {13, 5},
                 });
  CHECK(m.cache_length(0) == 0);
  CHECK(m.cache_length(4) == 4);    // sinks only
  CHECK(m.cache_length(6) == 6);    // 4 + 0 + min(2, 4)
  CHECK(m.cache_length(8) == 8);    // ring full
  CHECK(m.cache_length(9) == 8);    // and it stays full
  CHECK(m.cache_length(100) == 8);
}

TEST_CASE("sinks not a multiple of P: S = 4, P = 16 gives a bubble of 12") {
  // S = 4, P = 16, W = 32, one_more_block off:
  //   bubble = 16 - 4 mod 16 = 12, cyclic_len = 32 - 4 = 28, ring = slots 16..43
  //   (ring starts at 16 = one block: window edges fall on block edges).
  const WindowMapping m = WindowMapping::make(32, 4, 16, false);
  CHECK(m.bubble == 12);
  CHECK(m.cyclic_len == 28);
  check_slots(m, {
                     {0, 0}, {3, 3},
                     {4, 16},                    // 4 + 12 + 0
                     {5, 17},
                     {31, 43},                   // 16 + 27
                     {32, 16},                   // 32 - 4 = 28 = cyclic_len: wraps to the ring start
                     {59, 43}, {60, 16},
                 });
  CHECK(m.cache_length(3) == 3);
  CHECK(m.cache_length(4) == 4);
  CHECK(m.cache_length(5) == 17);  // 4 + 12 + 1: token 4 lives in slot 16
  CHECK(m.cache_length(32) == 44);  // 4 + 12 + 28
  CHECK(m.cache_length(1000) == 44);
}

TEST_CASE("one_more_block adds a block to the ring") {
  // S = 4, P = 16, W = 32, one_more_block on:
  //   bubble = 12, cyclic_len = 32 + 16 - 4 = 44, ring = slots 16..59.
  const WindowMapping on = WindowMapping::make(32, 4, 16, true);
  CHECK(on.bubble == 12);
  CHECK(on.cyclic_len == 44);
  check_slots(on, {{3, 3}, {4, 16}, {32, 44}, {47, 59}, {48, 16}, {49, 17}});
  CHECK(on.cache_length(20) == 32);   // 4 + 12 + 16
  CHECK(on.cache_length(1000) == 60);  // 4 + 12 + 44
  // The same token differs from the off mapping once the off ring has wrapped:
  // a reader and a writer that disagree on one_more_block read the wrong slot.
  const WindowMapping off = WindowMapping::make(32, 4, 16, false);
  CHECK(off.cache_token(32) == 16);
  CHECK(on.cache_token(32) == 44);
}

TEST_CASE("no sinks; odd page sizes") {
  // S = 0, P = 3, W = 5: bubble 0 (0 mod 3 = 0), cyclic_len 5 (off) or 8 (on).
  const WindowMapping off = WindowMapping::make(5, 0, 3, false);
  CHECK(off.bubble == 0);
  CHECK(off.cyclic_len == 5);
  check_slots(off, {{0, 0}, {4, 4}, {5, 0}, {7, 2}, {10, 0}});
  CHECK(off.cache_length(7) == 5);
  const WindowMapping on = WindowMapping::make(5, 0, 3, true);
  CHECK(on.cyclic_len == 8);
  check_slots(on, {{5, 5}, {7, 7}, {8, 0}});
  // S = 5, P = 3, W = 9: 5 mod 3 = 2, bubble = 1, cyclic_len = 4, ring = slots 6..9 (6 = 2 blocks).
  const WindowMapping m = WindowMapping::make(9, 5, 3, false);
  CHECK(m.bubble == 1);
  CHECK(m.cyclic_len == 4);
  // t -> 6 + (t - 5) mod 4: 5 -> 6, 8 -> 9, 9 -> 6, 12 -> 6 + 3 = 9, 13 -> 6
  check_slots(m, {{4, 4}, {5, 6}, {8, 9}, {9, 6}, {12, 9}, {13, 6}});
  CHECK(m.cache_length(6) == 7);  // 5 + 1 + 1
}

TEST_CASE("a window much larger than the sequence: identity below S, shifted by the bubble above") {
  // W = 1000, S = 4, P = 16: bubble 12, cyclic_len 996. For a sequence shorter than
  // W nothing wraps: token t sits in slot t (sink) or t + 12.
  const WindowMapping m = WindowMapping::make(1000, 4, 16, false);
  REQUIRE(m.bubble == 12);
  REQUIRE(m.cyclic_len == 996);
  int64_t wrong = 0;
  for (int64_t t = 0; t < 1000; ++t) wrong += m.cache_token(t) != (t < 4 ? t : t + 12);
  CHECK(wrong == 0);
  CHECK(m.cache_token(1000) == 16);  // token S + cyclic_len wraps onto token S's slot
  for (int64_t n = 5; n <= 1000; ++n) CHECK(m.cache_length(n) == n + 12);
  // Without sinks there is no bubble: a large window is the identity below W.
  const WindowMapping plain = WindowMapping::make(1000, 0, 7, true);
  REQUIRE(plain.enabled());
  wrong = 0;
  for (int64_t t = 0; t < 1000; ++t) wrong += plain.cache_token(t) != t;
  CHECK(wrong == 0);
  CHECK(plain.cache_length(1000) == 1000);
}

TEST_CASE("window 0 is no window: identity") {
  const WindowMapping m = WindowMapping::make(0, 0, 16, false);
  CHECK_FALSE(m.enabled());
  for (int64_t t : {int64_t{0}, int64_t{5}, int64_t{17}, int64_t{1} << 40}) {
    CHECK(m.cache_token(t) == t);
    CHECK(m.cache_length(t) == t);
  }
  CHECK_NOTHROW(validate_window(m));
}

TEST_CASE("wrap-around: token t + cyclic_len maps to the slot of token t (t >= S)") {
  for (bool omb : {false, true}) {
    const WindowMapping m = WindowMapping::make(20, 6, 7, omb);  // bubble 1, cyclic 14 or 21
    CAPTURE(omb);
    CHECK(m.cache_token(6 + m.cyclic_len) == m.cache_token(6));
    CHECK(m.cache_token(6) == 7 + 0);  // 6 + 1: the ring starts at block 1
    for (int64_t t = 6; t < 200; ++t) CHECK(m.cache_token(t + m.cyclic_len) == m.cache_token(t));
  }
}

TEST_CASE("property: slots in range, sinks fixed, the newest cyclic_len tokens distinct, cache_length = max slot + 1") {
  int configs = 0;
  int64_t failures = 0;
  std::string first_failure;
  for (int32_t P : {1, 3, 7, 16, 17})
    for (int32_t S = 0; S <= 2 * P + 1; ++S)
      for (int32_t W = S + 1; W <= S + 3 * P + 2; ++W)
        for (bool omb : {false, true}) {
          const WindowMapping m = WindowMapping::make(W, S, P, omb);
          ++configs;
          auto fail_once = [&](const std::string& what) {
            if (failures++ == 0)
              first_failure = "W=" + std::to_string(W) + " S=" + std::to_string(S) + " P=" + std::to_string(P) +
                              " omb=" + std::to_string(omb) + ": " + what;
          };
          if (catch_validation([&] { validate_window(m); }).has_value()) fail_once("rejected");
          const int64_t bubble = (P - S % P) % P;  // the pad that puts the ring on a block edge
          const int64_t cyclic = omb ? W + P - S : W - S;
          if (m.bubble != bubble) fail_once("bubble " + std::to_string(m.bubble));
          if (m.cyclic_len != cyclic) fail_once("cyclic_len " + std::to_string(m.cyclic_len));
          const int64_t ring_start = S + bubble;
          if (ring_start % P != 0) fail_once("ring not block-aligned");
          const int64_t capacity = S + bubble + cyclic;

          // Walk a sequence growing one token at a time, keeping slot counts of the
          // live tokens: all sinks plus the newest min(n - S, cyclic) others.
          std::vector<int> live(static_cast<size_t>(capacity), 0);
          int64_t duplicates = 0, max_slot = -1;
          const int64_t limit = S + 3 * cyclic + P;
          for (int64_t n = 1; n <= limit; ++n) {
            const int64_t t = n - 1;  // the token just appended
            const int64_t slot = m.cache_token(t);
            if (slot < 0 || slot >= capacity) {
              fail_once("token " + std::to_string(t) + " slot " + std::to_string(slot) + " out of range");
              break;
            }
            if (t < S && slot != t) fail_once("sink " + std::to_string(t) + " moved");
            if (t >= S && slot < ring_start) fail_once("token " + std::to_string(t) + " in the bubble or sinks");
            if (t >= S + cyclic) {  // the token leaving the window frees its slot
              const int64_t gone = m.cache_token(t - cyclic);
              if (gone != slot) fail_once("token " + std::to_string(t) + " does not reuse the slot of t - cyclic_len");
              duplicates -= live[static_cast<size_t>(gone)]-- > 1;
            }
            duplicates += live[static_cast<size_t>(slot)]++ > 0;
            if (duplicates != 0) fail_once("two live tokens share a slot at length " + std::to_string(n));
            max_slot = std::max(max_slot, slot);
            if (m.cache_length(n) != max_slot + 1)
              fail_once("cache_length(" + std::to_string(n) + ") = " + std::to_string(m.cache_length(n)) +
                        ", max slot + 1 = " + std::to_string(max_slot + 1));
          }
          if (m.cache_length(limit) != capacity) fail_once("cache_length does not saturate at capacity");
        }
  INFO(first_failure);
  CHECK(failures == 0);
  CHECK(configs > 1000);
}

TEST_CASE("validate_window: named bad_window errors") {
  struct Bad {
    WindowMapping m;
    std::vector<std::string> mentions;
  };
  const Bad bad[] = {
      {WindowMapping::make(-1, 0, 16, false), {"window = -1", ">= 0"}},
      {WindowMapping::make(32, -2, 16, false), {"sinks = -2", ">= 0"}},
      {WindowMapping::make(8, 8, 16, false), {"sinks = 8", "window = 8", "rule"}},  // cyclic_len would be 0
      {WindowMapping::make(8, 9, 16, true), {"sinks = 9", "window = 8"}},
      {WindowMapping::make(0, 4, 16, false), {"sinks = 4", "without a window"}},
  };
  for (const Bad& b : bad) {
    const auto err = catch_validation([&] { validate_window(b.m); });
    REQUIRE(err.has_value());
    const std::string what = err->what();
    INFO(what);
    CHECK(err->code() == ErrorCode::bad_window);
    CHECK(err->name() == "bad_window");
    for (const std::string& s : b.mentions) CHECK(what.find(s) != std::string::npos);
  }
  CHECK_NOTHROW(validate_window(WindowMapping::make(8, 7, 16, false)));  // cyclic_len 1
  CHECK_NOTHROW(validate_window(WindowMapping::make(8, 0, 3, true)));
}

// Regression (issue 9): S + bubble + ... was summed in 32 bits, so an accepted
// window with sinks near 2^31 wrapped negative and attention read outside the
// block table. Every accepted (W, S, P) now maps in 64 bits: checked against
// 128-bit arithmetic at the extremes of int32.
TEST_CASE("accepted windows near 2^31 map without overflow (64-bit slots, 128-bit reference)") {
  const int32_t kMax = INT32_MAX;
  const int32_t windows[] = {kMax, kMax - 1, (1 << 30) + 7, 1025};
  for (int32_t W : windows)
    for (int32_t S : {W - 1, W - 2, W / 2, 1, 0})
      for (int32_t P : {1, 3, 7, 16, 17, 1024})
        for (bool more : {false, true}) {
          if (S < 0) continue;
          const WindowMapping m = WindowMapping::make(W, S, P, more);
          CAPTURE(W);
          CAPTURE(S);
          CAPTURE(P);
          CAPTURE(more);
          REQUIRE_NOTHROW(validate_window(m));
          const __int128 bubble = S % P == 0 ? 0 : P - S % P;
          const __int128 cyclic = more ? static_cast<__int128>(W) + P - S : static_cast<__int128>(W) - S;
          CHECK(m.cyclic_len == static_cast<int64_t>(cyclic));
          for (int64_t t : {int64_t{0}, static_cast<int64_t>(S) - 1, static_cast<int64_t>(S), static_cast<int64_t>(S) + 1,
                            static_cast<int64_t>(kMax), static_cast<int64_t>(kMax) * 3 + 5, INT64_MAX / 2}) {
            if (t < 0) continue;
            const __int128 expected = t < S ? t : S + bubble + (t - S) % cyclic;
            CHECK(m.cache_token(t) == static_cast<int64_t>(expected));
            CHECK(m.cache_token(t) >= 0);
            CHECK(m.cache_token(t) < static_cast<int64_t>(S + bubble + cyclic));
          }
          const int64_t len = kMax;
          const __int128 ring = len - S < cyclic ? len - S : cyclic;
          const __int128 expected_len = len <= S ? len : S + bubble + ring;
          CHECK(m.cache_length(len) == static_cast<int64_t>(expected_len));
        }
  // The reproduction: W = 2^31 - 1, S = 2^31 - 2, P = 16, token 2^31 - 1.
  const WindowMapping m = WindowMapping::make(kMax, kMax - 1, 16, false);
  CHECK(m.bubble == 2);
  CHECK(m.cache_token(kMax) == 2147483648LL);
  CHECK(m.cache_length(kMax) == 2147483649LL);
}

TEST_CASE("validate_window rejects a hand-built mapping whose derived fields disagree (no division by zero)") {
  WindowMapping m = WindowMapping::make(64, 4, 16, false);
  REQUIRE_NOTHROW(validate_window(m));
  m.cyclic_len = 0;  // cache_token would divide by zero
  auto err = catch_validation([&] { validate_window(m); });
  REQUIRE(err.has_value());
  CHECK(err->code() == ErrorCode::bad_window);
  CHECK(std::string(err->what()).find("cyclic_len = 0") != std::string::npos);
  m = WindowMapping::make(64, 4, 16, false);
  m.bubble = 3;
  CHECK(catch_validation([&] { validate_window(m); }).has_value());
  m = WindowMapping::make(64, 4, 16, false);
  m.tokens_per_block = 0;
  err = catch_validation([&] { validate_window(m); });
  REQUIRE(err.has_value());
  CHECK(err->code() == ErrorCode::bad_window);
}

// vLLM's sliding window (make_linear): the slot is the position, the window
// only chooses keys; nothing wraps for any length a pool can hold.
TEST_CASE("linear window: slot = position, no bubble, cache_length = length, validated") {
  for (int32_t P : {1, 3, 16}) {
    const WindowMapping m = WindowMapping::make_linear(32, 0, P);
    CAPTURE(P);
    CHECK(m.enabled());
    CHECK(m.linear);
    CHECK(m.bubble == 0);
    CHECK(m.cyclic_len == WindowMapping::kLinearRing);
    for (int64_t t : {int64_t{0}, int64_t{31}, int64_t{32}, int64_t{1000}, int64_t{1} << 40}) {
      CHECK(m.cache_token(t) == t);
      CHECK(m.cache_length(t) == t);
    }
    REQUIRE_NOTHROW(validate_window(m));
    CHECK(WindowMapping::derive(m).cyclic_len == m.cyclic_len);
  }
  // Sinks keep their place too (no bubble pads them).
  const WindowMapping s = WindowMapping::make_linear(16, 3, 4);
  CHECK(s.bubble == 0);
  CHECK(s.cache_token(2) == 2);
  CHECK(s.cache_token(3) == 3);
  CHECK(s.cache_token(99) == 99);
  REQUIRE_NOTHROW(validate_window(s));
  // A linear mapping with a ring's parameters is a hand-built mismatch.
  WindowMapping bad = WindowMapping::make_linear(16, 0, 4);
  bad.cyclic_len = 16;
  auto err = catch_validation([&] { validate_window(bad); });
  REQUIRE(err.has_value());
  CHECK(err->code() == ErrorCode::bad_window);
  bad = WindowMapping::make_linear(16, 0, 4);
  bad.one_more_block = true;
  err = catch_validation([&] { validate_window(bad); });
  REQUIRE(err.has_value());
  CHECK(std::string(err->what()).find("one_more_block") != std::string::npos);
  CHECK(catch_validation([&] { validate_window(WindowMapping::make_linear(8, 8, 4)); }).has_value());
}

TEST_CASE("linear window key list: sinks, then the last W - S positions as slots, page tail masked") {
  const PageDivider page = PageDivider::make(4);
  const WindowMapping m = WindowMapping::make_linear(6, 2, 4);
  // Query at 13: sinks 0, 1; window [13 - 4 + 1, 13] = 10..13; its page 12..15 has tail slots 14, 15.
  const KeyList k = make_key_list(13, m, page);
  CHECK(k.n_sinks == 2);
  CHECK(k.window_start == 10);
  CHECK(k.n_attended == 6);
  CHECK(k.n_tail == 2);
  std::vector<int64_t> slots;
  for (int64_t j = 0; j < k.size(); ++j) {
    bool masked = false;
    slots.push_back(k.slot(j, m, masked));
    CHECK(masked == (j >= k.n_attended));
  }
  CHECK(slots == std::vector<int64_t>{0, 1, 10, 11, 12, 13, 14, 15});
  // Never wrapped: a late query still reads its own page's tail.
  CHECK(make_key_list(int64_t{1} << 40, m, page).n_tail == 3);
}
