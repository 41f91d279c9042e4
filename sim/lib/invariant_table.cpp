// The invariant and fault table (invariant_table.hpp). A new invariant or
// fault gets its enum value and its row here; tests/sim/invariant_table_test
// holds every row to its enum, its test file and docs/invariants.md.
#include "kvsim/sim/invariant_table.hpp"

#include <algorithm>
#include <array>

#include "kvsim/sim/replay_run.hpp"
#include "kvsim/sim/scenario.hpp"

namespace kvsim::sim {

namespace {

constexpr bool always(const Scenario&) { return true; }
constexpr bool ran(const RunRecord&) { return true; }

constexpr std::array<InvariantInfo, 13> kInvariants{{
    {Invariant::conservation, "conservation",
     "after every step, for both pools, free + referenced + cached = size, every block in exactly one of those "
     "states, each block's reference count equal to the table entries that hold it",
     "BlockManager::check_conservation() (sim/lib/block_manager.cpp), called by Runner::run()",
     "tests/sim/block_manager_test.cpp \"block manager: conservation after every operation, page sizes 1, 3, 7, 17\"", false,
     always, "", ran},
    {Invariant::chunking, "chunking",
     "outputs bit-equal to the same requests prefilled in one chunk (a whole-prompt scenario is compared with "
     "chunks of 5)",
     "replay(), the chunking re-run (sim/lib/replay.cpp)",
     "tests/sim/replay_test.cpp \"replay: counters and every invariant, page sizes 1, 3, 7, 17\"", true, always, "", ran},
    {Invariant::reuse, "reuse", "outputs bit-equal with prefix reuse on and off (layer by layer with [layers])",
     "replay(), the reuse re-run (sim/lib/replay.cpp)",
     "tests/sim/replay_test.cpp \"replay: prefix reuse hits, last-token recompute, eviction, offload and onboard\"", true,
     [](const Scenario& s) { return s.reuse.enabled; }, "reuse.enabled = true", ran},
    {Invariant::window, "window",
     "outputs at positions < W and every cached token bit-equal to the run without a window; with [layers], layer "
     "by layer against full attention in every layer",
     "replay(), the window re-run (sim/lib/replay.cpp)",
     "tests/sim/replay_test.cpp \"replay: both window modes, sinks with a bubble, window >= lengths\"", true,
     [](const Scenario& s) { return s.window.mode != WindowMode::none || s.layers.enabled; },
     "a window (window.mode = cyclic or release, or [layers])", ran},
    {Invariant::layout, "layout",
     "outputs and read-back gathers bit-equal across NHD / HND / split-x and in_block / per_layer",
     "replay(), the layout re-runs (sim/lib/replay.cpp)",
     "tests/sim/replay_test.cpp \"replay: every write path and dtype keeps the invariants\"", true, always, "", ran},
    {Invariant::dense, "dense",
     "each checked query head's paged attention output within a stated bound of attention in double over "
     "the K/V gathered through the sequence's table",
     "Runner::check_dense() (sim/lib/replay_run.cpp)", "tests/sim/replay_test.cpp \"replay: counters and every invariant, page sizes 1, 3, 7, 17\" (and every other replay case)", false,
     [](const Scenario& s) { return !s.mla.enabled; },
     "no MLA (the dense reference covers decode and prefill attention, not mla_attention)", ran},
    {Invariant::quantization, "quantization",
     "relative RMS error of a quantized cache's attention outputs against a bf16 cache within quantization_bound()",
     "quantization_error(), quantization_bound() (sim/lib/replay.cpp)",
     "tests/sim/replay_test.cpp \"replay: every write path and dtype keeps the invariants\"", true,
     [](const Scenario& s) { return is_quantized(s.cache.dtype) && !s.mla.enabled; },
     "a quantized cache.dtype (fp8_e4m3, fp8_e5m2, int8, nvfp4) and no MLA (the bf16 comparison covers "
     "decode and prefill attention)", ran},
    {Invariant::no_nan, "no_nan",
     "with every pool poisoned with NaN bytes before the run, no attention output holds NaN",
     "Runner::attend() (sim/lib/replay_run.cpp)",
     "tests/sim/replay_test.cpp \"replay: each fault is caught by its invariant, which passes with the fault off\"", false,
     [](const Scenario& s) {
       return s.cache.poison_nan ||
              std::find(s.faults.begin(), s.faults.end(), Fault::v_tail_not_zeroed) != s.faults.end();
     },
     "cache.poison_nan = true (the pools are poisoned only then)", ran},
    {Invariant::offload, "offload",
     "every offload and onboard moves the block's bytes (each layer's K and V, and nvfp4 scales) unchanged, and "
     "every onboard returns exactly the bytes its offload was given (BLAKE2b-128 of the block, end to end)",
     "Runner::move() (sim/lib/replay_run.cpp)",
     "tests/sim/replay_test.cpp \"replay: prefix reuse hits, last-token recompute, eviction, offload and onboard\"", false,
     [](const Scenario& s) { return s.reuse.offload; },
     "reuse.offload = true", [](const RunRecord& main) { return main.offload_round_trips > 0; }},
    {Invariant::batch, "batch", "a request's outputs bit-equal in its batch, with the batch in reverse order, and alone",
     "replay(), the batch re-runs (sim/lib/replay.cpp)",
     "tests/sim/replay_test.cpp \"replay: preemption by recompute under pool pressure keeps outputs bit-equal\"", true,
     [](const Scenario& s) { return s.requests.size() >= 2; }, "at least two requests", ran},
    {Invariant::write, "write",
     "a write oracle independent of the pool read: every cache row a finished request reads back, and its indexer-K "
     "bytes, equal the value its write op was given, recomputed from the synthetic model through core's codecs",
     "Runner::check_written_row(), Runner::check_indexer_rows(), Runner::expected_row() (sim/lib/replay_run.cpp)",
     "tests/sim/replay_test.cpp \"replay: every write path and dtype keeps the invariants\"", false,
     [](const Scenario& s) { return !(s.mla.enabled && s.cache.dtype == CacheDtype::nvfp4) || s.indexer_k_scatter; },
     "a cache the write oracle models (not an nvfp4 MLA latent cache without indexer.k_scatter)", [](const RunRecord& main) { return main.write_checked_rows > 0; }},
    {Invariant::state_hit, "state_hit",
     "a prefix hit is never longer than the deepest valid snapshot of the recurrent states: every request that "
     "resumes at a position past 0 finds a snapshot there",
     "Runner::advance_recurrent(), Runner::restore_state() (sim/lib/replay_run.cpp)",
     "tests/sim/replay_test.cpp \"replay: recurrent states, snapshots at block boundaries, hits limited to them\"", false,
     [](const Scenario& s) { return s.recurrent.layers > 0; }, "[recurrent] layers", ran},
    {Invariant::state_restore, "state_restore",
     "a restored recurrent state is byte-equal to the state recomputed from token 0 by core's recurrence",
     "Runner::restore_state() (sim/lib/replay_run.cpp)",
     "tests/sim/replay_test.cpp \"replay: recurrent states, snapshots at block boundaries, hits limited to them\"", false,
     [](const Scenario& s) { return s.recurrent.layers > 0; },
     "[recurrent] layers", [](const RunRecord& main) { return main.state_restores > 0; }},
}};

constexpr std::array<FaultInfo, 16> kFaults{{
    {Fault::past_len_zero, "past_len_zero", Invariant::chunking,
     "continuation chunks are written and read as if nothing were cached (past_seq_len = 0)"},
    {Fault::window_mismatch, "window_mismatch", Invariant::window,
     "the reader's window mapping forgets the sinks (and the bubble) the writer used"},
    {Fault::k_scale_for_v, "k_scale_for_v", Invariant::quantization, "attention dequantizes V with K's scale"},
    {Fault::reused_block_mismatch, "reused_block_mismatch", Invariant::reuse,
     "a prefix hit is served blocks holding other tokens' K/V"},
    {Fault::v_tail_not_zeroed, "v_tail_not_zeroed", Invariant::no_nan,
     "qkv_preprocess_write leaves the V tail of the last block, in NaN-poisoned pools"},
    {Fault::stale_bad_page, "stale_bad_page", Invariant::dense,
     "the reader's table is the previous step's, with BAD_PAGE where a block now lives"},
    {Fault::group_window_for_layer, "group_window_for_layer", Invariant::window,
     "a full layer reads through the model's sliding window (vLLM PR #51756)"},
    {Fault::window_table_absolute, "window_table_absolute", Invariant::window,
     "a ring-sized table indexed by absolute position (tt-metal PR #45184)"},
    {Fault::short_block_table, "short_block_table", Invariant::dense,
     "the attention op's table lacks the sequence's last page (vLLM PR #54296)"},
    {Fault::offload_drops_scales, "offload_drops_scales", Invariant::offload,
     "an offload leaves the nvfp4 block's packed scales behind (vLLM #48412)"},
    {Fault::split_x_heads_unwritten, "split_x_heads_unwritten", Invariant::write,
     "a split-x reshape_and_cache of one thread per x-vector, 512 threads and no stride loop leaves KV heads >= "
     "512 / (D / x) unwritten (vLLM's classic kernel)"},
    {Fault::slot_mapping_page_size, "slot_mapping_page_size", Invariant::write,
     "the slot mapping is computed for pages of 2P and written into pages of P (vLLM PR #47056)"},
    {Fault::indexer_slot_past_cache, "indexer_slot_past_cache", Invariant::write,
     "the indexer cache handed to indexer_k_scatter holds half the KV pool's blocks: a slot past it (TRT-LLM #15295)"},
    {Fault::offload_before_copy, "offload_before_copy", Invariant::offload,
     "an offload's copy lands after its freed block was written for another request, and is onboarded (vLLM #45704)"},
    {Fault::snapshot_off_block_boundary, "snapshot_off_block_boundary", Invariant::state_restore,
     "a chunk that crosses a block boundary snapshots its end state under the boundary's key (vLLM #45238, PR #47861)"},
    {Fault::q_scale_dropped, "q_scale_dropped", Invariant::dense,
     "fp8 queries reach attention without their q_scale in the bmm1 scale (SGLang PR #28144)"},
}};

}  // namespace

std::span<const InvariantInfo> invariant_table() { return kInvariants; }
std::span<const FaultInfo> fault_table() { return kFaults; }
const InvariantInfo& invariant_info(Invariant i) { return kInvariants.at(static_cast<size_t>(i)); }
const FaultInfo& fault_info(Fault f) { return kFaults.at(static_cast<size_t>(f)); }

std::string_view invariant_name(Invariant i) { return invariant_info(i).name; }
std::string_view fault_name(Fault f) { return fault_info(f).name; }
Invariant invariant_for(Fault f) { return fault_info(f).caught_by; }

std::optional<Invariant> parse_invariant(std::string_view s) {
  for (const InvariantInfo& i : kInvariants)
    if (i.name == s) return i.invariant;
  return std::nullopt;
}
std::optional<Fault> parse_fault(std::string_view s) {
  for (const FaultInfo& f : kFaults)
    if (f.name == s) return f.fault;
  return std::nullopt;
}

std::vector<std::string_view> invariant_names() {
  std::vector<std::string_view> names;
  for (const InvariantInfo& i : kInvariants) names.push_back(i.name);
  return names;
}
std::vector<std::string_view> fault_names() {
  std::vector<std::string_view> names;
  for (const FaultInfo& f : kFaults) names.push_back(f.name);
  return names;
}

std::string describe_invariant_table() {
  std::string out;
  for (const InvariantInfo& i : kInvariants) {
    out += std::string(i.name) + (i.comparison ? " (a comparison re-run)" : " (checked during the run)") + ": " +
           std::string(i.checks) + "\n";
    out += "  code:    " + std::string(i.code) + "\n";
    out += "  test:    " + std::string(i.test) + "\n";
    bool any = false;
    for (const FaultInfo& f : kFaults)
      if (f.caught_by == i.invariant) {
        out += std::string(any ? "           " : "  catches: ") + std::string(f.name) + ": " + std::string(f.breaks) + "\n";
        any = true;
      }
    if (!any) out += "  catches: no fault of its own\n";
  }
  return out;
}

bool invariant_applies(const Scenario& s, Invariant i, const RunRecord& main) {
  return invariant_info(i).possible(s) && invariant_info(i).happened(main);
}

std::optional<std::string> never_checked(const Scenario& s, Invariant i) {
  const InvariantInfo& info = invariant_info(i);
  if (!info.possible(s)) return std::string(info.name) + " is checked only with " + std::string(info.needs);
  // With faults on, the comparisons and the write oracle judge only what a
  // fault targets (replay(): the others would see the fault too).
  const InvariantSelection selection(s, std::nullopt);
  if ((info.comparison || i == Invariant::write) && !selection.wanted(i)) {
    std::string faults;
    for (Fault f : s.faults) faults += (faults.empty() ? "" : ", ") + std::string(fault_name(f));
    return std::string(info.name) + " is not judged while faults that target other invariants are on (" + faults +
           ": only the invariants the faults target are compared)";
  }
  // Any fault may make an op reject its input, which ends the run there
  // (counted as caught): what needs the run to get somewhere is not promised.
  // (dense needs an attention op to have run: a rejected first write leaves it nothing.)
  const bool needs_progress = info.happened != ran || i == Invariant::dense;
  if (!s.faults.empty() && needs_progress && !selection.targeted(i))
    return std::string(info.name) + " is not promised while a fault is on (" + std::string(fault_name(s.faults.front())) +
           "): an op that rejects the faulty input ends the run before it may check anything";
  return std::nullopt;
}

InvariantSelection::InvariantSelection(const Scenario& s, const std::optional<std::set<Invariant>>& selected)
    : selected_(selected), no_faults_(s.faults.empty()) {
  for (Fault f : s.faults) targeted_.insert(invariant_for(f));
}

bool InvariantSelection::any_comparison() const {
  for (const InvariantInfo& i : kInvariants)
    if (i.comparison && wanted(i.invariant)) return true;
  return false;
}

}  // namespace kvsim::sim
