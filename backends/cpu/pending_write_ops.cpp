// PENDING (development shim, must be deleted): lets the library link while the
// write_ops group is being written. The helper implementing write_ops deletes this file
// and writes backends/cpu/write_ops.cpp plus the validate_* definitions in core.
#include "backends/cpu/cpu_backend.hpp"

namespace kvsim {

void CpuBackend::run_append_paged(const KvPools&, const AppendPagedOp&) { throw std::logic_error("write_ops: not written yet"); }
void CpuBackend::run_reshape_and_cache(const KvPools&, const ReshapeAndCacheOp&) { throw std::logic_error("write_ops: not written yet"); }
void CpuBackend::run_append_mla(const KvPools&, const AppendMlaOp&) { throw std::logic_error("write_ops: not written yet"); }
void CpuBackend::run_indexer_k_scatter(const IndexerKScatterOp&) { throw std::logic_error("write_ops: not written yet"); }
void validate_append_paged(const KvPools&, const AppendPagedOp&) { throw std::logic_error("write_ops: not written yet"); }
void validate_reshape_and_cache(const KvPools&, const ReshapeAndCacheOp&) { throw std::logic_error("write_ops: not written yet"); }
void validate_append_mla(const KvPools&, const AppendMlaOp&) { throw std::logic_error("write_ops: not written yet"); }
void validate_indexer_k_scatter(const IndexerKScatterOp&) { throw std::logic_error("write_ops: not written yet"); }

}  // namespace kvsim
