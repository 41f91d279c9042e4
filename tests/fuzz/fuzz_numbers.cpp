// libFuzzer target: the command line's one number parser (cli/numbers.hpp)
// on arbitrary bytes with fuzzed ranges. Accepts or throws bad_argument, and
// what it accepts is canonical: an integer is in [min, max] and prints back as
// its text (decimal) or reparses to itself (hex); a list is its items; a
// float is finite, in range, and matches the grammar's characters.
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kvsim/validation/errors.hpp"
#include "numbers.hpp"

using namespace kvsim;
using namespace kvsim::cli;

namespace {

template <typename Fn>
bool accepts(Fn&& fn) {
  try {
    fn();
    return true;
  } catch (const ValidationError& e) {
    if (e.code() != ErrorCode::bad_argument) std::abort();
    // Messages quote the text printably: never a raw control byte.
    for (const char c : std::string(e.what()))
      if (static_cast<unsigned char>(c) < 0x20) std::abort();
    return false;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  int64_t lo = in.ConsumeIntegral<int64_t>(), hi = in.ConsumeIntegral<int64_t>();
  if (in.ConsumeBool()) lo = in.ConsumeIntegralInRange<int64_t>(-1000, 1000);
  if (lo > hi) std::swap(lo, hi);
  const IntSyntax syntax = in.ConsumeBool() ? IntSyntax::decimal_or_hex : IntSyntax::decimal;
  const int mode = in.ConsumeIntegralInRange<int>(0, 2);
  const std::string text = in.ConsumeRemainingBytesAsString();

  if (mode == 0) {
    int64_t v = 0;
    if (!accepts([&] { v = parse_int("--x", text, lo, hi, syntax); })) return 0;
    if (v < lo || v > hi) std::abort();
    const bool hex = text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X');
    if (hex && syntax != IntSyntax::decimal_or_hex) std::abort();
    if (!hex && std::to_string(v) != text && !(text == "-0" && v == 0)) std::abort();
    if (hex && parse_int("--x", text, lo, hi, syntax) != v) std::abort();
  } else if (mode == 1) {
    std::vector<int64_t> values;
    if (!accepts([&] { values = parse_int_list("--l", text, lo, hi, syntax); })) return 0;
    if (values.empty() || values.size() != split_list("--l", text).size()) std::abort();
    for (int64_t v : values)
      if (v < lo || v > hi) std::abort();
  } else {
    const double a = static_cast<double>(lo), b = static_cast<double>(hi);
    double v = 0;
    if (!accepts([&] { v = parse_float("--f", text, a, b); })) return 0;
    if (!std::isfinite(v) || v < a || v > b) std::abort();
    for (const char c : text)
      if (!((c >= '0' && c <= '9') || c == '.' || c == '-' || c == '+' || c == 'e' || c == 'E')) std::abort();
  }
  return 0;
}
