// Timing: warm-up launches, then launches until both a minimum count and a
// minimum time are reached (capped); medians of the kernel time the backend
// reports and of the whole op call (validation, uploads, kernels, sync).
#include <algorithm>
#include <chrono>
#include <vector>

#include "kvsim/bench/bench.hpp"

namespace kvsim::bench {

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}
}  // namespace

Measurement measure(Backend& be, Fixture& f, const TimingOptions& t) {
  const bool was_timing = be.kernel_timing();
  be.set_kernel_timing(true);
  for (int i = 0; i < t.warmup; ++i) f.run();
  be.synchronize();
  std::vector<double> kernel, op;
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  while (static_cast<int>(kernel.size()) < t.max_launches &&
         (static_cast<int>(kernel.size()) < t.min_launches || elapsed() < t.min_seconds)) {
    const auto a = std::chrono::steady_clock::now();
    kernel.push_back(f.run());
    be.synchronize();
    op.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  }
  be.set_kernel_timing(was_timing);
  return Measurement{median(kernel), median(op), static_cast<int>(kernel.size())};
}

namespace {
struct CopyFixture final : Fixture {
  Backend& be;
  BackendBuffer src, dst;
  CopyFixture(Backend& b, size_t bytes) : be(b), src(b, bytes), dst(b, bytes) {
    be.fill(src.get(), 1, bytes);
    be.fill(dst.get(), 0, bytes);
  }
  double run() override {
    be.copy(dst.get(), src.get(), src.bytes());
    return be.last_kernel_seconds();
  }
  CheckResult check(Backend&) override { return {}; }
};
}  // namespace

double copy_bandwidth(Backend& be, size_t bytes, const TimingOptions& t) {
  CopyFixture f(be, bytes);
  const Measurement m = measure(be, f, t);
  return 2.0 * static_cast<double>(bytes) / m.kernel_seconds / 1e9;
}

}  // namespace kvsim::bench
