// A Backend decorator that runs every op on a reference backend (the CPU
// oracle) and a candidate (e.g. cuda) in lockstep and, after every op,
// compares every buffer the op may write (pools, nvfp4 scale pools, output
// tensors) byte for byte. It is backend-agnostic: any two backends.
//
// Memory: allocate() returns a host "shadow" address range (reserved, never
// touched) and allocates the same size on both backends. An op's pointers
// (KvPools data/scales, TensorView data) are translated to each backend's
// allocation by finding the shadow allocation that contains them and adding
// the offset. New allocations are zero-filled on both sides, so bytes an op
// never writes compare equal. to_host() reads the reference.
//
// The first difference is kept as a DiffReport: op, the caller's context
// label (set_context; kvsim diff passes step/layer/op), buffer, byte offset,
// both values (hex and decoded), the pool coordinates found by inverting the
// strides, (sequence, token) found through the op's page table, and the
// element_offset() arithmetic that leads to that byte. Later ops still run and
// are counted.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/backend.hpp"

namespace kvsim {

struct DiffCounters {
  int64_t ops = 0;             // ops run on both backends
  int64_t bytes_compared = 0;  // bytes compared after those ops
};

// Pool coordinates of one element (entry = token slot inside the block).
struct PoolCoordinates {
  int64_t block = 0;
  int32_t layer = 0, kv = 0, head = 0, entry = 0, dim = 0;
};

struct DiffReport {
  std::string op;       // "append_paged"
  std::string context;  // the caller's label: "scenario x step 3 layer 1 qkv_preprocess_write"
  std::string buffer;   // "primary pool", "primary scale pool", "secondary pool", "out", "q_out", "cache"
  CacheDtype dtype = CacheDtype::fp32;  // element type of the buffer
  int64_t byte_offset = 0;              // from the buffer's start
  int64_t element = -1;                 // element offset (nibbles for nvfp4), -1 if not an element
  std::string reference_hex, candidate_hex;
  std::string reference_value, candidate_value;  // decoded
  std::optional<PoolCoordinates> pool_at;        // pools: the element's coordinates
  std::vector<int64_t> tensor_index;             // tensors: the element's index
  int32_t sequence = -1;                         // batch entry, when the op's table says
  std::string sequence_id;                       // from set_context, when given
  int64_t token = -1;                            // token position (or cache slot, see token_meaning)
  std::string token_meaning;                     // "token position", "cache slot", "input token"
  int32_t head = -1, dim = -1;
  std::string explain;  // the element_offset() terms that lead to byte_offset

  std::string text() const;  // several lines, for people
};

class DifferentialBackend final : public Backend {
 public:
  DifferentialBackend(std::unique_ptr<Backend> reference, std::unique_ptr<Backend> candidate);
  ~DifferentialBackend() override;
  DifferentialBackend(const DifferentialBackend&) = delete;
  DifferentialBackend& operator=(const DifferentialBackend&) = delete;

  std::string_view name() const override { return name_; }
  Backend& reference() { return *backends_[0]; }
  Backend& candidate() { return *backends_[1]; }

  // Labels the ops that follow (until the next call) in reports;
  // sequence_ids[b] names batch entry b of the op's page table.
  void set_context(std::string label, std::vector<std::string> sequence_ids = {});
  const std::optional<DiffReport>& first_difference() const { return first_; }
  const DiffCounters& counters() const { return counters_; }

  KVSIM_BACKEND_MEMORY_OVERRIDES

  // Everything the report needs to map a pool byte to (sequence, token).
  struct TokenMap {
    enum class Kind : uint8_t { none, csr, dense, slots } kind = Kind::none;
    std::span<const int32_t> indptr, indices;        // csr
    std::span<const int32_t> table;                  // dense [batch, max_blocks]
    int32_t max_blocks = 0;
    WindowMapping window;                            // dense tables index cache slots
    std::span<const int64_t> slots;                  // vLLM slot mapping
  };

 protected:
  KVSIM_BACKEND_OP_OVERRIDES

 private:
  struct Allocation {
    size_t bytes = 0;
    void* side[2] = {nullptr, nullptr};  // [reference, candidate]
  };
  void* reserve_shadow(size_t bytes);
  void* add_allocation(size_t bytes, void* reference, void* candidate);
  // The allocation holding `p` and p's offset in it; throws BackendError if none.
  std::pair<const Allocation*, size_t> find(const void* p, const char* what) const;
  void* translate(const void* p, int side) const;
  KvPools translate(const KvPools& pools, int side) const;
  TensorView translate(TensorView t, int side) const;

  // Runs op `id` on both sides and compares what it may write (op_list.hpp's traits).
  template <OpId id>
  void run_op(const KvPools& pools, const OpOf<id>& op);
  void compare_pools(const char* op, const KvPools& pools, PoolKind kind, const TokenMap& map);
  void compare_tensor(const char* op, const char* name, const TensorView& t);
  // Reads [p, p + bytes) from both sides; returns the first differing byte or -1.
  int64_t compare_bytes(const void* p, size_t bytes, std::vector<uint8_t>& ref, std::vector<uint8_t>& cand);

  std::string name_;
  std::unique_ptr<Backend> backends_[2];
  std::map<uintptr_t, Allocation> allocations_;  // by shadow start address
  std::string context_;
  std::vector<std::string> sequence_ids_;
  std::optional<DiffReport> first_;
  DiffCounters counters_;
};

}  // namespace kvsim
