// Host validation of the page-table contract (contract §3): block references,
// CSR tables, slot mappings, one writer per block, and FlashInfer's append
// coordinates (built here because building them checks the table).
#pragma once

#include <span>
#include <string>
#include <algorithm>
#include <unordered_map>
#include <utility>
#include <vector>

#include "errors.hpp"
#include "geometry.hpp"
#include "kvsim/core/page_table.hpp"

namespace kvsim {

inline std::string describe_ref(BlockRef r) {
  if (r.is_bad()) return "BAD_PAGE(-1)";
  if (!r.is_secondary()) return std::to_string(r.block());
  // A negative raw value other than -1 reads as a secondary reference (top
  // bit); show the raw number too, so a stray -2 is recognisable.
  return "secondary:" + std::to_string(r.block()) + " (raw " + std::to_string(r.raw) + ")";
}

// ---------------------------------------------------------------- validation helpers
namespace detail {
inline std::string seq_entry(int32_t b, const char* array, int64_t i) {
  return "sequence " + std::to_string(b) + ", " + array + "[" + std::to_string(i) + "]";
}
}  // namespace detail

// A reference used by an op: must be a live block of a primary pool in range.
// `where` names the reference in the error: a string, or a callable that
// returns one -- built only when the check fails, so validating a table of a
// million pages does not build a million messages.
namespace detail {
inline const std::string& where_text(const std::string& s) { return s; }
inline std::string where_text(const char* s) { return s; }
template <class F>
std::string where_text(const F& f) {
  return f();
}
}  // namespace detail

template <class Where>
inline void validate_block_ref(BlockRef r, const PoolGeometry& g, const Where& where, bool is_write) {
  if (!r.is_bad() && !r.is_secondary() && r.raw >= 0 && r.block() < g.primary_blocks) return;  // the common case
  if (r.is_bad()) {
    if (is_write)
      fail(ErrorCode::write_through_bad_page,
           detail::where_text(where) + " = -1 (BAD_PAGE): rule: a write must land in a live page, never through BAD_PAGE");
    return;  // reads of BAD_PAGE are defined per op (gather reads zeros)
  }
  if (r.is_secondary()) {
    if (r.block() >= g.secondary_blocks)
      fail(ErrorCode::block_out_of_range, detail::where_text(where) + " = " + describe_ref(r) +
                                              ": rule: block id < secondary_blocks = " + std::to_string(g.secondary_blocks));
    fail(ErrorCode::secondary_not_onboarded, detail::where_text(where) + " = " + describe_ref(r) +
                                                 ": rule: a secondary-pool block must be onboarded before it is read or written");
  }
  fail(ErrorCode::block_out_of_range, detail::where_text(where) + " = " + std::to_string(r.raw) +
                                          ": rule: block id must be in [0, primary_blocks = " +
                                          std::to_string(g.primary_blocks) + ")");
}

// CSR structure: indptr starts at 0 and never decreases, indices has
// indptr[n] entries, every entry is a valid reference (BAD_PAGE rejected when
// `for_write`), last_page_len in [1, P] for each sequence with pages.
inline void validate_csr(std::span<const int32_t> indptr, std::span<const int32_t> indices,
                         std::span<const int32_t> last_page_len, const PoolGeometry& g, bool for_write) {
  if (indptr.empty()) fail(ErrorCode::shape_mismatch, "indptr is empty: rule: indptr has batch + 1 entries");
  const int64_t batch = static_cast<int64_t>(indptr.size()) - 1;
  if (indptr[0] != 0)
    fail(ErrorCode::indptr_bad_start, "indptr[0] = " + std::to_string(indptr[0]) + ": rule: indptr starts at 0");
  for (int64_t b = 0; b < batch; ++b)
    if (indptr[b + 1] < indptr[b])
      fail(ErrorCode::non_monotone_indptr, "sequence " + std::to_string(b) + ": indptr[" + std::to_string(b + 1) +
                                               "] = " + std::to_string(indptr[b + 1]) + " < indptr[" +
                                               std::to_string(b) + "] = " + std::to_string(indptr[b]) +
                                               ": rule: indptr is non-decreasing");
  if (static_cast<int64_t>(indices.size()) != indptr[batch])
    fail(ErrorCode::indices_size_mismatch, "indices has " + std::to_string(indices.size()) + " entries but indptr[" +
                                               std::to_string(batch) + "] = " + std::to_string(indptr[batch]) +
                                               ": rule: indices has indptr[n] entries");
  if (static_cast<int64_t>(last_page_len.size()) != batch)
    fail(ErrorCode::shape_mismatch, "last_page_len has " + std::to_string(last_page_len.size()) + " entries for " +
                                        std::to_string(batch) + " sequences");
  for (int64_t b = 0; b < batch; ++b) {
    for (int32_t i = indptr[b]; i < indptr[b + 1]; ++i)
      validate_block_ref(
          BlockRef{indices[i]}, g, [&] { return detail::seq_entry(static_cast<int32_t>(b), "indices", i); }, for_write);
    if (indptr[b + 1] > indptr[b] && (last_page_len[b] < 1 || last_page_len[b] > g.tokens_per_block))
      fail(ErrorCode::last_page_len_out_of_range,
           detail::seq_entry(static_cast<int32_t>(b), "last_page_len", b) + " = " + std::to_string(last_page_len[b]) +
               ": rule: last_page_len is in [1, P = " + std::to_string(g.tokens_per_block) +
               "] for a sequence with pages");
  }
}

// Slots: each slot is negative (skip) or < primary_blocks * P.
inline void validate_slot_mapping(std::span<const int64_t> slots, const PoolGeometry& g, const char* name = "slot_mapping") {
  const int64_t limit = g.primary_blocks * g.tokens_per_block;
  for (size_t i = 0; i < slots.size(); ++i)
    if (slots[i] >= limit)
      fail(ErrorCode::slot_beyond_pool, "token " + std::to_string(i) + ", " + name + "[" + std::to_string(i) +
                                            "] = " + std::to_string(slots[i]) + ": rule: slot < blocks * P = " +
                                            std::to_string(limit) + " (negative = skip)");
}

// Two live sequences must never write one block in one op. `writes` lists
// (sequence, block) for every write the op will perform.
inline void validate_exclusive_writers(std::span<const std::pair<int32_t, int64_t>> writes) {
  std::unordered_map<int64_t, int32_t> owner;
  const std::pair<int32_t, int64_t>* previous = nullptr;
  for (const auto& w : writes) {
    // A write equal to the one before it (the tokens of one page, in turn)
    // cannot fail where that one passed: one lookup per run, not per token.
    if (previous && *previous == w) continue;
    previous = &w;
    const auto& [seq, block] = w;
    auto [it, inserted] = owner.emplace(block, seq);
    if (!inserted && it->second != seq)
      fail(ErrorCode::shared_block_write, "block " + std::to_string(block) + " is written by sequence " +
                                              std::to_string(it->second) + " and sequence " + std::to_string(seq) +
                                              ": rule: two live sequences never write one block");
  }
}

// Intervals [first, end) that may share no value, gathered so that the
// lists engines build stay short: an interval that starts where the one
// before it ended joins it (a page's tokens in turn are one run). disjoint()
// sorts the runs and checks neighbours: true proves that no value lies in two
// intervals; false means "not proven", and the caller's exact check (which
// names the first value written twice and its two writers) decides. A sort
// of the runs, not a hash or a bitmap per written element.
class RunSet {
 public:
  void add(int64_t first, int64_t count) {
    if (!runs_.empty() && runs_.back().second == first) runs_.back().second += count;
    else runs_.emplace_back(first, first + count);
  }
  size_t size() const { return runs_.size(); }
  bool disjoint() {
    std::sort(runs_.begin(), runs_.end());
    for (size_t i = 1; i < runs_.size(); ++i)
      if (runs_[i].first < runs_[i - 1].second) return false;
    return true;
  }

 private:
  std::vector<std::pair<int64_t, int64_t>> runs_;
};

// True when no value of `keys` repeats (negative values ignored), proven by
// RunSet from its runs of consecutive values.
inline bool distinct_by_runs(std::span<const int64_t> keys) {
  RunSet runs;
  for (const int64_t k : keys)
    if (k >= 0) runs.add(k, 1);
  return runs.disjoint();
}

// ---------------------------------------------------------------- append coordinates
// FlashInfer get_batch_indices_positions: for token i of sequence b (in
// [append_indptr[b], append_indptr[b+1])), positions[i] = i + len[b] -
// append_indptr[b+1], len being the post-append length.
struct BatchIndicesPositions {
  std::vector<int32_t> batch_indices;
  std::vector<int32_t> positions;
};

inline BatchIndicesPositions append_coordinates(std::span<const int32_t> append_indptr,
                                                std::span<const int64_t> seq_lens_after) {
  if (append_indptr.empty() || append_indptr.size() != seq_lens_after.size() + 1)
    fail(ErrorCode::shape_mismatch, "append_indptr has " + std::to_string(append_indptr.size()) +
                                        " entries for " + std::to_string(seq_lens_after.size()) +
                                        " sequences: rule: batch + 1 entries");
  if (append_indptr[0] != 0)
    fail(ErrorCode::indptr_bad_start, "append_indptr[0] = " + std::to_string(append_indptr[0]) + ": rule: starts at 0");
  BatchIndicesPositions c;
  const int64_t batch = static_cast<int64_t>(seq_lens_after.size());
  for (int64_t b = 0; b < batch; ++b) {
    if (append_indptr[b + 1] < append_indptr[b])
      fail(ErrorCode::non_monotone_indptr, "sequence " + std::to_string(b) + ": append_indptr[" +
                                               std::to_string(b + 1) + "] = " + std::to_string(append_indptr[b + 1]) +
                                               " < append_indptr[" + std::to_string(b) + "]: rule: non-decreasing");
    // positions are int32 (FlashInfer's): a longer sequence would wrap them.
    if (seq_lens_after[b] > INT32_MAX)
      fail(ErrorCode::position_beyond_sequence, "sequence " + std::to_string(b) + ": length after append " +
                                                    std::to_string(seq_lens_after[b]) +
                                                    ": rule: positions are 32-bit, length <= 2^31 - 1");
    const int64_t appended = static_cast<int64_t>(append_indptr[b + 1]) - append_indptr[b];
    if (appended > seq_lens_after[b])
      fail(ErrorCode::position_beyond_sequence,
           "sequence " + std::to_string(b) + " appends " + std::to_string(appended) + " tokens but its length after append is " +
               std::to_string(seq_lens_after[b]) + ": rule: positions[i] = i + len[b] - append_indptr[b+1] >= 0");
    for (int32_t i = append_indptr[b]; i < append_indptr[b + 1]; ++i) {
      c.batch_indices.push_back(static_cast<int32_t>(b));
      c.positions.push_back(static_cast<int32_t>(i + seq_lens_after[b] - append_indptr[b + 1]));
    }
  }
  return c;
}

}  // namespace kvsim
