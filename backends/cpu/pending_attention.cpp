// PENDING (development shim, must be deleted): lets the library link while the
// attention group is being written. The helper implementing attention deletes this file
// and writes backends/cpu/attention.cpp plus the validate_* definitions in core.
#include "backends/cpu/cpu_backend.hpp"

namespace kvsim {

void CpuBackend::run_decode_attention(const KvPools&, const DecodeAttentionOp&) { throw std::logic_error("attention: not written yet"); }
void CpuBackend::run_prefill_attention(const KvPools&, const PrefillAttentionOp&) { throw std::logic_error("attention: not written yet"); }
void validate_decode_attention(const KvPools&, const DecodeAttentionOp&) { throw std::logic_error("attention: not written yet"); }
void validate_prefill_attention(const KvPools&, const PrefillAttentionOp&) { throw std::logic_error("attention: not written yet"); }

}  // namespace kvsim
