// ReplayTimings and PhaseClock (replay.hpp): where a replay's wall time goes.
#include <chrono>

#include "kvsim/sim/replay.hpp"

namespace kvsim::sim {

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

ReplayTimings& ReplayTimings::operator+=(const ReplayTimings& o) {
  kernels += o.kernels;
  op_host += o.op_host;
  inputs += o.inputs;
  transfers += o.transfers;
  scheduling += o.scheduling;
  recording += o.recording;
  dense += o.dense;
  checks += o.checks;
  comparisons += o.comparisons;
  other += o.other;
  transfer_bytes += o.transfer_bytes;
  return *this;
}

ReplayTimings ReplayTimings::scaled(double f) const {
  ReplayTimings t = *this;
  for (double* part : {&t.kernels, &t.op_host, &t.inputs, &t.transfers, &t.scheduling, &t.recording, &t.dense, &t.checks,
                       &t.comparisons, &t.other})
    *part *= f;
  return t;
}

PhaseClock::PhaseClock(double* start) : current_(start), since_ns_(now_ns()) {}

double* PhaseClock::enter(double* part) {
  const int64_t t = now_ns();
  if (current_) *current_ += static_cast<double>(t - since_ns_) * 1e-9;
  since_ns_ = t;
  double* previous = current_;
  current_ = part;
  return previous;
}

void PhaseClock::stop() { enter(nullptr); }

}  // namespace kvsim::sim
