// The scenario invariants and faults of contract §6, written once: the table
// in sim/lib/invariant_table.cpp gives each invariant its name, what it
// checks, where the check lives and the test that shows it, and each fault
// its name, the invariant that catches it and what it breaks. Scenario files,
// `kvsim run` (its --invariants list, table, JSON and --list-invariants), the
// report, the replay's bookkeeping and docs/invariants.md (through the
// --list-invariants transcript docs_test re-runs) all read these names from
// here. The checks themselves run in the replay (replay_run.cpp: in-run;
// replay.cpp and invariants.hpp: the comparison re-runs).
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvsim::sim {

struct Scenario;   // scenario.hpp
struct RunRecord;  // replay_run.hpp

// Named invariants (contract §6), in the order every report lists them.
enum class Invariant : uint8_t {
  conservation, chunking, reuse, window, layout, dense, quantization, no_nan, offload, batch, write,
  state_hit, state_restore,
};

// Fault injection (contract §6): each reproduces one silent failure of the seed
// article's table or an engine's bug report; the fault table names the
// invariant that must catch it.
enum class Fault : uint8_t {
  past_len_zero,
  window_mismatch,
  k_scale_for_v,
  reused_block_mismatch,
  v_tail_not_zeroed,
  stale_bad_page,
  group_window_for_layer,
  window_table_absolute,
  short_block_table,
  offload_drops_scales,
  split_x_heads_unwritten,
  slot_mapping_page_size,
  indexer_slot_past_cache,
  offload_before_copy,
  snapshot_off_block_boundary,
  q_scale_dropped,
};

struct InvariantInfo {
  Invariant invariant;
  std::string_view name;    // in scenario files, --invariants, reports and JSON
  std::string_view checks;  // what is compared, in a sentence
  std::string_view code;    // where the check lives
  std::string_view test;    // the test that shows it holds (and catches its faults)
  // Checked by re-running the scenario with one setting changed (replay.cpp);
  // the others are checked during the scenario's own run.
  bool comparison;
  // Whether the scenario's settings give the invariant something to check,
  // and what that takes in words: validation rejects a must_pass, or a fault,
  // about an invariant the scenario never checks (never_checked below).
  bool (*possible)(const Scenario& s);
  std::string_view needs;
  // Whether the scenario's own run gave it something (an offload, a restored
  // state, a row the write oracle models): only the run can tell.
  bool (*happened)(const RunRecord& main);
};

struct FaultInfo {
  Fault fault;
  std::string_view name;   // faults.NAME in scenario files
  Invariant caught_by;
  std::string_view breaks; // what the fault does, and its source
};

// Every invariant and every fault, in enum order.
std::span<const InvariantInfo> invariant_table();
std::span<const FaultInfo> fault_table();
const InvariantInfo& invariant_info(Invariant i);
const FaultInfo& fault_info(Fault f);

std::string_view invariant_name(Invariant i);
std::optional<Invariant> parse_invariant(std::string_view s);
std::string_view fault_name(Fault f);
std::optional<Fault> parse_fault(std::string_view s);
// The invariant that catches a fault.
Invariant invariant_for(Fault f);
std::vector<std::string_view> invariant_names();
std::vector<std::string_view> fault_names();

// Whether the replay of `s` checks invariant `i` (reported n/a otherwise):
// the scenario makes it possible and its run gave it something.
bool invariant_applies(const Scenario& s, Invariant i, const RunRecord& main);
// Why the replay of `s` never checks invariant `i`, known from the scenario
// alone: its settings give it nothing (InvariantInfo::needs), or faults are
// switched on and none targets it (only the invariants a fault targets are
// compared). nullopt: it is checked when the run gives it something.
std::optional<std::string> never_checked(const Scenario& s, Invariant i);

// The table as `kvsim run --list-invariants` prints it (docs/invariants.md).
std::string describe_invariant_table();

// Which invariants a replay checks: the ones selected (ReplayOptions::
// invariants, `kvsim run --invariants`; nullopt = all) and, with a fault
// switched on, only those its faults target (the others would see the fault
// too and say nothing new).
class InvariantSelection {
 public:
  InvariantSelection(const Scenario& s, const std::optional<std::set<Invariant>>& selected);
  bool selected(Invariant i) const { return !selected_ || selected_->count(i) != 0; }
  bool targeted(Invariant i) const { return targeted_.count(i) != 0; }
  const std::set<Invariant>& targeted() const { return targeted_; }
  bool wanted(Invariant i) const { return selected(i) && (no_faults_ || targeted(i)); }
  // Any comparison invariant is wanted (the main run must record its outputs).
  bool any_comparison() const;

 private:
  std::optional<std::set<Invariant>> selected_;
  std::set<Invariant> targeted_;
  bool no_faults_ = true;
};

}  // namespace kvsim::sim
