// One replay of a scenario on a backend, recorded: the counters, a content
// digest of every attention output and of every finished request's cache
// contents (by request, layer and position, so two replays cut differently
// can be compared), the invariants checked during the run (conservation,
// dense, no-NaN, offload round trip) and the content hash. replay()
// (replay.hpp) runs this once, then again with one setting changed for each
// comparison invariant (invariants.hpp). A record holds 16 bytes of digest
// per output row, not the row: the bytes themselves are kept only where a
// comparison needs values (the quantization error, spilled to a temporary
// file) or for the one row a failed comparison names (ReplayOptions::capture).
#pragma once

#include <compare>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "digest.hpp"
#include "replay.hpp"

namespace kvsim::sim {

// An unlinked temporary file (in $TMPDIR, else /tmp) that output rows are
// appended to and read back from: the quantization invariant's values, off
// the heap.
class SpillFile {
 public:
  SpillFile();
  ~SpillFile();
  SpillFile(const SpillFile&) = delete;
  SpillFile& operator=(const SpillFile&) = delete;
  int64_t append(const void* data, size_t bytes);  // returns the offset
  std::vector<uint8_t> read(int64_t offset, size_t bytes) const;
  int64_t size() const { return size_; }

 private:
  int fd_ = -1;
  int64_t size_ = 0;
};

struct RecordedOutput {
  OutputKey key;
  Digest128 digest;          // BLAKE2b-128 of the row's bytes
  uint32_t bytes = 0;
  uint32_t order = 0;         // its place among the run's productions (finalize()'s tie-break)
  int64_t spill_offset = -1;  // where the row lies in RunRecord::spill; -1 = not kept
};

struct RunRecord {
  ReplayCounters counters;
  // One entry per key, sorted by key, the last production of the key when the
  // run wrote it more than once (a preempted request's recompute): see
  // record() and finalize().
  // finalize() sorts it in place (stable_sort took a buffer as large again).
  std::vector<RecordedOutput> outputs;
  std::shared_ptr<SpillFile> spill;  // rows kept for values (ReplayOptions::spill_attention)
  // The bytes of ReplayOptions::capture's key, its last production.
  std::optional<std::vector<uint8_t>> captured;
  std::optional<OutputKey> capture_key;
  bool spill_kinds[4] = {false, false, false, false};  // which OutputKinds record() writes to `spill`
  bool finished = true;  // every request finished within scheduler.max_steps
  // In-run invariants: "" = held (or not checked; see the *_checked counts).
  std::string conservation_violation;
  int64_t conservation_checks = 0;
  std::string dense_violation;
  int64_t dense_checked_rows = 0;
  double dense_worst_ratio = 0.0;  // max |out - ref| / bound over every checked element
  bool poisoned = false;           // pools were filled with NaN before the run
  std::string nan_found;
  int64_t state_resumes = 0;        // recurrent states resumed past position 0 (state_hit)
  std::string state_hit_violation;
  int64_t state_restores = 0;       // snapshots restored and compared with the recomputed state
  std::string state_restore_violation;
  int64_t write_checked_rows = 0;   // read-back rows (and indexer rows) compared with their inputs
  std::string write_violation;
  int64_t offload_round_trips = 0;  // offloads and onboards whose bytes were compared
  std::string offload_violation;
  // A fault switched on made an op reject its input (ValidationError): the
  // run stopped there; the message says which rule caught it.
  std::string op_rejection;
  uint64_t content_hash = 0;
  double seconds = 0.0;
  ReplayTimings timings;  // `seconds` split by part
};

// Adds an output row: its digest, its bytes to `spill` if its kind is
// spilled, and to `captured` if it is the capture key.
void record(RunRecord& r, const OutputKey& key, const void* data, size_t bytes);
// The same with the row's digest already made (blake2b_128 of its bytes).
void record(RunRecord& r, const OutputKey& key, const Digest128& digest, const void* data, size_t bytes);
// Sorts the rows by key and keeps each key's last production.
void finalize(RunRecord& r);
// The row of `key` in a finalized record; nullptr when the run has none.
const RecordedOutput* find_output(const RunRecord& r, const OutputKey& key);
// Its bytes when the record kept them (spilled or captured), else nullopt.
std::optional<std::vector<uint8_t>> output_bytes(const RunRecord& r, const RecordedOutput& o);

RunRecord run_scenario(const Scenario& s, Backend& backend, const ReplayOptions& options);

}  // namespace kvsim::sim
