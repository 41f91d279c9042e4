// Names of the scenario vocabulary (the strings scenario files and reports
// use) and the pool geometry a scenario describes.
#include "kvsim/sim/scenario.hpp"

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <map>
#include <utility>

namespace kvsim::sim {

namespace {
template <class E, size_t N>
std::optional<E> lookup(const std::array<std::pair<E, std::string_view>, N>& table, std::string_view s) {
  for (const auto& [e, name] : table)
    if (name == s) return e;
  return std::nullopt;
}
template <class E, size_t N>
std::string_view name_of(const std::array<std::pair<E, std::string_view>, N>& table, E e) {
  for (const auto& [x, name] : table)
    if (x == e) return name;
  return "?";
}

constexpr std::array<std::pair<BlockOrder, std::string_view>, 3> kBlockOrders{{
    {BlockOrder::lowest, "lowest"},
    {BlockOrder::highest, "highest"},
    {BlockOrder::shuffled, "shuffled"},
}};
constexpr std::array<std::pair<SnapshotMode, std::string_view>, 2> kSnapshotModes{{
    {SnapshotMode::all, "all"},
    {SnapshotMode::align, "align"},
}};
constexpr std::array<std::pair<WritePath, std::string_view>, 4> kWritePaths{{
    {WritePath::qkv_preprocess, "qkv_preprocess"},
    {WritePath::append_paged, "append_paged"},
    {WritePath::reshape_and_cache, "reshape_and_cache"},
    {WritePath::append_mla, "append_mla"},
}};
constexpr std::array<std::pair<WindowMode, std::string_view>, 4> kWindowModes{{
    {WindowMode::none, "none"},
    {WindowMode::cyclic, "cyclic"},
    {WindowMode::release, "release"},
    {WindowMode::sliding, "sliding"},
}};
constexpr std::array<std::pair<KvAllocation, std::string_view>, 2> kAllocations{{
    {KvAllocation::vswa, "vswa"},
    {KvAllocation::hybrid, "hybrid"},
}};
constexpr std::array<std::pair<VswaRule, std::string_view>, 2> kVswaRules{{
    {VswaRule::cyclic, "cyclic"},
    {VswaRule::release, "release"},
}};
}  // namespace

std::string_view snapshot_mode_name(SnapshotMode m) { return name_of(kSnapshotModes, m); }
std::optional<SnapshotMode> parse_snapshot_mode(std::string_view s) { return lookup(kSnapshotModes, s); }
std::string_view write_path_name(WritePath w) { return name_of(kWritePaths, w); }
std::optional<WritePath> parse_write_path(std::string_view s) { return lookup(kWritePaths, s); }
std::string_view window_mode_name(WindowMode m) { return name_of(kWindowModes, m); }
std::optional<WindowMode> parse_window_mode(std::string_view s) { return lookup(kWindowModes, s); }
std::string_view block_order_name(BlockOrder o) { return name_of(kBlockOrders, o); }
std::optional<BlockOrder> parse_block_order(std::string_view s) { return lookup(kBlockOrders, s); }
std::string_view allocation_name(KvAllocation a) { return name_of(kAllocations, a); }
std::optional<KvAllocation> parse_allocation(std::string_view s) { return lookup(kAllocations, s); }
std::string_view vswa_rule_name(VswaRule r) { return name_of(kVswaRules, r); }
std::optional<VswaRule> parse_vswa_rule(std::string_view s) { return lookup(kVswaRules, s); }

int64_t split_x_written_heads(CacheDtype t, int32_t head_dim) {
  PoolGeometry g;
  g.dtype = t;
  const int64_t vectors_per_head = std::max<int64_t>(1, head_dim / g.split_x());
  return 512 / vectors_per_head;
}

PoolGeometry pool_geometry(const Scenario& s) {
  PoolGeometry g;
  g.layers = s.model.layers;
  g.kv_factor = s.mla.enabled ? 1 : 2;
  g.kv_heads = s.mla.enabled ? 1 : s.model.kv_heads;
  g.tokens_per_block = s.cache.page_size;
  g.head_dim = s.model.head_dim;
  g.dtype = s.cache.dtype;
  g.layout = s.cache.layout;
  g.placement = s.cache.placement;
  g.primary_blocks = s.cache.primary_blocks;
  g.secondary_blocks = s.cache.secondary_blocks;
  return g;
}

int32_t layer_window(const Scenario& s, int32_t layer) {
  if (s.layers.enabled && !s.layers.windows.empty())
    return s.layers.windows[static_cast<size_t>(layer) % s.layers.windows.size()];
  return s.window.mode == WindowMode::none ? 0 : s.window.window;
}

std::vector<KvGroup> kv_groups(const Scenario& s) {
  if (!s.layers.enabled || s.layers.windows.empty()) {
    KvGroup g;
    g.mode = s.window.mode;
    g.window = s.window.window;
    g.sinks = s.window.sinks;
    g.one_more_block = s.window.one_more_block;
    for (int32_t l = 0; l < s.model.layers; ++l) g.layers.push_back(l);
    return {g};
  }
  const LayersSpec& ls = s.layers;
  // Layers by window, in increasing window size with full attention (0) last.
  std::map<int64_t, std::vector<int32_t>> by_window;
  for (int32_t l = 0; l < s.model.layers; ++l) {
    const int32_t w = layer_window(s, l);
    by_window[w == 0 ? INT64_MAX : w].push_back(l);
  }
  auto group_of = [&](int64_t key, std::vector<int32_t> layers, int32_t pool) {
    KvGroup g;
    g.window = key == INT64_MAX ? 0 : static_cast<int32_t>(key);
    if (g.window > 0) {
      const bool ring = ls.allocation == KvAllocation::vswa && ls.rule == VswaRule::cyclic;
      g.mode = ring ? WindowMode::cyclic : WindowMode::sliding;
      g.sinks = ls.sinks;
      g.one_more_block = ring && ls.one_more_block;
    }
    g.pool = pool;
    g.layers = std::move(layers);
    return g;
  };
  std::vector<KvGroup> groups;
  if (ls.allocation == KvAllocation::vswa) {
    for (const auto& [key, layers] : by_window)
      groups.push_back(group_of(key, layers, static_cast<int32_t>(groups.size())));
    return groups;
  }
  size_t size = SIZE_MAX;
  for (const auto& [key, layers] : by_window) size = std::min(size, layers.size());
  for (const auto& [key, layers] : by_window)
    for (size_t i = 0; i + size <= layers.size(); i += size)
      groups.push_back(group_of(key, std::vector<int32_t>(layers.begin() + static_cast<std::ptrdiff_t>(i),
                                                          layers.begin() + static_cast<std::ptrdiff_t>(i + size)),
                                0));
  return groups;
}

int32_t kv_pool_count(const std::vector<KvGroup>& groups) {
  int32_t n = 0;
  for (const KvGroup& g : groups) n = std::max(n, g.pool + 1);
  return n;
}

PoolGeometry kv_pool_geometry(const Scenario& s, const std::vector<KvGroup>& groups, int32_t pool) {
  PoolGeometry g = pool_geometry(s);
  for (const KvGroup& k : groups)
    if (k.pool == pool) {
      g.layers = static_cast<int32_t>(k.layers.size());
      break;
    }
  return g;
}

}  // namespace kvsim::sim
