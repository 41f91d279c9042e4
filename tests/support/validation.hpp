// The named error a call throws, if any: tests assert which rule an input
// breaks (docs/errors.md) without a try/catch of their own.
#pragma once

#include <optional>

#include "kvsim/validation.hpp"

namespace kvsim::test {

inline std::optional<ValidationError> catch_validation(const auto& fn) {
  try {
    fn();
  } catch (const ValidationError& e) {
    return e;
  }
  return std::nullopt;
}

}  // namespace kvsim::test
