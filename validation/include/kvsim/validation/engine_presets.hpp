// Engine tensor presets: the KV-cache tensors of vLLM, FlashInfer,
// TensorRT-LLM and SGLang as each engine shapes them, and kvsim's strides
// for them. A preset turns an engine's tensor shape into PoolStrides, so
// every offset still comes from element_offset() (geometry.hpp); nothing
// is tabled twice. Used by `kvsim layout --engine`, `kvsim explain --engine`,
// scenario files (cache.engine) and the Python module (pools from an engine's
// own tensors).
//
// Each engine keeps one tensor per layer (or one for the whole pool), holding
// K and V together or apart. kvsim lays all of an engine's tensors in one
// allocation, layer after layer, K tensor before V tensor, so a pool is still
// one pointer with strides; the offset inside the engine's own tensor is the
// element offset minus the tensor's first element (EngineLayout::tensor_base).
//
// Sources (the engines' public code):
//   vllm-flash   vllm/v1/attention/backends/flash_attn.py,
//                FlashAttentionBackend.get_kv_cache_shape: per layer
//                kv_cache [2, num_blocks, block_size, num_kv_heads, head_size];
//                key_cache, value_cache = kv_cache.unbind(0)
//                (reshape_and_cache_flash in csrc/cache_kernels.cu writes it).
//   vllm-flash-cross-layer  the same backend's cross-layer arrangement (one
//                tensor for every layer, get_kv_cache_stride_order with the
//                layers dimension, used by KV connectors):
//                [num_blocks, num_layers, 2, block_size, num_kv_heads, head_size].
//   vllm-paged   vllm/attention/ops/paged_attn.py, PagedAttention.split_kv_cache
//                (and get_key_block_shape of the original cache engine):
//                key_cache [num_blocks, num_kv_heads, head_size/x, block_size, x],
//                value_cache [num_blocks, num_kv_heads, head_size, block_size],
//                x = 16 bytes / element size, two tensors per layer
//                (reshape_and_cache in csrc/cache_kernels.cu writes them).
//   flashinfer   flashinfer/page.py, append_paged_kv_cache, with paged_kv_cache
//                one tensor per layer [max_num_pages, 2, page_size,
//                num_kv_heads, head_dim] (NHD) or [max_num_pages, 2,
//                num_kv_heads, page_size, head_dim] (HND); K = t[:, 0].
//   flashinfer-tuple  the same function with paged_kv_cache a (k_cache,
//                v_cache) tuple, each [max_num_pages, page_size, num_kv_heads,
//                head_dim] (NHD) or [max_num_pages, num_kv_heads, page_size,
//                head_dim] (HND) (flashinfer/utils.py, _unpack_paged_kv_cache).
//   trtllm       cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp (the pool
//                [num_blocks, num_layers, kv_factor, block_size]) and
//                cpp/tensorrt_llm/kernels/kvCacheUtils.h,
//                KVBlockArray::getKVLocalIdx (head * tokens_per_block *
//                dims_per_head + token * dims_per_head + channel): one pool
//                [num_blocks, num_layers, 2, num_kv_heads, tokens_per_block, head_dim].
//   sglang       python/sglang/srt/mem_cache/memory_pool.py, MHATokenToKVPool:
//                per layer k_buffer and v_buffer [size + page_size, head_num,
//                head_dim], indexed by the token's cache location (page *
//                page_size + offset); kvsim's block b is SGLang's page b (SGLang
//                keeps location 0 as the padding slot: leave block 0 unused).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "errors.hpp"
#include "geometry.hpp"
#include "kvsim/core/geometry.hpp"

namespace kvsim {

enum class Engine : uint8_t { vllm_flash, vllm_flash_cross_layer, vllm_paged, flashinfer, flashinfer_tuple, trtllm, sglang };

inline constexpr std::array<Engine, 7> kEngines = {Engine::vllm_flash, Engine::vllm_flash_cross_layer,
                                                   Engine::vllm_paged, Engine::flashinfer, Engine::flashinfer_tuple,
                                                   Engine::trtllm, Engine::sglang};

constexpr std::string_view engine_name(Engine e) {
  switch (e) {
    case Engine::vllm_flash: return "vllm-flash";
    case Engine::vllm_flash_cross_layer: return "vllm-flash-cross-layer";
    case Engine::vllm_paged: return "vllm-paged";
    case Engine::flashinfer: return "flashinfer";
    case Engine::flashinfer_tuple: return "flashinfer-tuple";
    case Engine::trtllm: return "trtllm";
    case Engine::sglang: return "sglang";
  }
  return "?";
}

constexpr std::optional<Engine> parse_engine(std::string_view s) {
  for (Engine e : kEngines)
    if (engine_name(e) == s) return e;
  return std::nullopt;
}

inline std::string engine_choices() {
  std::string s;
  for (Engine e : kEngines) s += (s.empty() ? "" : "|") + std::string(engine_name(e));
  return s;
}

// The block layout and layer placement an engine has. FlashInfer's kv_layout
// is the caller's choice (NHD or HND): `requested` passes through.
constexpr BlockLayout engine_block_layout(Engine e, BlockLayout requested) {
  switch (e) {
    case Engine::flashinfer:
    case Engine::flashinfer_tuple: return requested;
    case Engine::vllm_paged: return BlockLayout::split_x;
    case Engine::trtllm: return BlockLayout::hnd;
    default: return BlockLayout::nhd;
  }
}
constexpr LayerPlacement engine_placement(Engine e) {
  return e == Engine::vllm_flash_cross_layer || e == Engine::trtllm ? LayerPlacement::in_block
                                                                    : LayerPlacement::per_layer;
}

// What one axis of an engine tensor indexes. `slot` is SGLang's token
// location block * P + entry (one axis for both).
enum class EngineAxis : uint8_t { kv, layer, block, head, token, dim, dim_outer, dim_inner, slot };

struct EngineTensorAxis {
  std::string name;
  EngineAxis indexes;
  int64_t extent = 0;
  int64_t stride = 0;  // row-major stride of the engine's contiguous tensor (elements)
};

// One of the engine's tensors (one per layer when per_layer).
struct EngineTensor {
  std::string name;     // the engine's own name: kv_cache, key_cache, paged_kv_cache, k_buffer, ...
  bool per_layer = true;
  int32_t kv = -1;      // -1: holds K and V (a kv axis); 0: K only; 1: V only
  std::vector<EngineTensorAxis> axes;
  int64_t elements() const {
    int64_t n = 1;
    for (const EngineTensorAxis& a : axes) n *= a.extent;
    return n;
  }
  std::string shape_text() const {
    std::string t;
    for (const EngineTensorAxis& a : axes) t += "[" + a.name + " " + std::to_string(a.extent) + "]";
    return t;
  }
};

struct EngineLayout {
  Engine engine = Engine::flashinfer;
  PoolGeometry geometry;        // layout and placement as the engine has them
  PoolStrides strides;          // into the one allocation of every tensor (see the header)
  int64_t allocation_elements = 0;
  std::vector<EngineTensor> tensors;  // one (K and V together) or two (K, then V)

  int32_t tensor_index(int32_t kv) const { return tensors.size() == 1 ? 0 : kv; }
  const EngineTensor& tensor_of(int32_t kv) const { return tensors[tensor_index(kv)]; }
  // First element of the tensor holding (layer, kv) within the allocation.
  int64_t tensor_base(int32_t layer, int32_t kv) const {
    const EngineTensor& t = tensor_of(kv);
    return (t.per_layer ? static_cast<int64_t>(layer) * strides.layer : 0) +
           (t.kv >= 0 ? static_cast<int64_t>(kv) * strides.kv : 0);
  }
  // "key_cache[layer 1]" or "pool"
  std::string tensor_label(int32_t layer, int32_t kv) const {
    const EngineTensor& t = tensor_of(kv);
    return t.per_layer ? t.name + "[layer " + std::to_string(layer) + "]" : t.name;
  }
};

namespace engine_detail {

inline EngineTensorAxis axis(const char* name, EngineAxis what, int64_t extent) { return {name, what, extent, 0}; }

// kvsim's strides for tensors whose axes have strides axis_strides[tensor][axis]
// (elements): the axis that indexes a coordinate gives its stride. Two tensors
// (K and V apart) lie kv_distance elements apart; per-layer tensors
// layer_distance apart.
inline PoolStrides strides_from_axes(const PoolGeometry& g, const std::vector<EngineTensor>& tensors,
                                     const std::vector<std::vector<int64_t>>& axis_strides, int64_t kv_distance,
                                     int64_t layer_distance) {
  PoolStrides s{};
  for (int32_t kv = 0; kv < g.kv_factor; ++kv) {
    const size_t ti = tensors.size() == 1 ? 0 : static_cast<size_t>(kv);
    const EngineTensor& t = tensors[ti];
    InnerStrides in{};
    in.x = g.head_dim;
    for (size_t i = 0; i < t.axes.size(); ++i) {
      const int64_t stride = axis_strides[ti][i];
      switch (t.axes[i].indexes) {
        case EngineAxis::kv: s.kv = stride; break;
        case EngineAxis::layer: s.layer = stride; break;
        case EngineAxis::block: s.block = stride; break;
        case EngineAxis::slot:
          s.block = stride * g.tokens_per_block;
          in.token = stride;
          break;
        case EngineAxis::head: in.head = stride; break;
        case EngineAxis::token: in.token = stride; break;
        case EngineAxis::dim: in.dim_inner = stride; break;
        case EngineAxis::dim_outer: in.dim_outer = stride; break;
        case EngineAxis::dim_inner:
          in.dim_inner = stride;
          in.x = static_cast<int32_t>(t.axes[i].extent);
          break;
      }
    }
    if (in.x == g.head_dim) in.dim_outer = g.head_dim * in.dim_inner;  // dim / x is always 0
    s.inner[kv] = in;
    if (t.kv >= 0 && kv == 1) s.kv = kv_distance;
    if (t.per_layer) s.layer = layer_distance;
  }
  return s;
}

// Row-major strides of the engine's contiguous tensors, laid in one
// allocation (layer after layer, K tensor before V tensor).
inline void finish(EngineLayout& l) {
  std::vector<std::vector<int64_t>> axis_strides;
  int64_t per_layer = 0;
  bool any_per_layer = false;
  for (EngineTensor& t : l.tensors) {
    int64_t stride = 1;
    for (size_t i = t.axes.size(); i-- > 0;) {
      t.axes[i].stride = stride;
      stride *= t.axes[i].extent;
    }
    std::vector<int64_t> row;
    for (const EngineTensorAxis& a : t.axes) row.push_back(a.stride);
    axis_strides.push_back(row);
    if (t.per_layer) per_layer += t.elements();
    any_per_layer |= t.per_layer;
  }
  l.strides = strides_from_axes(l.geometry, l.tensors, axis_strides, l.tensors[0].elements(), per_layer);
  l.allocation_elements = any_per_layer ? l.geometry.layers * per_layer : l.tensors[0].elements();
}

}  // namespace engine_detail

using engine_detail::strides_from_axes;

// The engine's tensors for geometry g (layers, heads, page size, head_dim,
// dtype, blocks of pool `kind`). The engine fixes the layout and placement;
// FlashInfer keeps g's NHD or HND. A geometry the engine cannot hold is a
// bad_geometry error naming the engine and the rule.
inline EngineLayout engine_layout(Engine e, PoolGeometry g, PoolKind kind = PoolKind::primary) {
  using engine_detail::axis;
  const std::string who = "engine " + std::string(engine_name(e)) + ": ";
  const bool flashinfer = e == Engine::flashinfer || e == Engine::flashinfer_tuple;
  const bool nvfp4_ok = flashinfer || e == Engine::trtllm;
  if (g.dtype == CacheDtype::nvfp4 && !nvfp4_ok)
    fail(ErrorCode::bad_geometry, who + "no nvfp4 cache (nvfp4 presets: flashinfer, flashinfer-tuple, trtllm)");
  if (g.kv_factor != 2) fail(ErrorCode::bad_geometry, who + "kv_factor must be 2 (separate K and V)");
  if (flashinfer && g.layout == BlockLayout::split_x)
    fail(ErrorCode::bad_geometry, who + "kv_layout is NHD or HND, not split-x");
  g.layout = engine_block_layout(e, g.layout);
  g.placement = engine_placement(e);
  validate_geometry(g);

  const int64_t B = g.blocks(kind), L = g.layers, H = g.kv_heads, P = g.tokens_per_block, D = g.head_dim;
  const auto kv2 = axis("kv", EngineAxis::kv, 2);
  const auto blocks = axis("blocks", EngineAxis::block, B);
  const auto heads = axis("heads", EngineAxis::head, H);
  const auto tokens = axis("tokens", EngineAxis::token, P);
  const auto dims = axis("dim", EngineAxis::dim, D);
  const bool hnd = g.layout == BlockLayout::hnd;
  EngineLayout l;
  l.engine = e;
  l.geometry = g;
  switch (e) {
    case Engine::vllm_flash:
      l.tensors = {{"kv_cache", true, -1, {kv2, blocks, tokens, heads, dims}}};
      break;
    case Engine::vllm_flash_cross_layer:
      l.tensors = {{"kv_cache", false, -1, {blocks, axis("layers", EngineAxis::layer, L), kv2, tokens, heads, dims}}};
      break;
    case Engine::vllm_paged: {
      const int64_t x = g.split_x();
      l.tensors = {{"key_cache", true, 0,
                    {blocks, heads, axis("dim/x", EngineAxis::dim_outer, D / x), tokens,
                     axis("x", EngineAxis::dim_inner, x)}},
                   {"value_cache", true, 1, {blocks, heads, dims, tokens}}};
      break;
    }
    case Engine::flashinfer:
      l.tensors = {{"paged_kv_cache", true, -1,
                    hnd ? std::vector{blocks, kv2, heads, tokens, dims} : std::vector{blocks, kv2, tokens, heads, dims}}};
      break;
    case Engine::flashinfer_tuple: {
      const auto inner = hnd ? std::vector{blocks, heads, tokens, dims} : std::vector{blocks, tokens, heads, dims};
      l.tensors = {{"k_cache", true, 0, inner}, {"v_cache", true, 1, inner}};
      break;
    }
    case Engine::trtllm:
      l.tensors = {{"pool", false, -1, {blocks, axis("layers", EngineAxis::layer, L), kv2, heads, tokens, dims}}};
      break;
    case Engine::sglang: {
      const auto slots = axis("locations", EngineAxis::slot, B * P);
      l.tensors = {{"k_buffer", true, 0, {slots, heads, dims}}, {"v_buffer", true, 1, {slots, heads, dims}}};
      break;
    }
  }
  engine_detail::finish(l);
  validate_strides(g, l.strides, kind, l.allocation_elements);
  return l;
}

// The nvfp4 block-scale tensors of an engine: the same arrangement with
// head_dim / 16 one-byte scales (FlashInfer's and TensorRT-LLM's scale
// pools mirror their data pools).
inline EngineLayout engine_scale_layout(Engine e, const PoolGeometry& g, PoolKind kind = PoolKind::primary) {
  const EngineLayout data = engine_layout(e, g, kind);
  return engine_layout(e, data.geometry.scale_geometry(), kind);
}

}  // namespace kvsim
