// The page-table contract (contract §3): one TEST_CASE per named validation error
// that core can raise, each asserting the code, its name and that the message
// says which sequence, entry, value and rule; a failed validation leaves the
// pool unchanged (checked byte for byte through a validate-then-write scatter
// built from core's pieces); then the positive side -- CSR length and the
// FlashInfer divmod, dense tables, slots, block references and append
// coordinates -- against examples worked by hand.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kvsim/core/geometry.hpp"
#include "kvsim/core/page_table.hpp"
#include "kvsim/core/window.hpp"

#include "../support/validation.hpp"

using namespace kvsim;
using kvsim::test::catch_validation;

namespace {

// Runs fn, which must throw a ValidationError with `code`; its name() must be
// `name` (spelled out here, not taken from core) and its message must contain
// every string in `mentions`.
void expect_error(const auto& fn, ErrorCode code, std::string_view name, const std::vector<std::string>& mentions) {
  const auto err = catch_validation(fn);
  REQUIRE_MESSAGE(err.has_value(), "expected ", name, " but nothing was thrown");
  const std::string what = err->what();
  INFO("message: ", what);
  CHECK(err->code() == code);
  CHECK(err->name() == name);
  CHECK(what.rfind(std::string(name) + ": ", 0) == 0);  // what() leads with the name
  for (const std::string& m : mentions) {
    INFO("must mention: ", m);
    CHECK(what.find(m) != std::string::npos);
  }
}

// P = 3, H = 2, D = 4, one byte per element, NHD, in_block, one layer, K and V.
PoolGeometry test_geometry() {
  PoolGeometry g{.layers = 1, .kv_factor = 2, .kv_heads = 2, .tokens_per_block = 3, .head_dim = 4,
                 .dtype = CacheDtype::int8, .layout = BlockLayout::nhd, .placement = LayerPlacement::in_block,
                 .primary_blocks = 10, .secondary_blocks = 4};
  return g;
}

// The CSR table used throughout, worked by hand (P = 3):
//   sequence 0: pages indices[0..3) = {7, 2, 9}, last_page_len 2 -> length (3-1)*3 + 2 = 8
//   sequence 1: pages indices[3..5) = {4, 0},    last_page_len 3 -> length (2-1)*3 + 3 = 6
struct Csr {
  std::vector<int32_t> indptr{0, 3, 5};
  std::vector<int32_t> indices{7, 2, 9, 4, 0};
  std::vector<int32_t> last_page_len{2, 3};
  // Appends: sequence 0 its last 2 tokens, sequence 1 its last 3.
  std::vector<int32_t> append_indptr{0, 2, 5};
};

// What an append op does, in the contract's order: validate every input
// (geometry, CSR for writing, append coordinates, one writer per block), and
// only then write K rows [nnz][H][D] through core's locate / element_offset.
void validated_scatter(std::vector<uint8_t>& pool, const PoolGeometry& g, std::span<const int32_t> indptr,
                       std::span<const int32_t> indices, std::span<const int32_t> last_page_len,
                       std::span<const int32_t> append_indptr, std::span<const uint8_t> values) {
  validate_geometry(g);
  if (bits_per_element(g.dtype) != 8) fail(ErrorCode::shape_mismatch, "test scatter writes one byte per element");
  if (static_cast<int64_t>(pool.size()) != g.pool_bytes(PoolKind::primary))
    fail(ErrorCode::shape_mismatch, "pool size");
  validate_csr(indptr, indices, last_page_len, g, /*for_write=*/true);
  const CsrPageTable csr = make_csr_view(indptr, indices, last_page_len, g);
  std::vector<int64_t> lengths(static_cast<size_t>(csr.batch));
  for (int32_t b = 0; b < csr.batch; ++b) lengths[static_cast<size_t>(b)] = csr.length(b);
  const BatchIndicesPositions coords = append_coordinates(append_indptr, lengths);
  const size_t nnz = coords.positions.size();
  const size_t row = static_cast<size_t>(g.kv_heads) * g.head_dim;
  if (values.size() != nnz * row) fail(ErrorCode::shape_mismatch, "values");

  struct Target {
    int64_t block;
    int32_t entry;
  };
  std::vector<Target> targets(nnz);
  std::vector<std::pair<int32_t, int64_t>> writes(nnz);
  for (size_t i = 0; i < nnz; ++i) {
    int64_t page_slot;
    int32_t entry;
    csr.locate(coords.batch_indices[i], coords.positions[i], page_slot, entry);
    targets[i] = {csr.block_at(page_slot).block(), entry};
    writes[i] = {coords.batch_indices[i], targets[i].block};
  }
  validate_exclusive_writers(writes);

  const PoolStrides s = contiguous_strides(g);
  for (size_t i = 0; i < nnz; ++i)
    for (int32_t h = 0; h < g.kv_heads; ++h)
      for (int32_t d = 0; d < g.head_dim; ++d)
        pool[static_cast<size_t>(element_offset(s, targets[i].block, 0, 0, h, targets[i].entry, d))] =
            values[i * row + static_cast<size_t>(h * g.head_dim + d)];
}

// vLLM's path: validate the slot mapping, then write; a negative slot skips.
void validated_slot_scatter(std::vector<uint8_t>& pool, const PoolGeometry& g, std::span<const int64_t> slots,
                            std::span<const uint8_t> values) {
  validate_geometry(g);
  validate_slot_mapping(slots, g);
  const PoolStrides s = contiguous_strides(g);
  const PageDivider page = g.page_divider();
  const size_t row = static_cast<size_t>(g.kv_heads) * g.head_dim;
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i] < 0) continue;
    const SlotLocation at = locate_slot(slots[i], page);
    for (int32_t h = 0; h < g.kv_heads; ++h)
      for (int32_t d = 0; d < g.head_dim; ++d)
        pool[static_cast<size_t>(element_offset(s, at.block, 0, 0, h, at.entry, d))] =
            values[i * row + static_cast<size_t>(h * g.head_dim + d)];
  }
}

std::vector<uint8_t> poisoned_pool(const PoolGeometry& g) {
  std::vector<uint8_t> pool(static_cast<size_t>(g.pool_bytes(PoolKind::primary)));
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = static_cast<uint8_t>(0xA5 ^ (i * 37));
  return pool;
}

std::vector<uint8_t> row_values(size_t nnz, const PoolGeometry& g) {
  std::vector<uint8_t> v(nnz * static_cast<size_t>(g.kv_heads) * g.head_dim);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(i + 1);  // never 0, all distinct
  return v;
}

// Calls validated_scatter with the given (bad) table on a poisoned pool: it must
// throw `code` and leave every byte as it was.
void expect_scatter_rejected(const PoolGeometry& g, const Csr& t, ErrorCode code) {
  const size_t nnz = t.append_indptr.empty() ? 0 : static_cast<size_t>(t.append_indptr.back());
  const std::vector<uint8_t> values = row_values(nnz, g);
  std::vector<uint8_t> pool = poisoned_pool(g);
  const std::vector<uint8_t> saved = pool;
  const auto err = catch_validation(
      [&] { validated_scatter(pool, g, t.indptr, t.indices, t.last_page_len, t.append_indptr, values); });
  REQUIRE(err.has_value());
  CHECK(err->code() == code);
  CHECK(pool == saved);
}

}  // namespace

// ---------------------------------------------------------------- the scatter itself works

TEST_CASE("validated_scatter writes each appended row where the hand-worked divmod says") {
  const PoolGeometry g = test_geometry();
  const Csr t;
  const std::vector<uint8_t> values = row_values(5, g);  // token i, head h, dim d -> i*8 + h*4 + d + 1
  std::vector<uint8_t> pool = poisoned_pool(g);
  const std::vector<uint8_t> before = pool;
  REQUIRE_NOTHROW(validated_scatter(pool, g, t.indptr, t.indices, t.last_page_len, t.append_indptr, values));
  // Block = 2 (K, V) * 2 heads * 3 tokens * 4 dims = 48 bytes; NHD K offset in a
  // block = (entry * 2 + h) * 4 + d.
  //   token 0: sequence 0 position 8 - 2 + 0 = 6: linear 0*3 + 6 = 6  -> page 2, entry 0 -> block 9 -> 432 + 0
  //   token 1: sequence 0 position 7:             linear 7            -> page 2, entry 1 -> block 9 -> 432 + 8
  //   token 2: sequence 1 position 6 - 5 + 2 = 3: linear 3*3 + 3 = 12 -> page 4, entry 0 -> block 0 -> 0
  //   token 3: sequence 1 position 4:             linear 13           -> page 4, entry 1 -> block 0 -> 8
  //   token 4: sequence 1 position 5:             linear 14           -> page 4, entry 2 -> block 0 -> 16
  const size_t row_start[5] = {432, 440, 0, 8, 16};
  std::vector<uint8_t> expected = before;
  for (size_t i = 0; i < 5; ++i)
    for (size_t k = 0; k < 8; ++k) expected[row_start[i] + k] = static_cast<uint8_t>(i * 8 + k + 1);
  CHECK(pool == expected);
}

// ---------------------------------------------------------------- one case per error

TEST_CASE("indptr_bad_start") {
  const PoolGeometry g = test_geometry();
  Csr t;
  t.indptr = {1, 3, 5};
  expect_error([&] { validate_csr(t.indptr, t.indices, t.last_page_len, g, true); }, ErrorCode::indptr_bad_start,
               "indptr_bad_start", {"indptr[0] = 1", "rule", "starts at 0"});
  expect_scatter_rejected(g, t, ErrorCode::indptr_bad_start);
  const std::vector<int64_t> lens{8, 6};
  const std::vector<int32_t> append_indptr{2, 4, 5};
  expect_error([&] { append_coordinates(append_indptr, lens); }, ErrorCode::indptr_bad_start, "indptr_bad_start",
               {"append_indptr[0] = 2", "rule"});
}

TEST_CASE("non_monotone_indptr") {
  const PoolGeometry g = test_geometry();
  Csr t;
  t.indptr = {0, 3, 2};
  t.indices = {7, 2};
  expect_error([&] { validate_csr(t.indptr, t.indices, t.last_page_len, g, true); }, ErrorCode::non_monotone_indptr,
               "non_monotone_indptr", {"sequence 1", "indptr[2] = 2", "indptr[1] = 3", "rule", "non-decreasing"});
  expect_scatter_rejected(g, t, ErrorCode::non_monotone_indptr);
  const std::vector<int64_t> lens{8, 6, 4};
  const std::vector<int32_t> append_indptr{0, 2, 1, 3};
  expect_error([&] { append_coordinates(append_indptr, lens); }, ErrorCode::non_monotone_indptr,
               "non_monotone_indptr", {"sequence 1", "append_indptr[2] = 1", "rule"});
}

TEST_CASE("indices_size_mismatch") {
  const PoolGeometry g = test_geometry();
  Csr t;
  t.indices = {7, 2, 9, 4};
  expect_error([&] { validate_csr(t.indptr, t.indices, t.last_page_len, g, true); }, ErrorCode::indices_size_mismatch,
               "indices_size_mismatch", {"indices has 4 entries", "indptr[2] = 5", "rule"});
  expect_scatter_rejected(g, t, ErrorCode::indices_size_mismatch);
}

TEST_CASE("block_out_of_range, primary and secondary") {
  const PoolGeometry g = test_geometry();  // 10 primary blocks, 4 secondary
  SUBCASE("primary block id == primary_blocks") {
    Csr t;
    t.indices = {7, 2, 9, 4, 10};
    expect_error([&] { validate_csr(t.indptr, t.indices, t.last_page_len, g, true); }, ErrorCode::block_out_of_range,
                 "block_out_of_range", {"sequence 1", "indices[4]", "= 10", "rule", "primary_blocks = 10"});
    // Reads are held to the same range.
    expect_error([&] { validate_csr(t.indptr, t.indices, t.last_page_len, g, false); }, ErrorCode::block_out_of_range,
                 "block_out_of_range", {"sequence 1", "indices[4]"});
    expect_scatter_rejected(g, t, ErrorCode::block_out_of_range);
  }
  SUBCASE("secondary block id == secondary_blocks") {
    Csr t;
    t.indices = {7, BlockRef::secondary(4).raw, 9, 4, 0};
    expect_error([&] { validate_csr(t.indptr, t.indices, t.last_page_len, g, true); }, ErrorCode::block_out_of_range,
                 "block_out_of_range", {"sequence 0", "indices[1]", "secondary:4", "rule", "secondary_blocks = 4"});
    expect_scatter_rejected(g, t, ErrorCode::block_out_of_range);
  }
  SUBCASE("a negative id other than BAD_PAGE is out of range, never a valid block") {
    Csr t;
    t.indices = {7, 2, 9, -2, 0};
    expect_error([&] { validate_csr(t.indptr, t.indices, t.last_page_len, g, true); }, ErrorCode::block_out_of_range,
                 "block_out_of_range", {"sequence 1", "indices[3]"});
  }
}

TEST_CASE("last_page_len_out_of_range: 0 and P + 1") {
  const PoolGeometry g = test_geometry();  // P = 3
  SUBCASE("0") {
    Csr t;
    t.last_page_len = {0, 3};
    expect_error([&] { validate_csr(t.indptr, t.indices, t.last_page_len, g, true); },
                 ErrorCode::last_page_len_out_of_range, "last_page_len_out_of_range",
                 {"sequence 0", "last_page_len[0] = 0", "rule", "[1, P = 3]"});
    expect_scatter_rejected(g, t, ErrorCode::last_page_len_out_of_range);
  }
  SUBCASE("P + 1") {
    Csr t;
    t.last_page_len = {2, 4};
    expect_error([&] { validate_csr(t.indptr, t.indices, t.last_page_len, g, false); },
                 ErrorCode::last_page_len_out_of_range, "last_page_len_out_of_range",
                 {"sequence 1", "last_page_len[1] = 4", "rule", "[1, P = 3]"});
    expect_scatter_rejected(g, t, ErrorCode::last_page_len_out_of_range);
  }
  SUBCASE("a sequence without pages may carry any last_page_len") {
    const std::vector<int32_t> indptr{0, 3, 3, 5}, indices{7, 2, 9, 4, 0}, last{2, 0, 3};
    CHECK_NOTHROW(validate_csr(indptr, indices, last, g, true));
    CHECK(make_csr_view(indptr, indices, last, g).length(1) == 0);
  }
}

TEST_CASE("position_beyond_sequence (append_coordinates)") {
  const PoolGeometry g = test_geometry();
  // Sequence 1 is 6 tokens long after the append but claims 7 appended tokens.
  const std::vector<int64_t> lens{8, 6};
  const std::vector<int32_t> append_indptr{0, 2, 9};
  expect_error([&] { append_coordinates(append_indptr, lens); }, ErrorCode::position_beyond_sequence,
               "position_beyond_sequence", {"sequence 1", "appends 7 tokens", "length after append is 6", "rule"});
  Csr t;
  t.append_indptr = append_indptr;
  expect_scatter_rejected(g, t, ErrorCode::position_beyond_sequence);
}

TEST_CASE("write_through_bad_page") {
  const PoolGeometry g = test_geometry();
  Csr t;
  t.indices = {7, 2, kBadPage, 4, 0};
  expect_error([&] { validate_csr(t.indptr, t.indices, t.last_page_len, g, /*for_write=*/true); },
               ErrorCode::write_through_bad_page, "write_through_bad_page",
               {"sequence 0", "indices[2]", "-1", "BAD_PAGE", "rule"});
  expect_scatter_rejected(g, t, ErrorCode::write_through_bad_page);
  // A read may see BAD_PAGE (gather reads zeros there): not an error.
  CHECK_NOTHROW(validate_csr(t.indptr, t.indices, t.last_page_len, g, /*for_write=*/false));
  expect_error([&] { validate_block_ref(BlockRef{kBadPage}, g, "table[3][1]", true); },
               ErrorCode::write_through_bad_page, "write_through_bad_page", {"table[3][1]", "BAD_PAGE"});
}

TEST_CASE("slot_beyond_pool") {
  const PoolGeometry g = test_geometry();  // 10 blocks * P 3 = 30 slots
  const std::vector<int64_t> slots{0, 29, -1, 30, 5};
  expect_error([&] { validate_slot_mapping(slots, g); }, ErrorCode::slot_beyond_pool, "slot_beyond_pool",
               {"token 3", "slot_mapping[3] = 30", "rule", "blocks * P = 30"});
  // The pool is unchanged although tokens 0 and 1 come before the bad one.
  const std::vector<uint8_t> values = row_values(slots.size(), g);
  std::vector<uint8_t> pool = poisoned_pool(g);
  const std::vector<uint8_t> saved = pool;
  CHECK_THROWS_AS(validated_slot_scatter(pool, g, slots, values), ValidationError);
  CHECK(pool == saved);
  // The last slot and a negative one (skip) are fine.
  const std::vector<int64_t> good{29, -1, -7};
  CHECK_NOTHROW(validate_slot_mapping(good, g));
}

TEST_CASE("shared_block_write") {
  const PoolGeometry g = test_geometry();
  const std::vector<std::pair<int32_t, int64_t>> writes{{0, 4}, {1, 5}, {0, 4}, {2, 4}};
  expect_error([&] { validate_exclusive_writers(writes); }, ErrorCode::shared_block_write, "shared_block_write",
               {"block 4", "sequence 0", "sequence 2", "rule"});
  // One sequence writing a block several times is fine.
  const std::vector<std::pair<int32_t, int64_t>> own{{0, 4}, {0, 4}, {1, 5}};
  CHECK_NOTHROW(validate_exclusive_writers(own));
  // Through the scatter: sequence 1's last page is block 9, which sequence 0 appends into too.
  Csr t;
  t.indices = {7, 2, 9, 4, 9};
  expect_scatter_rejected(g, t, ErrorCode::shared_block_write);
}

TEST_CASE("secondary_not_onboarded") {
  const PoolGeometry g = test_geometry();
  Csr t;
  t.indices = {7, 2, BlockRef::secondary(3).raw, 4, 0};
  expect_error([&] { validate_csr(t.indptr, t.indices, t.last_page_len, g, /*for_write=*/false); },
               ErrorCode::secondary_not_onboarded, "secondary_not_onboarded",
               {"sequence 0", "indices[2]", "secondary:3", "rule", "onboarded"});
  expect_error([&] { validate_csr(t.indptr, t.indices, t.last_page_len, g, /*for_write=*/true); },
               ErrorCode::secondary_not_onboarded, "secondary_not_onboarded", {"indices[2]"});
  expect_scatter_rejected(g, t, ErrorCode::secondary_not_onboarded);
}

TEST_CASE("unsupported_head_dim") {
  PoolGeometry g = test_geometry();
  Csr t;
  SUBCASE("nvfp4 with head_dim not a multiple of 16") {
    g.dtype = CacheDtype::nvfp4;
    g.head_dim = 24;
    expect_error([&] { validate_geometry(g); }, ErrorCode::unsupported_head_dim, "unsupported_head_dim",
                 {"head_dim = 24", "16", "nvfp4"});
  }
  SUBCASE("split-x with head_dim not a multiple of x") {
    g.dtype = CacheDtype::fp16;
    g.layout = BlockLayout::split_x;
    g.head_dim = 12;
    expect_error([&] { validate_geometry(g); }, ErrorCode::unsupported_head_dim, "unsupported_head_dim",
                 {"head_dim = 12", "x = 8", "split-x", "fp16"});
  }
  SUBCASE("head_dim 0") {
    g.head_dim = 0;
    expect_error([&] { validate_geometry(g); }, ErrorCode::unsupported_head_dim, "unsupported_head_dim",
                 {"head_dim = 0"});
    expect_scatter_rejected(g, t, ErrorCode::unsupported_head_dim);
  }
}

TEST_CASE("unsupported_page_size: 0 and 1025") {
  PoolGeometry g = test_geometry();
  Csr t;
  for (int32_t p : {0, 1025, -3}) {
    CAPTURE(p);
    g.tokens_per_block = p;
    expect_error([&] { validate_geometry(g); }, ErrorCode::unsupported_page_size, "unsupported_page_size",
                 {"tokens_per_block = " + std::to_string(p), "1..1024"});
  }
  g.tokens_per_block = 0;
  expect_scatter_rejected(g, t, ErrorCode::unsupported_page_size);
  for (int32_t p : {1, 1024}) {
    g.tokens_per_block = p;
    CHECK_NOTHROW(validate_geometry(g));
  }
}

TEST_CASE("bad_geometry") {
  const PoolGeometry base = test_geometry();
  struct Case {
    const char* field;
    void (*apply)(PoolGeometry&);
    std::string mention;
  };
  const Case cases[] = {
      {"layers", [](PoolGeometry& g) { g.layers = 0; }, "layers = 0"},
      {"kv_factor", [](PoolGeometry& g) { g.kv_factor = 3; }, "kv_factor = 3"},
      {"kv_heads", [](PoolGeometry& g) { g.kv_heads = 0; }, "kv_heads = 0"},
      {"primary_blocks", [](PoolGeometry& g) { g.primary_blocks = 0; }, "primary_blocks = 0"},
      {"secondary_blocks", [](PoolGeometry& g) { g.secondary_blocks = -1; }, "secondary_blocks = -1"},
      {"split-x nvfp4",
       [](PoolGeometry& g) {
         g.layout = BlockLayout::split_x;
         g.dtype = CacheDtype::nvfp4;
         g.head_dim = 32;
       },
       "nvfp4"},
      {"element count",
       [](PoolGeometry& g) {
         g.tokens_per_block = 1024;
         g.head_dim = 1024;
         g.kv_heads = 1024;
         g.layers = 1024;
         g.primary_blocks = 10000000;  // 1024^4 * 2 (K, V) * 1e7 = 2.2e19 elements : its size in bits overflows int64
       },
       "overflows 64-bit"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.field);
    PoolGeometry g = base;
    c.apply(g);
    expect_error([&] { validate_geometry(g); }, ErrorCode::bad_geometry, "bad_geometry",
                 {c.mention, "geometry L="});
    Csr t;
    if (g.kv_heads > 0 && g.head_dim <= 64 && g.primary_blocks > 0)  // small enough to allocate its pool
      expect_scatter_rejected(g, t, ErrorCode::bad_geometry);
  }
  CHECK_NOTHROW(validate_geometry(base));
}

TEST_CASE("bad_window") {
  expect_error([&] { validate_window(WindowMapping::make(8, 8, 4, false)); }, ErrorCode::bad_window, "bad_window",
               {"sinks = 8", "window = 8", "rule"});
  expect_error([&] { validate_window(WindowMapping::make(-1, 0, 4, false)); }, ErrorCode::bad_window, "bad_window",
               {"window = -1"});
  expect_error([&] { validate_window(WindowMapping::make(0, 2, 4, false)); }, ErrorCode::bad_window, "bad_window",
               {"sinks = 2", "without a window"});
}

TEST_CASE("bad_strides") {
  const PoolGeometry g = test_geometry();
  PoolStrides s = contiguous_strides(g);
  s.inner[0].token = 3;  // NHD token stride below one token's H*D = 8 elements: rows overlap
  expect_error([&] { validate_strides(g, s, PoolKind::primary, g.pool_elements(PoolKind::primary)); },
               ErrorCode::bad_strides, "bad_strides", {"stride of token = 3", "overlaps"});
}

TEST_CASE("shape_mismatch for table arrays of the wrong size") {
  const PoolGeometry g = test_geometry();
  const Csr t;
  const std::vector<int32_t> empty;
  expect_error([&] { validate_csr(empty, t.indices, t.last_page_len, g, true); }, ErrorCode::shape_mismatch,
               "shape_mismatch", {"indptr is empty"});
  const std::vector<int32_t> short_last{2};
  expect_error([&] { validate_csr(t.indptr, t.indices, short_last, g, true); }, ErrorCode::shape_mismatch,
               "shape_mismatch", {"last_page_len has 1 entries", "2 sequences"});
  const std::vector<int64_t> lens{8};
  expect_error([&] { append_coordinates(t.append_indptr, lens); }, ErrorCode::shape_mismatch, "shape_mismatch",
               {"append_indptr has 3 entries", "1 sequences"});
}

// ---------------------------------------------------------------- positive: the contract's arithmetic

TEST_CASE("CsrPageTable: length and FlashInfer's divmod locate, P = 3, two sequences (worked by hand)") {
  const PoolGeometry g = test_geometry();
  const Csr t;
  REQUIRE_NOTHROW(validate_csr(t.indptr, t.indices, t.last_page_len, g, false));
  const CsrPageTable csr = make_csr_view(t.indptr, t.indices, t.last_page_len, g);
  CHECK(csr.batch == 2);
  CHECK(csr.num_pages(0) == 3);
  CHECK(csr.num_pages(1) == 2);
  CHECK(csr.length(0) == 8);  // (3 - 1) * 3 + 2
  CHECK(csr.length(1) == 6);  // (2 - 1) * 3 + 3

  // locate(b, pos): linear = indptr[b] * P + pos; (page slot, entry) = divmod(linear, 3); block = indices[slot].
  struct Expect {
    int32_t b;
    int64_t pos, slot;
    int32_t entry, block;
  };
  const Expect expect[] = {
      {0, 0, 0, 0, 7},  // 0*3 + 0 = 0  -> (0, 0) -> indices[0] = 7
      {0, 2, 0, 2, 7},  // 2            -> (0, 2) -> 7
      {0, 3, 1, 0, 2},  // 3            -> (1, 0) -> indices[1] = 2
      {0, 5, 1, 2, 2},  // 5            -> (1, 2) -> 2
      {0, 7, 2, 1, 9},  // 7 (last token: page 3 holds 2) -> (2, 1) -> indices[2] = 9
      {1, 0, 3, 0, 4},  // 1 starts at indptr 3: 3*3 + 0 = 9 -> (3, 0) -> indices[3] = 4
      {1, 2, 3, 2, 4},  // 11 -> (3, 2) -> 4
      {1, 4, 4, 1, 0},  // 13 -> (4, 1) -> indices[4] = 0
      {1, 5, 4, 2, 0},  // 14 (last token: full last page) -> (4, 2) -> 0
  };
  for (const Expect& e : expect) {
    CAPTURE(e.b);
    CAPTURE(e.pos);
    int64_t slot = -1;
    int32_t entry = -1;
    csr.locate(e.b, e.pos, slot, entry);
    CHECK(slot == e.slot);
    CHECK(entry == e.entry);
    CHECK(csr.block_at(slot).block() == e.block);
    CHECK(csr.block_at(slot).pool() == PoolKind::primary);
  }
}

TEST_CASE("CsrPageTable::locate is 64-bit: indptr[b] * P past 2^31") {
  // Only locate is used, so the arrays need not hold 3e6 indices.
  const int32_t indptr[] = {0, 3000000, 3000002};
  const int32_t last[] = {1024, 500};
  CsrPageTable csr{indptr, nullptr, last, 2, PageDivider::make(1024)};
  CHECK(csr.length(1) == 1024 + 500);
  int64_t slot = -1;
  int32_t entry = -1;
  // 3,000,000 * 1024 + 1500 = 3,072,001,500 = 3,000,001 * 1024 + 476
  csr.locate(1, 1500, slot, entry);
  CHECK(slot == 3000001);
  CHECK(entry == 476);
  // Same through plain division with a non-power-of-two page (P = 1000):
  csr.page = PageDivider::make(1000);
  csr.locate(1, 1500, slot, entry);  // 3,000,001,500 -> (3,000,001, 500)
  CHECK(slot == 3000001);
  CHECK(entry == 500);
}

TEST_CASE("DenseBlockTable::block_at: padding and out-of-row pages read as BAD_PAGE") {
  // Two sequences, up to 3 blocks each:
  //   sequence 0: 5, 1, pad
  //   sequence 1: 3, pad, pad
  const int32_t table[] = {5, 1, -1, 3, -1, -1};
  const DenseBlockTable t{table, 2, 3};
  CHECK(t.block_at(0, 0).block() == 5);
  CHECK(t.block_at(0, 1).block() == 1);
  CHECK(t.block_at(1, 0).block() == 3);
  CHECK(t.block_at(0, 2).is_bad());
  CHECK(t.block_at(1, 1).is_bad());
  CHECK(t.block_at(1, 2).is_bad());
  CHECK(t.block_at(0, 3).is_bad());  // beyond max_blocks_per_seq: not sequence 1's first entry
  CHECK(t.block_at(0, -1).is_bad());
  CHECK_FALSE(t.block_at(0, 0).is_bad());
}

TEST_CASE("locate_slot: slot = block * P + entry") {
  // 37 = 2 * 16 + 5 = 12 * 3 + 1
  CHECK(locate_slot(37, PageDivider::make(16)).block == 2);
  CHECK(locate_slot(37, PageDivider::make(16)).entry == 5);
  CHECK(locate_slot(37, PageDivider::make(3)).block == 12);
  CHECK(locate_slot(37, PageDivider::make(3)).entry == 1);
  CHECK(locate_slot(0, PageDivider::make(7)).block == 0);
  CHECK(locate_slot(0, PageDivider::make(7)).entry == 0);
  // 2^40 + 5 with P = 1024: block 2^30, entry 5; with P = 17: 2^40 = 64,677,154,575 * 17 + 1, so entry 6
  const int64_t big = (int64_t{1} << 40) + 5;
  CHECK(locate_slot(big, PageDivider::make(1024)).block == (int64_t{1} << 30));
  CHECK(locate_slot(big, PageDivider::make(1024)).entry == 5);
  CHECK(locate_slot(big, PageDivider::make(17)).block == 64677154575LL);
  CHECK(locate_slot(big, PageDivider::make(17)).entry == 6);
}

TEST_CASE("BlockRef: primary, secondary (top bit) and BAD_PAGE") {
  constexpr BlockRef p = BlockRef::primary(5);
  static_assert(p.raw == 5 && !p.is_bad() && !p.is_secondary() && p.block() == 5);
  const BlockRef s = BlockRef::secondary(5);
  CHECK(static_cast<uint32_t>(s.raw) == 0x80000005u);  // TensorRT-LLM KVCacheIndex: pool flag in bit 31
  CHECK(s.raw < 0);
  CHECK(s.is_secondary());
  CHECK_FALSE(s.is_bad());
  CHECK(s.block() == 5);
  CHECK(s.pool() == PoolKind::secondary);
  CHECK(p.pool() == PoolKind::primary);
  const BlockRef s0 = BlockRef::secondary(0);
  CHECK(static_cast<uint32_t>(s0.raw) == 0x80000000u);
  CHECK(s0.is_secondary());
  CHECK(s0.block() == 0);
  const BlockRef big = BlockRef::secondary(0x7FFFFFFE);
  CHECK(big.is_secondary());
  CHECK(big.block() == 0x7FFFFFFE);
  const BlockRef bad{};
  CHECK(bad.raw == -1);
  CHECK(bad.is_bad());
  CHECK_FALSE(bad.is_secondary());  // BAD_PAGE has the top bit set but is not a secondary reference
  CHECK(BlockRef{kBadPage}.is_bad());
  CHECK_FALSE(BlockRef::primary(0).is_bad());
  CHECK(describe_ref(s) == "secondary:5 (raw -2147483643)");  // 0x80000005 as int32
  CHECK(describe_ref(BlockRef{-2}) == "secondary:2147483646 (raw -2)");  // a stray negative id stays recognisable
  CHECK(describe_ref(p) == "5");
  CHECK(describe_ref(bad) == "BAD_PAGE(-1)");
}

TEST_CASE("append_coordinates against a hand-worked example") {
  // Three sequences with post-append lengths 8, 6, 4 append 2, 3 and 0 tokens:
  //   append_indptr = {0, 2, 5, 5}; positions[i] = i + len[b] - append_indptr[b + 1]
  //   sequence 0, i = 0, 1:    0 + 8 - 2 = 6, 7
  //   sequence 1, i = 2, 3, 4: 2 + 6 - 5 = 3, 4, 5
  //   sequence 2: nothing
  const std::vector<int32_t> append_indptr{0, 2, 5, 5};
  const std::vector<int64_t> lens{8, 6, 4};
  const BatchIndicesPositions c = append_coordinates(append_indptr, lens);
  CHECK(c.batch_indices == std::vector<int32_t>{0, 0, 1, 1, 1});
  CHECK(c.positions == std::vector<int32_t>{6, 7, 3, 4, 5});
  // A sequence appending its whole length (a prefill) gets positions 0..len-1.
  const std::vector<int32_t> prefill_indptr{0, 3};
  const std::vector<int64_t> prefill_len{3};
  const BatchIndicesPositions p = append_coordinates(prefill_indptr, prefill_len);
  CHECK(p.positions == std::vector<int32_t>{0, 1, 2});
  CHECK(p.batch_indices == std::vector<int32_t>{0, 0, 0});
}

// distinct_by_runs (validation's one-writer proof from runs of consecutive
// slots) against a sorted check: never "distinct" for a list with a repeat,
// always for lists made of disjoint page runs in any order, over odd run
// lengths, gaps, negative (skipped) entries and runs split by other runs.
TEST_CASE("distinct_by_runs proves page-run slot lists and never a list with a repeat") {
  uint64_t state = 12345;
  auto next = [&](uint64_t n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (state >> 33) % n;
  };
  int proven = 0, repeats = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    // Disjoint pages of 1..17 slots, each cut into 1..3 pieces, pieces shuffled.
    const int64_t page = 1 + static_cast<int64_t>(next(17));
    const int pages = 1 + static_cast<int>(next(9));
    std::vector<std::vector<int64_t>> pieces;
    std::vector<int64_t> order(64);
    for (int64_t i = 0; i < 64; ++i) order[i] = i;
    for (int64_t i = 63; i > 0; --i) std::swap(order[i], order[next(static_cast<uint64_t>(i + 1))]);
    for (int p = 0; p < pages; ++p) {
      const int64_t first = order[p] * page;
      const int64_t len = 1 + static_cast<int64_t>(next(static_cast<uint64_t>(page)));
      int64_t at = first;
      const int cuts = 1 + static_cast<int>(next(3));
      for (int c = 0; c < cuts && at < first + len; ++c) {
        const int64_t end = c + 1 == cuts ? first + len : std::min(first + len, at + 1 + static_cast<int64_t>(next(4)));
        std::vector<int64_t> piece;
        for (int64_t k = at; k < end; ++k) piece.push_back(k);
        if (next(5) == 0) piece.push_back(-1);  // a token that writes nothing
        pieces.push_back(piece);
        at = end;
      }
    }
    for (size_t i = pieces.size(); i > 1; --i) std::swap(pieces[i - 1], pieces[next(i)]);
    std::vector<int64_t> keys;
    for (const auto& piece : pieces) keys.insert(keys.end(), piece.begin(), piece.end());
    const bool repeat = trial % 2 == 1 && keys.size() > 1;
    if (repeat) {  // one slot written twice, anywhere
      std::vector<int64_t> live;
      for (int64_t k : keys)
        if (k >= 0) live.push_back(k);
      if (live.empty()) continue;
      keys.insert(keys.begin() + static_cast<int64_t>(next(keys.size() + 1)), live[next(live.size())]);
    }
    std::vector<int64_t> sorted;
    for (int64_t k : keys)
      if (k >= 0) sorted.push_back(k);
    std::sort(sorted.begin(), sorted.end());
    const bool distinct = std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
    const bool claim = distinct_by_runs(keys);
    if (claim) CHECK(distinct);  // never a false proof
    if (!repeat) CHECK(claim);   // disjoint page runs are always proven
    proven += claim;
    repeats += !distinct;
  }
  CHECK(proven > 1000);
  CHECK(repeats > 1000);
}
