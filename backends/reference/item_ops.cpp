// The reference backend's items-form ops (op_list.hpp): core's work items, in
// order, one at a time.
#include "backends/reference/reference_backend.hpp"

namespace kvsim {

namespace {

template <OpId id, class Make>
void run_item_op(ReferenceBackend&, const KvPools& pools, const OpOf<id>& op, Make make) {
  const auto items = make(pools, op);
  for (int64_t i = 0; i < items.count; ++i) items(i);
}

}  // namespace

#define KVSIM_ITEM_BACKEND ReferenceBackend
KVSIM_DEFINE_ITEM_OP_RUNS
#undef KVSIM_ITEM_BACKEND

}  // namespace kvsim
