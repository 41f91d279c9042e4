// Keeps docs/ true: every `$ kvsim ...` transcript in a ```console block of
// docs/*.md is run again (through bash, with the built kvsim first on PATH,
// stderr merged as a terminal shows it) and its output must equal the text
// pasted under it, byte for byte after trimming trailing spaces.
#include <doctest/doctest.h>

#include "../support/sanitizer.hpp"

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Transcript {
  std::string file;
  int line = 0;
  std::string command;
  std::string expected;
};

std::string rstrip_lines(const std::string& s) {
  std::istringstream in(s);
  std::string line, out;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.pop_back();
    out += line + "\n";
  }
  while (out.size() >= 2 && out[out.size() - 1] == '\n' && out[out.size() - 2] == '\n') out.pop_back();
  return out;
}

std::vector<Transcript> read_transcripts(const std::filesystem::path& md) {
  std::ifstream in(md);
  std::vector<Transcript> all;
  std::string line;
  bool in_console = false;
  int n = 0;
  Transcript* current = nullptr;
  while (std::getline(in, line)) {
    ++n;
    if (!in_console) {
      in_console = line.rfind("```console", 0) == 0;
      current = nullptr;
      continue;
    }
    if (line.rfind("```", 0) == 0) {
      in_console = false;
      current = nullptr;
      continue;
    }
    if (line.rfind("$ ", 0) == 0) {
      all.push_back(Transcript{md.filename().string(), n, line.substr(2), ""});
      current = &all.back();
    } else if (current) {
      current->expected += line + "\n";
    }
  }
  return all;
}

std::string run_shell(const std::string& command) {
  const std::string bin_dir = std::filesystem::path(KVSIM_BINARY).parent_path().string();
  const std::string full = "cd '" KVSIM_SOURCE_DIR "' && PATH='" + bin_dir + "':\"$PATH\" bash -c '" +
                           [&] {
                             std::string q;
                             for (char c : command) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
                             return q;
                           }() +
                           "' 2>&1";
  FILE* p = popen(full.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  std::array<char, 4096> buf{};
  size_t got = 0;
  while ((got = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), got);
  pclose(p);
  return out;
}

}  // namespace

TEST_CASE("every kvsim transcript in docs/*.md reproduces exactly") {
  // jq is installed by scripts/setup.sh; elsewhere (the GPU machine) the
  // transcripts that pipe into it are skipped, and said so.
  const bool have_jq = !run_shell("command -v jq").empty();
  int checked = 0, skipped = 0, skipped_ulimit = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::path(KVSIM_SOURCE_DIR) / "docs")) {
    if (entry.path().extension() != ".md") continue;
    for (const Transcript& t : read_transcripts(entry.path())) {
      if (t.command.find("kvsim") == std::string::npos) continue;
      if (!have_jq && t.command.find("jq ") != std::string::npos) {
        ++skipped;
        continue;
      }
      if (kAddressSanitizer && t.command.find("ulimit -v") != std::string::npos) {
        ++skipped_ulimit;
        continue;
      }
      const std::string got = rstrip_lines(run_shell(t.command));
      INFO(t.file << ":" << t.line << ": $ " << t.command);
      CHECK(got == rstrip_lines(t.expected));
      ++checked;
    }
  }
  MESSAGE(checked << " transcripts checked" << (skipped ? ", " + std::to_string(skipped) + " skipped (no jq)" : "")
                  << (skipped_ulimit ? ", " + std::to_string(skipped_ulimit) + " skipped (ulimit -v under AddressSanitizer)"
                                     : ""));
  CHECK(checked + skipped + skipped_ulimit >= 30);  // docs/index-arithmetic.md alone holds more than 30
  CHECK(checked >= 25);
}
