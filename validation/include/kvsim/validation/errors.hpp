// The error a rejection throws (contract §3): one of core's named ErrorCodes
// plus a message naming the sequence, the entry, the value and the rule.
// Validation always happens before any byte moves, so a thrown ValidationError
// means every pool is unchanged. Host only: core holds the codes, not this.
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>

#include "kvsim/core/errors.hpp"

namespace kvsim {

class ValidationError : public std::runtime_error {
 public:
  ValidationError(ErrorCode code, const std::string& message)
      : std::runtime_error(std::string(error_name(code)) + ": " + message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }
  std::string_view name() const noexcept { return error_name(code_); }

 private:
  ErrorCode code_;
};

[[noreturn]] inline void fail(ErrorCode code, const std::string& message) {
  throw ValidationError(code, message);
}

// A user's text (a file's key or string, an environment variable's value)
// echoed in a message: cut after 64 characters, so a 10 MB value does not
// come back whole, and control characters written as TOML escapes (\u0000):
// a NUL would end the message where it is printed, and the terminal must not
// take the rest as commands.
inline std::string clipped(std::string_view text) {
  constexpr size_t kShown = 64;
  std::string out;
  for (const char c : text.substr(0, kShown)) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7F) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04X", u);
      out += esc;
    } else {
      out += c;
    }
  }
  if (text.size() <= kShown) return out;
  return out + "... (" + std::to_string(text.size()) + " characters)";
}

}  // namespace kvsim
