// kvsim's replay report (issue 18): one self-contained HTML page per
// scenario (inline SVG, CSS and plain JavaScript; nothing fetched) that draws
// the pools, page tables, window ring, prefix tree, timeline and invariants
// at every step, plus an index page; and the path drawing of one element
// (token -> window slot -> logical page -> table entry -> physical block ->
// element offset -> byte) for a difference, a failed invariant or
// `kvsim explain --svg`. The page's data is the ReplayRecorder's JSON
// (recorder.hpp), embedded as <script type="application/json" id="replay">.
// docs/report.md describes the page.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/differential_backend.hpp"
#include "kvsim/report/recorder.hpp"
#include "kvsim/sim/explain.hpp"
#include "kvsim/sim/replay.hpp"

namespace kvsim::report {

// Where an invariant's finding sits, read from its detail text: "request a,
// layer 0, position 16, element 0: -1.75 vs -0.20", "step 0, layer 0,
// request a, position 0, head 0, dim 0: out -0.78, Eigen double 0", ...
struct Locus {
  std::string request;
  int32_t layer = 0;
  int64_t position = -1;
  int64_t step = -1;     // when the detail names one
  int64_t element = -1;  // of an attention output row [Hq, D]
  int32_t head = -1;     // query head (with dim), when named; a KV head when head_is_kv
  bool head_is_kv = false;
  int32_t dim = -1;
  std::vector<std::pair<std::string, std::string>> values;  // ("this run", "-1.75"), ("reference", "-0.20")
  int64_t frame = -1;    // the frame whose tables to use; -1 = the frame that computed `position`
};
std::optional<Locus> parse_locus(const std::string& detail);

// The drawing of one element's path as an inline <svg>, `values` printed
// under it (the two sides of a difference). kv picks K (0) or V (1).
std::string path_svg(const sim::Explanation& e, int32_t kv, const std::string& title,
                     const std::vector<std::pair<std::string, std::string>>& values);

// An explanation of the K element a locus names in a replayed scenario: the
// request's table at the frame that computed the position, the query head's
// KV head (head / (Hq / H)), the window of the scenario. nullopt when the
// locus names no request or position the recording holds.
std::optional<sim::Explanation> explain_locus(const sim::Scenario& s, const ReplayRecorder& rec, const Locus& l,
                                              int64_t& frame);

// The page's data: the recording plus the scenario, the outcome, the
// invariants (each with the frame it links to) and the drawn paths.
// `extra_paths` are drawn too (kvsim diff's first difference).
struct DrawnPath {
  std::string title;
  int64_t frame = -1;
  std::string svg;
};
nlohmann::json scenario_document(const sim::Scenario& s, const sim::ScenarioReport& r, const ReplayRecorder& rec,
                                 const std::vector<DrawnPath>& extra_paths = {});

// kvsim diff's first difference drawn as the path of the element it names
// (a pool element, or the K element an attention output's query head read),
// through the request's table recorded at the step the op ran; `layer` is
// the op's model layer. Without a request and position to follow (a
// generated op, a cache-slot coordinate), the drawing is the report's text.
// Which op made a differential run's first difference: the backend compares
// after every op, so it is the op that ran before the first before_op call
// that sees a difference (or the last op). Feed it from ReplayOptions::before_op.
class FirstDifferenceOp {
 public:
  void before_op(const sim::OpContext& c, const DifferentialBackend& diff) {
    if (!located_ && diff.first_difference()) {
      at_ = last_;
      located_ = true;
    }
    last_ = c;
  }
  const sim::OpContext& op() const { return located_ ? at_ : last_; }

 private:
  sim::OpContext last_, at_;
  bool located_ = false;
};

DrawnPath difference_path(const sim::Scenario& s, const ReplayRecorder& rec, const DiffReport& d, int64_t step,
                          int32_t layer);

// The whole page of one scenario, and the index of several ({name, ok, steps, file}).
std::string scenario_page(const nlohmann::json& document);
std::string index_page(const std::string& title, const nlohmann::json& entries);
// An SVG file of its own (explain --svg): the XML prolog and the drawing.
std::string standalone_svg(const std::string& svg);

// A report folder: one page per scenario (NAME.html) and index.html. The
// folder is created and checked writable when the writer is made, before
// anything runs (a bad --report DIR is bad input, exit 2, nothing replayed).
class ReportFolder {
 public:
  explicit ReportFolder(std::string dir);
  // Writes SCENARIO.html; `summary` is the index's invariants cell.
  void add(const sim::Scenario& s, const sim::ScenarioReport& r, const ReplayRecorder& rec, const std::string& summary,
           const std::vector<DrawnPath>& extra_paths = {});
  void write_index(const std::string& title) const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  nlohmann::json entries_ = nlohmann::json::array();
};

// Creates `dir` (and parents) and writes `name` into it, or throws
// ValidationError(bad_argument) naming the path (and `flag`).
void write_report_file(const std::string& dir, const std::string& name, const std::string& content,
                       const std::string& flag = "--report");
// Writes one file (its folder must exist), or throws ValidationError(bad_argument) naming it.
void write_text_file(const std::string& path, const std::string& content, const std::string& flag);

}  // namespace kvsim::report
