// The error a rejection throws (contract §3): one of core's named ErrorCodes
// plus a message naming the sequence, the entry, the value and the rule.
// Validation always happens before any byte moves, so a thrown ValidationError
// means every pool is unchanged. Host only: core holds the codes, not this.
#pragma once

#include <stdexcept>
#include <string>

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

}  // namespace kvsim
