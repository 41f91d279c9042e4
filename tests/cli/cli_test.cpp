// CLI tests: run the built `kvsim` binary (KVSIM_BINARY) through popen with
// stdout and stderr captured and the exit status checked. Every number the
// CLI prints is compared with core functions called here (contiguous_strides,
// element_offset, scale_offset, WindowMapping, PageDivider, CsrPageTable,
// codecs), plus a few values worked out by hand from the contract formulas.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvsim/validation.hpp"

using nlohmann::json;
using namespace kvsim;

namespace {

struct RunResult {
  int status = -1;
  std::string out;
  std::string err;
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string temp_path() {
  char name[] = "/tmp/kvsim_cli_test_XXXXXX";
  const int fd = mkstemp(name);
  REQUIRE(fd >= 0);
  close(fd);
  return name;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Runs kvsim with `args`; stdin is `input` (empty file when not given).
RunResult run_kvsim(const std::vector<std::string>& args, const std::string& input = "") {
  const std::string err_path = temp_path();
  const std::string in_path = temp_path();
  {
    std::ofstream in(in_path, std::ios::binary);
    in << input;
  }
  std::string cmd = quote(KVSIM_BINARY);
  for (const std::string& a : args) cmd += " " + quote(a);
  cmd += " <" + quote(in_path) + " 2>" + quote(err_path);
  RunResult r;
  FILE* pipe = popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) r.out.append(buf, n);
  const int raw = pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.err = read_file(err_path);
  std::remove(err_path.c_str());
  std::remove(in_path.c_str());
  return r;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

std::string join(const std::vector<int32_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

std::string hex_code(uint32_t code, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*x", digits, code);
  return buf;
}

// ---------------------------------------------------------------- geometry helpers

struct Geo {
  std::string layout = "nhd";
  std::string placement = "in_block";
  std::string dtype = "bf16";
  int32_t layers = 1, kv_factor = 2, kv_heads = 8, head_dim = 128, page_size = 16;
  int64_t blocks = 64, secondary = 0;

  std::vector<std::string> flags() const {
    return {"--layout",   layout,    "--placement", placement, "--dtype",    dtype,
            "--layers",   std::to_string(layers),   "--kv-factor",           std::to_string(kv_factor),
            "--kv-heads", std::to_string(kv_heads), "--head-dim",            std::to_string(head_dim),
            "--page-size", std::to_string(page_size), "--blocks",            std::to_string(blocks),
            "--secondary-blocks", std::to_string(secondary)};
  }
  PoolGeometry core() const {
    PoolGeometry g;
    g.layout = *parse_layout(layout);
    g.placement = *parse_placement(placement);
    g.dtype = *parse_dtype(dtype);
    g.layers = layers;
    g.kv_factor = kv_factor;
    g.kv_heads = kv_heads;
    g.head_dim = head_dim;
    g.tokens_per_block = page_size;
    g.primary_blocks = blocks;
    g.secondary_blocks = secondary;
    validate_geometry(g);
    return g;
  }
  std::string name() const {
    return layout + "/" + placement + "/" + dtype + " L" + std::to_string(layers) + " F" + std::to_string(kv_factor) +
           " H" + std::to_string(kv_heads) + " D" + std::to_string(head_dim) + " P" + std::to_string(page_size);
  }
};

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

void check_inner_strides(const json& j, const InnerStrides& s) {
  CHECK(j.at("head").get<int64_t>() == s.head);
  CHECK(j.at("token").get<int64_t>() == s.token);
  CHECK(j.at("dim_outer").get<int64_t>() == s.dim_outer);
  CHECK(j.at("dim_inner").get<int64_t>() == s.dim_inner);
  CHECK(j.at("x").get<int32_t>() == s.x);
}

void check_strides(const json& j, const PoolStrides& s, int32_t kv_factor) {
  CHECK(j.at("block").get<int64_t>() == s.block);
  CHECK(j.at("layer").get<int64_t>() == s.layer);
  CHECK(j.at("kv").get<int64_t>() == s.kv);
  check_inner_strides(j.at("inner").at("k"), s.inner[0]);
  if (kv_factor == 2)
    check_inner_strides(j.at("inner").at("v"), s.inner[1]);
  else
    CHECK(j.at("inner").at("v").is_null());
}

// Offset of a coordinate through the axes `layout --json` prints: each axis
// name picks its coordinate. Equal to element_offset for every coordinate iff
// the printed shape and strides describe the pool correctly.
int64_t offset_via_axes(const json& outer, const json& inner, int64_t block, int32_t layer, int32_t kv, int32_t head,
                        int32_t token, int32_t dim, int32_t x) {
  int64_t offset = 0;
  auto coord = [&](const std::string& name) -> int64_t {
    if (name == "block") return block;
    if (name == "layer") return layer;
    if (name == "kv") return kv;
    if (name == "head") return head;
    if (name == "token") return token;
    if (name == "dim") return dim;
    if (name == "dim/x") return dim / x;
    if (name == "x") return dim % x;
    FAIL("unknown axis " << name);
    return 0;
  };
  for (const json* axes : {&outer, &inner})
    for (const json& a : *axes) {
      const int64_t c = coord(a.at("name").get<std::string>());
      CHECK(c < a.at("extent").get<int64_t>());
      offset += c * a.at("stride").get<int64_t>();
    }
  return offset;
}

void check_pool_json(const json& pool, const PoolGeometry& g, PoolKind kind) {
  const PoolStrides s = contiguous_strides(g, kind);
  CHECK(pool.at("blocks").get<int64_t>() == g.blocks(kind));
  CHECK(pool.at("elements").get<int64_t>() == g.pool_elements(kind));
  CHECK(pool.at("bytes").get<int64_t>() == g.pool_bytes(kind));
  check_strides(pool.at("strides"), s, g.kv_factor);
  if (g.blocks(kind) == 0) return;
  // Every coordinate: the printed axes give element_offset's value.
  for (int32_t kv = 0; kv < g.kv_factor; ++kv) {
    const json& inner = pool.at("inner_axes").at(kv == 0 ? "k" : "v");
    const int32_t x = s.inner[kv].x;
    for (int64_t b = 0; b < g.blocks(kind); ++b)
      for (int32_t l = 0; l < g.layers; ++l)
        for (int32_t h = 0; h < g.kv_heads; ++h)
          for (int32_t t = 0; t < g.tokens_per_block; ++t)
            for (int32_t d = 0; d < g.head_dim; ++d)
              REQUIRE(offset_via_axes(pool.at("outer_axes"), inner, b, l, kv, h, t, d, x) ==
                      element_offset(s, b, l, kv, h, t, d));
  }
  if (g.kv_factor == 1) CHECK(pool.at("inner_axes").at("v").is_null());
}

std::vector<std::string> axis_names(const json& axes) {
  std::vector<std::string> names;
  for (const json& a : axes) names.push_back(a.at("name").get<std::string>());
  return names;
}

}  // namespace

// ---------------------------------------------------------------- top level

TEST_CASE("kvsim --version prints the core version and exits 0") {
  const RunResult r = run_kvsim({"--version"});
  CHECK(r.status == 0);
  CHECK(r.out == std::string("kvsim ") + kVersion + "\n");
}

TEST_CASE("kvsim without a subcommand, or with an unknown one, is a usage error") {
  for (const auto& args : {std::vector<std::string>{}, std::vector<std::string>{"frobnicate"},
                           std::vector<std::string>{"layout", "--no-such-flag"}}) {
    const RunResult r = run_kvsim(args);
    CHECK(r.status == 2);
    CHECK(r.out.empty());
    CHECK(r.err.find("kvsim: error:") != std::string::npos);
  }
}

TEST_CASE("mma-check: bad input is refused by name before the device is asked") {
  for (const auto& args : {std::vector<std::string>{"mma-check", "--count", "0", "--targeted", "0"},
                           std::vector<std::string>{"mma-check", "--dump", "/nonexistent-dir/x"},
                           std::vector<std::string>{"mma-check", "--type", "int8"}}) {
    const RunResult r = run_kvsim(args);
    CHECK(r.status == 2);
    CHECK(r.out.empty());
    CHECK(r.err.find(args[1] == "--type" ? "bad_usage" : "bad_argument") != std::string::npos);
  }
  if (!KVSIM_HAVE_CUDA) {  // with CUDA the check runs (tests/cuda: cuda.kvsim_mma_check)
    const RunResult r = run_kvsim({"mma-check", "--count", "128", "--targeted", "0"});
    CHECK(r.status == 2);
    CHECK(r.err.find("backend_unavailable") != std::string::npos);
  }
}

// ---------------------------------------------------------------- layout

TEST_CASE("layout text reports the element size, block and pool bytes and strides") {
  Geo geo;  // the defaults: nhd, in_block, L1, F2, H8, D128, P16, bf16, 64 blocks
  const PoolGeometry g = geo.core();
  const RunResult r = run_kvsim({"layout"});
  REQUIRE(r.status == 0);
  const PoolStrides s = contiguous_strides(g);
  CHECK(r.out.find(geometry_summary(g)) != std::string::npos);
  CHECK(r.out.find("16 bits") != std::string::npos);
  CHECK(r.out.find(std::to_string(g.block_bytes()) + " bytes") != std::string::npos);
  CHECK(r.out.find(std::to_string(g.pool_bytes(PoolKind::primary)) + " bytes") != std::string::npos);
  CHECK(r.out.find("tensor  [block 64][layer 1][kv 2][token 16][head 8][dim 128]") != std::string::npos);
  CHECK(r.out.find("strides  block " + std::to_string(s.block) + "  layer " + std::to_string(s.layer) + "  kv " +
                   std::to_string(s.kv) + "  token " + std::to_string(s.inner[0].token) + "  head " +
                   std::to_string(s.inner[0].head) + "  dim " + std::to_string(s.inner[0].dim_inner)) !=
        std::string::npos);

  // The same through explicit flags: split-x prints x and both inner layouts.
  Geo sx;
  sx.layout = "split-x";
  sx.dtype = "fp8_e4m3";
  const RunResult rs = run_kvsim(concat({"layout"}, sx.flags()));
  REQUIRE(rs.status == 0);
  CHECK(rs.out.find("split-x x        16 elements = 16 bytes") != std::string::npos);
  CHECK(rs.out.find("tensor  [block 64][layer 1][kv 2][block-inner]") != std::string::npos);
  CHECK(rs.out.find("K inner [head 8][dim/x 8][token 16][x 16]") != std::string::npos);
  CHECK(rs.out.find("V inner [head 8][dim 128][token 16]") != std::string::npos);
}

TEST_CASE("layout --json matches PoolGeometry and contiguous_strides for every layout, placement and dtype") {
  for (const char* layout : {"nhd", "hnd", "split-x"})
    for (const char* placement : {"in_block", "per_layer"})
      for (const char* dtype : {"fp32", "bf16", "fp8_e4m3", "int8", "nvfp4"})
        for (int32_t kv_factor : {1, 2}) {
          Geo geo{.layout = layout, .placement = placement, .dtype = dtype, .layers = 2, .kv_factor = kv_factor,
                  .kv_heads = 2, .head_dim = 32, .page_size = 3, .blocks = 3, .secondary = 2};
          if (geo.layout == "split-x" && geo.dtype == "nvfp4") continue;  // rejected, tested below
          CAPTURE(geo.name());
          const PoolGeometry g = geo.core();
          const RunResult r = run_kvsim(concat({"layout", "--json"}, geo.flags()));
          REQUIRE(r.status == 0);
          const json j = json::parse(r.out);
          CHECK(j.at("kvsim_version") == kVersion);
          CHECK(j.at("geometry").at("layout") == layout_name(g.layout));
          CHECK(j.at("geometry").at("placement") == placement_name(g.placement));
          CHECK(j.at("geometry").at("dtype") == dtype_name(g.dtype));
          CHECK(j.at("element_bits").get<int>() == bits_per_element(g.dtype));
          CHECK(j.at("inner_elements").get<int64_t>() == g.inner_elements());
          CHECK(j.at("block_elements").get<int64_t>() == g.block_elements());
          CHECK(j.at("bytes_per_block").get<int64_t>() == g.block_bytes());
          if (g.layout == BlockLayout::split_x)
            CHECK(j.at("split_x").get<int32_t>() == g.split_x());
          else
            CHECK(j.at("split_x").is_null());
          check_pool_json(j.at("pools").at("primary"), g, PoolKind::primary);
          check_pool_json(j.at("pools").at("secondary"), g, PoolKind::secondary);

          const json& outer = j.at("pools").at("primary").at("outer_axes");
          if (g.placement == LayerPlacement::in_block)
            CHECK(axis_names(outer) == std::vector<std::string>{"block", "layer", "kv"});
          else
            CHECK(axis_names(outer) == std::vector<std::string>{"layer", "block", "kv"});
          const json& k_axes = j.at("pools").at("primary").at("inner_axes").at("k");
          switch (g.layout) {
            case BlockLayout::nhd: CHECK(axis_names(k_axes) == std::vector<std::string>{"token", "head", "dim"}); break;
            case BlockLayout::hnd: CHECK(axis_names(k_axes) == std::vector<std::string>{"head", "token", "dim"}); break;
            case BlockLayout::split_x:
              CHECK(axis_names(k_axes) == std::vector<std::string>{"head", "dim/x", "token", "x"});
              if (kv_factor == 2)
                CHECK(axis_names(j.at("pools").at("primary").at("inner_axes").at("v")) ==
                      std::vector<std::string>{"head", "dim", "token"});
              break;
          }

          if (g.has_scale_pool()) {
            const PoolGeometry sg = g.scale_geometry();
            const json& sp = j.at("scale_pool");
            CHECK(sp.at("elements_per_scale").get<int>() == codec::kNvfp4BlockElems);
            CHECK(sp.at("bytes_per_block").get<int64_t>() == sg.block_bytes());
            CHECK(sp.at("geometry").at("head_dim").get<int32_t>() == g.head_dim / 16);
            check_pool_json(sp.at("pools").at("primary"), sg, PoolKind::primary);
            check_pool_json(sp.at("pools").at("secondary"), sg, PoolKind::secondary);
          } else {
            CHECK(j.at("scale_pool").is_null());
          }
        }
}

TEST_CASE("layout sizes worked by hand: bf16 NHD, 2 layers, H 8, D 128, P 16, 64 blocks") {
  // block = L * F * H * P * D elements = 2 * 2 * 8 * 16 * 128 = 65536 elements = 131072 bytes
  Geo geo;
  geo.layers = 2;
  const RunResult r = run_kvsim(concat({"layout", "--json"}, geo.flags()));
  REQUIRE(r.status == 0);
  const json j = json::parse(r.out);
  CHECK(j.at("bytes_per_block").get<int64_t>() == 131072);
  CHECK(j.at("pools").at("primary").at("bytes").get<int64_t>() == 131072LL * 64);
  const json& s = j.at("pools").at("primary").at("strides");
  CHECK(s.at("block").get<int64_t>() == 65536);   // L * F * H * P * D
  CHECK(s.at("layer").get<int64_t>() == 32768);   // F * H * P * D
  CHECK(s.at("kv").get<int64_t>() == 16384);      // H * P * D
  CHECK(s.at("inner").at("k").at("token").get<int64_t>() == 1024);  // H * D
  CHECK(s.at("inner").at("k").at("head").get<int64_t>() == 128);    // D
}

TEST_CASE("layout rejects bad flags and bad geometries with exit 2 and a named error") {
  struct Case {
    std::vector<std::string> args;
    const char* expect;
  } cases[] = {
      {{"layout", "--dtype", "fp9"}, "--dtype"},
      {{"layout", "--layout", "nchw"}, "--layout"},
      {{"layout", "--placement", "sideways"}, "--placement"},
      {{"layout", "--layers", "abc"}, "--layers"},
      {{"layout", "--page-size", "0"}, "unsupported_page_size"},
      {{"layout", "--page-size", "1025"}, "unsupported_page_size"},
      {{"layout", "--blocks", "0"}, "bad_geometry"},
      {{"layout", "--kv-factor", "3"}, "bad_geometry"},
      {{"layout", "--layout", "split-x", "--dtype", "nvfp4"}, "bad_geometry"},
      {{"layout", "--dtype", "nvfp4", "--head-dim", "40"}, "unsupported_head_dim"},
      {{"layout", "--layout", "split-x", "--dtype", "fp32", "--head-dim", "6"}, "unsupported_head_dim"},
  };
  for (const Case& c : cases) {
    const RunResult r = run_kvsim(c.args);
    CAPTURE(c.args);
    CHECK(r.status == 2);
    CHECK(r.out.empty());
    CHECK(r.err.find(c.expect) != std::string::npos);
  }
}

// ---------------------------------------------------------------- explain

namespace {

struct WindowArgs {
  int32_t window = 0, sinks = 0;
  bool one_more_block = false;
};

std::vector<std::string> window_flags(const WindowArgs& w) {
  std::vector<std::string> f;
  if (w.window > 0) f = {"--window", std::to_string(w.window), "--sinks", std::to_string(w.sinks)};
  if (w.one_more_block) f.push_back("--one-more-block");
  return f;
}

// Checks the offsets of an explain --json object against core for the
// physical (block, entry) the test derived itself.
void check_offsets(const json& j, const PoolGeometry& g, int64_t block, int32_t entry, int32_t layer, int32_t head,
                   int32_t dim) {
  const PoolStrides s = contiguous_strides(g);
  check_strides(j.at("strides"), s, g.kv_factor);
  const int64_t k = element_offset(s, block, layer, 0, head, entry, dim);
  CHECK(j.at("k_offset").get<int64_t>() == k);
  CHECK(j.at("k_byte_offset").get<int64_t>() == element_byte_offset(k, g.dtype));
  int64_t sum = 0;  // the printed terms must add up to the offset
  for (const json& t : j.at("k_terms")) sum += t.at("index").get<int64_t>() * t.at("stride").get<int64_t>();
  CHECK(sum == k);
  if (g.kv_factor == 2) {
    const int64_t v = element_offset(s, block, layer, 1, head, entry, dim);
    CHECK(j.at("v_offset").get<int64_t>() == v);
    CHECK(j.at("v_byte_offset").get<int64_t>() == element_byte_offset(v, g.dtype));
  } else {
    // Documented: with kv_factor 1 every v_* key is present and null.
    for (const char* key : {"v_offset", "v_byte_offset", "v_terms", "v_nibble", "v_scale_offset", "v_scale_byte_offset"})
      CHECK(j.at(key).is_null());
  }
  if (g.dtype == CacheDtype::nvfp4) {
    const PoolGeometry sg = g.scale_geometry();
    const PoolStrides ss = contiguous_strides(sg);
    check_strides(j.at("scale_strides"), ss, g.kv_factor);
    const int64_t ks = scale_offset(ss, block, layer, 0, head, entry, dim);
    CHECK(j.at("k_nibble") == ((k & 1) ? "high" : "low"));
    CHECK(j.at("k_scale_offset").get<int64_t>() == ks);
    CHECK(j.at("k_scale_byte_offset").get<int64_t>() == element_byte_offset(ks, sg.dtype));
    if (g.kv_factor == 2) {
      const int64_t v = element_offset(s, block, layer, 1, head, entry, dim);
      const int64_t vs = scale_offset(ss, block, layer, 1, head, entry, dim);
      CHECK(j.at("v_nibble") == ((v & 1) ? "high" : "low"));
      CHECK(j.at("v_scale_offset").get<int64_t>() == vs);
      CHECK(j.at("v_scale_byte_offset").get<int64_t>() == element_byte_offset(vs, sg.dtype));
    }
  } else {
    for (const char* key : {"k_nibble", "v_nibble", "scale_strides", "k_scale_offset", "v_scale_offset",
                            "k_scale_byte_offset", "v_scale_byte_offset"})
      CHECK(j.at(key).is_null());
  }
}

// explain --json with a dense block table; every key checked against core.
void check_dense_explain(const Geo& geo, const std::vector<int32_t>& table, int64_t token, int32_t layer, int32_t head,
                         int32_t dim, const WindowArgs& w = {}) {
  const PoolGeometry g = geo.core();
  const WindowMapping wm = WindowMapping::make(w.window, w.sinks, g.tokens_per_block, w.one_more_block);
  const int64_t cache_token = wm.cache_token(token);
  const PageDivider d = g.page_divider();
  const int64_t page = d.div(cache_token);
  const int32_t entry = d.mod(cache_token);
  const DenseBlockTable dt{table.data(), 1, static_cast<int32_t>(table.size())};
  const BlockRef ref = dt.block_at(0, page);
  REQUIRE(page < static_cast<int64_t>(table.size()));  // the caller picks tokens inside the table
  REQUIRE(!ref.is_bad());

  std::vector<std::string> args = concat({"explain", "--json", "--block-table", join(table), "--token",
                                          std::to_string(token), "--layer", std::to_string(layer), "--head",
                                          std::to_string(head), "--dim", std::to_string(dim)},
                                         geo.flags());
  args = concat(args, window_flags(w));
  CAPTURE(geo.name());
  CAPTURE(token);
  CAPTURE(w.window);
  CAPTURE(w.sinks);
  const RunResult r = run_kvsim(args);
  REQUIRE_MESSAGE(r.status == 0, r.err);
  const json j = json::parse(r.out);
  CHECK(j.at("token").get<int64_t>() == token);
  CHECK(j.at("cache_token").get<int64_t>() == cache_token);
  if (wm.enabled()) {
    CHECK(j.at("window").at("bubble").get<int32_t>() == wm.bubble);
    CHECK(j.at("window").at("cyclic_len").get<int64_t>() == wm.cyclic_len);
    CHECK(j.at("window").at("is_sink").get<bool>() == wm.is_sink(token));
  } else {
    CHECK(j.at("window").is_null());
  }
  CHECK(j.at("page_divider").at("pow2").get<bool>() == d.pow2);
  CHECK(j.at("logical_page").get<int64_t>() == page);
  CHECK(j.at("page_slot").get<int64_t>() == page);
  CHECK(j.at("entry").get<int32_t>() == entry);
  CHECK(j.at("block_ref").get<int32_t>() == ref.raw);
  CHECK(j.at("block").get<int64_t>() == ref.block());
  CHECK(j.at("pool") == "primary");
  const SlotLocation slot = locate_slot(j.at("slot").get<int64_t>(), d);
  CHECK(slot.block == ref.block());
  CHECK(slot.entry == entry);
  CHECK(j.at("table").at("kind") == "dense");
  CHECK(j.at("table").at("block_table").get<std::vector<int32_t>>() == table);
  check_offsets(j, g, ref.block(), entry, layer, head, dim);
}

}  // namespace

TEST_CASE("explain worked by hand: bf16 NHD in_block, token 37 of table [4,9,2,7]") {
  // P = 16: page = 37 >> 4 = 2, entry = 37 & 15 = 5, block = table[2] = 2.
  // K = block*(L*F*H*P*D) + entry*(H*D) + head*D + dim = 2*32768 + 5*1024 + 3*128 + 70
  const RunResult r = run_kvsim({"explain", "--json", "--block-table", "4,9,2,7", "--token", "37", "--head", "3",
                                 "--dim", "70"});
  REQUIRE(r.status == 0);
  const json j = json::parse(r.out);
  CHECK(j.at("logical_page").get<int64_t>() == 2);
  CHECK(j.at("entry").get<int32_t>() == 5);
  CHECK(j.at("block").get<int64_t>() == 2);
  CHECK(j.at("slot").get<int64_t>() == 2 * 16 + 5);
  CHECK(j.at("k_offset").get<int64_t>() == 2 * 32768 + 5 * 1024 + 3 * 128 + 70);
  CHECK(j.at("v_offset").get<int64_t>() == 2 * 32768 + 16384 + 5 * 1024 + 3 * 128 + 70);
  CHECK(j.at("k_byte_offset").get<int64_t>() == 2 * (2 * 32768 + 5 * 1024 + 3 * 128 + 70));
  CHECK(j.at("page_divider").at("pow2").get<bool>());
  CHECK(j.at("page_divider").at("shift").get<int>() == 4);
  CHECK(j.at("page_divider").at("mask").get<int>() == 15);

  // The text form shows the same steps.
  const RunResult t = run_kvsim({"explain", "--block-table", "4,9,2,7", "--token", "37", "--head", "3", "--dim", "70"});
  REQUIRE(t.status == 0);
  CHECK(t.out.find("logical_page = cache_token >> 4 = 37 >> 4 = 2; entry = cache_token & 15 = 37 & 15 = 5") !=
        std::string::npos);
  CHECK(t.out.find("block_table[2] = 2 -> primary block 2") != std::string::npos);
  CHECK(t.out.find("= 71110") != std::string::npos);
}

TEST_CASE("explain --json matches core over layouts, placements, dtypes and odd page sizes") {
  const std::vector<int32_t> table = {5, 0, 7, 2, 6};
  for (const char* layout : {"nhd", "hnd", "split-x"})
    for (const char* placement : {"in_block", "per_layer"})
      for (int32_t page_size : {3, 7, 16, 17}) {
        Geo geo;
        geo.layout = layout;
        geo.placement = placement;
        geo.page_size = page_size;
        geo.layers = 3;
        geo.kv_heads = 4;
        geo.head_dim = 64;
        geo.blocks = 8;
        geo.dtype = (page_size == 7) ? "fp8_e4m3" : (page_size == 17 ? "fp32" : "bf16");
        const int64_t tokens = static_cast<int64_t>(table.size()) * page_size;
        for (int64_t token : {int64_t{0}, int64_t{1}, int64_t{page_size - 1}, int64_t{page_size}, tokens / 2 + 1,
                              tokens - 1})
          check_dense_explain(geo, table, token, 2, 3, 61);
      }
}

TEST_CASE("explain: kv_factor 1 (MLA latent) has no V") {
  Geo geo{.kv_factor = 1, .kv_heads = 1, .head_dim = 576, .page_size = 7};
  check_dense_explain(geo, {3, 1}, 9, 0, 0, 575);
  const RunResult t = run_kvsim(concat({"explain", "--block-table", "3,1", "--token", "9"}, geo.flags()));
  REQUIRE(t.status == 0);
  CHECK(t.out.find("no V") != std::string::npos);
}

TEST_CASE("explain: nvfp4 nibbles and scale offsets match core") {
  for (const char* layout : {"nhd", "hnd"})
    for (const char* placement : {"in_block", "per_layer"})
      for (int32_t dim : {0, 1, 15, 16, 77, 127}) {
        Geo geo{.layout = layout, .placement = placement, .dtype = "nvfp4", .layers = 2, .kv_heads = 2,
                .page_size = 3};
        check_dense_explain(geo, {4, 1, 9}, 7, 1, 1, dim);
      }
}

TEST_CASE("explain: window with sinks (S not a multiple of P) maps tokens as WindowMapping does") {
  // W 20, S 5, P 7: bubble = 7 - 5 = 2; the ring holds W - S = 15 (or W + P - S = 22) tokens.
  Geo geo{.kv_heads = 2, .head_dim = 32, .page_size = 7};
  const std::vector<int32_t> table = {3, 8, 1, 6, 2};
  for (bool one_more : {false, true})
    for (int64_t token = 0; token < 60; token += (token < 24 ? 1 : 7))
      check_dense_explain(geo, table, token, 0, 1, 31, WindowArgs{20, 5, one_more});

  // By hand: token 30 >= S: 5 + 2 + (30 - 5) mod 15 = 17 -> page 17 / 7 = 2, entry 3.
  const RunResult r = run_kvsim(concat({"explain", "--json", "--block-table", join(table), "--token", "30", "--window",
                                        "20", "--sinks", "5"},
                                       geo.flags()));
  REQUIRE(r.status == 0);
  const json j = json::parse(r.out);
  CHECK(j.at("window").at("bubble").get<int>() == 2);
  CHECK(j.at("window").at("cyclic_len").get<int>() == 15);
  CHECK(j.at("cache_token").get<int64_t>() == 17);
  CHECK(j.at("logical_page").get<int64_t>() == 2);
  CHECK(j.at("entry").get<int>() == 3);
  CHECK(j.at("block").get<int64_t>() == 1);
  CHECK(j.at("page_divider").at("pow2").get<bool>() == false);
}

TEST_CASE("explain with a CSR page table follows FlashInfer's divmod") {
  const std::vector<int32_t> indptr = {0, 3, 5, 6};
  const std::vector<int32_t> indices = {4, 9, 2, 7, 1, 0};
  const std::vector<int32_t> last_page_len = {2, 3, 1};  // valid for P 3 and P 16
  for (int32_t page_size : {3, 16}) {
    Geo geo{.kv_heads = 2, .head_dim = 16, .page_size = page_size, .blocks = 16};
    const PoolGeometry g = geo.core();
    const CsrPageTable csr = make_csr_view(indptr, indices, last_page_len, g);
    for (int32_t seq = 0; seq < csr.batch; ++seq)
      for (int64_t pos = 0; pos < csr.length(seq); ++pos) {
        CAPTURE(page_size);
        CAPTURE(seq);
        CAPTURE(pos);
        int64_t page_slot = 0;
        int32_t entry = 0;
        csr.locate(seq, pos, page_slot, entry);
        const BlockRef ref = csr.block_at(page_slot);
        const RunResult r = run_kvsim(concat({"explain", "--json", "--indptr", join(indptr), "--indices", join(indices),
                                              "--last-page-len", join(last_page_len), "--seq", std::to_string(seq),
                                              "--token", std::to_string(pos), "--head", "1", "--dim", "9"},
                                             geo.flags()));
        REQUIRE_MESSAGE(r.status == 0, r.err);
        const json j = json::parse(r.out);
        CHECK(j.at("table").at("kind") == "csr");
        CHECK(j.at("table").at("length").get<int64_t>() == csr.length(seq));
        CHECK(j.at("table").at("num_pages").get<int32_t>() == csr.num_pages(seq));
        CHECK(j.at("cache_token").get<int64_t>() == pos);
        CHECK(j.at("page_slot").get<int64_t>() == page_slot);
        CHECK(j.at("logical_page").get<int64_t>() == page_slot - indptr[seq]);
        CHECK(j.at("entry").get<int32_t>() == entry);
        CHECK(j.at("block").get<int64_t>() == ref.block());
        check_offsets(j, g, ref.block(), entry, 0, 1, 9);
      }
  }
  // By hand, P 16: sequence 1 has length (2 - 1) * 16 + 3 = 19; position 18 is
  // linear 3 * 16 + 18 = 66 -> page slot 4, entry 2 -> indices[4] = 1.
  Geo geo;
  const RunResult r = run_kvsim(concat({"explain", "--json", "--indptr", "0,3,5,6", "--indices", "4,9,2,7,1,0",
                                        "--last-page-len", "5,3,1", "--seq", "1", "--token", "18"},
                                       geo.flags()));
  REQUIRE(r.status == 0);
  const json j = json::parse(r.out);
  CHECK(j.at("table").at("length").get<int64_t>() == 19);
  CHECK(j.at("linear_token").get<int64_t>() == 66);
  CHECK(j.at("page_slot").get<int64_t>() == 4);
  CHECK(j.at("entry").get<int32_t>() == 2);
  CHECK(j.at("block").get<int64_t>() == 1);
}

TEST_CASE("explain errors exit 2 with the rule's name and print nothing on stdout") {
  struct Case {
    std::vector<std::string> args;
    const char* expect;
  } cases[] = {
      {{"--block-table", "4,-1,2", "--token", "20"}, "write_through_bad_page"},
      {{"--block-table", "4,1,2", "--token", "48"}, "position_beyond_sequence"},
      {{"--block-table", "4,s1,2", "--token", "20", "--secondary-blocks", "4"}, "secondary_not_onboarded"},
      {{"--block-table", "4,0x80000001,2", "--token", "20", "--secondary-blocks", "4"}, "secondary_not_onboarded"},
      {{"--block-table", "4,64,2", "--token", "20"}, "block_out_of_range"},
      {{"--block-table", "4,x,2", "--token", "20"}, "bad_argument"},
      {{"--block-table", "4", "--token", "2", "--dtype", "fp9"}, "--dtype"},
      {{"--block-table", "4", "--token", "2", "--page-size", "0"}, "unsupported_page_size"},
      {{"--block-table", "4", "--token", "2", "--layout", "split-x", "--dtype", "nvfp4"}, "bad_geometry"},
      {{"--block-table", "4", "--token", "2", "--head", "8"}, "bad_argument"},
      {{"--block-table", "4", "--token", "2", "--layer", "1"}, "bad_argument"},
      {{"--block-table", "4", "--token", "2", "--dim", "128"}, "bad_argument"},
      {{"--block-table", "4", "--token", "-3"}, "bad_argument"},
      {{"--block-table", "4", "--token", "2", "--window", "8", "--sinks", "8"}, "bad_window"},
      {{"--block-table", "4", "--token", "2", "--one-more-block"}, "bad_window"},
      {{"--token", "2"}, "--block-table"},
      {{"--block-table", "4"}, "--token"},
      {{"--indptr", "0,1", "--indices", "3", "--last-page-len", "17", "--token", "2"}, "last_page_len_out_of_range"},
      {{"--indptr", "0,2,1", "--indices", "3", "--last-page-len", "1,1", "--token", "0"}, "non_monotone_indptr"},
      {{"--indptr", "0,1", "--indices", "3", "--last-page-len", "3", "--token", "3"}, "position_beyond_sequence"},
      {{"--indptr", "0,1,2", "--indices", "3,-1", "--last-page-len", "3,3", "--seq", "1", "--token", "0"},
       "write_through_bad_page"},
      {{"--indptr", "0,1", "--indices", "3", "--last-page-len", "3", "--seq", "1", "--token", "0"}, "bad_argument"},
  };
  for (const Case& c : cases)
    for (bool as_json : {false, true}) {
      std::vector<std::string> args = concat({"explain"}, c.args);
      if (as_json) args.push_back("--json");
      CAPTURE(args);
      const RunResult r = run_kvsim(args);
      CHECK(r.status == 2);
      CHECK(r.out.empty());
      CHECK(r.err.find(c.expect) != std::string::npos);
    }
}

// ---------------------------------------------------------------- codec

TEST_CASE("codec encode: hand-checked codes") {
  struct Case {
    const char* format;
    std::vector<std::string> values;
    std::vector<std::string> codes;
  } cases[] = {
      // e4m3 max 448 = 0x7e; 464 is the tie between 448 and 480 (not finite): even -> 448.
      {"e4m3", {"448", "464", "480", "1", "-1.5", "0", "-0", "nan", "0x1p-9", "0x1p-10"},
       {"0x7e", "0x7e", "0x7e", "0x38", "0xbc", "0x00", "0x80", "0x7f", "0x01", "0x00"}},
      {"e4m3-nosat", {"480", "448", "inf"}, {"0x7f", "0x7e", "0x7f"}},
      {"e5m2", {"57344", "65536", "inf", "1"}, {"0x7b", "0x7b", "0x7b", "0x3c"}},
      {"e5m2-nosat", {"65536", "inf"}, {"0x7c", "0x7c"}},
      // e2m1: 0.25 ties 0 / 0.5 -> 0; 0.75 ties 0.5 / 1 -> 1 (code 2); 5 ties 4 / 6 -> 4 (code 6).
      {"e2m1", {"6", "7", "-0.5", "0.25", "0.75", "5", "nan"}, {"0x7", "0x7", "0x9", "0x0", "0x2", "0x6", "0x7"}},
      {"bf16", {"1", "-2", "nan", "inf", "0x1.01p0", "0x1.018p0"}, {"0x3f80", "0xc000", "0x7fff", "0x7f80", "0x3f80", "0x3f81"}},
      {"fp16", {"1", "65504", "65520", "0x1p-24"}, {"0x3c00", "0x7bff", "0x7c00", "0x0001"}},
      {"int8", {"2.5", "3.5", "-1", "200", "-200", "nan"}, {"0x02", "0x04", "0xff", "0x7f", "0x80", "0x00"}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.format);
    const RunResult r = run_kvsim(concat({"codec", "encode", "--format", c.format, "--"}, c.values));
    REQUIRE_MESSAGE(r.status == 0, r.err);
    CHECK(lines_of(r.out) == c.codes);
  }
  // Negative numbers need no `--`; -inf does (it looks like a flag), before the values.
  const RunResult neg = run_kvsim({"codec", "encode", "--format", "e4m3", "-2", "-0x1p3"});
  REQUIRE(neg.status == 0);
  CHECK(lines_of(neg.out) == std::vector<std::string>{"0xc0", "0xd0"});
  const RunResult ninf = run_kvsim({"codec", "encode", "--format", "e4m3-nosat", "--", "-2", "-inf"});
  REQUIRE(ninf.status == 0);
  CHECK(lines_of(ninf.out) == std::vector<std::string>{"0xc0", "0xff"});
}

TEST_CASE("codec encode from stdin equals core's codecs for random fp32 bit patterns (hex floats)") {
  std::mt19937 rng(12345);
  std::vector<float> values;
  std::string input;
  for (int i = 0; i < 2000; ++i) {
    float v = bits_float(rng());
    if (i % 3 == 0) v = bits_float((rng() & 0x807FFFFFu) | (static_cast<uint32_t>(110 + rng() % 40) << 23));
    values.push_back(v);
    char buf[64];
    if (is_nan(v))
      std::snprintf(buf, sizeof buf, "nan\n");
    else
      std::snprintf(buf, sizeof buf, "%a\n", static_cast<double>(v));
    input += buf;
  }
  struct Fmt {
    const char* name;
    int digits;
    uint32_t (*encode)(float);
  } formats[] = {
      {"e4m3", 2, [](float v) -> uint32_t { return codec::f32_to_e4m3(v, codec::Saturation::finite); }},
      {"e4m3-nosat", 2, [](float v) -> uint32_t { return codec::f32_to_e4m3(v, codec::Saturation::none); }},
      {"e5m2", 2, [](float v) -> uint32_t { return codec::f32_to_e5m2(v, codec::Saturation::finite); }},
      {"e5m2-nosat", 2, [](float v) -> uint32_t { return codec::f32_to_e5m2(v, codec::Saturation::none); }},
      {"e2m1", 1, [](float v) -> uint32_t { return codec::f32_to_e2m1(v); }},
      {"bf16", 4, [](float v) -> uint32_t { return codec::f32_to_bf16(v); }},
      {"fp16", 4, [](float v) -> uint32_t { return codec::f32_to_f16(v); }},
      {"int8", 2, [](float v) -> uint32_t { return static_cast<uint8_t>(codec::f32_to_int8(v)); }},
  };
  for (const Fmt& f : formats) {
    CAPTURE(f.name);
    const RunResult r = run_kvsim({"codec", "encode", "--format", f.name}, input);
    REQUIRE(r.status == 0);
    const auto lines = lines_of(r.out);
    REQUIRE(lines.size() == values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      CAPTURE(values[i]);
      REQUIRE(lines[i] == hex_code(f.encode(values[i]), f.digits));
    }
  }
}

TEST_CASE("codec decode prints values that parse back to core's decoded bits") {
  struct Fmt {
    const char* name;
    uint32_t codes;
    float (*decode)(uint32_t);
  } formats[] = {
      {"e4m3", 256, [](uint32_t c) { return codec::e4m3_to_f32(static_cast<uint8_t>(c)); }},
      {"e5m2", 256, [](uint32_t c) { return codec::e5m2_to_f32(static_cast<uint8_t>(c)); }},
      {"e2m1", 16, [](uint32_t c) { return codec::e2m1_to_f32(static_cast<uint8_t>(c)); }},
      {"int8", 256, [](uint32_t c) { return codec::int8_to_f32(static_cast<int8_t>(static_cast<uint8_t>(c))); }},
      {"bf16", 65536, [](uint32_t c) { return codec::bf16_to_f32(static_cast<uint16_t>(c)); }},
      {"fp16", 65536, [](uint32_t c) { return codec::f16_to_f32(static_cast<uint16_t>(c)); }},
  };
  for (const Fmt& f : formats) {
    CAPTURE(f.name);
    std::string input;
    for (uint32_t c = 0; c < f.codes; ++c) input += hex_code(c, 1) + "\n";
    const RunResult r = run_kvsim({"codec", "decode", "--format", f.name}, input);
    REQUIRE(r.status == 0);
    const auto lines = lines_of(r.out);
    REQUIRE(lines.size() == f.codes);
    for (uint32_t c = 0; c < f.codes; ++c) {
      const float expect = f.decode(c);
      CAPTURE(c);
      CAPTURE(lines[c]);
      if (is_nan(expect)) {
        REQUIRE(lines[c] == "nan");
      } else {
        const float back = std::strtof(lines[c].c_str(), nullptr);
        REQUIRE(float_bits(back) == float_bits(expect));  // -0, inf, -inf and subnormals included
      }
    }
  }
  // Hand-checked spellings.
  const RunResult r = run_kvsim({"codec", "decode", "--format", "e4m3", "0x7e", "0x7f", "0x80", "0x01", "56"});
  REQUIRE(r.status == 0);
  CHECK(lines_of(r.out) == std::vector<std::string>{"448", "nan", "-0", "0.001953125", "1"});
  const RunResult e5 = run_kvsim({"codec", "decode", "--format", "e5m2", "0x7c", "0xfc"});
  CHECK(lines_of(e5.out) == std::vector<std::string>{"inf", "-inf"});
  const RunResult i8 = run_kvsim({"codec", "decode", "--format", "int8", "0xff", "-128"});
  CHECK(lines_of(i8.out) == std::vector<std::string>{"-1", "-128"});
}

TEST_CASE("codec nvfp4: hand-checked block, core equality through stdin, and errors") {
  // g = 1, amax 6: sf = 6 / (6 * 1) = 1 -> e4m3 0x38; multiplier 1; each value
  // is exactly an e2m1 code 0..7 (negatives 8..f); element 2i in the low nibble.
  const RunResult r = run_kvsim({"codec", "nvfp4", "--global-scale", "1", "0", "0.5", "1", "1.5", "2", "3", "4", "6",
                                 "-0", "-0.5", "-1", "-1.5", "-2", "-3", "-4", "-6"});
  REQUIRE_MESSAGE(r.status == 0, r.err);
  const auto lines = lines_of(r.out);
  REQUIRE(lines.size() >= 2);
  CHECK(lines[0] == "scale 0x38");
  CHECK(lines[1] == "packed 0x10 0x32 0x54 0x76 0x98 0xba 0xdc 0xfe");

  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-40.0f, 40.0f);
  for (int block = 0; block < 50; ++block) {
    float x[16];
    std::string input;
    for (float& v : x) {
      v = dist(rng);
      char buf[64];
      std::snprintf(buf, sizeof buf, "%a\n", static_cast<double>(v));
      input += buf;
    }
    const float g = 0.25f + static_cast<float>(block);
    uint8_t packed[8];
    const uint8_t scale = codec::nvfp4_quantize16(x, g, packed);
    std::string expect_packed = "packed";
    for (uint8_t b : packed) expect_packed += " " + hex_code(b, 2);
    char gtext[64];
    std::snprintf(gtext, sizeof gtext, "%a", static_cast<double>(g));
    const RunResult q = run_kvsim({"codec", "nvfp4", "--global-scale", gtext}, input);
    REQUIRE(q.status == 0);
    const auto out = lines_of(q.out);
    REQUIRE(out.size() >= 2);
    CHECK(out[0] == "scale " + hex_code(scale, 2));
    CHECK(out[1] == expect_packed);
  }

  for (const char* bad : {"0", "-1", "inf", "nan"}) {
    CAPTURE(bad);
    const RunResult e = run_kvsim({"codec", "nvfp4", "--global-scale", bad, "--", "1", "2", "3", "4", "5", "6", "7",
                                   "8", "9", "10", "11", "12", "13", "14", "15", "16"});
    CHECK(e.status == 2);
    CHECK(e.out.empty());
    CHECK(e.err.find("bad_global_scale") != std::string::npos);
  }
  const RunResult few = run_kvsim({"codec", "nvfp4", "--global-scale", "1", "1", "2", "3"});
  CHECK(few.status == 2);
  CHECK(few.err.find("16") != std::string::npos);
  const RunResult few_stdin = run_kvsim({"codec", "nvfp4", "--global-scale", "1"}, "1\n2\n");
  CHECK(few_stdin.status == 2);
}

TEST_CASE("codec rejects malformed values, codes and formats with exit 2") {
  const std::vector<std::vector<std::string>> cases = {
      {"codec", "encode", "--format", "e4m3", "1.5x"},
      {"codec", "encode", "--format", "e9", "1"},
      {"codec", "encode", "1"},
      {"codec", "decode", "--format", "e2m1", "0x10"},
      {"codec", "decode", "--format", "e4m3", "0x100"},
      {"codec", "decode", "--format", "bf16", "-1"},
      {"codec", "decode", "--format", "int8", "-129"},
      {"codec"},
  };
  for (const auto& args : cases) {
    CAPTURE(args);
    const RunResult r = run_kvsim(args);
    CHECK(r.status == 2);
    CHECK(r.out.empty());
    CHECK(!r.err.empty());
  }
  const RunResult bad_stdin = run_kvsim({"codec", "encode", "--format", "e4m3"}, "1\nbanana\n");
  CHECK(bad_stdin.status == 2);
}
