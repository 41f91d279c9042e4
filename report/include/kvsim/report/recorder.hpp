// The replay as the report draws it: a sim::StepObserver that keeps, per
// step, only what changed (bounded by what the replay did, not by steps x
// blocks):
//   * "p": primary blocks whose state changed, [pool, block, owner, holders]
//     (owner: the lowest request index whose table holds it, or kFree /
//     kCached / kReserved; holders: table entries holding it). Per-layer
//     attention kinds may give several primary pools (TensorRT-LLM VSWA);
//   * "s": secondary blocks that changed, [block, 0 free | 1 holding an offloaded cached block];
//   * "t": page-table entries that changed, [request, group, new length (-1: dropped), [[page, block]...]];
//   * "r": requests whose length or phase changed, [request, tokens in the cache, phase];
//   * "ring": with a window, each changed request's newest token and its
//     cache slot per windowed group, [request, group, position, slot];
//   * "tree": prefix-tree blocks added or moved [id, parent id (-1: a root),
//     0 primary | 1 secondary, block, group, primary pool] and removed [id];
//   * "ev": the step's block events [kind, request, block, secondary, source,
//     tokens, pool, group] (hits, partial copies, evictions, offloads,
//     onboards, window releases) and preemptions;
//   * "prefill" / "decode": the step's chunks; "counts": primary free,
//     referenced, cached (all pools) and secondary held; "cons": conservation.
// A 2,048-block pool over 530 steps records 0.4 MB (tests/report); the page
// rebuilds step k from keyframes it makes itself (report.js).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvsim/sim/step_observer.hpp"

namespace kvsim::report {

inline constexpr int32_t kFree = -1;
inline constexpr int32_t kCached = -2;     // unreferenced, in the prefix tree: reusable
inline constexpr int32_t kReserved = -3;   // release mode's null block

class ReplayRecorder final : public sim::StepObserver {
 public:
  void start(const sim::Scenario& s, const sim::BlockManager& bm, const std::vector<sim::RequestState>& reqs) override;
  void block_event(const sim::BlockEvent& e) override;
  void step_done(const sim::StepView& v) override;

  // {"requests": [...], "window": {...}, "frames": [...]}
  const nlohmann::json& data() const { return doc_; }
  int64_t frames() const { return static_cast<int64_t>(doc_["frames"].size()); }
  // The frame (index into "frames") that computed `position` of request
  // `request` (an index), or -1.
  int64_t frame_of(int32_t request, int64_t position) const;
  // Request index of an id, or -1.
  int32_t request_index(const std::string& id) const;
  // Request `request`'s page table of `group` as of frame `frame` (replaying the changes).
  std::vector<int32_t> table_at(int64_t frame, int32_t request, int32_t group = 0) const;
  // Tokens in the cache of request `request` after frame `frame` (0 before its first).
  int64_t length_at(int64_t frame, int32_t request) const;
  // The window mapping of KV cache group `group` (core's, as the block manager uses it).
  const WindowMapping& window(int32_t group) const { return windows_.at(static_cast<size_t>(group)); }

 private:
  nlohmann::json doc_;
  nlohmann::json events_ = nlohmann::json::array();
  std::vector<std::vector<int32_t>> owner_, holders_;  // [pool][block]
  std::vector<int32_t> secondary_;
  std::map<std::pair<int32_t, int32_t>, std::vector<int32_t>> tables_;  // (request, group)
  std::vector<int64_t> lengths_;
  std::vector<int> phases_;
  std::map<uint64_t, int32_t> node_ids_;
  std::map<int32_t, std::array<int64_t, 5>> nodes_;  // id -> parent id, pool kind, block, group, primary pool
  std::vector<WindowMapping> windows_;                // per group
  // (request, first position, tokens, frame) of every chunk, for frame_of().
  std::vector<std::array<int64_t, 4>> chunks_;
};

}  // namespace kvsim::report
