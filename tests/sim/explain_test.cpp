// The explain library (sim/include/kvsim/sim/explain.hpp): the steps as data
// agree with core's offset function, the CSR and dense forms of one table give
// the same block and offsets, the text is the header plus the numbered steps,
// and bad requests raise core's named errors. The command line's byte-exact
// output is held by tests/cli (cli_test, docs_test).
#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <vector>

#include "kvsim/sim/explain.hpp"

using namespace kvsim;
using namespace kvsim::sim;

namespace {

PoolGeometry geometry(BlockLayout layout, LayerPlacement placement, CacheDtype dtype, int32_t page) {
  PoolGeometry g{.layers = 3, .kv_heads = 4, .tokens_per_block = page, .head_dim = 64, .dtype = dtype,
                 .layout = layout, .placement = placement, .primary_blocks = 12};
  return g;
}

std::optional<ErrorCode> error_of(const ExplainRequest& r) {
  try {
    explain(r);
  } catch (const ValidationError& e) {
    return e.code();
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("explain: offsets are core's element_offset for every layout, placement and dtype") {
  for (BlockLayout layout : {BlockLayout::nhd, BlockLayout::hnd, BlockLayout::split_x})
    for (LayerPlacement placement : {LayerPlacement::in_block, LayerPlacement::per_layer})
      for (CacheDtype dtype : {CacheDtype::bf16, CacheDtype::fp8_e4m3, CacheDtype::fp32, CacheDtype::nvfp4})
        for (int32_t page : {16, 7}) {
          if (layout == BlockLayout::split_x && dtype == CacheDtype::nvfp4) continue;
          ExplainRequest r;
          r.geometry = geometry(layout, placement, dtype, page);
          r.block_table = {5, 11, 2, 7};
          r.token = 2 * page + 3;
          r.layer = 2;
          r.head = 3;
          r.dim = 37;
          CAPTURE(geometry_summary(r.geometry));
          const Explanation e = explain(r);
          const PoolStrides s = contiguous_strides(r.geometry);
          CHECK(e.logical_page == 2);
          CHECK(e.entry == 3);
          CHECK(e.ref.block() == 2);
          CHECK(e.slot == 2 * page + 3);
          REQUIRE(e.tensors.size() == 2);
          for (const TensorOffsets& t : e.tensors) {
            const int64_t expect = element_offset(s, 2, 2, t.kv, 3, 3, 37);
            CHECK(t.element == expect);
            CHECK(t.byte == element_byte_offset(expect, dtype));
            int64_t sum = 0;
            for (const OffsetTerm& term : t.terms) sum += term.index * term.stride;
            CHECK(sum == expect);
            if (dtype == CacheDtype::nvfp4) {
              const PoolStrides ss = contiguous_strides(r.geometry.scale_geometry());
              CHECK(t.scale_element == scale_offset(ss, 2, 2, t.kv, 3, 3, 37));
              CHECK(t.high_nibble == ((expect & 1) != 0));
            }
          }
          const std::vector<ExplainStep> steps = explain_steps(e);
          std::vector<std::string> keys;
          for (const ExplainStep& step : steps) keys.push_back(step.key);
          std::vector<std::string> expect_keys{"window", "page", "table", "element", "byte"};
          if (dtype == CacheDtype::nvfp4) expect_keys.push_back("scale");
          CHECK(keys == expect_keys);
        }
}

TEST_CASE("explain: a CSR table and its dense form reach the same element; the window maps first") {
  ExplainRequest dense;
  dense.geometry = geometry(BlockLayout::hnd, LayerPlacement::per_layer, CacheDtype::bf16, 8);
  dense.block_table = {9, 4, 6};
  dense.token = 21;
  dense.window = 12;
  dense.sinks = 3;
  dense.head = 1;
  dense.dim = 5;
  ExplainRequest csr = dense;
  csr.csr = true;
  csr.block_table.clear();
  csr.indptr = {0, 2, 5};
  csr.indices = {1, 0, 9, 4, 6};
  csr.last_page_len = {8, 8};
  csr.seq = 1;
  const Explanation a = explain(dense), b = explain(csr);
  CHECK(a.cache_token == WindowMapping::make(12, 3, 8, false).cache_token(21));
  CHECK(a.cache_token == b.cache_token);
  CHECK(a.ref.raw == b.ref.raw);
  CHECK(a.entry == b.entry);
  CHECK(b.page_slot == a.logical_page + 2);
  CHECK(a.tensors[1].element == b.tensors[1].element);
}

TEST_CASE("explain_text is the header, a blank line, then each step numbered with its lines indented") {
  ExplainRequest r;
  r.geometry = geometry(BlockLayout::split_x, LayerPlacement::per_layer, CacheDtype::fp8_e4m3, 16);
  r.block_table = {3};
  r.token = 4;
  r.dim = 17;
  const Explanation e = explain(r);
  std::string expect;
  for (const std::string& line : explain_header(e)) expect += line + "\n";
  expect += "\n";
  int n = 0;
  for (const ExplainStep& step : explain_steps(e)) {
    expect += std::to_string(++n) + ". " + step.title + "\n";
    for (const std::string& line : step.lines) expect += "   " + line + "\n";
  }
  CHECK(explain_text(e) == expect);
  CHECK(explain_text(e).find("split-x: x = 16 bytes / 1 bytes = 16; K splits dim 17 into dim/x = 1, dim%x = 1") !=
        std::string::npos);
}

TEST_CASE("explain: bad requests raise core's named errors") {
  ExplainRequest r;
  r.geometry = geometry(BlockLayout::nhd, LayerPlacement::in_block, CacheDtype::bf16, 16);
  r.block_table = {4, -1, 2};
  r.token = 20;
  CHECK(error_of(r) == ErrorCode::write_through_bad_page);
  r.token = 48;
  CHECK(error_of(r) == ErrorCode::position_beyond_sequence);
  r.token = 2;
  r.head = 4;
  CHECK(error_of(r) == ErrorCode::bad_argument);
  r.head = 0;
  r.one_more_block = true;
  CHECK(error_of(r) == ErrorCode::bad_window);
  r.one_more_block = false;
  r.block_table = {4, 99};
  CHECK(error_of(r) == ErrorCode::block_out_of_range);
}

TEST_CASE("explain: a layer's own window from --layer-windows, and the null entries of a hybrid group table") {
  // Gemma-3-like: layers 0 and 1 slide over 8 tokens, layer 2 is global; vLLM's hybrid manager keeps a
  // sliding group's table indexed by position with released pages pointing at the null block 0.
  ExplainRequest r;
  r.geometry = geometry(BlockLayout::nhd, LayerPlacement::in_block, CacheDtype::bf16, 4);
  r.layer_windows = {8, 8, 0};
  r.null_block = 0;
  r.block_table = {0, 0, 7, 9};  // pages 0 and 1 released
  r.token = 13;
  r.layer = 1;
  const Explanation e = explain(r);
  CHECK(e.window.enabled());
  CHECK(e.window.window == 8);
  CHECK(e.window.linear);             // no ring: the slot is the position
  CHECK(e.cache_token == 13);
  CHECK(e.ref.block() == 9);
  CHECK(e.null_entries == std::vector<int64_t>{0, 1});
  const std::string text = explain_text(e);
  CHECK(text.find("layer 1 of [8,8,0]: sliding window W = 8") != std::string::npos);
  CHECK(text.find("null entries (block 0, released: outside layer 1's window): block_table[0], block_table[1]") !=
        std::string::npos);
  CHECK(text.find("cyclic_len") == std::string::npos);  // a linear window has no ring to print

  // The global layer: no window; the same table read for it is the group-window bug (vLLM PR #51756).
  r.layer = 2;
  r.token = 13;
  const Explanation full = explain(r);
  CHECK_FALSE(full.window.enabled());
  CHECK(explain_text(full).find("layer 2 has full attention and needs every page before its token") !=
        std::string::npos);
  r.token = 5;  // on page 1: the null block
  CHECK(error_of(r) == ErrorCode::bad_window);
  r.layer = 0;  // sliding layer, token before its window
  CHECK(error_of(r) == ErrorCode::bad_window);

  // Without the hybrid manager the layer's window is TensorRT-LLM's ring (VSWA): token 13 -> slot 13 mod 8 = 5.
  r.null_block.reset();
  r.block_table = {3, 7};
  r.token = 13;
  const Explanation ring = explain(r);
  CHECK_FALSE(ring.window.linear);
  CHECK(ring.cache_token == 5);
  CHECK(ring.ref.block() == 7);

  // Bad requests: one entry per layer, not both forms of the window, a null block inside the pool.
  r.layer_windows = {8, 0};
  CHECK(error_of(r) == ErrorCode::bad_argument);
  r.layer_windows = {8, 8, 0};
  r.window = 8;
  CHECK(error_of(r) == ErrorCode::bad_argument);
  r.window = 0;
  r.null_block = 12;
  CHECK(error_of(r) == ErrorCode::block_out_of_range);
}
