// One replay of a scenario on a backend, recorded: the counters, every
// attention output and every finished request's cache contents (by request,
// layer and position, so two replays cut differently can be compared byte
// for byte), the invariants checked during the run (conservation, dense,
// no-NaN, offload round trip) and the content hash. replay() (replay.hpp)
// runs this once, then again with one setting changed for each comparison
// invariant (invariants.hpp).
#pragma once

#include <compare>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "replay.hpp"

namespace kvsim::sim {

enum class OutputKind : int32_t {
  attention = 0,  // the attention output row of the query at `position`: [Hq, D] fp32
  k_cache = 1,    // a finished request's K (or MLA latent) row at `position`, read back by gather_paged: [H, D] fp32
  v_cache = 2,    // ... its V row
};

struct OutputKey {
  std::string request;
  int32_t layer = 0;
  OutputKind kind = OutputKind::attention;
  int64_t position = 0;
  auto operator<=>(const OutputKey&) const = default;
};

struct RunRecord {
  ReplayCounters counters;
  std::map<OutputKey, std::vector<uint8_t>> outputs;
  bool finished = true;  // every request finished within scheduler.max_steps
  // In-run invariants: "" = held (or not checked; see the *_checked counts).
  std::string conservation_violation;
  int64_t conservation_checks = 0;
  std::string dense_violation;
  int64_t dense_checked_rows = 0;
  double dense_worst_ratio = 0.0;  // max |out - ref| / bound over every checked element
  bool poisoned = false;           // pools were filled with NaN before the run
  std::string nan_found;
  int64_t offload_round_trips = 0;  // offloads and onboards whose bytes were compared
  std::string offload_violation;
  // A fault switched on made an op reject its input (ValidationError): the
  // run stopped there; the message says which rule caught it.
  std::string op_rejection;
  uint64_t content_hash = 0;
  double seconds = 0.0;
};

RunRecord run_scenario(const Scenario& s, Backend& backend, const ReplayOptions& options);

// FNV-1a 64 over bytes, continuing from `h`.
uint64_t fnv1a(uint64_t h, const void* data, size_t bytes);
inline constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;

}  // namespace kvsim::sim
