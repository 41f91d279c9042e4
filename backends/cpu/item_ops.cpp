// The fast CPU backend's items-form ops (op_list.hpp): core's work items on
// the arena's threads. Each item owns its output bytes (validation proved
// it), so any thread count gives the same bytes.
#include "backends/cpu/cpu_backend.hpp"

namespace kvsim {

namespace {

template <OpId id, class Make>
void run_item_op(CpuBackend& b, const KvPools& pools, const OpOf<id>& op, Make make) {
  const auto items = make(pools, op);
  b.for_each_item(items.count, [&](int64_t i) { items(i); });
}

}  // namespace

#define KVSIM_ITEM_BACKEND CpuBackend
KVSIM_DEFINE_ITEM_OP_RUNS
#undef KVSIM_ITEM_BACKEND

}  // namespace kvsim
