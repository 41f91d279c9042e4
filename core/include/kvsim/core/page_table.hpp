// The page-table contract (contract §3): CSR tables (FlashInfer), dense block
// tables (TensorRT-LLM / vLLM), slot mappings (vLLM), append coordinates and
// primary/secondary block references (TensorRT-LLM KVCacheIndex). The views
// are plain pointers + sizes so the same struct serves the host reference and
// a kernel (as FlashInfer's paged_kv_t does). Their host validation
// (validate_*, append_coordinates) is in kvsim/validation/page_table.hpp.
#pragma once

#include <span>
#include <vector>

#include "geometry.hpp"

namespace kvsim {

inline constexpr int32_t kBadPage = -1;

// A block reference: -1 is BAD_PAGE; otherwise the top bit selects the
// secondary pool (TensorRT-LLM's KVCacheIndex) and the low 31 bits the block.
struct BlockRef {
  int32_t raw = kBadPage;
  static constexpr uint32_t kSecondaryBit = 0x80000000u;

  KVSIM_HD static constexpr BlockRef primary(int32_t block) { return BlockRef{block}; }
  KVSIM_HD static constexpr BlockRef secondary(int32_t block) {
    return BlockRef{static_cast<int32_t>(static_cast<uint32_t>(block) | kSecondaryBit)};
  }
  KVSIM_HD constexpr bool is_bad() const { return raw == kBadPage; }
  KVSIM_HD constexpr bool is_secondary() const { return !is_bad() && (static_cast<uint32_t>(raw) & kSecondaryBit); }
  KVSIM_HD constexpr int32_t block() const { return static_cast<int32_t>(static_cast<uint32_t>(raw) & ~kSecondaryBit); }
  KVSIM_HD constexpr PoolKind pool() const { return is_secondary() ? PoolKind::secondary : PoolKind::primary; }
};

// ---------------------------------------------------------------- CSR view
// length(b) = 0 without pages, else (pages - 1) * P + last_page_len[b].
struct CsrPageTable {
  const int32_t* indptr = nullptr;         // [batch + 1]
  const int32_t* indices = nullptr;        // [indptr[batch]] raw BlockRefs
  const int32_t* last_page_len = nullptr;  // [batch]
  int32_t batch = 0;
  PageDivider page;

  KVSIM_HD constexpr int32_t num_pages(int32_t b) const { return indptr[b + 1] - indptr[b]; }
  KVSIM_HD constexpr int64_t length(int32_t b) const {
    const int32_t n = num_pages(b);
    return n == 0 ? 0 : static_cast<int64_t>(n - 1) * page.page_size + last_page_len[b];
  }
  // FlashInfer's divmod: (indptr[b] * P + position) -> (global page slot, entry).
  KVSIM_HD constexpr void locate(int32_t b, int64_t position, int64_t& page_slot, int32_t& entry) const {
    const int64_t linear = static_cast<int64_t>(indptr[b]) * page.page_size + position;
    page_slot = page.div(linear);
    entry = page.mod(linear);
  }
  KVSIM_HD constexpr BlockRef block_at(int64_t page_slot) const { return BlockRef{indices[page_slot]}; }
};

// ---------------------------------------------------------------- dense table
// [batch, max_blocks_per_seq] padded with -1 (BAD_PAGE).
struct DenseBlockTable {
  const int32_t* table = nullptr;
  int32_t batch = 0;
  int32_t max_blocks_per_seq = 0;

  KVSIM_HD constexpr BlockRef block_at(int32_t b, int64_t logical_page) const {
    if (logical_page < 0 || logical_page >= max_blocks_per_seq) return BlockRef{kBadPage};
    return BlockRef{table[static_cast<int64_t>(b) * max_blocks_per_seq + logical_page]};
  }
};

// ---------------------------------------------------------------- slots
// vLLM: slot = block * P + offset; a negative slot means "skip this token".
struct SlotLocation {
  int64_t block;
  int32_t entry;
};
KVSIM_HD constexpr SlotLocation locate_slot(int64_t slot, PageDivider page) {
  return SlotLocation{page.div(slot), page.mod(slot)};
}

inline CsrPageTable make_csr_view(std::span<const int32_t> indptr, std::span<const int32_t> indices,
                                  std::span<const int32_t> last_page_len, const PoolGeometry& g) {
  return CsrPageTable{indptr.data(), indices.data(), last_page_len.data(), static_cast<int32_t>(indptr.size()) - 1,
                      g.page_divider()};
}

}  // namespace kvsim
