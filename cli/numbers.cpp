#include "numbers.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <thread>

#include "kvsim/validation/errors.hpp"

namespace kvsim::cli {

int machine_threads() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }
namespace {

[[noreturn]] void reject(std::string_view flag, std::string_view text, const std::string& rule) {
  fail(ErrorCode::bad_argument, std::string(flag) + " = '" + printable(text) + "': " + rule);
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }
int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void reject_empty_or_nul(std::string_view flag, std::string_view text) {
  if (text.empty()) reject(flag, text, "empty value: expected a number");
  if (text.find('\0') != std::string_view::npos) reject(flag, text, "contains a NUL byte");
}

std::string range_text(int64_t min, int64_t max) {
  return "[" + std::to_string(min) + ", " + std::to_string(max) + "]";
}

std::string_view trim_blanks(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

std::string printable(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (out.size() >= 64) {
      out += "...";
      break;
    }
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7F && c != '\'' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    }
  }
  return out;
}

int64_t parse_int(std::string_view flag, std::string_view text, int64_t min, int64_t max, IntSyntax syntax) {
  reject_empty_or_nul(flag, text);
  const bool negative = text[0] == '-';
  std::string_view digits = negative ? text.substr(1) : text;
  const bool hex = digits.size() >= 2 && digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X');
  const auto expected = [&] {
    return std::string(syntax == IntSyntax::decimal_or_hex ? "expected a decimal integer or 0xHEX"
                                                           : "expected a decimal integer");
  };
  if (hex && syntax != IntSyntax::decimal_or_hex) reject(flag, text, "hex is not accepted here: " + expected());
  if (hex && negative) reject(flag, text, "a hex value has no sign: " + expected());
  if (hex) digits.remove_prefix(2);
  if (digits.empty()) reject(flag, text, expected());
  if (!hex && digits.size() > 1 && digits[0] == '0')
    reject(flag, text, "leading zero: decimal numbers are written without one (it is not octal)");
  // Accumulate the magnitude with overflow checks; |INT64_MIN| fits in uint64.
  const uint64_t limit = negative ? uint64_t{1} << 63 : static_cast<uint64_t>(INT64_MAX);
  const uint64_t base = hex ? 16 : 10;
  uint64_t magnitude = 0;
  bool too_large = false;
  for (char c : digits) {
    const int d = hex ? hex_digit(c) : (is_digit(c) ? c - '0' : -1);
    if (d < 0) reject(flag, text, expected());
    if (magnitude > (limit - static_cast<uint64_t>(d)) / base) too_large = true;
    if (!too_large) magnitude = magnitude * base + static_cast<uint64_t>(d);
  }
  if (too_large) reject(flag, text, "out of range: must be in " + range_text(min, max));
  const int64_t value = negative ? (magnitude == (uint64_t{1} << 63) ? INT64_MIN : -static_cast<int64_t>(magnitude))
                                 : static_cast<int64_t>(magnitude);
  if (value < min || value > max) reject(flag, text, "out of range: must be in " + range_text(min, max));
  return value;
}

std::vector<std::string_view> split_list(std::string_view flag, std::string_view text) {
  reject_empty_or_nul(flag, text);
  std::vector<std::string_view> items;
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    const std::string_view item = trim_blanks(text.substr(start, comma == std::string_view::npos ? text.npos : comma - start));
    if (item.empty())
      reject(std::string(flag) + " entry " + std::to_string(items.size()), item,
             "empty entry in '" + printable(text) +
                 "': expected comma-separated integers (no leading, trailing or doubled commas)");
    items.push_back(item);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return items;
}

std::vector<int64_t> parse_int_list(std::string_view flag, std::string_view text, int64_t min, int64_t max,
                                    IntSyntax syntax) {
  std::vector<int64_t> values;
  for (std::string_view item : split_list(flag, text))
    values.push_back(parse_int(std::string(flag) + " entry " + std::to_string(values.size()), item, min, max, syntax));
  return values;
}

double parse_float(std::string_view flag, std::string_view text, double min, double max) {
  reject_empty_or_nul(flag, text);
  // [-]D[.D][e[+-]D] or [-].D[e[+-]D]: checked by hand so strtod's extras
  // (blanks, hex, nan, inf, locale) never get a say.
  size_t i = 0;
  const auto digits = [&] {
    const size_t from = i;
    while (i < text.size() && is_digit(text[i])) ++i;
    return i - from;
  };
  if (i < text.size() && text[i] == '-') ++i;
  size_t mantissa = digits();
  if (i < text.size() && text[i] == '.') {
    ++i;
    mantissa += digits();
  }
  bool ok = mantissa > 0;
  if (ok && i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    ok = digits() > 0;
  }
  if (!ok || i != text.size()) reject(flag, text, "expected a finite decimal number (e.g. 0.5, 2, 1e-3)");
  const std::string copy(text);
  const double value = std::strtod(copy.c_str(), nullptr);
  if (!std::isfinite(value) || value < min || value > max) {
    char range[96];
    std::snprintf(range, sizeof range, "[%g, %g]", min, max);
    reject(flag, text, std::string("out of range: must be in ") + range);
  }
  return value;
}

float parse_fp32(std::string_view flag, std::string_view text) {
  reject_empty_or_nul(flag, text);
  const std::string copy(text);
  // strtof skips leading blanks; the grammar does not.
  if (copy[0] == ' ' || copy[0] == '\t' || copy[0] == '\n' || copy[0] == '\r' || copy[0] == '\f' || copy[0] == '\v')
    reject(flag, text, "not a number (strtof syntax: 1.5, -2e3, 0x1p-3, nan, inf)");
  char* end = nullptr;
  errno = 0;
  const float v = std::strtof(copy.c_str(), &end);
  if (end == copy.c_str() || *end != '\0')
    reject(flag, text, "not a number (strtof syntax: 1.5, -2e3, 0x1p-3, nan, inf)");
  return v;
}

CLI::Option* add_float_option(CLI::App& cmd, const std::string& name, double& target, const std::string& description,
                              double min, double max) {
  const std::string label = numbers_detail::flag_label(name);
  char shown[32];
  std::snprintf(shown, sizeof shown, "%g", target);
  CLI::Option* opt = cmd.add_option_function<std::string>(
      name, [&target, label, min, max](const std::string& text) { target = parse_float(label, text, min, max); },
      description + " (default " + shown + ")");
  opt->expected(0, 1);
  return opt;
}

namespace numbers_detail {

std::string flag_label(const std::string& option_name) {
  std::string best;
  size_t start = 0;
  for (;;) {
    const size_t comma = option_name.find(',', start);
    std::string part = option_name.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (part.size() > best.size()) best = part;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return best;
}

std::string list_text(const std::vector<int64_t>& values) {
  std::string s;
  for (size_t i = 0; i < values.size(); ++i) s += (i ? "," : "") + std::to_string(values[i]);
  return s;
}

}  // namespace numbers_detail
}  // namespace kvsim::cli
