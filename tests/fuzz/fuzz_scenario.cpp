// libFuzzer target: the scenario-file parser (sim/scenario_file.hpp,
// parse_scenario) on arbitrary text. It accepts, or rejects with
// kvsim::ValidationError(bad_scenario); nothing else may
// escape (no other exception, crash, leak or sanitizer report).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "kvsim/validation/errors.hpp"
#include "kvsim/sim/scenario_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    (void)kvsim::sim::parse_scenario(text, "fuzz.toml");
  } catch (const kvsim::ValidationError& e) {
    if (e.code() != kvsim::ErrorCode::bad_scenario) std::abort();
  }
  return 0;
}
