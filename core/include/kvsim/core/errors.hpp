// Named validation errors (contract §3): the codes and their names. Every
// rejection in kvsim carries one of these codes plus a message naming the
// sequence, the entry, the value and the rule; the exception that carries
// them (ValidationError) and every check are host code in
// validation/include/kvsim/validation/.
#pragma once

#include <string_view>

namespace kvsim {

enum class ErrorCode {
  bad_geometry,              // a PoolGeometry field out of its range
  bad_strides,               // caller strides overlap or leave the pool
  unsupported_head_dim,      // head_dim the layout, dtype or op does not support
  unsupported_page_size,     // tokens_per_block outside 1..1024 or not allowed by the op
  indptr_bad_start,          // indptr[0] != 0
  non_monotone_indptr,       // indptr[b+1] < indptr[b]
  indices_size_mismatch,     // indices.size() != indptr[n]
  block_out_of_range,        // a block id >= the pool's block count (or negative, not BAD_PAGE)
  last_page_len_out_of_range,// last_page_len[b] not in [1, P] for a sequence with pages
  position_beyond_sequence,  // a token position outside [0, length)
  write_through_bad_page,    // a write lands on a BAD_PAGE (-1) entry
  slot_beyond_pool,          // slot >= blocks * P
  shared_block_write,        // two live sequences write one block in one op
  secondary_not_onboarded,   // a secondary-pool reference used by a read or write
  bad_global_scale,          // nvfp4 global scale not finite and > 0
  bad_window,                // window/sink parameters inconsistent
  shape_mismatch,            // tensor shape or dtype does not match what the op needs
  bad_argument,              // any other argument the op cannot accept
  bad_scenario,              // a scenario file that is malformed or asks for impossible settings
  bad_trace,                 // a request trace file that is malformed (FILE:LINE: field)
  bad_event_stream,          // a KV-event stream that cannot be read (FILE:LINE or FILE:byte N: field)
  unsupported_attention_order, // attention order mma asked of a cache dtype it is not offered for
  insufficient_memory,       // a replay whose estimated peak exceeds the backend's free memory (or disk for a spill)
};

constexpr std::string_view error_name(ErrorCode c) {
  switch (c) {
    case ErrorCode::bad_geometry: return "bad_geometry";
    case ErrorCode::bad_strides: return "bad_strides";
    case ErrorCode::unsupported_head_dim: return "unsupported_head_dim";
    case ErrorCode::unsupported_page_size: return "unsupported_page_size";
    case ErrorCode::indptr_bad_start: return "indptr_bad_start";
    case ErrorCode::non_monotone_indptr: return "non_monotone_indptr";
    case ErrorCode::indices_size_mismatch: return "indices_size_mismatch";
    case ErrorCode::block_out_of_range: return "block_out_of_range";
    case ErrorCode::last_page_len_out_of_range: return "last_page_len_out_of_range";
    case ErrorCode::position_beyond_sequence: return "position_beyond_sequence";
    case ErrorCode::write_through_bad_page: return "write_through_bad_page";
    case ErrorCode::slot_beyond_pool: return "slot_beyond_pool";
    case ErrorCode::shared_block_write: return "shared_block_write";
    case ErrorCode::secondary_not_onboarded: return "secondary_not_onboarded";
    case ErrorCode::bad_global_scale: return "bad_global_scale";
    case ErrorCode::bad_window: return "bad_window";
    case ErrorCode::shape_mismatch: return "shape_mismatch";
    case ErrorCode::bad_argument: return "bad_argument";
    case ErrorCode::bad_scenario: return "bad_scenario";
    case ErrorCode::bad_trace: return "bad_trace";
    case ErrorCode::bad_event_stream: return "bad_event_stream";
    case ErrorCode::unsupported_attention_order: return "unsupported_attention_order";
    case ErrorCode::insufficient_memory: return "insufficient_memory";
  }
  return "unknown";
}

}  // namespace kvsim
