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
#include <cstddef>
#include <iterator>
#include <type_traits>
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

// A record's rows in chunks of kRowsPerChunk (5 MiB): appending never moves
// more than the first chunk. One vector's doubling held up to three times its
// rows at once (old buffer, new buffer), a gap between the estimate and the
// full 8B mix's peak RSS. finalize() sorts the rows in place through the
// random-access iterator below. A record of R rows takes at most
// R + min(2R, kRowsPerChunk) rows of memory, which is what estimate.cpp counts.
class RecordRows {
 public:
  static constexpr size_t kRowsPerChunk = size_t{1} << 16;

  template <bool Const>
  class Iter {
   public:
    using iterator_category = std::random_access_iterator_tag;
    using value_type = RecordedOutput;
    using difference_type = std::ptrdiff_t;
    using reference = std::conditional_t<Const, const RecordedOutput&, RecordedOutput&>;
    using pointer = std::conditional_t<Const, const RecordedOutput*, RecordedOutput*>;
    using Owner = std::conditional_t<Const, const RecordRows, RecordRows>;
    Iter() = default;
    Iter(Owner* rows, size_t i) : rows_(rows), i_(static_cast<difference_type>(i)) {}
    reference operator*() const { return (*rows_)[static_cast<size_t>(i_)]; }
    pointer operator->() const { return &**this; }
    reference operator[](difference_type n) const { return *(*this + n); }
    Iter& operator++() { ++i_; return *this; }
    Iter operator++(int) { Iter t = *this; ++i_; return t; }
    Iter& operator--() { --i_; return *this; }
    Iter operator--(int) { Iter t = *this; --i_; return t; }
    Iter& operator+=(difference_type n) { i_ += n; return *this; }
    Iter& operator-=(difference_type n) { i_ -= n; return *this; }
    friend Iter operator+(Iter a, difference_type n) { return a += n; }
    friend Iter operator+(difference_type n, Iter a) { return a += n; }
    friend Iter operator-(Iter a, difference_type n) { return a -= n; }
    friend difference_type operator-(const Iter& a, const Iter& b) { return a.i_ - b.i_; }
    friend bool operator==(const Iter& a, const Iter& b) { return a.i_ == b.i_; }
    friend auto operator<=>(const Iter& a, const Iter& b) { return a.i_ <=> b.i_; }

   private:
    Owner* rows_ = nullptr;
    difference_type i_ = 0;
  };
  using iterator = Iter<false>;
  using const_iterator = Iter<true>;

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  RecordedOutput& operator[](size_t i) { return chunks_[i / kRowsPerChunk][i % kRowsPerChunk]; }
  const RecordedOutput& operator[](size_t i) const { return chunks_[i / kRowsPerChunk][i % kRowsPerChunk]; }
  void push_back(RecordedOutput o);
  // Keeps the first n rows and frees every chunk past them.
  void truncate(size_t n);
  iterator begin() { return {this, 0}; }
  iterator end() { return {this, size_}; }
  const_iterator begin() const { return {this, 0}; }
  const_iterator end() const { return {this, size_}; }

 private:
  std::vector<std::vector<RecordedOutput>> chunks_;  // every one but the first reserved to kRowsPerChunk
  size_t size_ = 0;
};

struct RunRecord {
  ReplayCounters counters;
  // One entry per key, sorted by key, the last production of the key when the
  // run wrote it more than once (a preempted request's recompute): see
  // record() and finalize().
  // finalize() sorts it in place (stable_sort took a buffer as large again).
  RecordRows outputs;
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
