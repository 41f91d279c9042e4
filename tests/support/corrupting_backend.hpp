// A test double for the checks that must catch a wrong backend: the CPU
// oracle, except that after every op named `corrupt_op` it flips the bits of
// one byte (of the primary pool or of the op's output). Used by
// tests/oracle/differential_backend_test and tests/bench/bench_check_test.
#pragma once

#include <string>

#include "backends/cpu/cpu_backend.hpp"

namespace kvsim::testing {

// pool_byte: a byte of the primary pool; out_byte: a byte of the op's output
// tensor (gather_paged, attention, qkv's q_out, indexer's cache). At most
// `corruptions` ops are corrupted (an op run twice would flip the byte back).
class CorruptingBackend final : public Backend {
 public:
  std::string corrupt_op;
  int64_t pool_byte = -1;
  int64_t out_byte = -1;
  int corruptions = 1 << 30;

  std::string_view name() const override { return "corrupting-cpu"; }
  void* allocate(size_t bytes) override { return cpu_.allocate(bytes); }
  void release(void* p) noexcept override { cpu_.release(p); }
  void to_backend(void* dst, const void* src, size_t bytes) override { cpu_.to_backend(dst, src, bytes); }
  void to_host(void* dst, const void* src, size_t bytes) override { cpu_.to_host(dst, src, bytes); }
  void fill(void* dst, uint8_t byte, size_t bytes) override { cpu_.fill(dst, byte, bytes); }

 protected:
  void corrupt(const char* op, const KvPools* pools, const TensorView* out) {
    if (corrupt_op != op || corruptions <= 0) return;
    --corruptions;
    if (pools && pool_byte >= 0) pools->bytes(PoolKind::primary)[pool_byte] ^= 0xFF;
    if (out && out_byte >= 0) static_cast<uint8_t*>(out->data)[out_byte] ^= 0xFF;
  }
  void run_append_paged(const KvPools& p, const AppendPagedOp& o) override {
    cpu_.append_paged(p, o);
    corrupt("append_paged", &p, nullptr);
  }
  void run_reshape_and_cache(const KvPools& p, const ReshapeAndCacheOp& o) override {
    cpu_.reshape_and_cache(p, o);
    corrupt("reshape_and_cache", &p, nullptr);
  }
  void run_qkv_preprocess_write(const KvPools& p, const QkvPreprocessOp& o) override {
    cpu_.qkv_preprocess_write(p, o);
    corrupt("qkv_preprocess_write", &p, &o.q_out);
  }
  void run_append_mla(const KvPools& p, const AppendMlaOp& o) override {
    cpu_.append_mla(p, o);
    corrupt("append_mla", &p, nullptr);
  }
  void run_indexer_k_scatter(const IndexerKScatterOp& o) override {
    cpu_.indexer_k_scatter(o);
    corrupt("indexer_k_scatter", nullptr, &o.cache);
  }
  void run_gather_paged(const KvPools& p, const GatherPagedOp& o) override {
    cpu_.gather_paged(p, o);
    corrupt("gather_paged", nullptr, &o.out);
  }
  void run_decode_attention(const KvPools& p, const DecodeAttentionOp& o) override {
    cpu_.decode_attention(p, o);
    corrupt("decode_attention", nullptr, &o.out);
  }
  void run_prefill_attention(const KvPools& p, const PrefillAttentionOp& o) override {
    cpu_.prefill_attention(p, o);
    corrupt("prefill_attention", nullptr, &o.out);
  }
  void run_mla_attention(const KvPools& p, const MlaAttentionOp& o) override {
    cpu_.mla_attention(p, o);
    corrupt("mla_attention", nullptr, &o.out);
  }
  void run_partial_copy(const KvPools& p, const PartialCopyOp& o) override {
    cpu_.partial_copy(p, o);
    corrupt("partial_copy", &p, nullptr);
  }
  void run_copy_blocks(const KvPools& p, const CopyBlocksOp& o) override {
    cpu_.copy_blocks(p, o);
    corrupt("copy_blocks", &p, nullptr);
  }
  void run_move_blocks(const KvPools& p, const MoveBlocksOp& o, bool to_secondary) override {
    to_secondary ? cpu_.offload(p, o) : cpu_.onboard(p, o);
    corrupt(to_secondary ? "offload" : "onboard", &p, nullptr);
  }

 private:
  CpuBackend cpu_{2};
};


}  // namespace kvsim::testing
