// A two-way switch read from the environment, for same-binary timings of a
// change (KVSIM_PREFILL_PASS1, KVSIM_PREFILL_TILES_AHEAD, KVSIM_RUNS_AT_ONCE):
// unset, empty or `on` is true, `off` false; any other value is bad_argument,
// naming the variable, its value and both choices.
#pragma once

#include <cstdlib>
#include <string>
#include <string_view>

#include "kvsim/validation/errors.hpp"

namespace kvsim {

inline bool env_switch(const char* name, std::string_view on, std::string_view off) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0' || std::string_view(env) == on) return true;
  if (std::string_view(env) == off) return false;
  throw ValidationError(ErrorCode::bad_argument, std::string(name) + " = '" + clipped(env) + "': expected " + std::string(on) +
                                                     " or " + std::string(off) + " (or unset: " + std::string(on) + ")");
}

}  // namespace kvsim
