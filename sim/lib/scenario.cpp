// Names of the scenario vocabulary (the strings scenario files and reports
// use) and the pool geometry a scenario describes.
#include "kvsim/sim/scenario.hpp"

#include <array>
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

constexpr std::array<std::pair<Fault, std::string_view>, 6> kFaults{{
    {Fault::past_len_zero, "past_len_zero"},
    {Fault::window_mismatch, "window_mismatch"},
    {Fault::k_scale_for_v, "k_scale_for_v"},
    {Fault::reused_block_mismatch, "reused_block_mismatch"},
    {Fault::v_tail_not_zeroed, "v_tail_not_zeroed"},
    {Fault::stale_bad_page, "stale_bad_page"},
}};
constexpr std::array<std::pair<Invariant, std::string_view>, 10> kInvariants{{
    {Invariant::conservation, "conservation"},
    {Invariant::chunking, "chunking"},
    {Invariant::reuse, "reuse"},
    {Invariant::window, "window"},
    {Invariant::layout, "layout"},
    {Invariant::dense, "dense"},
    {Invariant::quantization, "quantization"},
    {Invariant::no_nan, "no_nan"},
    {Invariant::offload, "offload"},
    {Invariant::batch, "batch"},
}};
constexpr std::array<std::pair<WritePath, std::string_view>, 4> kWritePaths{{
    {WritePath::qkv_preprocess, "qkv_preprocess"},
    {WritePath::append_paged, "append_paged"},
    {WritePath::reshape_and_cache, "reshape_and_cache"},
    {WritePath::append_mla, "append_mla"},
}};
constexpr std::array<std::pair<WindowMode, std::string_view>, 3> kWindowModes{{
    {WindowMode::none, "none"},
    {WindowMode::cyclic, "cyclic"},
    {WindowMode::release, "release"},
}};
}  // namespace

std::string_view fault_name(Fault f) { return name_of(kFaults, f); }
std::optional<Fault> parse_fault(std::string_view s) { return lookup(kFaults, s); }
std::string_view invariant_name(Invariant i) { return name_of(kInvariants, i); }
std::optional<Invariant> parse_invariant(std::string_view s) { return lookup(kInvariants, s); }
std::string_view write_path_name(WritePath w) { return name_of(kWritePaths, w); }
std::optional<WritePath> parse_write_path(std::string_view s) { return lookup(kWritePaths, s); }
std::string_view window_mode_name(WindowMode m) { return name_of(kWindowModes, m); }
std::optional<WindowMode> parse_window_mode(std::string_view s) { return lookup(kWindowModes, s); }

Invariant invariant_for(Fault f) {
  switch (f) {
    case Fault::past_len_zero: return Invariant::chunking;
    case Fault::window_mismatch: return Invariant::window;
    case Fault::k_scale_for_v: return Invariant::quantization;
    case Fault::reused_block_mismatch: return Invariant::reuse;
    case Fault::v_tail_not_zeroed: return Invariant::no_nan;
    case Fault::stale_bad_page: return Invariant::dense;
  }
  return Invariant::conservation;
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

}  // namespace kvsim::sim
