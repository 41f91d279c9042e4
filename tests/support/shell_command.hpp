// Runs a shell command line for the command-line tests: its exit status and
// everything it wrote to stdout (redirect stderr in the line to see it).
#pragma once

#include <cstdio>
#include <string>
#include <sys/wait.h>

#include <doctest/doctest.h>

namespace kvsim::test {

struct ShellResult {
  int code = -1;
  std::string out;
};

inline ShellResult run_shell(const std::string& command) {
  ShellResult r;
  FILE* p = popen(command.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace kvsim::test
