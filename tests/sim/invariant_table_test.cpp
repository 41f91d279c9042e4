// The invariant and fault table (sim/include/kvsim/sim/invariant_table.hpp)
// against what it names: every enum value has its row, every name parses
// back, every row's test case and code file exist, every fault has its
// built-in scenario that switches it on and expects it caught, and
// docs/invariants.md has a row for each invariant.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <span>
#include <string>

#include "kvsim/sim/invariant_table.hpp"
#include "kvsim/sim/scenario_file.hpp"

using namespace kvsim::sim;

namespace {

std::string read_source(const std::string& relative) {
  std::ifstream in(std::string(KVSIM_SOURCE_DIR) + "/" + relative);
  REQUIRE_MESSAGE(in.good(), relative << " does not exist");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

// Row k is enum value k; names are unique and name <-> value both ways.
template <class Row, class Parse, class Name>
void check_named_rows(std::span<const Row> rows, auto value_of, Parse parse, Name name) {
  std::set<std::string_view> names;
  for (size_t k = 0; k < rows.size(); ++k) {
    const Row& row = rows[k];
    INFO(row.name);
    CHECK(static_cast<size_t>(value_of(row)) == k);
    CHECK(names.insert(row.name).second);
    CHECK(parse(row.name) == value_of(row));
    CHECK(name(value_of(row)) == row.name);
  }
}

TEST_CASE("invariant table: one row per invariant, in enum order, names unique and parsed back") {
  check_named_rows(invariant_table(), [](const InvariantInfo& i) { return i.invariant; }, parse_invariant,
                   invariant_name);
  for (const InvariantInfo& i : invariant_table()) {
    CHECK(!i.checks.empty());
    CHECK(static_cast<bool>(i.possible));
    CHECK(static_cast<bool>(i.happened));
    CHECK((i.needs.empty() == (i.possible == invariant_table()[0].possible)));  // a condition says what it needs
  }
  CHECK(invariant_table().size() == static_cast<size_t>(Invariant::state_restore) + 1);
  CHECK(invariant_names().size() == invariant_table().size());
  CHECK_FALSE(parse_invariant("Dense").has_value());
}

TEST_CASE("fault table: one row per fault, each caught by an invariant of the table") {
  check_named_rows(fault_table(), [](const FaultInfo& f) { return f.fault; }, parse_fault, fault_name);
  for (const FaultInfo& f : fault_table()) {
    CHECK(invariant_for(f.fault) == f.caught_by);
    CHECK(!f.breaks.empty());
  }
  CHECK(fault_names().size() == fault_table().size());
  CHECK_FALSE(parse_fault("dense").has_value());
}

TEST_CASE("invariant table: each row's test case and code file exist") {
  for (const InvariantInfo& i : invariant_table()) {
    INFO(i.name);
    // test: FILE "TEST CASE NAME" ...
    const std::string test(i.test);
    const size_t space = test.find(' ');
    REQUIRE(space != std::string::npos);
    const std::string file = test.substr(0, space);
    const size_t open = test.find('"'), close = test.find('"', open + 1);
    REQUIRE(close != std::string::npos);
    const std::string test_case = test.substr(open + 1, close - open - 1);
    CHECK_MESSAGE(read_source(file).find("TEST_CASE(\"" + test_case + "\")") != std::string::npos,
                  file << " has no TEST_CASE \"" << test_case << "\"");
    // code: ... (FILE) ...
    const std::string code(i.code);
    const size_t from = code.find("(sim/"), to = code.find(')', from);
    REQUIRE(from != std::string::npos);
    CHECK(std::filesystem::exists(std::string(KVSIM_SOURCE_DIR) + "/" + code.substr(from + 1, to - from - 1)));
  }
}

TEST_CASE("fault table: every fault has its built-in scenario, which switches it on and expects it caught") {
  for (const FaultInfo& f : fault_table()) {
    INFO(f.name);
    const Scenario s =
        load_scenario_file(std::string(KVSIM_SOURCE_DIR) + "/scenarios/fault_" + std::string(f.name) + ".toml");
    CHECK(std::find(s.faults.begin(), s.faults.end(), f.fault) != s.faults.end());
    CHECK(std::find(s.expect.must_catch.begin(), s.expect.must_catch.end(), f.fault) != s.expect.must_catch.end());
  }
}

TEST_CASE("docs/invariants.md: a row for every invariant, and every fault named") {
  const std::string doc = read_source("docs/invariants.md");
  for (const InvariantInfo& i : invariant_table())
    CHECK_MESSAGE(doc.find("| `" + std::string(i.name) + "` |") != std::string::npos, "no row for " << i.name);
  for (const FaultInfo& f : fault_table())
    CHECK_MESSAGE(doc.find("`" + std::string(f.name) + "`") != std::string::npos, "fault " << f.name << " not named");
}

TEST_CASE("invariant selection: --invariants selects; a fault narrows the comparisons to its invariant") {
  Scenario s;
  const InvariantSelection all(s, std::nullopt);
  for (const InvariantInfo& i : invariant_table()) CHECK(all.wanted(i.invariant));
  CHECK(all.any_comparison());
  const InvariantSelection dense_only(s, std::set<Invariant>{Invariant::dense});
  CHECK(dense_only.wanted(Invariant::dense));
  CHECK_FALSE(dense_only.selected(Invariant::chunking));
  CHECK_FALSE(dense_only.any_comparison());
  s.faults = {Fault::past_len_zero};
  const InvariantSelection faulted(s, std::nullopt);
  CHECK(faulted.wanted(Invariant::chunking));
  CHECK(faulted.targeted(Invariant::chunking));
  CHECK(faulted.selected(Invariant::reuse));
  CHECK_FALSE(faulted.wanted(Invariant::reuse));
}
