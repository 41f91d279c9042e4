// The terminal progress line of `kvsim run` and `kvsim diff` (docs/run.md):
// on stderr, only when it is a terminal, rewritten in place at most ten
// times a second. It names the scenario, the run (the scenario's own replay
// or a comparison re-run) as "run i/n NAME", "step k of n" (n from
// sim::planned_steps, a dry run of the scheduler), the tokens done, the
// run's tokens per second and an estimate of the time left over every run of
// the scenario, from kvsim validate's token-layer estimate (an upper bound:
// prefix hits are not predicted, so the estimate errs long).
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "kvsim/sim/replay.hpp"

namespace kvsim::cli {

class ProgressLine {
 public:
  ProgressLine() : on_(isatty(STDERR_FILENO) != 0) {}
  bool on() const { return on_; }
  // A scenario starts: `runs` replays of `token_layers` in all (sim::estimate_replay).
  void start(const std::string& scenario, int64_t runs, double token_layers) {
    scenario_ = scenario;
    runs_ = runs;
    total_ = token_layers;
    start_ = last_ = run_start_ = std::chrono::steady_clock::now();
    run_index_ = -1;
  }
  void update(const sim::RunProgress& p) {
    if (!on_) return;
    const auto now = std::chrono::steady_clock::now();
    if (p.run_index != run_index_) {
      // A run is seen first after its first step: it began about when the one before last reported.
      run_start_ = run_index_ < 0 ? start_ : last_;
      run_index_ = p.run_index;
    } else if (now - last_ < std::chrono::milliseconds(100)) {
      return;
    }
    last_ = now;
    const double run_s = std::chrono::duration<double>(now - run_start_).count();
    const double all_s = std::chrono::duration<double>(now - start_).count();
    const double done = static_cast<double>(p.token_layers_before + p.token_layers);
    char left[32] = "?";
    if (done > 0 && total_ > done) {
      const auto s = static_cast<long long>((total_ - done) * all_s / done);
      std::snprintf(left, sizeof left, s >= 60 ? "%lldm%02llds" : "%lld s", s >= 60 ? s / 60 : s, s % 60);
    } else if (done > 0) {
      std::snprintf(left, sizeof left, "0 s");
    }
    const std::string run = "run " + std::to_string(p.run_index + 1) + "/" +
                            std::to_string(std::max<int64_t>(runs_, p.run_index + 1)) + " " + p.run;
    std::fprintf(stderr, "\r\033[K%s: %s: step %lld of %lld, %lld tokens, %.3g tokens/s, about %s left",
                 scenario_.c_str(), run.c_str(), static_cast<long long>(p.step + 1),
                 static_cast<long long>(std::max(p.steps_planned, p.step + 1)), static_cast<long long>(p.tokens),
                 run_s > 0 ? static_cast<double>(p.tokens) / run_s : 0.0, left);
    std::fflush(stderr);
  }
  // Clears the line (before the table).
  void clear() const {
    if (on_) std::fprintf(stderr, "\r\033[K");
  }

 private:
  bool on_;
  std::string scenario_;
  int64_t runs_ = 1;
  double total_ = 0;
  int32_t run_index_ = -1;
  std::chrono::steady_clock::time_point start_, last_, run_start_;
};

}  // namespace kvsim::cli
