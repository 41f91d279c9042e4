// Random, valid op instances for differential testing (`kvsim diff
// --generated`, tests/cuda): random geometry, ragged batches, shuffled
// non-contiguous block ids, strided inputs, pools filled with random codes
// before the ops. Everything goes through the Backend interface, so the same
// generator drives a DifferentialBackend (every op compared byte for byte) or
// any single backend. Deterministic for a seed.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "backends/backend.hpp"

namespace kvsim {

// The ops the generator draws: the op list's ids whose traits say `generated`
// (op_list.hpp), in list order.
using GeneratedOp = OpId;
inline constexpr auto kGeneratedOps = kGeneratedOpIds;
constexpr std::string_view generated_op_name(GeneratedOp op) { return op_name(op); }

// Whether an op can run on pools of geometry g (kv_factor, dtype, head count).
bool op_supports_geometry(GeneratedOp op, const PoolGeometry& g);

// Knobs of one generated op; unset ones are drawn at random.
struct OpKnobs {
  int32_t batch = -1;                     // sequences / tokens group count (ragged lengths)
  int32_t group = -1;                     // query heads per KV head (qkv_preprocess, attention)
  std::optional<CacheDtype> input_dtype;  // fp32/fp16/bf16 where the op takes float input
  int32_t window = -1;                    // 0: no window, 1: window with sinks, -1: random
  // Attention's arithmetic order (decode/prefill); mma only where the cache
  // dtype offers it (mma_order::offered_for), else fp32. Never drawn, so the
  // generated sequences stay as they were.
  AttentionOrder order = AttentionOrder::fp32;
};

class OpGenerator {
 public:
  // special_values: inputs and pools also hold NaN (with payloads), +-Inf and
  // fp8 NaN codes; off, every value is finite (edge values still appear).
  OpGenerator(Backend& backend, uint64_t seed, bool special_values = true);
  ~OpGenerator();
  OpGenerator(const OpGenerator&) = delete;
  OpGenerator& operator=(const OpGenerator&) = delete;

  // Allocates pools of g (released on the next call or in the destructor) and
  // fills them with random codes.
  void set_geometry(const PoolGeometry& g);
  const PoolGeometry& geometry() const { return pools_.geometry; }
  // Random codes into every pool and scale pool (fp32/fp16/bf16: values in
  // [-4, 4] with a few specials; byte codes: any byte, finite ones only
  // without special values).
  void poison();
  // Runs one random valid instance of `op` on the pools. Returns a one-line
  // description ("append_paged: batch 3, nnz 17, ...").
  std::string run(GeneratedOp op, const OpKnobs& knobs = {});

  // A random geometry `op` supports: page sizes 1..33 (odd and even), head
  // dims 16..256, every dtype / layout / placement the op allows.
  static PoolGeometry random_geometry(GeneratedOp op, std::mt19937_64& rng);

 private:
  struct Impl;
  Backend& backend_;
  std::mt19937_64 rng_;
  bool special_values_ = true;
  KvPools pools_;
  bool have_pools_ = false;
  std::vector<BackendBuffer> buffers_;  // an op's tensors, freed before the next op
  int64_t attention_ops_ = 0;            // every other attention op also writes its LSE

  TensorView tensor(CacheDtype dtype, std::vector<int64_t> shape, bool padded);
  // An fp32 output [rows, cols] filled with NaN bytes, drawing nothing from the
  // RNG (so adding it changed no generated sequence).
  TensorView nan_output(int64_t rows, int64_t cols);
  void release_pools();
};

// Runs `sequences` generated op sequences on `backend`: each has a random
// geometry and runs every op that geometry supports in a shuffled order
// (append_mla on its own latent pool), with `ops_per_sequence` ops in all.
// before_op(description) is called before each op (e.g. DifferentialBackend::
// set_context). Returns the number of ops run.
int64_t run_generated_sequences(Backend& backend, int sequences, uint64_t seed, int ops_per_sequence,
                                const std::function<void(const std::string&)>& before_op,
                                bool special_values = true);

}  // namespace kvsim
