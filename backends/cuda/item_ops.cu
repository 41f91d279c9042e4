// The CUDA backend's items-form ops (op_list.hpp): the spans OpTraits::uploads
// lists are copied to the device in one transfer and swapped into a copy of
// the op, core's make_<name>_items builds the functor from it, and one thread
// runs each work item (launch.cuh). Each item owns its output bytes
// (validation proved it), so the schedule cannot change a byte.
#include <array>
#include <tuple>
#include <utility>

#include "backends/cuda/cuda_backend.hpp"
#include "backends/cuda/launch.cuh"

namespace kvsim {

namespace {

// `op` with every span of OpTraits<id>::uploads pointing at its device copy.
template <OpId id>
OpOf<id> with_device_spans(CudaBackend& b, const char* name, const OpOf<id>& op) {
  OpOf<id> dev = op;
  std::apply(
      [&](auto... member) {
        const std::array<CudaBackend::HostArray, sizeof...(member)> arrays{CudaBackend::HostArray(op.*member)...};
        const std::vector<const void*> d = b.upload(name, arrays);
        size_t i = 0;
        ((dev.*member = {static_cast<decltype((op.*member).data())>(d[i++]), (op.*member).size()}), ...);
      },
      OpTraits<id>::uploads);
  return dev;
}

template <OpId id, class Make>
void run_item_op(CudaBackend& b, const KvPools& pools, const OpOf<id>& op, Make make) {
  const char* name = op_name(id).data();  // a string literal: NUL-terminated
  if (make(pools, op).count == 0) return;
  const auto items = make(pools, with_device_spans<id>(b, name, op));
  b.begin_kernels();
  cuda::launch_items(name, "work items", b.stream(), items.count, items);
  b.finish(name);
}

}  // namespace

#define KVSIM_ITEM_BACKEND CudaBackend
KVSIM_DEFINE_ITEM_OP_RUNS
#undef KVSIM_ITEM_BACKEND

}  // namespace kvsim
