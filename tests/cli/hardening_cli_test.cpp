// Regressions of issue 9 on the command line, one case per class of defect:
// 64-bit window arithmetic, the dense block table validated like the CSR
// form, bench's ranges and memory check, the strict number grammar, and the
// output contract (nothing on stdout when a command fails, write errors and
// unknown subcommands named, CLI11's errors in kvsim's form).
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

namespace {

struct Result {
  int status = -1;
  std::string out, err;
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Runs `kvsim ARGS` through bash with stdin from `input`; `redirect` replaces
// the stdout capture (e.g. "> /dev/full").
// `prefix` goes before the binary (e.g. setpriv to run it without root).
Result kvsim(const std::vector<std::string>& args, const std::string& input = "", const std::string& redirect = "",
             const std::string& prefix = "") {
  char err_name[] = "/tmp/kvsim_hard_err_XXXXXX", in_name[] = "/tmp/kvsim_hard_in_XXXXXX";
  close(mkstemp(err_name));
  close(mkstemp(in_name));
  std::ofstream(in_name, std::ios::binary) << input;
  std::string cmd = prefix + quote(KVSIM_BINARY);
  for (const std::string& a : args) cmd += " " + quote(a);
  cmd += " <" + quote(in_name) + " 2>" + quote(err_name) + (redirect.empty() ? "" : " " + redirect);
  Result r;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.err = slurp(err_name);
  std::remove(err_name);
  std::remove(in_name);
  return r;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A failed command: exit 2, nothing on stdout, the named error on stderr.
void check_rejected(const Result& r, const std::string& name, const std::string& detail = "") {
  INFO("stderr: " << r.err);
  CHECK(r.status == 2);
  CHECK(r.out.empty());
  CHECK(has(r.err, "kvsim: error: " + name + ": "));
  if (!detail.empty()) CHECK(has(r.err, detail));
}

}  // namespace

TEST_CASE("explain: a window with sinks near 2^31 maps in 64 bits and names the right error") {
  const Result r = kvsim({"explain", "--window", "2147483647", "--sinks", "2147483646", "--block-table", "1", "--token",
                          "2147483647"});
  check_rejected(r, "position_beyond_sequence", "cache token 2147483648");
  // A table long enough is not needed to see the mapping: a sink token still maps to itself.
  const Result sink = kvsim({"explain", "--window", "2147483647", "--sinks", "2147483646", "--block-table", "1",
                             "--token", "3", "--json"});
  CHECK(sink.status == 0);
  CHECK(has(sink.out, "\"cache_token\": 3"));
}

TEST_CASE("explain: the dense block table is validated whole, exactly as its CSR form") {
  check_rejected(kvsim({"explain", "--block-table", "999999,3", "--token", "16"}), "block_out_of_range",
                 "block_table[0] = 999999");
  check_rejected(kvsim({"explain", "--indptr", "0,2", "--indices", "999999,3", "--last-page-len", "16", "--token", "16"}),
                 "block_out_of_range");
  // Property: over tables mixing live, BAD_PAGE, out-of-range and secondary
  // entries, and tokens on every page and beyond, the dense form and the CSR
  // form (full pages) accept exactly the same (table, token) pairs.
  std::mt19937 rng(9);
  const std::vector<std::string> entries{"-1", "0", "5", "63", "64", "999999", "s3", "0x80000001"};
  int agreed = 0, accepted = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 4);
    std::string table;
    for (int i = 0; i < n; ++i) table += (i ? "," : "") + entries[rng() % entries.size()];
    const std::string token = std::to_string(rng() % (16 * (n + 1)));
    const Result dense = kvsim({"explain", "--secondary-blocks", "8", "--block-table", table, "--token", token});
    const Result csr = kvsim({"explain", "--secondary-blocks", "8", "--indptr", "0," + std::to_string(n), "--indices",
                              table, "--last-page-len", "16", "--token", token});
    INFO("table " << table << " token " << token << "\ndense: " << dense.err << "csr: " << csr.err);
    CHECK(dense.status == csr.status);
    CHECK((dense.status == 0 || dense.status == 2));
    agreed += dense.status == csr.status;
    accepted += dense.status == 0;
  }
  CHECK(agreed == 40);
  CHECK(accepted > 0);  // both outcomes were exercised
  CHECK(accepted < 40);
}

TEST_CASE("bench: --threads within 1..cores, --min-seconds finite and >= 0, sizes checked against memory") {
  for (const char* threads : {"16777216", "0", "-1", "", "1,,2"}) {
    INFO("--threads '" << threads << "'");
    check_rejected(kvsim({"bench", "--sequences=1", "--tokens=16", "--min-seconds=0", std::string("--threads=") + threads}),
                   "bad_argument", "--threads");
  }
  for (const char* seconds : {"-1", "nan", "inf", "1e999", "0x10", ""}) {
    INFO("--min-seconds '" << seconds << "'");
    check_rejected(kvsim({"bench", "--sequences=1", "--tokens=16", std::string("--min-seconds=") + seconds}),
                   "bad_argument", "--min-seconds");
  }
  const Result huge = kvsim({"bench", "--sequences", "4096", "--tokens", "1048576", "--min-seconds", "0"});
  check_rejected(huge, "bad_argument", "bytes");
  CHECK(has(huge.err, "needs about"));
}

TEST_CASE("numbers: no octal, no empty values, no dropped entries, no NUL cut") {
  check_rejected(kvsim({"layout", "--page-size", "010"}), "bad_argument", "--page-size = '010': leading zero");
  check_rejected(kvsim({"explain", "--block-table", "010", "--token", "0"}), "bad_argument", "leading zero");
  check_rejected(kvsim({"explain", "--block-table", "1", "--token", ""}), "bad_argument", "--token = '': empty value");
  // "--block-table=" must not swallow "--token=0": the empty table is the error.
  check_rejected(kvsim({"explain", "--block-table=", "--token=0"}), "bad_argument", "--block-table");
  check_rejected(kvsim({"explain", "--block-table", "1,2,", "--token", "0"}), "bad_argument", "--block-table entry 2");
  check_rejected(kvsim({"codec", "encode", "--format", "e4m3"}, std::string("1\n2\0" "3\n", 6)), "bad_argument",
                 "stdin line 2 = '2\\x003': contains a NUL byte");
  check_rejected(kvsim({"codec", "decode", "--format", "e4m3", "010"}), "bad_argument", "leading zero");
  CHECK(kvsim({"codec", "decode", "--format", "e4m3", "0x7e"}).out == "448\n");  // codes document hex
}

TEST_CASE("output contract: nothing on stdout on failure, write errors, unknown subcommands, CLI11's errors") {
  check_rejected(kvsim({"codec", "encode", "--format", "e4m3", "1", "2", "abc"}), "bad_argument", "value 3 = 'abc'");
  check_rejected(kvsim({"codec", "decode", "--format", "e2m1", "1", "0x10"}), "bad_argument", "value 2");

  const Result full = kvsim({"layout", "--json"}, "", "> /dev/full");
  CHECK(full.status == 2);
  CHECK(has(full.err, "kvsim: error: output_failed: writing to stdout failed"));

  const Result unknown = kvsim({"lay"});
  check_rejected(unknown, "unknown_subcommand", "'lay' is not a subcommand of kvsim");
  CHECK(has(unknown.err, "layout"));
  check_rejected(kvsim({"codec", "encrypt"}), "unknown_subcommand", "'encrypt' is not a subcommand of kvsim codec");

  check_rejected(kvsim({"layout", "--no-such-flag"}), "bad_usage");
  check_rejected(kvsim({"explain", "--block-table", "1"}), "bad_usage", "--token");
  check_rejected(kvsim({"layout", "--dtype", "fp64"}), "bad_usage");
}

// Issue 13 item 11: messages a new user tripped over, each through the binary.
namespace {

std::string temp_path(const std::string& name) { return "/tmp/kvsim_messages_test_" + name; }

void write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// Runs kvsim without root's privileges (as nobody) where the test runs as
// root, so file permissions hold; "" when that is not possible here.
std::string unprivileged_prefix() {
  if (geteuid() != 0) return " ";
  if (std::system("command -v setpriv >/dev/null 2>&1") != 0) return "";
  return "setpriv --reuid=65534 --regid=65534 --clear-groups ";
}

Result kvsim_unprivileged(const std::string& prefix, const std::vector<std::string>& args) {
  return kvsim(args, "", "", prefix);
}

const std::string kScenario = std::string(KVSIM_SOURCE_DIR) + "/scenarios/quant_int8.toml";

}  // namespace

TEST_CASE("messages: a symlink loop, an unreadable file and an unwritable --dump folder say why") {
  const std::string a = temp_path("loop_a.toml"), b = temp_path("loop_b.toml");
  std::remove(a.c_str());
  std::remove(b.c_str());
  REQUIRE(symlink(b.c_str(), a.c_str()) == 0);
  REQUIRE(symlink(a.c_str(), b.c_str()) == 0);
  for (const char* cmd : {"validate", "run"}) {
    const Result loop = kvsim({cmd, a});
    check_rejected(loop, "bad_scenario", "Too many levels of symbolic links");
    CHECK_FALSE(has(loop.err, "no such file"));
  }
  std::remove(a.c_str());
  std::remove(b.c_str());
  check_rejected(kvsim({"validate", temp_path("missing.toml")}), "bad_scenario", "got no such file");

  const std::string prefix = unprivileged_prefix();
  if (prefix.empty()) {
    MESSAGE("running as root without setpriv: permissions cannot be tested here");
    return;
  }
  const std::string locked = temp_path("locked.toml");
  write(locked, "[[request]]\ngenerated = 3\n");
  chmod(locked.c_str(), 0);
  check_rejected(kvsim_unprivileged(prefix, {"validate", locked}), "bad_scenario", "got Permission denied");
  std::remove(locked.c_str());

  const std::string folder = temp_path("read_only_dir");
  std::system(("rm -rf " + quote(folder)).c_str());
  REQUIRE(mkdir(folder.c_str(), 0555) == 0);
  chmod(folder.c_str(), 0555);
  const Result inside = kvsim_unprivileged(prefix, {"run", kScenario, "--dump", folder + "/x"});
  check_rejected(inside, "bad_argument", "cannot create the folder: Permission denied");
  const Result into = kvsim_unprivileged(prefix, {"run", kScenario, "--dump", folder});
  check_rejected(into, "bad_argument", ": Permission denied");
  CHECK(has(into.err, "--dump: cannot write " + folder + "/"));
  rmdir(folder.c_str());
}

TEST_CASE("messages: a float that rounds to 0, a pool size, a 10 MB key: what was given, readably") {
  const std::string tiny = temp_path("tiny_scale.toml");
  write(tiny, "[cache]\ndtype = \"fp8_e4m3\"\nk_scale = 1e-308\n[[request]]\ngenerated = 3\n");
  const Result scale = kvsim({"validate", tiny});
  check_rejected(scale, "bad_scenario", "cache.k_scale: expected a number in float range");
  CHECK(has(scale.err, "got a float (1e-308)"));
  CHECK_FALSE(has(scale.err, "got 0"));
  std::remove(tiny.c_str());

  // Sizes are counts, not "1638400000000.000000": exact below 2^64, else 4 digits.
  const Result exact = kvsim({"layout", "--layers", "64", "--kv-heads", "64", "--head-dim", "4096", "--blocks", "2000000000"});
  check_rejected(exact, "bad_geometry", "pool of 1073741824000000000 elements (16 bits each) overflows");
  const Result huge = kvsim({"layout", "--layers", "1024", "--kv-heads", "1024", "--head-dim", "4096", "--blocks", "2000000000"});
  check_rejected(huge, "bad_geometry", "pool of 2.7488e+20 elements");
  for (const Result* r : {&exact, &huge}) CHECK_FALSE(has(r->err, ".000000"));

  const std::string big = temp_path("big_key.toml");
  write(big, "[model]\n" + std::string(10'000'000, 'k') + " = 1\n[[request]]\ngenerated = 3\n");
  const Result key = kvsim({"validate", big});
  check_rejected(key, "bad_scenario", " characters): unknown key");
  CHECK(key.err.size() < 1000);
  write(big, "[cache]\ndtype = \"" + std::string(10'000'000, 'v') + "\"\n[[request]]\ngenerated = 3\n");
  const Result value = kvsim({"validate", big});
  check_rejected(value, "bad_scenario", "cache.dtype: expected one of");
  CHECK(value.err.size() < 1000);
  std::remove(big.c_str());
}

TEST_CASE("messages: diff without a GPU, a flag without its value, a flag where a subcommand belongs") {
  const Result diff = kvsim({"diff", kScenario});
  if (!KVSIM_HAVE_CUDA || diff.status == 2) check_rejected(diff, "backend_unavailable", "kvsim diff needs the cuda backend");

  // explain --block-table without a value names it, not the missing --token.
  const Result table = kvsim({"explain", "--block-table"});
  check_rejected(table, "bad_argument", "--block-table = '': empty value");
  CHECK_FALSE(has(table.err, "--token is required"));
  check_rejected(kvsim({"explain", "--block-table", "1"}), "bad_usage", "--token is required");

  // "--flag=" never takes the next argument as its value.
  std::vector<std::string> block{"codec", "nvfp4", "--global-scale=", "--", "-inf"};
  for (int i = 1; i < 16; ++i) block.push_back(std::to_string(i));
  check_rejected(kvsim(block), "bad_argument", "--global-scale = '': empty value");
  block.erase(block.begin() + 3);  // without "--": "1" is not taken as the scale
  block[3] = "16";
  check_rejected(kvsim(block), "bad_argument", "--global-scale = '': empty value");
  check_rejected(kvsim({"run", "--dump=", kScenario}), "bad_argument", "--dump = '': empty value");

  const Result x = kvsim({"-x"});
  check_rejected(x, "bad_usage", "The following argument was not expected: -x");
  CHECK(has(x.err, "one of layout, explain"));
  CHECK_FALSE(has(x.err, "A subcommand is required"));
  check_rejected(kvsim({"codec", "--nope", "1"}), "bad_usage", "--nope (kvsim codec takes a subcommand first");
  CHECK(kvsim({"--version"}).status == 0);
  CHECK(kvsim({"codec", "--help"}).status == 0);
}

TEST_CASE("messages: under a cyclic window, run --details says what the chunking comparison prefilled") {
  const std::string path = temp_path("cyclic.toml");
  // A ring of 35 tokens after 5 sinks wraps at token 40; without one_more_block a
  // wrapped ring takes chunks of 1 token (the scenario itself prefills one at a time).
  write(path, "[cache]\npage_size = 16\nprimary_blocks = 24\n[window]\nmode = \"cyclic\"\nwindow = 40\nsinks = 5\n"
              "[scheduler]\nchunk_size = 1\n[[request]]\ngenerated = 50\ndecode_tokens = 4\n");
  const Result r = kvsim({"run", path, "--details"});
  INFO(r.out << r.err);
  CHECK(r.status == 0);
  CHECK(has(r.out, "chunking pass: "));
  CHECK(has(r.out, " outputs bit-equal to one-chunk prefill until the cyclic ring wraps at token 40, then chunks of "
                   "1 token"));
  std::remove(path.c_str());
}

TEST_CASE("hostile input to the newer flags and tables: exit 2, the flag or key named, nothing on stdout") {
  check_rejected(kvsim({"run", "--list-invariants", "extra.toml"}), "bad_argument", "got 'extra.toml'");
  check_rejected(kvsim({"run", "--list-invariants", "--json"}), "bad_argument", "got --json");
  const std::string trace = std::string(KVSIM_SOURCE_DIR) + "/traces/mooncake_synthetic_trace.jsonl";
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad_flags = {
      {{"--kv-dtype", "fp64"}, "--kv-dtype"},          {{"--kv-dtype", ""}, "--kv-dtype"},
      {{"--kv-dtype="}, "--kv-dtype"},                 {{"--secondary-blocks", "-1"}, "--secondary-blocks"},
      {{"--secondary-blocks", "x"}, "--secondary-blocks"}, {{"--secondary-blocks="}, "--secondary-blocks"},
      {{"--poison-nan=2"}, "poison-nan"},              {{"--poison-nan=maybe"}, "poison-nan"},
      {{"--layer-windows", "a,b"}, "--layer-windows"}, {{"--layer-windows", "-5"}, "--layer-windows"},
      {{"--layer-windows", "3,,4"}, "--layer-windows"}, {{"--layer-windows="}, "--layer-windows"},
      {{"--layer-windows", "99999999999"}, "--layer-windows"},
  };
  for (const auto& bad : bad_flags)  // no structured binding: INFO captures it (clang 14)
    for (const std::vector<std::string>& head :
         {std::vector<std::string>{"trace", "import", trace}, std::vector<std::string>{"run", "--trace", trace}}) {
      const std::vector<std::string>& flag = bad.first;
      const std::string& name = bad.second;
      std::vector<std::string> args = head;
      for (const char* a : {"--requests", "56:62", "--scale", "1/32"}) args.push_back(a);
      args.insert(args.end(), flag.begin(), flag.end());
      const Result r = kvsim(args);
      INFO(head[0] << " " << flag[0] << " (" << flag.size() << " words): " << r.err);
      CHECK(r.status == 2);
      CHECK(r.out.empty());
      CHECK(has(r.err, "kvsim: error: "));
      CHECK(has(r.err, name));
    }
  const std::string path = temp_path("hostile.toml");
  const std::vector<std::pair<std::string, std::string>> bad_tables = {
      {"[attention]\norder = \"tensor\"\n", "attention.order"},
      {"[attention]\norder = 3\n", "attention.order"},
      {"[attention]\norder = \"\"\n", "attention.order"},
      {"[attention]\norder = [\"mma\"]\n", "attention.order"},
      {"[attention]\norder = \"mma\"\n[cache]\ndtype = \"nvfp4\"\n", "attention.order"},
      {"[attention]\nordr = \"mma\"\n", "attention.ordr"},
      {"attention = \"mma\"\n", "attention"},
      {"[recurrent]\nlayers = -1\n", "recurrent.layers"},
      {"[recurrent]\nlayers = 2000\n", "recurrent.layers"},
      {"[recurrent]\nlayers = 1.5\n", "recurrent.layers"},
      {"[recurrent]\nlayers = \"2\"\n", "recurrent.layers"},
      {"[recurrent]\nlayers = 2\nstate_size = 0\n", "recurrent.state_size"},
      {"[recurrent]\nlayers = 2\nstate_size = 100000\n", "recurrent.state_size"},
      {"[recurrent]\nlayers = 2\nsnapshots = \"some\"\n", "recurrent.snapshots"},
      {"[recurrent]\nlayers = 2\nsnapshots = 1\n", "recurrent.snapshots"},
      {"[recurrent]\nlayers = 2\nstates = 3\n", "recurrent.states"},
      {"recurrent = 3\n", "recurrent"},
      {"[[recurrent]]\nlayers = 2\n", "recurrent"},
      {"[recurrent]\nlayers = 2\n[window]\nmode = \"cyclic\"\nwindow = 8\n", "recurrent.layers"},
      {"[recurrent]\nlayers = 2\n[reuse]\nenabled = true\npartial = true\n", "reuse.partial"},
  };
  for (const auto& bad : bad_tables)  // no structured binding: INFO captures it (clang 14)
    for (const char* cmd : {"validate", "run"}) {
      const std::string& table = bad.first;
      const std::string& key = bad.second;
      write(path, table + "[[request]]\ngenerated = 5\n");
      INFO(cmd << ":\n" << table);
      check_rejected(kvsim({cmd, path}), "bad_scenario", ": " + key + ": ");
    }
  std::remove(path.c_str());
}
