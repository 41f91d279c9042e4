// The command line's one number parser (cli/numbers.hpp): the grammar,
// the ranges, the error text, and the CLI11 adapters inside a real CLI::App.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "../../cli/numbers.hpp"
#include "kvsim/validation/errors.hpp"

using namespace kvsim;
using namespace kvsim::cli;

namespace {

// The ValidationError message of `fn`, or "" when it does not throw one.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const ValidationError& e) {
    CHECK(e.code() == ErrorCode::bad_argument);
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("parse_int: decimal integers in range") {
  CHECK(parse_int("--x", "0", 0, 10) == 0);
  CHECK(parse_int("--x", "7", 0, 10) == 7);
  CHECK(parse_int("--x", "-3", -5, 10) == -3);
  CHECK(parse_int("--x", "-0", -5, 10) == 0);
  CHECK(parse_int("--x", "9223372036854775807", INT64_MIN, INT64_MAX) == INT64_MAX);
  CHECK(parse_int("--x", "-9223372036854775808", INT64_MIN, INT64_MAX) == INT64_MIN);
  CHECK(parse_int("--x", "1024", 1, 1024) == 1024);
}

TEST_CASE("parse_int: every malformed spelling is rejected with the flag and the text") {
  const char* bad[] = {"", "010", "00", "+5", " 5", "5 ", "5x", "x5", "1e3", "1.0", "-", "--5", "0x10", "٣"};
  for (const char* text : bad) {
    INFO("text '" << text << "'");
    const std::string e = error_of([&] { parse_int("--page-size", text, INT64_MIN, INT64_MAX); });
    CHECK(contains(e, "bad_argument: --page-size = '"));
  }
  CHECK(contains(error_of([] { parse_int("--page-size", "010", 0, 100); }), "leading zero"));
  CHECK(contains(error_of([] { parse_int("--token", "", 0, 100); }), "--token = '': empty value"));
  CHECK(contains(error_of([] { parse_int("--x", "0x10", 0, 100); }), "hex is not accepted here"));
}

TEST_CASE("parse_int: ranges and 64-bit overflow") {
  CHECK(contains(error_of([] { parse_int("--threads", "0", 1, 2); }), "out of range: must be in [1, 2]"));
  CHECK(contains(error_of([] { parse_int("--threads", "3", 1, 2); }), "out of range"));
  CHECK(contains(error_of([] { parse_int("--x", "9223372036854775808", INT64_MIN, INT64_MAX); }), "out of range"));
  CHECK(contains(error_of([] { parse_int("--x", "-9223372036854775809", INT64_MIN, INT64_MAX); }), "out of range"));
  CHECK(contains(error_of([] { parse_int("--x", "99999999999999999999999", 0, 1); }), "out of range"));
  CHECK(contains(error_of([] { parse_int("--x", "2147483648", INT32_MIN, INT32_MAX); }), "out of range"));
}

TEST_CASE("parse_int: hex only where the flag allows it") {
  CHECK(parse_int("--x", "0x10", 0, 0xFFFFFFFF, IntSyntax::decimal_or_hex) == 16);
  CHECK(parse_int("--x", "0XfF", 0, 0xFFFFFFFF, IntSyntax::decimal_or_hex) == 255);
  CHECK(parse_int("--x", "0x80000003", 0, 0xFFFFFFFF, IntSyntax::decimal_or_hex) == 0x80000003LL);
  CHECK(parse_int("--x", "10", 0, 100, IntSyntax::decimal_or_hex) == 10);
  for (const char* text : {"0x", "-0x1", "0xg", "0x 1", "010"}) {
    INFO(text);
    CHECK(!error_of([&] { parse_int("--x", text, INT64_MIN, INT64_MAX, IntSyntax::decimal_or_hex); }).empty());
  }
}

TEST_CASE("parse_int: an embedded NUL is named, never silently cut") {
  const std::string text("12\0" "3", 4);
  const std::string e = error_of([&] { parse_int("stdin line 1", text, 0, 1000); });
  CHECK(contains(e, "stdin line 1 = '12\\x003': contains a NUL byte"));
}

TEST_CASE("parse_int_list: items, blanks, empty entries") {
  CHECK(parse_int_list("--l", "1,2,3", 0, 9) == std::vector<int64_t>{1, 2, 3});
  CHECK(parse_int_list("--l", " 4 , 5", 0, 9) == std::vector<int64_t>{4, 5});
  CHECK(parse_int_list("--l", "-1", -1, 9) == std::vector<int64_t>{-1});
  for (const char* text : {"", "1,2,", ",1", "1,,2", ",", " ", "1, ,2"}) {
    INFO("'" << text << "'");
    CHECK(!error_of([&] { parse_int_list("--block-table", text, -1, 9); }).empty());
  }
  CHECK(contains(error_of([] { parse_int_list("--block-table", "1,2,", 0, 9); }), "--block-table entry 2 = ''"));
  CHECK(contains(error_of([] { parse_int_list("--block-table", "1,010", 0, 99); }),
                 "--block-table entry 1 = '010': leading zero"));
}

TEST_CASE("parse_float: finite decimals in range, nothing else") {
  CHECK(parse_float("--s", "0", 0, 10) == 0.0);
  CHECK(parse_float("--s", "0.25", 0, 10) == 0.25);
  CHECK(parse_float("--s", ".5", 0, 10) == 0.5);
  CHECK(parse_float("--s", "5.", 0, 10) == 5.0);
  CHECK(parse_float("--s", "1e-3", 0, 10) == 1e-3);
  CHECK(parse_float("--s", "-2E+0", -3, 10) == -2.0);
  for (const char* text : {"", "nan", "inf", "-inf", "0x1p3", " 1", "1 ", "1e", "e3", ".", "-", "1..2", "+1", "1e400"}) {
    INFO("'" << text << "'");
    CHECK(!error_of([&] { parse_float("--min-seconds", text, -1e300, 1e300); }).empty());
  }
  CHECK(contains(error_of([] { parse_float("--min-seconds", "-1", 0, 3600); }), "out of range: must be in [0, 3600]"));
}

TEST_CASE("parse_fp32: strtof syntax, whole text, no NUL") {
  CHECK(parse_fp32("value", "1.5") == 1.5f);
  CHECK(parse_fp32("value", "0x1p-3") == 0.125f);
  CHECK(std::isnan(parse_fp32("value", "nan")));
  CHECK(std::isinf(parse_fp32("value", "-inf")));
  CHECK(std::isinf(parse_fp32("value", "1e60")));
  for (const char* text : {"", " 1", "1 ", "abc", "1,5"}) {
    INFO("'" << text << "'");
    CHECK(!error_of([&] { parse_fp32("value", text); }).empty());
  }
  CHECK(!error_of([] { parse_fp32("value", std::string("1\0" "5", 3)); }).empty());
}

TEST_CASE("CLI11 adapters: values go through the strict parser, defaults are kept") {
  CLI::App app{"t"};
  int32_t page = 16;
  int64_t token = 0;
  std::vector<int32_t> table;
  double seconds = 0.3;
  add_int_option(app, "-p,--page-size", page, "P", 1, 1024);
  add_int_option(app, "--token", token, "t", 0, INT64_MAX);
  add_int_list_option(app, "--block-table", table, "table", -1, INT32_MAX);
  add_float_option(app, "--min-seconds", seconds, "s", 0.0, 3600.0);

  const auto parse = [&](std::vector<std::string> args) {
    std::vector<std::string> reversed(args.rbegin(), args.rend());
    app.parse(reversed);
  };
  parse({"--page-size", "7", "--block-table", "3,-1,4", "--min-seconds", "0"});
  CHECK(page == 7);
  CHECK(token == 0);
  CHECK(table == std::vector<int32_t>{3, -1, 4});
  CHECK(seconds == 0.0);

  CHECK(contains(error_of([&] { parse({"--page-size", "010"}); }), "--page-size = '010': leading zero"));
  CHECK(contains(error_of([&] { parse({"-p", "2000"}); }), "--page-size = '2000': out of range"));
  CHECK(contains(error_of([&] { parse({"--token="}); }), "--token = '': empty value"));
  CHECK(contains(error_of([&] { parse({"--block-table", "1,2,"}); }), "--block-table entry 2"));
  CHECK(contains(error_of([&] { parse({"--min-seconds", "nan"}); }), "--min-seconds = 'nan'"));
  parse({"--block-table", "1", "--block-table", "2,3"});  // repeated list flags append
  CHECK(table == std::vector<int32_t>{1, 2, 3});
}
