// replay() (replay.hpp): one recorded run, then the comparison invariants
// (each a second run with one setting changed), fault bookkeeping and the
// scenario's expectations.
#include "kvsim/sim/replay.hpp"

#include <tbb/task_arena.h>
#include <tbb/task_group.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string_view>

#include "backends/env_switch.hpp"
#include "kvsim/sim/estimate.hpp"
#include "kvsim/sim/invariants.hpp"
#include "kvsim/sim/scheduler.hpp"

namespace kvsim::sim {

std::string_view invariant_status_name(InvariantStatus s) {
  switch (s) {
    case InvariantStatus::pass: return "pass";
    case InvariantStatus::fail: return "fail";
    case InvariantStatus::caught: return "caught";
    case InvariantStatus::not_applicable: return "n/a";
    case InvariantStatus::skipped: return "skipped";
  }
  return "?";
}

namespace {
std::string kind_name(OutputKind k) {
  return k == OutputKind::attention ? "attention output"
         : k == OutputKind::k_cache ? "cached K"
         : k == OutputKind::v_cache ? "cached V"
                                    : "recurrent state";
}
std::string describe(const OutputKey& k) {
  return kind_name(k.kind) + " of request " + k.request + ", layer " + std::to_string(k.layer) + ", position " +
         std::to_string(k.position);
}
}  // namespace

std::string describe_difference(const OutputKey& key, const std::vector<uint8_t>& test,
                                const std::vector<uint8_t>& reference) {
  size_t i = 0;
  const size_t n = std::min(test.size(), reference.size());
  while (i + 4 <= n && std::memcmp(&test[i], &reference[i], 4) == 0) i += 4;
  if (i + 4 > n) return describe(key) + ", " + std::to_string(test.size()) + " vs " + std::to_string(reference.size()) + " bytes";
  float a = 0, b = 0;
  std::memcpy(&a, &test[i], 4);
  std::memcpy(&b, &reference[i], 4);
  char buf[128];
  std::snprintf(buf, sizeof buf, ", element %zu: %.9g vs %.9g", i / 4, a, b);
  return describe(key) + buf;
}

namespace {
// Calls f(test row, reference row) for every key both finalized records hold.
template <class F>
void for_common(const RunRecord& test, const RunRecord& reference, F&& f) {
  auto a = test.outputs.begin(), b = reference.outputs.begin();
  while (a != test.outputs.end() && b != reference.outputs.end()) {
    if (a->key < b->key) {
      ++a;
    } else if (b->key < a->key) {
      ++b;
    } else {
      f(*a, *b);
      ++a;
      ++b;
    }
  }
}
}  // namespace

Comparison compare_outputs(const RunRecord& test, const RunRecord& reference,
                           const std::function<bool(const OutputKey&)>& include) {
  Comparison c;
  for_common(test, reference, [&](const RecordedOutput& a, const RecordedOutput& b) {
    if (include && !include(a.key)) return;
    ++c.compared;
    if (c.differing_key || (a.digest == b.digest && a.bytes == b.bytes)) return;
    c.differing_key = a.key;
    const auto ta = output_bytes(test, a), tb = output_bytes(reference, b);
    c.located = ta && tb;
    c.first_difference = c.located ? describe_difference(a.key, *ta, *tb) : describe(a.key) + " (content digests differ)";
  });
  return c;
}

namespace {
// " at attention of request R, layer L, position P, element E: out A, bf16 B" (the report draws its path).
std::string worst_at(const QuantizationError& q) {
  if (q.worst_element < 0) return "";
  char buf[96];
  std::snprintf(buf, sizeof buf, ", element %lld: out %.9g, bf16 %.9g", static_cast<long long>(q.worst_element),
                q.worst_value, q.worst_reference);
  return " at " + describe(q.worst) + buf;
}
}  // namespace

double quantization_bound(CacheDtype t) {
  switch (t) {
    case CacheDtype::fp8_e4m3: return 0.125;
    case CacheDtype::fp8_e5m2: return 0.25;
    case CacheDtype::int8: return 0.125;
    case CacheDtype::nvfp4: return 0.5;
    default: return 0.0;
  }
}

QuantizationError quantization_error(const RunRecord& test, const RunRecord& ref) {
  QuantizationError q;
  double num = 0, den = 0;
  bool missing = false;
  for_common(test, ref, [&](const RecordedOutput& x, const RecordedOutput& y) {
    if (x.key.kind != OutputKind::attention) return;
    const auto xa = output_bytes(test, x), ya = output_bytes(ref, y);
    if (!xa || !ya || xa->size() != ya->size()) {
      missing = true;
      return;
    }
    ++q.compared;
    const size_t n = xa->size() / 4;
    for (size_t i = 0; i < n; ++i) {
      float a = 0, b = 0;
      std::memcpy(&a, xa->data() + 4 * i, 4);
      std::memcpy(&b, ya->data() + 4 * i, 4);
      const double d = static_cast<double>(a) - b;
      num += d * d;
      den += static_cast<double>(b) * b;
      if (std::fabs(d) > q.max_abs) {
        q.max_abs = std::fabs(d);
        q.worst = x.key;
        q.worst_element = static_cast<int64_t>(i);
        q.worst_value = a;
        q.worst_reference = b;
      }
    }
  });
  // Both runs must have kept their attention rows (ReplayOptions::spill_attention).
  if (missing) throw std::logic_error("quantization_error: a record did not keep its attention rows");
  q.rel_rms = den > 0 ? std::sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
  if (std::isnan(q.rel_rms)) q.rel_rms = INFINITY;
  return q;
}

namespace {

struct Outcome {
  bool applicable = false;
  bool violated = false;
  std::string detail;
};

// One comparison run of replay()'s plan: the scenario with one setting
// changed, and how its record is judged against the main run's.
struct ComparisonRun {
  Invariant invariant;
  Scenario scenario;
  ReplayOptions options;
  std::string name;      // the progress line's
  std::string rejected;  // an outcome's detail before the message, when validation rejects the run
  std::function<Outcome(const RunRecord&)> judge;
};

Outcome from_comparison(const Comparison& c, const std::string& what) {
  Outcome o;
  o.applicable = c.compared > 0;
  o.violated = !c.first_difference.empty();
  o.detail = o.applicable ? (o.violated ? "differs from " + what + ": " + c.first_difference
                                        : std::to_string(c.compared) + " outputs bit-equal to " + what)
                          : "no output in common with " + what;
  return o;
}

// Folds one comparison run into an invariant checked by several: the first
// violation wins; otherwise the details accumulate.
void merge(Outcome& total, const Outcome& o) {
  total.applicable = total.applicable || o.applicable;
  if (total.violated) return;
  if (o.violated) {
    total.violated = true;
    total.detail = o.detail;
  } else {
    total.detail += (total.detail.empty() ? "" : "; ") + o.detail;
  }
}

std::string format_double(double x) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.3g", x);
  return buf;
}

// KVSIM_RUNS_AT_ONCE=0 makes every replay's runs follow each other (same-binary
// timings of the two ways); 1 or unset lets a small scenario's runs go at once.
bool runs_at_once_allowed() { return env_switch("KVSIM_RUNS_AT_ONCE", "1", "0"); }

// What the chunking re-run `c` of `s` prefills, said as it runs: once a
// prompt wraps a cyclic ring, the scheduler cuts every chunk to what the ring
// can take without overwriting keys the chunk's own queries attend to
// (Scheduler::chunk_for), so "one chunk" is one chunk only until then.
std::string chunking_comparison(const Scenario& s, const Scenario& c) {
  const int64_t chunk = c.scheduler.chunk_size > 0 ? c.scheduler.chunk_size : std::numeric_limits<int64_t>::max();
  const std::string what =
      c.scheduler.chunk_size > 0 ? "prefill in chunks of " + std::to_string(chunk) : "one-chunk prefill";
  int64_t longest = 0;
  for (const RequestState& r : make_requests(s)) longest = std::max(longest, r.prompt_len);
  for (const KvGroup& g : kv_groups(s)) {
    if (g.mode != WindowMode::cyclic) continue;
    const WindowMapping m = WindowMapping::make(g.window, g.sinks, s.cache.page_size, g.one_more_block);
    const int64_t wraps_at = static_cast<int64_t>(m.sinks) + m.cyclic_len;
    const int64_t ring_chunk = m.cyclic_len - (static_cast<int64_t>(m.window) - m.sinks) + 1;
    if (longest > wraps_at && ring_chunk < chunk)
      return what + " until the cyclic ring wraps at token " + std::to_string(wraps_at) + ", then chunks of " +
             std::to_string(ring_chunk) + (ring_chunk == 1 ? " token" : " tokens") +
             " (the most a wrapped ring takes without overwriting keys the chunk's own queries attend to)";
  }
  return what;
}

}  // namespace

ScenarioReport replay(const Scenario& s, Backend& backend, const ReplayOptions& options) {
  if (options.threads > 0) {
    tbb::task_arena arena(options.threads);
    ReplayOptions inside = options;
    inside.threads = 0;
    return arena.execute([&] { return replay(s, backend, inside); });
  }
  ScenarioReport rep;
  const auto t0 = std::chrono::steady_clock::now();
  // The wall time by part (ReplayTimings): each run charges its own parts,
  // the comparisons theirs, the rest of replay() goes to `other`.
  PhaseClock clock(&rep.timings.other);
  rep.name = s.name;
  const InvariantSelection selection(s, options.invariants);
  const std::set<Invariant>& targeted = selection.targeted();
  auto selected = [&](Invariant inv) { return selection.selected(inv); };
  auto wanted = [&](Invariant inv) { return selection.wanted(inv); };
  const bool compare_quantization = options.comparison_invariants && is_quantized(s.cache.dtype) && !s.mla.enabled &&
                                    wanted(Invariant::quantization);
  // Each run by name for the progress line (ReplayOptions::progress).
  int32_t runs_started = 0;
  int64_t token_layers_done = 0;
  // The options of the next run, telling ReplayOptions::progress about its steps.
  auto with_progress = [&](const Scenario& scenario, const ReplayOptions& o, const std::string& name) {
    ReplayOptions told = o;
    if (options.progress)
      told.after_step = [&options, name, then = o.after_step, index = runs_started, before = token_layers_done,
                         planned = planned_steps(scenario)](int64_t step, const ReplayCounters& c) {
        if (then) then(step, c);
        options.progress({name, index, step, c.prefill_tokens + c.decode_tokens, c.token_layers, before, planned});
      };
    ++runs_started;
    return told;
  };
  auto run_timed = [&](const Scenario& scenario, Backend& be, const ReplayOptions& o, const std::string& name) {
    const Phase paused(clock, nullptr);
    const auto r0 = std::chrono::steady_clock::now();
    auto since_r0 = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - r0).count(); };
    const ReplayOptions told = with_progress(scenario, o, name);
    try {
      RunRecord r = run_scenario(scenario, be, told);
      token_layers_done += r.counters.token_layers;
      rep.timings += r.timings;
      // The run's set-up before its clock started and its pools' release after it stopped.
      rep.timings.other += std::max(0.0, since_r0() - r.timings.total());
      return r;
    } catch (...) {
      rep.timings.other += since_r0();  // a rejected comparison run
      throw;
    }
  };
  ReplayOptions main_options = options;
  main_options.record_outputs = options.comparison_invariants && selection.any_comparison();
  main_options.dense_check = options.dense_check && selected(Invariant::dense);
  main_options.write_check = options.write_check && selected(Invariant::write);
  main_options.spill_attention = compare_quantization;

  // The comparison runs, planned before any run: each re-runs the scenario
  // with one setting changed, and its judge compares its record with the
  // main run's (set below, before any judge is called).
  const RunRecord* main_record = nullptr;
  std::vector<ComparisonRun> plan;
  ReplayOptions inner;
  inner.comparison_invariants = false;
  inner.dense_check = false;
  inner.content_hash = false;
  inner.write_check = false;
  // The records keep digests, not bytes: a difference is named by running
  // both scenarios once more, keeping only the first differing row.
  auto compare = [&](const Scenario& changed, const RunRecord& r, const std::string& what,
                     const std::function<bool(const OutputKey&)>& include = {}) {
    std::optional<Phase> comparing(std::in_place, clock, &rep.timings.comparisons);
    Comparison c = compare_outputs(*main_record, r, include);
    comparing.reset();
    if (c.differing_key && !c.located) {
      ReplayOptions capture = inner;
      capture.capture = c.differing_key;
      const RunRecord a = run_timed(s, backend, capture, "locating the difference (the scenario)"),
                      b = run_timed(changed, backend, capture, "locating the difference (" + what + ")");
      if (a.captured && b.captured) c.first_difference = describe_difference(*c.differing_key, *a.captured, *b.captured);
    }
    return from_comparison(c, what);
  };
  // A comparison run whose judge compares every output both runs hold (or those `include` takes).
  auto plan_compare = [&](Invariant inv, const Scenario& changed, const std::string& run_name, const std::string& what,
                          const std::string& rejected, std::function<bool(const OutputKey&)> include = {}) {
    plan.push_back({inv, changed, inner, run_name, rejected, {}});
    plan.back().judge = [&compare, &plan, i = plan.size() - 1, what, include = std::move(include)](const RunRecord& r) {
      return compare(plan[i].scenario, r, what, include);
    };
  };
  if (options.comparison_invariants) {
    const std::string rejected_run = "the comparison run was rejected: ";
    if (wanted(Invariant::chunking)) {
      Scenario c = s;
      if (s.scheduler.chunk_size > 0) {
        // Each prompt in one chunk, in steps no larger than the main run's or
        // the longest request (bounded memory: not every prompt in one step).
        c.scheduler.chunk_size = 0;
        c.scheduler.whole_prompts = true;
        c.scheduler.token_budget = one_chunk_budget(s);
      } else {
        c.scheduler.chunk_size = 5;  // odd chunks, against the scenario's whole-prompt prefill
      }
      const std::string what = chunking_comparison(s, c);
      plan_compare(Invariant::chunking, c, "chunking (" + what + ")", what, rejected_run);
    }
    if (s.reuse.enabled && wanted(Invariant::reuse)) {
      Scenario c = s;
      c.reuse.enabled = false;
      plan_compare(Invariant::reuse, c, "reuse (reuse off)", "reuse off", rejected_run);
    }
    if (s.layers.enabled && wanted(Invariant::window)) {
      // Per layer: a full layer's outputs at every position, a sliding
      // layer's at positions < its W, and every cached token, bit-equal to
      // the same model with full attention everywhere.
      Scenario c = s;
      c.layers = LayersSpec{};
      int64_t blocks = 1;
      for (const RequestState& r : make_requests(s)) blocks += (r.final_len + s.cache.page_size - 1) / s.cache.page_size;
      c.cache.primary_blocks = std::max(c.cache.primary_blocks, blocks);
      plan_compare(Invariant::window, c, "window (full attention in every layer)",
                   "full attention in every layer (each sliding layer's positions < its W, every full layer's output, "
                   "every cached token)",
                   rejected_run, [&s](const OutputKey& k) {
                     const int32_t w = layer_window(s, k.layer);
                     return k.kind != OutputKind::attention || w == 0 || k.position < w;
                   });
    }
    if (s.window.mode != WindowMode::none && wanted(Invariant::window)) {
      Scenario c = s;
      c.window = WindowSpec{};
      // Without the window every token stays cached: give the pool room for all of them.
      int64_t blocks = 1;
      for (const RequestState& r : make_requests(s)) blocks += (r.final_len + s.cache.page_size - 1) / s.cache.page_size;
      c.cache.primary_blocks = std::max(c.cache.primary_blocks, blocks);
      const int64_t W = s.window.window;
      // Queries at positions < W attend exactly what they would without a window.
      plan_compare(Invariant::window, c, "window (no window)",
                   "no window (positions < W = " + std::to_string(W) + ", and every cached token)", rejected_run,
                   [W](const OutputKey& k) { return k.kind != OutputKind::attention || k.position < W; });
    }
    if (wanted(Invariant::layout)) {
      const BlockLayout layouts[3] = {BlockLayout::nhd, BlockLayout::hnd, BlockLayout::split_x};
      int cur = 0;
      while (layouts[cur] != s.cache.layout) ++cur;
      const LayerPlacement other = s.cache.placement == LayerPlacement::in_block ? LayerPlacement::per_layer
                                                                                 : LayerPlacement::in_block;
      const std::pair<BlockLayout, LayerPlacement> alts[2] = {{layouts[(cur + 1) % 3], other},
                                                              {layouts[(cur + 2) % 3], s.cache.placement}};
      for (const auto& [layout, placement] : alts) {
        if (layout == BlockLayout::split_x && s.cache.dtype == CacheDtype::nvfp4) continue;  // no split-x nvfp4
        Scenario c = s;
        c.cache.layout = layout;
        c.cache.placement = placement;
        c.cache.shared_kv_allocation = false;
        c.cache.engine.reset();
        const std::string what = std::string(layout_name(layout)) + " " + std::string(placement_name(placement));
        plan_compare(Invariant::layout, c, "layout (" + what + ")", what, what + " rejected: ");
      }
    }
    if (compare_quantization) {
      Scenario c = s;
      c.cache.dtype = CacheDtype::bf16;
      ReplayOptions spilled = inner;
      spilled.spill_attention = true;
      plan.push_back({Invariant::quantization, c, spilled, "quantization (a bf16 cache)", rejected_run,
                      [&](const RunRecord& r) {
                        const Phase comparing(clock, &rep.timings.comparisons);
                        const QuantizationError q = quantization_error(*main_record, r);
                        const double bound = quantization_bound(s.cache.dtype);
                        return Outcome{q.compared > 0, !(q.rel_rms <= bound),
                                       "relative RMS error against bf16 " + format_double(q.rel_rms) +
                                           (q.rel_rms <= bound ? " <= " : " > ") + "bound " + format_double(bound) +
                                           " over " + std::to_string(q.compared) + " outputs (max |diff| " +
                                           format_double(q.max_abs) + worst_at(q) + ")"};
                      }});
    }
    if (wanted(Invariant::batch) && s.requests.size() >= 2) {
      Scenario reversed = s;
      std::reverse(reversed.requests.begin(), reversed.requests.end());
      Scenario alone = s;
      alone.requests = {s.requests.front()};
      const std::string alone_what = "request " + s.requests.front().id + " alone";
      plan_compare(Invariant::batch, reversed, "batch (the batch in reverse order)", "the batch in reverse order",
                   "the batch in reverse order rejected: ");
      plan_compare(Invariant::batch, alone, "batch (" + alone_what + ")", alone_what, alone_what + " rejected: ");
    }
  }

  // A host backend replays a small scenario's runs at once, each on its own
  // backend instance and thread (estimate.hpp's concurrent_runs: they fit
  // together in kConcurrentRunsBytes), and judges them afterwards in the plan's
  // order; otherwise each comparison run follows the main run and is judged
  // before the next starts (one comparison record at a time). Results are the
  // same either way; observers, dumps, captures and the progress line (which
  // names each run in turn) keep the sequential order.
  std::vector<std::unique_ptr<Backend>> run_backends;
  if (!plan.empty() && options.runs_at_once && runs_at_once_allowed() && !options.observer && !options.before_op && !options.after_step &&
      !options.progress && options.dump_dir.empty() && !options.capture && tbb::this_task_arena::max_concurrency() > 1 &&
      estimate_replay(s, options.invariants).concurrent_runs > 1) {
    for (size_t i = 0; i < plan.size(); ++i) {
      std::unique_ptr<Backend> b = backend.another();
      if (!b) {
        run_backends.clear();
        break;
      }
      b->set_kernel_timing(backend.kernel_timing());
      run_backends.push_back(std::move(b));
    }
  }
  const bool at_once = !run_backends.empty();
  struct RunSlot {
    std::optional<RunRecord> record;
    std::exception_ptr error;
  };
  std::vector<RunSlot> slots(at_once ? plan.size() + 1 : 0);
  if (at_once) {
    const Phase paused(clock, nullptr);
    const auto w0 = std::chrono::steady_clock::now();
    tbb::task_group group;
    for (size_t i = 0; i < slots.size(); ++i)
      group.run([&, i] {
        try {
          slots[i].record = i == 0 ? run_scenario(s, backend, main_options)
                                   : run_scenario(plan[i - 1].scenario, *run_backends[i - 1], plan[i - 1].options);
        } catch (...) {
          slots[i].error = std::current_exception();
        }
      });
    group.wait();
    // The wall time of the runs, split in the proportions of their own splits.
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
    double summed = 0;
    for (const RunSlot& slot : slots)
      if (slot.record) summed += slot.record->timings.total();
    const double share = summed > 0 ? wall / summed : 0.0;
    for (const RunSlot& slot : slots)
      if (slot.record) rep.timings += slot.record->timings.scaled(share);
    rep.timings.other += std::max(0.0, wall - summed * share);
    if (slots[0].error) std::rethrow_exception(slots[0].error);
  }
  const RunRecord main = at_once ? std::move(*slots[0].record) : run_timed(s, backend, main_options, "replay");
  if (at_once) slots[0].record.reset();
  main_record = &main;
  rep.counters = main.counters;
  rep.content_hash = main.content_hash;
  rep.main_seconds = main.seconds;
  rep.concurrent_runs = at_once ? static_cast<int32_t>(slots.size()) : 1;

  std::map<Invariant, InvariantReport> results;
  std::set<Invariant> settled_by_rejection;
  auto settle = [&](Invariant inv, const Outcome& o) {
    if (!selected(inv)) return;  // reported as skipped below
    if (settled_by_rejection.count(inv)) return;
    InvariantReport r;
    r.invariant = inv;
    r.detail = o.detail;
    if (!o.applicable)
      r.status = targeted.count(inv) ? InvariantStatus::fail : InvariantStatus::not_applicable;
    else if (targeted.count(inv))
      r.status = o.violated ? InvariantStatus::caught : InvariantStatus::fail;
    else
      r.status = o.violated ? InvariantStatus::fail : InvariantStatus::pass;
    if (targeted.count(inv) && r.status == InvariantStatus::fail)
      r.detail = "a fault for this invariant is on but was not caught (" + o.detail + ")";
    results[inv] = r;
  };

  const bool rejected = !main.op_rejection.empty();
  if (rejected) {
    // A fault made an op reject its input: validation caught it before any byte moved.
    for (Invariant inv : targeted) settle(inv, {true, true, "the op rejected the faulty input: " + main.op_rejection});
    settled_by_rejection = targeted;
  }
  // The in-run invariants judge the steps that ran (with a rejection, those
  // before it), so a must_pass about them holds whatever the fault does; the
  // comparisons need a whole main run.
  {
    settle(Invariant::conservation,
           {true, !main.conservation_violation.empty(),
            main.conservation_violation.empty()
                ? "free + referenced + cached = size for both pools after all " + std::to_string(main.conservation_checks) + " steps"
                : main.conservation_violation});
    if (!s.mla.enabled)
      settle(Invariant::dense, {main.dense_checked_rows > 0, !main.dense_violation.empty(),
                                main.dense_violation.empty()
                                    ? std::to_string(main.dense_checked_rows) +
                                          " query heads within the bound; worst |err| / bound = " +
                                          format_double(main.dense_worst_ratio)
                                    : main.dense_violation});
    if (main.poisoned)
      settle(Invariant::no_nan, {true, !main.nan_found.empty(),
                                 main.nan_found.empty() ? "pools poisoned with NaN; no attention output holds NaN"
                                                        : main.nan_found});
    // Another fault that moves bytes (a reused block of other tokens, a chunk
    // written at position 0) breaks the write invariant too: with faults on,
    // it is judged only when one of them targets it.
    if (main.write_checked_rows > 0 && wanted(Invariant::write))
      settle(Invariant::write, {true, !main.write_violation.empty(),
                                main.write_violation.empty()
                                    ? std::to_string(main.write_checked_rows) +
                                          " cached rows equal the values their write ops were given"
                                    : main.write_violation});
    if (s.recurrent.layers > 0)
      settle(Invariant::state_hit, {true, !main.state_hit_violation.empty(),
                                    main.state_hit_violation.empty()
                                        ? std::to_string(main.state_resumes) +
                                              " resumptions past token 0, each at a valid snapshot"
                                        : main.state_hit_violation});
    if (main.state_restores > 0)
      settle(Invariant::state_restore, {true, !main.state_restore_violation.empty(),
                                        main.state_restore_violation.empty()
                                            ? std::to_string(main.state_restores) +
                                                  " restored states byte-equal to the recomputed ones"
                                            : main.state_restore_violation});
    if (main.offload_round_trips > 0)
      settle(Invariant::offload,
             {true, !main.offload_violation.empty(),
              main.offload_violation.empty()
                  ? std::to_string(main.offload_round_trips) + " offloads/onboards moved every byte unchanged"
                  : main.offload_violation});

    if (options.comparison_invariants && !rejected) {
      // Each invariant's runs folded into one outcome (merge), settled in the plan's order.
      std::vector<std::pair<Invariant, Outcome>> totals;
      for (size_t i = 0; i < plan.size(); ++i) {
        const ComparisonRun& run = plan[i];
        Outcome o;
        try {
          if (at_once) {
            if (slots[i + 1].error) std::rethrow_exception(slots[i + 1].error);
            o = run.judge(*slots[i + 1].record);
            slots[i + 1].record.reset();
          } else {
            o = run.judge(run_timed(run.scenario, backend, run.options, run.name));
          }
        } catch (const ValidationError& e) {
          o = {false, false, run.rejected + e.what()};
        }
        if (totals.empty() || totals.back().first != run.invariant) totals.push_back({run.invariant, Outcome{false, false, ""}});
        merge(totals.back().second, o);
      }
      for (const auto& [inv, total] : totals) settle(inv, total);
    }
  }

  for (const InvariantInfo& info : invariant_table()) {
    const Invariant inv = info.invariant;
    auto it = results.find(inv);
    // Skipped: not selected, and one the scenario would have checked.
    const bool applies = invariant_applies(s, inv, main);
    if (!selected(inv) && !applies) {
      InvariantReport r;
      r.invariant = inv;
      rep.invariants.push_back(r);
    } else if (!selected(inv)) {
      InvariantReport r;
      r.invariant = inv;
      r.status = InvariantStatus::skipped;
      r.detail = "not selected by --invariants";
      rep.invariants.push_back(r);
    } else if (it != results.end()) {
      rep.invariants.push_back(it->second);
    } else {
      InvariantReport r;
      r.invariant = inv;
      if (targeted.count(inv)) {
        r.status = InvariantStatus::fail;
        r.detail = "a fault for this invariant is on but the invariant was not checked";
      }
      rep.invariants.push_back(r);
    }
  }

  // Expectations.
  auto missed = [&](ExpectationFailure f, std::string message) {
    rep.expectation_details.push_back(std::move(f));
    rep.expectation_failures.push_back(std::move(message));
  };
  auto expect_count = [&](const char* name, const std::optional<int64_t>& want, int64_t got) {
    if (want && *want != got)
      missed({name, "", *want, got},
             std::string("expected ") + name + " = " + std::to_string(*want) + ", got " + std::to_string(got));
  };
  const Expectations& ex = s.expect;
  expect_count("reuse_hit_tokens", ex.reuse_hit_tokens, main.counters.reuse_hit_tokens);
  expect_count("evicted_blocks", ex.evicted_blocks, main.counters.evicted_blocks);
  expect_count("offloaded_blocks", ex.offloaded_blocks, main.counters.offloaded_blocks);
  expect_count("onboarded_blocks", ex.onboarded_blocks, main.counters.onboarded_blocks);
  expect_count("preemptions", ex.preemptions, main.counters.preemptions);
  if (!main.finished)
    missed({"max_steps", "", s.scheduler.max_steps, main.counters.steps},
           "did not finish within scheduler.max_steps = " + std::to_string(s.scheduler.max_steps));
  auto status_of = [&](Invariant inv) {
    for (const InvariantReport& r : rep.invariants)
      if (r.invariant == inv) return r.status;
    return InvariantStatus::not_applicable;
  };
  // Expectations about an invariant --invariants left out are left out too.
  for (Invariant inv : ex.must_pass)
    if (selected(inv) && status_of(inv) != InvariantStatus::pass)
      missed({"must_pass", std::string(invariant_name(inv)), std::string("pass"),
              std::string(invariant_status_name(status_of(inv)))},
             "expected invariant " + std::string(invariant_name(inv)) + " to pass, got " +
                 std::string(invariant_status_name(status_of(inv))));
  for (Fault f : ex.must_catch) {
    if (!selected(invariant_for(f))) continue;
    const std::string fault(fault_name(f));
    if (std::find(s.faults.begin(), s.faults.end(), f) == s.faults.end())
      missed({"must_catch", fault, std::string("caught"), std::string("not switched on")},
             "expected fault " + fault + " to be caught, but it is not switched on");
    else if (status_of(invariant_for(f)) != InvariantStatus::caught)
      missed({"must_catch", fault, std::string("caught"), std::string(invariant_status_name(status_of(invariant_for(f))))},
             "expected fault " + fault + " to be caught by " + std::string(invariant_name(invariant_for(f))) + ", got " +
                 std::string(invariant_status_name(status_of(invariant_for(f)))));
  }
  clock.stop();
  rep.total_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  rep.ok = rep.expectation_failures.empty();
  for (const InvariantReport& r : rep.invariants) rep.ok = rep.ok && r.status != InvariantStatus::fail;
  return rep;
}

}  // namespace kvsim::sim
