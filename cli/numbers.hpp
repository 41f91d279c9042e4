// The one number parser of the kvsim command line. Every numeric flag, every
// comma-separated list and every number read from stdin goes through here, so
// one grammar holds everywhere:
//
//   integer   [-]DIGITS          decimal only; no '+', no blanks inside, no
//                                leading zero ("010" is an error, never octal 8
//                                or decimal 10); "0" is fine
//             0xHEX              only where the flag documents hex
//                                (IntSyntax::decimal_or_hex)
//   list      ITEM,ITEM,...      blanks around an item are ignored; an empty
//                                item ("1,,2", "1,2,", ",1", "") is an error
//   float     [-]D[.D][e[+-]D]   finite decimal, range checked
//   fp32      strtof syntax      for codec inputs only: also nan, inf, hex floats
//
// A value with a NUL byte, an empty value, a value out of [min, max] or one
// that does not fit the target type is rejected with
//   kvsim::ValidationError(bad_argument, "<flag> = '<text>': <rule>")
// which main() prints as `kvsim: error: bad_argument: ...` with exit code 2.
//
// Subcommands bind flags with the add_*_option adapters below instead of
// CLI11's add_option(name, int&): CLI11's own conversion reads "010" as octal
// and "" as 0. Example:
//   add_int_option(*cmd, "--page-size", opts.page_size, "Tokens per block", 1, 1024);
//   add_int_list_option(*cmd, "--lengths", opts.lengths, "Sequence lengths", 0, INT32_MAX);
//   add_float_option(*cmd, "--min-seconds", opts.min_seconds, "Seconds per measurement", 0.0, 3600.0);
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

namespace kvsim::cli {

enum class IntSyntax : uint8_t {
  decimal,         // the default for every flag
  decimal_or_hex,  // also 0xHEX (block references, codec codes): the flag's help says so
};

// The text as an error message shows it: printable ASCII as is, anything else
// (NUL, control bytes, non-ASCII) as \xNN, cut after 64 characters.
std::string printable(std::string_view text);

// The range every --threads flag accepts: 1..this machine's cores (oneTBB
// cannot build an arena of millions of threads; unset = all cores).
int machine_threads();

// One integer in [min, max]. `flag` names the value in the error ("--token",
// "stdin line 3").
int64_t parse_int(std::string_view flag, std::string_view text, int64_t min, int64_t max,
                  IntSyntax syntax = IntSyntax::decimal);

// The items of a comma-separated list, blanks around each trimmed; an empty
// list or an empty item is an error naming `flag` and the item's index. For
// lists whose items are not plain integers (explain's sN block references).
std::vector<std::string_view> split_list(std::string_view flag, std::string_view text);

// A comma-separated list of integers, each in [min, max]; at least one item.
std::vector<int64_t> parse_int_list(std::string_view flag, std::string_view text, int64_t min, int64_t max,
                                    IntSyntax syntax = IntSyntax::decimal);

// A finite decimal number in [min, max] (no nan, inf or hex floats).
double parse_float(std::string_view flag, std::string_view text, double min, double max);

// An fp32 value in strtof syntax (correctly rounded decimal, hex floats, nan,
// inf; overflow gives +-inf as strtof does): the codecs' input, where
// non-finite values are the point. Still no empty value, no NUL, no trailing
// characters.
float parse_fp32(std::string_view flag, std::string_view text);

// ---------------------------------------------------------------- CLI11 adapters
// `name` is CLI11's option name ("--threads" or "-t,--threads"); the longest
// spelling names the flag in errors. The current value of `target` is shown as
// the default in --help (in the description: CLI11 would substitute a
// default_str for an empty value, and an empty value must be an error). The parsed value is stored when CLI11 runs the
// option's callback; a bad value throws from inside app.parse().

template <typename Int>
CLI::Option* add_int_option(CLI::App& cmd, const std::string& name, Int& target, const std::string& description,
                            int64_t min = std::numeric_limits<Int>::min(),
                            int64_t max = static_cast<int64_t>(std::numeric_limits<Int>::max()),
                            IntSyntax syntax = IntSyntax::decimal);

template <typename Int>
CLI::Option* add_int_list_option(CLI::App& cmd, const std::string& name, std::vector<Int>& target,
                                 const std::string& description, int64_t min = std::numeric_limits<Int>::min(),
                                 int64_t max = static_cast<int64_t>(std::numeric_limits<Int>::max()),
                                 IntSyntax syntax = IntSyntax::decimal);

CLI::Option* add_float_option(CLI::App& cmd, const std::string& name, double& target, const std::string& description,
                              double min, double max);

// ---------------------------------------------------------------- template definitions

namespace numbers_detail {
std::string flag_label(const std::string& option_name);  // "-t,--threads" -> "--threads"
std::string list_text(const std::vector<int64_t>& values);
}  // namespace numbers_detail

template <typename Int>
CLI::Option* add_int_option(CLI::App& cmd, const std::string& name, Int& target, const std::string& description,
                            int64_t min, int64_t max, IntSyntax syntax) {
  const std::string label = numbers_detail::flag_label(name);
  CLI::Option* opt = cmd.add_option_function<std::string>(
      name, [&target, label, min, max, syntax](const std::string& text) {
        target = static_cast<Int>(parse_int(label, text, min, max, syntax));
      },
      description + " (default " + std::to_string(target) + ")");
  opt->expected(0, 1);  // "--flag=" and a bare "--flag" reach the parser as "" (an error) instead of swallowing the next flag
  return opt;
}

template <typename Int>
CLI::Option* add_int_list_option(CLI::App& cmd, const std::string& name, std::vector<Int>& target,
                                 const std::string& description, int64_t min, int64_t max, IntSyntax syntax) {
  const std::string label = numbers_detail::flag_label(name);
  // "--threads 1,2" and "--threads 1 --threads 2" give the same list.
  CLI::Option* opt = cmd.add_option_function<std::vector<std::string>>(
      name, [&target, label, min, max, syntax](const std::vector<std::string>& texts) {
        target.clear();
        for (const std::string& text : texts)
          for (int64_t v : parse_int_list(label, text, min, max, syntax)) target.push_back(static_cast<Int>(v));
      },
      target.empty() ? description
                     : description + " (default " + numbers_detail::list_text({target.begin(), target.end()}) + ")");
  opt->expected(0, 1)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  return opt;
}

}  // namespace kvsim::cli
