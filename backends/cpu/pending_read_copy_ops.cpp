// PENDING (development shim, must be deleted): lets the library link while the
// read_copy_ops group is being written. The helper implementing read_copy_ops deletes this file
// and writes backends/cpu/read_copy_ops.cpp plus the validate_* definitions in core.
#include "backends/cpu/cpu_backend.hpp"

namespace kvsim {

void CpuBackend::run_gather_paged(const KvPools&, const GatherPagedOp&) { throw std::logic_error("read_copy_ops: not written yet"); }
void CpuBackend::run_partial_copy(const KvPools&, const PartialCopyOp&) { throw std::logic_error("read_copy_ops: not written yet"); }
void CpuBackend::run_copy_blocks(const KvPools&, const CopyBlocksOp&) { throw std::logic_error("read_copy_ops: not written yet"); }
void CpuBackend::run_move_blocks(const KvPools&, const MoveBlocksOp&, bool) { throw std::logic_error("read_copy_ops: not written yet"); }
void validate_gather_paged(const KvPools&, const GatherPagedOp&) { throw std::logic_error("read_copy_ops: not written yet"); }
void validate_partial_copy(const KvPools&, const PartialCopyOp&) { throw std::logic_error("read_copy_ops: not written yet"); }
void validate_copy_blocks(const KvPools&, const CopyBlocksOp&) { throw std::logic_error("read_copy_ops: not written yet"); }
void validate_move_blocks(const KvPools&, const MoveBlocksOp&) { throw std::logic_error("read_copy_ops: not written yet"); }

}  // namespace kvsim
