// kvsim._kvsim: the C++ side of the Python module (docs/python.md). Tensors
// arrive through DLPack (any object with __dlpack__: numpy arrays, torch CPU
// tensors); the memory is used in place, with the tensor's own strides. Pools
// are built from an engine's tensors through core's engine presets
// (validation/engine_presets.hpp), ops run through the Backend API on the CPU
// oracle, explain() is sim::explain. The engine-shaped wrappers, CUDA
// staging and kvsim.testing are Python (python/kvsim/*.py).
//
// Element types: DLPack float 32/16, bfloat 16, int 8, uint 8 (fp8 codes,
// nvfp4 packed bytes: the kvsim dtype says which) and the float8 type codes of
// DLPack >= 1.0 (kDLFloat8_e4m3fn = 10, kDLFloat8_e5m2 = 12), read here by
// number because Debian's dlpack.h (0.6) predates them.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <dlpack/dlpack.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <ucontext.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvsim/validation.hpp"
#include "backends/backend.hpp"
#include "kvsim/sim/explain.hpp"
#include "kvsim/sim/replay.hpp"
#include "kvsim/sim/scenario_file.hpp"

namespace py = pybind11;
using namespace kvsim;

namespace {

constexpr uint8_t kDLFloat8_e4m3fn = 10;  // DLPack 1.0 (dlpack.h of 0.6 has no float8 codes)
constexpr uint8_t kDLFloat8_e5m2 = 12;

// A borrowed DLPack tensor: the capsule keeps the producer's memory alive for
// as long as this object lives (we never take ownership, so the capsule's own
// destructor releases it).
struct Borrowed {
  py::object capsule;
  DLTensor* t = nullptr;
  bool on_cuda() const { return t->device.device_type == kDLCUDA; }
};

Borrowed borrow(py::handle obj, const std::string& what) {
  if (!py::hasattr(obj, "__dlpack__"))
    fail(ErrorCode::shape_mismatch, what + ": expected an object with __dlpack__ (numpy array, torch tensor)");
  Borrowed b;
  b.capsule = obj.attr("__dlpack__")();
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(b.capsule.ptr(), "dltensor"));
  if (managed == nullptr) {
    PyErr_Clear();
    fail(ErrorCode::shape_mismatch, what + ": __dlpack__ did not return a DLPack tensor capsule");
  }
  b.t = &managed->dl_tensor;
  const DLDeviceType type = b.t->device.device_type;
  // CUDA tensors run on the CUDA backend (device 0, the one CudaBackend uses);
  // without it the Python layer stages them through host copies.
  if (type == kDLCUDA && (!KVSIM_HAVE_CUDA || b.t->device.device_id != 0))
    fail(ErrorCode::bad_argument, what + ": a tensor on cuda:" + std::to_string(b.t->device.device_id) +
                                      (KVSIM_HAVE_CUDA ? ": kvsim's CUDA backend runs on cuda:0"
                                                       : " reached a module built without CUDA"));
  if (type != kDLCPU && type != kDLCUDAHost && type != kDLCUDA)
    fail(ErrorCode::bad_argument, what + ": DLPack device type " + std::to_string(type) + " is neither the host nor CUDA");
  if (b.t->dtype.lanes != 1) fail(ErrorCode::shape_mismatch, what + ": vector element types are not supported");
  return b;
}

// The kvsim dtype a DLPack element type can hold. `as` names the dtype the
// bytes mean when the element type cannot say (uint8 holding fp8 codes).
CacheDtype dtype_of(const DLTensor& t, const std::string& as, const std::string& what) {
  const DLDataType d = t.dtype;
  if (!as.empty()) {
    const std::optional<CacheDtype> want = parse_dtype(as);
    if (!want) fail(ErrorCode::bad_argument, what + ": unknown kvsim dtype '" + as + "'");
    const bool byte_holder = d.bits == 8 && (d.code == kDLUInt || d.code == kDLInt || d.code == kDLFloat8_e4m3fn ||
                                             d.code == kDLFloat8_e5m2);
    const int want_bits = *want == CacheDtype::nvfp4 ? 8 : bits_per_element(*want);
    if (byte_holder && want_bits == 8) return *want;
    if (!byte_holder && static_cast<int>(d.bits) == want_bits) return *want;
    fail(ErrorCode::shape_mismatch, what + ": element type (code " + std::to_string(d.code) + ", " +
                                        std::to_string(d.bits) + " bits) cannot hold " + as);
  }
  if (d.code == kDLFloat && d.bits == 32) return CacheDtype::fp32;
  if (d.code == kDLFloat && d.bits == 16) return CacheDtype::fp16;
  if (d.code == kDLBfloat && d.bits == 16) return CacheDtype::bf16;
  if (d.code == kDLInt && d.bits == 8) return CacheDtype::int8;
  if (d.code == kDLFloat8_e4m3fn && d.bits == 8) return CacheDtype::fp8_e4m3;
  if (d.code == kDLFloat8_e5m2 && d.bits == 8) return CacheDtype::fp8_e5m2;
  fail(ErrorCode::shape_mismatch, what + ": element type code " + std::to_string(d.code) + " with " +
                                      std::to_string(d.bits) + " bits is not a kvsim type (uint8 needs dtype=...)");
}

int64_t dl_stride(const DLTensor& t, int i) {
  if (t.strides) return t.strides[i];
  int64_t s = 1;
  for (int j = t.ndim - 1; j > i; --j) s *= t.shape[j];
  return s;
}

void* dl_data(const DLTensor& t) { return static_cast<uint8_t*>(t.data) + t.byte_offset; }

// One past the largest element offset the tensor reaches (0 when empty).
int64_t dl_extent(const DLTensor& t) {
  int64_t last = 0;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] == 0) return 0;
    if (dl_stride(t, i) < 0) fail(ErrorCode::bad_strides, "negative strides are not supported");
    last += (t.shape[i] - 1) * dl_stride(t, i);
  }
  return last + 1;
}

// A TensorView over a borrowed tensor of the expected rank.
TensorView view_of(const Borrowed& b, CacheDtype dtype, int rank, const std::string& what) {
  const DLTensor& t = *b.t;
  if (t.ndim != rank)
    fail(ErrorCode::shape_mismatch, what + ": expected rank " + std::to_string(rank) + ", got " + std::to_string(t.ndim));
  TensorView v;
  v.data = dl_data(t);
  v.dtype = dtype;
  v.rank = rank;
  for (int i = 0; i < rank; ++i) {
    v.shape[i] = t.shape[i];
    v.stride[i] = dl_stride(t, i);
  }
  return v;
}

// A new 1-D C-contiguous array of n elements, from a shape vector. Not
// array_t(count): built with pybind11 3.1 and numpy 2 (the GPU machine's venv)
// that constructor gave arrays whose every element read back as the first
// (docs/python.md), and writing n elements through mutable_data() overran it.
template <class T>
py::array_t<T> new_vector(py::ssize_t n) {
  return py::array_t<T>(std::vector<py::ssize_t>{n});
}

template <class T>
std::vector<T> int_list(const py::handle& obj) {
  py::array_t<T, py::array::c_style | py::array::forcecast> a = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(obj);
  if (!a) fail(ErrorCode::shape_mismatch, "expected an integer array");
  return std::vector<T>(a.data(), a.data() + a.size());
}

// The engine a name means, or bad_argument.
Engine engine_named(const std::string& name) {
  const std::optional<Engine> e = parse_engine(name);
  if (!e) fail(ErrorCode::bad_argument, "engine '" + name + "': expected one of " + engine_choices());
  return *e;
}

// A geometry from the Python side's names and numbers (validated by core when used).
PoolGeometry geometry_of(const std::string& dtype, const std::string& layout, int32_t layers, int32_t kv_heads,
                         int32_t page_size, int32_t head_dim, int64_t blocks) {
  PoolGeometry g{.layers = layers, .kv_heads = kv_heads, .tokens_per_block = page_size, .head_dim = head_dim,
                 .primary_blocks = blocks};
  const std::optional<CacheDtype> d = parse_dtype(dtype);
  if (!d) fail(ErrorCode::bad_argument, "cache dtype '" + dtype + "' is not a kvsim dtype");
  g.dtype = *d;
  const std::optional<BlockLayout> l = parse_layout(layout);
  if (!l) fail(ErrorCode::bad_argument, "layout '" + layout + "': expected NHD, HND or split-x");
  g.layout = *l;
  return g;
}

// ---------------------------------------------------------------- pools from engine tensors

// An engine's cache tensors, borrowed, as one KvPools (primary pool only). Two
// tensors (K and V apart) must lie in one address range with V after K; the
// Python layer stages them otherwise. Per-layer engines take one layer's
// tensors (geometry layers = 1).
struct EnginePools {
  std::vector<Borrowed> keep;
  KvPools pools;
  EngineLayout layout;
};

std::shared_ptr<EnginePools> engine_pools(const std::string& engine_name, const std::string& dtype,
                                          const std::string& kv_layout, int32_t layers, int32_t kv_heads,
                                          int32_t page_size, int32_t head_dim, const py::list& tensors,
                                          const py::list& scale_tensors) {
  const std::optional<Engine> engine = engine_named(engine_name);
  const PoolGeometry g = geometry_of(dtype, kv_layout, layers, kv_heads, page_size, head_dim, 1);
  auto out = std::make_shared<EnginePools>();

  // The block count is the engine tensor's block (or location) axis extent.
  const auto bind = [&](const py::list& list, bool scales, const PoolGeometry& geo0) -> EngineLayout {
    EngineLayout probe = engine_layout(*engine, geo0);
    if (list.size() != probe.tensors.size())
      fail(ErrorCode::shape_mismatch, std::string("engine ") + engine_name + ": expected " +
                                          std::to_string(probe.tensors.size()) + (scales ? " scale" : "") +
                                          " tensor(s), got " + std::to_string(list.size()));
    std::vector<Borrowed> borrowed;
    for (size_t i = 0; i < list.size(); ++i)
      borrowed.push_back(borrow(list[i], probe.tensors[i].name));
    const auto check_rank = [](const DLTensor& t, const EngineTensor& e) {
      if (t.ndim != static_cast<int>(e.axes.size()))
        fail(ErrorCode::shape_mismatch, e.name + ": expected rank " + std::to_string(e.axes.size()) + " " +
                                            e.shape_text() + ", got rank " + std::to_string(t.ndim));
    };
    // nvfp4 data is packed two per byte: the last (dim) axis counts bytes.
    const bool packed = geo0.dtype == CacheDtype::nvfp4;
    PoolGeometry geo = geo0;
    {
      const DLTensor& t0 = *borrowed[0].t;
      const EngineTensor& e0 = probe.tensors[0];
      check_rank(t0, e0);
      for (size_t a = 0; a < e0.axes.size(); ++a) {
        if (e0.axes[a].indexes == EngineAxis::block) geo.primary_blocks = t0.shape[a];
        if (e0.axes[a].indexes == EngineAxis::slot) {
          if (t0.shape[a] % page_size != 0)
            fail(ErrorCode::shape_mismatch, e0.name + ": " + std::to_string(t0.shape[a]) +
                                                " locations is not a whole number of pages of " + std::to_string(page_size));
          geo.primary_blocks = t0.shape[a] / page_size;
        }
      }
    }
    EngineLayout l = engine_layout(*engine, geo);
    std::vector<std::vector<int64_t>> axis_strides;
    for (size_t i = 0; i < borrowed.size(); ++i) {
      const DLTensor& t = *borrowed[i].t;
      const EngineTensor& e = l.tensors[i];
      check_rank(t, e);
      dtype_of(t, scales ? "fp8_e4m3" : dtype, e.name);  // the element type must hold the cache dtype
      std::vector<int64_t> row;
      for (size_t a = 0; a < e.axes.size(); ++a) {
        const bool last = a + 1 == e.axes.size();
        const int64_t want = packed && last ? e.axes[a].extent / 2 : e.axes[a].extent;
        if (t.shape[a] != want)
          fail(ErrorCode::shape_mismatch, e.name + ": axis " + std::to_string(a) + " (" + e.axes[a].name + ") is " +
                                              std::to_string(t.shape[a]) + ", expected " + std::to_string(want) +
                                              " for " + e.shape_text() + (packed && last ? " (packed bytes)" : ""));
        int64_t stride = dl_stride(t, static_cast<int>(a));
        if (packed) {
          if (last && stride != 1)
            fail(ErrorCode::bad_strides, e.name + ": packed nvfp4 bytes must be contiguous in the last axis");
          stride = last ? 1 : 2 * stride;  // strides in nibbles
        }
        row.push_back(stride);
      }
      axis_strides.push_back(row);
    }
    // Two tensors: V's distance from K in elements (nibbles for nvfp4).
    const int64_t unit_bits = packed ? 4 : bits_per_element(geo.dtype);
    const auto* base = static_cast<const uint8_t*>(dl_data(*borrowed[0].t));
    int64_t kv_distance = 0, allocation = dl_extent(*borrowed[0].t) * (packed ? 2 : 1);
    if (borrowed.size() == 2) {
      const auto* v = static_cast<const uint8_t*>(dl_data(*borrowed[1].t));
      const int64_t bytes = v - base;
      if (bytes <= 0 || (bytes * 8) % unit_bits != 0)
        fail(ErrorCode::bad_argument, "kv_tensors_unordered: the V tensor does not lie after the K tensor in whole "
                                      "elements (the Python layer stages such tensors)");
      kv_distance = bytes * 8 / unit_bits;
      allocation = kv_distance + dl_extent(*borrowed[1].t) * (packed ? 2 : 1);
    }
    l.strides = strides_from_axes(geo, l.tensors, axis_strides, kv_distance, 0);
    l.allocation_elements = allocation;
    for (Borrowed& b : borrowed) out->keep.push_back(std::move(b));
    return l;
  };

  if (engine_layout(*engine, g).tensors[0].per_layer && layers != 1)
    fail(ErrorCode::bad_argument, "a per-layer engine's tensors hold one layer: layers must be 1");
  out->layout = bind(tensors, false, g);
  const PoolGeometry& geo = out->layout.geometry;
  out->pools.geometry = geo;
  out->pools.data[0] = const_cast<void*>(static_cast<const void*>(dl_data(*out->keep[0].t)));
  out->pools.strides[0] = out->layout.strides;
  out->pools.allocation_elements[0] = out->layout.allocation_elements;
  if (geo.has_scale_pool()) {
    const size_t first = out->keep.size();
    PoolGeometry sg = geo.scale_geometry();
    sg.primary_blocks = geo.primary_blocks;
    const EngineLayout sl = bind(scale_tensors, true, sg);
    out->pools.scales[0] = dl_data(*out->keep[first].t);
    out->pools.scale_strides[0] = sl.strides;
    out->pools.scale_allocation_elements[0] = sl.allocation_elements;
  } else if (!scale_tensors.empty()) {
    fail(ErrorCode::bad_argument, "scale tensors are for nvfp4 caches only");
  }
  validate_pool(out->pools, PoolKind::primary, "engine " + engine_name + " tensors: ");
  return out;
}

// ---------------------------------------------------------------- latent (MLA) pools and the secondary pool

// A latent pool (kv_factor 1, one head: DeepSeek MLA's [ckv | kpe] row per
// token) over one borrowed tensor [blocks, page_size, width] with its own
// strides: vLLM's MLA kv_cache per layer ([num_blocks, block_size,
// kv_lora_rank + pe_dim], vllm/v1/attention/backends/mla/common.py
// get_kv_cache_shape) and FlashInfer's ckv_kpe cache. nvfp4: packed bytes
// (width / 2 per row) and a byte scale tensor [blocks, page_size, width / 16].
std::shared_ptr<EnginePools> latent_pools(py::handle tensor, const std::string& dtype, const py::object& scale_tensor) {
  auto out = std::make_shared<EnginePools>();
  out->keep.push_back(borrow(tensor, "kv_cache"));
  const DLTensor& t = *out->keep[0].t;
  if (t.ndim != 3)
    fail(ErrorCode::shape_mismatch, "kv_cache: expected rank 3 [blocks, page_size, width], got rank " + std::to_string(t.ndim));
  const CacheDtype d = dtype_of(t, dtype, "kv_cache");
  const bool packed = d == CacheDtype::nvfp4;
  const int64_t unit = packed ? 2 : 1;  // strides in nibbles for nvfp4
  if (packed && dl_stride(t, 2) != 1)
    fail(ErrorCode::bad_strides, "kv_cache: packed nvfp4 bytes must be contiguous in the last axis");
  const auto int32_extent = [](int64_t n, const char* what) {
    if (n < 1 || n > INT32_MAX) fail(ErrorCode::shape_mismatch, std::string("kv_cache: ") + what + " of " + std::to_string(n));
    return static_cast<int32_t>(n);
  };
  PoolGeometry g{.layers = 1, .kv_factor = 1, .kv_heads = 1,
                 .tokens_per_block = int32_extent(t.shape[1], "page_size"),
                 .head_dim = int32_extent(t.shape[2] * unit, "row width"), .primary_blocks = t.shape[0]};
  g.dtype = d;
  g.layout = BlockLayout::nhd;
  const auto strides_of = [&](const DLTensor& x, int64_t u, int32_t width) {
    PoolStrides s{};
    s.block = dl_stride(x, 0) * u;
    s.layer = s.block;  // one layer: never multiplied by more than 0
    s.kv = 0;
    s.inner[0] = InnerStrides{.head = 0, .token = dl_stride(x, 1) * u, .dim_outer = width * (u == 2 ? 1 : dl_stride(x, 2)),
                              .dim_inner = u == 2 ? 1 : dl_stride(x, 2), .x = width};
    s.inner[1] = s.inner[0];
    return s;
  };
  out->pools.geometry = g;
  out->pools.data[0] = dl_data(t);
  out->pools.strides[0] = strides_of(t, unit, g.head_dim);
  out->pools.allocation_elements[0] = dl_extent(t) * unit;
  if (packed) {
    if (scale_tensor.is_none()) fail(ErrorCode::bad_argument, "an nvfp4 latent pool needs its scale tensor");
    out->keep.push_back(borrow(scale_tensor, "kv_cache_scales"));
    const DLTensor& st = *out->keep[1].t;
    const PoolGeometry sg = g.scale_geometry();
    dtype_of(st, "fp8_e4m3", "kv_cache_scales");
    if (st.ndim != 3 || st.shape[0] != t.shape[0] || st.shape[1] != t.shape[1] || st.shape[2] != sg.head_dim)
      fail(ErrorCode::shape_mismatch, "kv_cache_scales: expected [" + std::to_string(t.shape[0]) + ", " +
                                          std::to_string(t.shape[1]) + ", " + std::to_string(sg.head_dim) + "] bytes");
    out->pools.scales[0] = dl_data(st);
    out->pools.scale_strides[0] = strides_of(st, 1, sg.head_dim);
    out->pools.scale_allocation_elements[0] = dl_extent(st);
  } else if (!scale_tensor.is_none()) {
    fail(ErrorCode::bad_argument, "scale tensors are for nvfp4 caches only");
  }
  validate_pool(out->pools, PoolKind::primary, "latent kv_cache: ");
  return out;
}

// The pool `primary` with `secondary`'s primary pool as its secondary pool
// (TensorRT-LLM's host offload pool): same geometry but the block count, its
// own tensors and strides, and no byte shared with the primary pool.
std::shared_ptr<EnginePools> with_secondary(const std::shared_ptr<EnginePools>& primary,
                                            const std::shared_ptr<EnginePools>& secondary) {
  PoolGeometry a = primary->pools.geometry, b = secondary->pools.geometry;
  const int64_t secondary_blocks = b.primary_blocks;
  b.primary_blocks = a.primary_blocks;
  b.secondary_blocks = a.secondary_blocks;
  if (geometry_summary(a) != geometry_summary(b) || a.dtype != b.dtype || a.layout != b.layout || a.placement != b.placement)
    fail(ErrorCode::shape_mismatch, "the secondary pool's geometry (" + geometry_summary(secondary->pools.geometry) +
                                        ") differs from the primary's (" + geometry_summary(primary->pools.geometry) +
                                        ") in more than the block count");
  auto out = std::make_shared<EnginePools>(*primary);
  for (const Borrowed& k : secondary->keep) out->keep.push_back(k);
  KvPools& p = out->pools;
  const KvPools& s = secondary->pools;
  p.geometry.secondary_blocks = secondary_blocks;
  p.data[1] = s.data[0];
  p.strides[1] = s.strides[0];
  p.allocation_elements[1] = s.allocation_elements[0];
  p.scales[1] = s.scales[0];
  p.scale_strides[1] = s.scale_strides[0];
  p.scale_allocation_elements[1] = s.scale_allocation_elements[0];
  // Byte ranges of every primary and secondary allocation: a move must never read what it writes.
  const auto range = [](const void* d, int64_t elements, int64_t bits) {
    const auto* b0 = static_cast<const uint8_t*>(d);
    return std::pair{b0, b0 + (elements * bits + 7) / 8};
  };
  const int64_t bits = bits_per_element(a.dtype);
  std::vector<std::pair<const uint8_t*, const uint8_t*>> ranges[2];
  for (int k = 0; k < 2; ++k) {
    ranges[k].push_back(range(p.data[k], p.allocation_elements[k], bits));
    if (p.scales[k]) ranges[k].push_back(range(p.scales[k], p.scale_allocation_elements[k], 8));
  }
  for (const auto& x : ranges[0])
    for (const auto& y : ranges[1])
      if (x.first < y.second && y.first < x.second)
        fail(ErrorCode::bad_argument, "the secondary pool's tensors share memory with the primary pool's: rule: "
                                      "offload and onboard copy between two separate allocations");
  validate_pool(p, PoolKind::secondary, "secondary pool: ");
  return out;
}

// The CPU oracle, made on first use and never destroyed: a static's
// destructor would run at exit, after the interpreter is finalized, and tear
// down its oneTBB arena while oneTBB's own statics may already be gone. The
// process's end reclaims it.
Backend& cpu() {
  static Backend* const backend = make_backend("cpu").release();
  return *backend;
}

// The CUDA backend, made on first use like cpu(); backend_unavailable without a GPU.
Backend& cuda() {
  static Backend* const backend = make_backend("cuda").release();
  return *backend;
}

// The backend an op runs on: the CPU oracle when every tensor (the pool's and
// the op's) is host memory, the CUDA backend when every one is a CUDA tensor
// (kernels read and write them in place); a mix is refused by name. Before a
// CUDA op, every kernel already queued on the device (the caller's, e.g.
// PyTorch's stream) finishes, so the op reads what the caller wrote; the op
// itself ends synchronized.
Backend& backend_for(const char* op, const EnginePools* p, std::initializer_list<const Borrowed*> tensors) {
  int cuda_count = 0, count = 0;
  std::string first_cuda, first_host;
  const auto note = [&](const Borrowed& b, const char* what) {
    ++count;
    if (b.on_cuda()) {
      if (cuda_count++ == 0) first_cuda = what;
    } else if (first_host.empty()) {
      first_host = what;
    }
  };
  if (p != nullptr)
    for (const Borrowed& b : p->keep) note(b, "the cache");
  for (const Borrowed* b : tensors)
    if (b != nullptr && b->t != nullptr) note(*b, "an input or output tensor");
  if (cuda_count == 0) return cpu();
  if (cuda_count != count)
    fail(ErrorCode::bad_argument, std::string(op) + ": tensors on different devices (" + first_cuda + " on cuda:0, " +
                                      first_host + " on the host): rule: one device per op");
  Backend& b = cuda();
  b.wait_for_device();
  return b;
}

// A host view of `v`'s elements for code in this module that reads or writes
// them on the host (a CUDA tensor is downloaded into `bytes`); put_back()
// uploads them again after a host write.
struct HostElements {
  Backend* backend = nullptr;
  TensorView device_view, view;
  std::vector<uint8_t> bytes;
  size_t extent_bytes = 0;
  HostElements(Backend& b, const TensorView& v) : device_view(v), view(v) {
    if (&b == &cpu() || v.empty()) return;
    backend = &b;
    extent_bytes = static_cast<size_t>(v.span_bytes());
    bytes.resize(extent_bytes);
    b.to_host(bytes.data(), v.data, extent_bytes);
    view.data = bytes.data();
  }
  void put_back() {
    if (backend != nullptr) backend->to_backend(device_view.data, bytes.data(), extent_bytes);
  }
};

// A contiguous host array the module built (a RoPE table, gathered rows) as a
// tensor in `b`'s memory: itself on the CPU, a device copy held by `keep` on CUDA.
TensorView on_backend(Backend& b, const TensorView& host, BackendBuffer& keep) {
  if (&b == &cpu() || host.empty()) return host;
  const size_t bytes = static_cast<size_t>((host.numel() * bits_per_element(host.dtype) + 7) / 8);
  keep = BackendBuffer(b, bytes);
  keep.upload(host.data, bytes);
  TensorView v = host;
  v.data = keep.get();
  return v;
}

// ---------------------------------------------------------------- ops

// FlashInfer's append coordinates (batch_indices, positions and the CSR page
// table) as host int32 lists an append op's spans point into.
struct AppendCoordinateLists {
  std::vector<int32_t> batch, positions, indptr, indices, last;
  AppendCoordinateLists(py::handle b, py::handle p, py::handle ip, py::handle ix, py::handle lpl)
      : batch(int_list<int32_t>(b)), positions(int_list<int32_t>(p)), indptr(int_list<int32_t>(ip)),
        indices(int_list<int32_t>(ix)), last(int_list<int32_t>(lpl)) {}
  void into(AppendCoordinates& op) const { op = {batch, positions, indptr, indices, last}; }
};

void append_paged(const EnginePools& p, int32_t layer, py::handle k, py::handle v, py::handle batch_indices,
                  py::handle positions, py::handle indptr, py::handle indices, py::handle last_page_len,
                  const std::string& input_dtype, float k_global_scale, float v_global_scale) {
  const Borrowed kb = borrow(k, "append_key"), vb = borrow(v, "append_value");
  AppendPagedOp op;
  op.layer = layer;
  op.k = view_of(kb, dtype_of(*kb.t, input_dtype, "append_key"), 3, "append_key");
  op.v = view_of(vb, dtype_of(*vb.t, input_dtype, "append_value"), 3, "append_value");
  const AppendCoordinateLists at(batch_indices, positions, indptr, indices, last_page_len);
  at.into(op);
  op.k_global_scale = k_global_scale;
  op.v_global_scale = v_global_scale;
  backend_for("append_paged", &p, {&kb, &vb}).append_paged(p.pools, op);
}

void reshape_and_cache(const EnginePools& p, int32_t layer, py::handle key, py::handle value, py::handle slot_mapping,
                       const std::string& input_dtype, float k_scale, float v_scale) {
  const Borrowed kb = borrow(key, "key"), vb = borrow(value, "value");
  ReshapeAndCacheOp op;
  op.layer = layer;
  op.key = view_of(kb, dtype_of(*kb.t, input_dtype, "key"), 3, "key");
  op.value = view_of(vb, dtype_of(*vb.t, input_dtype, "value"), 3, "value");
  const std::vector<int64_t> slots = int_list<int64_t>(slot_mapping);
  op.slot_mapping = slots;
  op.k_scale = k_scale;
  op.v_scale = v_scale;
  backend_for("reshape_and_cache", &p, {&kb, &vb}).reshape_and_cache(p.pools, op);
}

// What decode and prefill attention take alike: q and out (fp32 or the input
// dtype, rank 3), the table's width, the scales and the window.
template <class Op>
void bind_attention(Op& op, const EnginePools& p, int32_t layer, const Borrowed& qb, const Borrowed& ob,
                    int32_t max_blocks_per_seq, float sm_scale, float k_scale, float v_scale, float kg, float vg,
                    int32_t window, int32_t sinks) {
  op.layer = layer;
  op.q = view_of(qb, dtype_of(*qb.t, "", "q"), 3, "q");
  op.out = view_of(ob, dtype_of(*ob.t, "", "out"), 3, "out");
  op.max_blocks_per_seq = max_blocks_per_seq;
  op.scales = AttentionScales{
      .sm_scale = sm_scale, .k_scale = k_scale, .v_scale = v_scale, .k_global_scale = kg, .v_global_scale = vg};
  op.window = WindowMapping::make_linear(window, sinks, p.pools.geometry.tokens_per_block);  // FlashInfer's/vLLM's windows: slot = position
}

// The optional LSE output of an attention op: None (not written) or an
// [rows, Hq] fp32 tensor, any strides (a transposed [Hq, rows] view is fine).
TensorView lse_view(const py::object& lse, std::vector<Borrowed>& keep) {
  if (lse.is_none()) return {};
  keep.push_back(borrow(lse, "lse"));
  return view_of(keep.back(), dtype_of(*keep.back().t, "", "lse"), 2, "lse");
}

// FlashInfer's convention: the natural-log LSE the op wrote, in base 2
// (core's lse_base2: one multiply by fp32 log2(e)), in place.
void lse_to_base2(Backend& b, const TensorView& lse) {
  HostElements host(b, lse);
  for (int64_t r = 0; r < lse.shape[0]; ++r)
    for (int64_t h = 0; h < lse.shape[1]; ++h) {
      float& x = static_cast<float*>(host.view.data)[host.view.offset(r, h)];
      x = canonical_nan(canon::lse_base2(x));
    }
  host.put_back();
}

void decode_attention(const EnginePools& p, int32_t layer, py::handle q, py::handle out, py::handle seq_lens,
                      py::handle block_table, int32_t max_blocks_per_seq, float sm_scale, float k_scale, float v_scale,
                      float kg, float vg, int32_t window, int32_t sinks, const py::object& lse, bool lse_base2) {
  const Borrowed qb = borrow(q, "q"), ob = borrow(out, "out");
  std::vector<Borrowed> keep;
  DecodeAttentionOp op;
  bind_attention(op, p, layer, qb, ob, max_blocks_per_seq, sm_scale, k_scale, v_scale, kg, vg, window, sinks);
  op.lse = lse_view(lse, keep);
  const std::vector<int32_t> lens = int_list<int32_t>(seq_lens), table = int_list<int32_t>(block_table);
  op.seq_lens = lens;
  op.block_table = table;
  Backend& b = backend_for("decode_attention", &p, {&qb, &ob, keep.empty() ? nullptr : &keep[0]});
  b.decode_attention(p.pools, op);
  if (lse_base2 && !op.lse.empty()) lse_to_base2(b, op.lse);
}

void prefill_attention(const EnginePools& p, int32_t layer, py::handle q, py::handle out, py::handle q_indptr,
                       py::handle seq_lens, py::handle block_table, int32_t max_blocks_per_seq, float sm_scale,
                       float k_scale, float v_scale, float kg, float vg, int32_t window, int32_t sinks,
                       const py::object& lse, bool lse_base2) {
  const Borrowed qb = borrow(q, "q"), ob = borrow(out, "out");
  std::vector<Borrowed> keep;
  PrefillAttentionOp op;
  bind_attention(op, p, layer, qb, ob, max_blocks_per_seq, sm_scale, k_scale, v_scale, kg, vg, window, sinks);
  op.lse = lse_view(lse, keep);
  const std::vector<int32_t> qi = int_list<int32_t>(q_indptr), lens = int_list<int32_t>(seq_lens),
                             table = int_list<int32_t>(block_table);
  op.q_indptr = qi;
  op.seq_lens = lens;
  op.block_table = table;
  Backend& b = backend_for("prefill_attention", &p, {&qb, &ob, keep.empty() ? nullptr : &keep[0]});
  b.prefill_attention(p.pools, op);
  if (lse_base2 && !op.lse.empty()) lse_to_base2(b, op.lse);
}

// TensorRT-LLM's write path (applyBiasRopeUpdateKVCache) over its pool:
// core's qkv_preprocess_write with a RoPE table from core's build_rope_table.
void qkv_preprocess(const EnginePools& p, int32_t layer, int32_t num_q_heads, py::handle qkv, const py::object& bias,
                    py::handle q_out, const std::string& rope, int32_t rotary_dim, double rope_base,
                    int64_t max_position, py::handle seq_lens, py::handle cache_lens, const py::object& position_offsets,
                    py::handle block_table, int32_t max_blocks_per_seq, int32_t window, int32_t sinks,
                    bool context_phase, bool zero_v_tail, float k_scale, float v_scale, float kg, float vg) {
  const Borrowed xb = borrow(qkv, "qkv_input"), ob = borrow(q_out, "q_output");
  std::vector<Borrowed> keep;
  QkvPreprocessOp op;
  op.layer = layer;
  op.num_q_heads = num_q_heads;
  op.qkv = view_of(xb, dtype_of(*xb.t, "", "qkv_input"), 2, "qkv_input");
  op.q_out = view_of(ob, dtype_of(*ob.t, "", "q_output"), 3, "q_output");
  if (!bias.is_none()) {
    keep.push_back(borrow(bias, "qkv_bias"));
    op.bias = view_of(keep.back(), dtype_of(*keep.back().t, "", "qkv_bias"), 1, "qkv_bias");
  }
  Backend& b = backend_for("qkv_preprocess_write", &p, {&xb, &ob, keep.empty() ? nullptr : &keep[0]});
  RopeTable table;
  BackendBuffer table_on_backend;
  if (rope == "neox" || rope == "gptj") {
    op.rope_style = rope == "neox" ? RopeStyle::neox : RopeStyle::gptj;
    op.rotary_dim = rotary_dim;
    table = build_rope_table(rotary_dim, max_position, rope_base);
    op.cos_sin = on_backend(b, contiguous_view(table.cos_sin.data(), CacheDtype::fp32, {max_position, rotary_dim}),
                            table_on_backend);
  } else if (rope != "none") {
    fail(ErrorCode::bad_argument, "rope '" + rope + "': expected none, neox (GPT-NeoX) or gptj (GPT-J)");
  }
  const std::vector<int32_t> lens = int_list<int32_t>(seq_lens), cache = int_list<int32_t>(cache_lens),
                             blocks = int_list<int32_t>(block_table);
  std::vector<int32_t> offsets;
  if (!position_offsets.is_none()) offsets = int_list<int32_t>(position_offsets);
  op.seq_lens = lens;
  op.cache_lens = cache;
  op.position_offsets = offsets;
  op.block_table = blocks;
  op.max_blocks_per_seq = max_blocks_per_seq;
  op.window = WindowMapping::make(window, sinks, p.pools.geometry.tokens_per_block, false);  // TensorRT-LLM's ring
  op.context_phase = context_phase;
  op.zero_v_tail = zero_v_tail;
  op.scale_orig_quant[1] = k_scale;
  op.scale_orig_quant[2] = v_scale;
  op.nvfp4_global_scale[1] = kg;
  op.nvfp4_global_scale[2] = vg;
  b.qkv_preprocess_write(p.pools, op);
}

// gather_paged (contract §5.9's read side): one sequence's K (kv = 0) or V
// rows decoded to fp32 into out [num_tokens, H, D] (any strides).
void gather(const EnginePools& p, int32_t layer, int32_t kv, py::handle block_ids, int64_t num_tokens, py::handle out,
            float scale, float global_scale) {
  const Borrowed ob = borrow(out, "out");
  const std::vector<int32_t> ids = int_list<int32_t>(block_ids);
  GatherPagedOp op;
  op.layer = layer;
  op.kv = kv;
  op.block_ids = ids;
  op.num_tokens = num_tokens;
  op.out = view_of(ob, dtype_of(*ob.t, "", "out"), 3, "out");
  op.scale = scale;
  op.global_scale = global_scale;
  backend_for("gather_paged", &p, {&ob}).gather_paged(p.pools, op);
}

// vLLM's copy_blocks (whole blocks, data and nvfp4 scales) and TensorRT-LLM's
// partial copy (the first num_tokens entries of every (layer, kv, head)).
void copy_blocks(const EnginePools& p, py::handle src, py::handle dst) {
  const std::vector<int32_t> s = int_list<int32_t>(src), d = int_list<int32_t>(dst);
  if (s.size() != d.size()) fail(ErrorCode::shape_mismatch, "copy_blocks: src and dst lists differ in length");
  std::vector<std::pair<int32_t, int32_t>> pairs;
  for (size_t i = 0; i < s.size(); ++i) pairs.emplace_back(s[i], d[i]);
  CopyBlocksOp op;
  op.pairs = pairs;
  backend_for("copy_blocks", &p, {}).copy_blocks(p.pools, op);
}

void partial_copy(const EnginePools& p, int32_t src_block, int32_t dst_block, int32_t num_tokens) {
  PartialCopyOp op;
  op.src_block = src_block;
  op.dst_block = dst_block;
  op.num_tokens = num_tokens;
  backend_for("partial_copy", &p, {}).partial_copy(p.pools, op);
}

// ---------------------------------------------------------------- MLA, offload, onboard

// FlashInfer's append_paged_mla_kv_cache into a latent pool (contract §5.4):
// ckv [nnz, d_ckv] and kpe [nnz, d_kpe] with FlashInfer's CSR coordinates.
// ckv_dtype / kpe_dtype name what uint8 inputs hold ("" = the element type).
void append_mla(const EnginePools& p, int32_t layer, py::handle ckv, py::handle kpe, py::handle batch_indices,
                py::handle positions, py::handle indptr, py::handle indices, py::handle last_page_len,
                const std::string& ckv_dtype, const std::string& kpe_dtype, float ckv_global_scale, float kpe_scale) {
  const Borrowed cb = borrow(ckv, "append_ckv"), kb = borrow(kpe, "append_kpe");
  AppendMlaOp op;
  op.layer = layer;
  op.ckv = view_of(cb, dtype_of(*cb.t, ckv_dtype, "append_ckv"), 2, "append_ckv");
  op.kpe = view_of(kb, dtype_of(*kb.t, kpe_dtype, "append_kpe"), 2, "append_kpe");
  const AppendCoordinateLists at(batch_indices, positions, indptr, indices, last_page_len);
  at.into(op);
  op.ckv_global_scale = ckv_global_scale;
  op.kpe_scale = kpe_scale;
  backend_for("append_mla", &p, {&cb, &kb}).append_mla(p.pools, op);
}

// vLLM's concat_and_cache_mla (csrc/cache_kernels.cu): token i's [kv_c | k_pe]
// row goes to slot slot_mapping[i] = block * block_size + entry, a negative
// slot is skipped, rows past slot_mapping's length are padding. Run as
// append_mla with one CSR sequence per written block (a whole page, the
// token's entry its position), so core validates and writes. fp8 caches of
// float input: each element becomes core's fp8_encode_divided(x, scale)
// first (vLLM's scaled_convert divides), then its bytes are appended.
void concat_and_cache_mla(const EnginePools& p, py::handle kv_c, py::handle k_pe, py::handle slot_mapping,
                          const std::string& input_dtype, float scale) {
  const Borrowed cb = borrow(kv_c, "kv_c"), kb = borrow(k_pe, "k_pe");
  const PoolGeometry& g = p.pools.geometry;
  const std::vector<int64_t> slots = int_list<int64_t>(slot_mapping);
  TensorView ckv = view_of(cb, dtype_of(*cb.t, input_dtype, "kv_c"), 2, "kv_c");
  TensorView kpe = view_of(kb, dtype_of(*kb.t, input_dtype, "k_pe"), 2, "k_pe");
  const int64_t n = static_cast<int64_t>(slots.size());
  if (ckv.shape[0] < n || kpe.shape[0] < n)
    fail(ErrorCode::shape_mismatch, "kv_c has " + std::to_string(ckv.shape[0]) + " rows and k_pe " +
                                        std::to_string(kpe.shape[0]) + " but slot_mapping " + std::to_string(n) +
                                        ": rule: at least one row per slot (later rows are CUDA-graph padding)");
  std::vector<int32_t> batch, positions, indptr{0}, indices, last;
  std::vector<int64_t> rows;
  std::vector<int64_t> seq_of_block;
  std::unordered_map<int64_t, int32_t> seq_of;
  const int64_t capacity = g.primary_blocks * g.tokens_per_block;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = slots[static_cast<size_t>(i)];
    if (s < 0) continue;
    if (s >= capacity)
      fail(ErrorCode::slot_beyond_pool, "token " + std::to_string(i) + ": slot_mapping[" + std::to_string(i) + "] = " +
                                            std::to_string(s) + ": rule: slot < num_blocks * block_size = " +
                                            std::to_string(capacity));
    const int64_t block = s / g.tokens_per_block;
    auto [it, inserted] = seq_of.emplace(block, static_cast<int32_t>(indices.size()));
    if (inserted) {
      indices.push_back(static_cast<int32_t>(block));
      indptr.push_back(static_cast<int32_t>(indices.size()));
      last.push_back(g.tokens_per_block);
    }
    batch.push_back(it->second);
    positions.push_back(static_cast<int32_t>(s % g.tokens_per_block));
    rows.push_back(i);
  }
  // The written rows, gathered (a view's rows stay where they are: the row stride is the gather).
  const bool quantize = is_fp8(g.dtype) && is_float_input(ckv.dtype);
  if (quantize && !(scale > 0.0f && scale < canon::pos_inf()))
    fail(ErrorCode::bad_argument, "scale = " + std::to_string(scale) + ": rule: an fp8 per-tensor scale is finite and > 0");
  const auto gathered = [&](const TensorView& in, std::vector<uint8_t>& bytes) {
    const int64_t width = in.shape[1];
    const CacheDtype to = quantize ? g.dtype : in.dtype;
    const int64_t esize = bits_per_element(to) / 8;
    bytes.assign(static_cast<size_t>(rows.size() * width * esize), 0);
    for (size_t r = 0; r < rows.size(); ++r)
      for (int64_t d = 0; d < width; ++d) {
        uint8_t* o = bytes.data() + (r * width + d) * esize;
        const int64_t at = in.offset(rows[r], d);
        if (quantize) *o = fp8_encode_divided(load_float(in.data, in.dtype, at), scale, g.dtype);
        else std::memcpy(o, static_cast<const uint8_t*>(in.data) + at * esize, static_cast<size_t>(esize));
      }
    return contiguous_view(bytes.data(), to, {static_cast<int64_t>(rows.size()), width});
  };
  // CUDA inputs are read on the host (the gather and quantization above), the gathered rows uploaded.
  Backend& b = backend_for("concat_and_cache_mla", &p, {&cb, &kb});
  const HostElements ckv_host(b, ckv), kpe_host(b, kpe);
  std::vector<uint8_t> ckv_bytes, kpe_bytes;
  BackendBuffer ckv_on_backend, kpe_on_backend;
  AppendMlaOp op;
  op.ckv = on_backend(b, gathered(ckv_host.view, ckv_bytes), ckv_on_backend);
  op.kpe = on_backend(b, gathered(kpe_host.view, kpe_bytes), kpe_on_backend);
  op.coordinates() = {batch, positions, indptr, indices, last};
  b.append_mla(p.pools, op);
}

// DeepSeek-V3 absorbed MLA attention (core/ops/mla_attention.hpp): q [rows,
// Hq, d_ckv + d_kpe] (q_nope · W_UK | q_pe), out [rows, Hq, d_ckv]; decode
// when q_indptr is None, else causal prefill chunks.
void mla_attention(const EnginePools& p, int32_t layer, py::handle q, py::handle out, const py::object& q_indptr,
                   py::handle seq_lens, py::handle block_table, int32_t max_blocks_per_seq, int32_t d_ckv,
                   int32_t d_kpe, float sm_scale, float scale, float ckv_global_scale, float kpe_scale) {
  const Borrowed qb = borrow(q, "q"), ob = borrow(out, "out");
  MlaAttentionOp op;
  op.layer = layer;
  op.q = view_of(qb, dtype_of(*qb.t, "", "q"), 3, "q");
  op.out = view_of(ob, dtype_of(*ob.t, "", "out"), 3, "out");
  std::vector<int32_t> qi;
  if (!q_indptr.is_none()) qi = int_list<int32_t>(q_indptr);
  const std::vector<int32_t> lens = int_list<int32_t>(seq_lens), table = int_list<int32_t>(block_table);
  op.q_indptr = qi;
  op.seq_lens = lens;
  op.block_table = table;
  op.max_blocks_per_seq = max_blocks_per_seq;
  op.d_ckv = d_ckv;
  op.d_kpe = d_kpe;
  op.sm_scale = sm_scale;
  op.scale = scale;
  op.ckv_global_scale = ckv_global_scale;
  op.kpe_scale = kpe_scale;
  backend_for("mla_attention", &p, {&qb, &ob}).mla_attention(p.pools, op);
}

// TensorRT-LLM's offloading (contract: MoveBlocksOp): offload copies primary
// block primary[i] to secondary block secondary[i]; onboard the other way.
void move_blocks(const EnginePools& p, py::handle primary, py::handle secondary, bool to_secondary) {
  const std::vector<int32_t> a = int_list<int32_t>(primary), b = int_list<int32_t>(secondary);
  MoveBlocksOp op;
  op.primary = a;
  op.secondary = b;
  Backend& backend = backend_for(to_secondary ? "offload" : "onboard", &p, {});
  if (to_secondary) backend.offload(p.pools, op);
  else backend.onboard(p.pools, op);
}

// TensorRT-LLM's indexer K cache scatter (DeepSeek sparse attention): fp8
// bytes [T, D] and 4 scale bytes [T, 4] per token into the byte cache
// [blocks, block_size, 1, D + 4] at flat element indices; core validates.
void indexer_k_scatter(py::handle k_fp8, py::handle k_scale, py::handle slots_fp8, py::handle slots_scale,
                       py::handle cache) {
  const Borrowed kb = borrow(k_fp8, "k_fp8"), sb = borrow(k_scale, "k_scale"), cb = borrow(cache, "k_cache");
  const std::vector<int64_t> fp8 = int_list<int64_t>(slots_fp8), scale = int_list<int64_t>(slots_scale);
  IndexerKScatterOp op;
  op.k_fp8 = view_of(kb, dtype_of(*kb.t, "fp8_e4m3", "k_fp8"), 2, "k_fp8");
  op.k_scale = view_of(sb, dtype_of(*sb.t, "fp8_e4m3", "k_scale"), 2, "k_scale");
  op.cache = view_of(cb, dtype_of(*cb.t, "fp8_e4m3", "k_cache"), 4, "k_cache");
  op.slot_mapping_fp8 = fp8;
  op.slot_mapping_scale = scale;
  backend_for("indexer_k_scatter", nullptr, {&kb, &sb, &cb}).indexer_k_scatter(op);
}

// FlashInfer's CSR page table (kv_indptr, kv_indices, kv_last_page_len) as
// the attention ops' dense one: (seq_lens [batch], block_table [batch,
// max pages], -1 padded), after core's CSR validation (validate_csr).
py::tuple csr_to_dense(const EnginePools& p, py::handle indptr, py::handle indices, py::handle last_page_len) {
  const std::vector<int32_t> ip = int_list<int32_t>(indptr), ix = int_list<int32_t>(indices),
                             lpl = int_list<int32_t>(last_page_len);
  const PoolGeometry& g = p.pools.geometry;
  validate_csr(ip, ix, lpl, g, /*for_write=*/false);
  const CsrPageTable t = make_csr_view(ip, ix, lpl, g);
  int32_t max_pages = 0;
  for (int32_t b = 0; b < t.batch; ++b) max_pages = std::max(max_pages, t.num_pages(b));
  py::array_t<int32_t> lens = new_vector<int32_t>(t.batch), table({static_cast<py::ssize_t>(t.batch), static_cast<py::ssize_t>(max_pages)});
  int32_t* row = table.mutable_data();
  for (int32_t b = 0; b < t.batch; ++b, row += max_pages) {
    if (t.length(b) > INT32_MAX) fail(ErrorCode::shape_mismatch, "sequence " + std::to_string(b) + " is longer than 2^31 tokens");
    lens.mutable_data()[b] = static_cast<int32_t>(t.length(b));
    for (int32_t j = 0; j < max_pages; ++j) row[j] = j < t.num_pages(b) ? ix[ip[b] + j] : kBadPage;
  }
  return py::make_tuple(lens, table);
}

// ---------------------------------------------------------------- explain, presets, codecs, replay

py::dict terms_dict(const std::vector<sim::OffsetTerm>& terms) {
  py::dict d;
  for (const sim::OffsetTerm& t : terms) d[py::str(t.axis)] = py::make_tuple(t.index, t.stride);
  return d;
}

py::dict explain(const std::string& engine, const std::string& dtype, const std::string& layout,
                 const std::string& placement, int32_t layers, int32_t kv_heads, int32_t page_size, int32_t head_dim,
                 int64_t blocks, std::vector<int32_t> block_table, std::vector<int32_t> indptr,
                 std::vector<int32_t> indices, std::vector<int32_t> last_page_len, int32_t seq, int64_t token,
                 int32_t layer, int32_t head, int32_t dim, int32_t window, int32_t sinks,
                 std::vector<int32_t> layer_windows, std::optional<int32_t> null_block) {
  sim::ExplainRequest r{.geometry = geometry_of(dtype, layout, layers, kv_heads, page_size, head_dim, blocks),
                        .csr = !indptr.empty(),
                        .block_table = std::move(block_table),
                        .indptr = std::move(indptr),
                        .indices = std::move(indices),
                        .last_page_len = std::move(last_page_len),
                        .seq = seq,
                        .token = token,
                        .layer = layer,
                        .head = head,
                        .dim = dim,
                        .window = window,
                        .sinks = sinks,
                        .layer_windows = std::move(layer_windows),
                        .null_block = null_block};
  if (auto p = parse_placement(placement)) r.geometry.placement = *p;
  else fail(ErrorCode::bad_argument, "placement '" + placement + "'");
  if (!engine.empty()) r.engine = engine_named(engine);
  const sim::Explanation e = sim::explain(r);
  py::dict d;
  d["cache_token"] = e.cache_token;
  d["logical_page"] = e.logical_page;
  d["page_slot"] = e.page_slot;
  d["entry"] = e.entry;
  d["block"] = e.ref.block();
  d["slot"] = e.slot;
  d["window"] = e.window.window;  // the explained layer's (0: full attention)
  d["null_entries"] = e.null_entries;
  py::list tensors;
  for (const sim::TensorOffsets& t : e.tensors) {
    py::dict td;
    td["kv"] = t.kv;
    td["offset"] = t.element;
    td["byte_offset"] = t.byte;
    td["terms"] = terms_dict(t.terms);
    if (e.scale_strides) {
      td["scale_offset"] = t.scale_element;
      td["high_nibble"] = t.high_nibble;
    }
    if (e.engine) {
      td["tensor"] = t.tensor;
      td["tensor_offset"] = t.tensor_element;
      td["tensor_byte_offset"] = t.tensor_byte;
    }
    tensors.append(td);
  }
  d["tensors"] = tensors;
  py::list steps;
  for (const sim::ExplainStep& s : sim::explain_steps(e))
    steps.append(py::dict(py::arg("key") = s.key, py::arg("title") = s.title, py::arg("lines") = s.lines));
  d["steps"] = steps;
  d["text"] = sim::explain_text(e);
  return d;
}

py::dict engine_info(const std::string& engine, const std::string& dtype, const std::string& kv_layout, int32_t layers,
                     int32_t kv_heads, int32_t page_size, int32_t head_dim, int64_t blocks) {
  const Engine e = engine_named(engine);
  const PoolGeometry g = geometry_of(dtype, kv_layout, layers, kv_heads, page_size, head_dim, blocks);
  const EngineLayout l = engine_layout(e, g);
  py::list tensors;
  for (const EngineTensor& t : l.tensors) {
    py::list axes;
    for (const EngineTensorAxis& a : t.axes) axes.append(py::make_tuple(a.name, a.extent, a.stride));
    tensors.append(py::dict(py::arg("name") = t.name, py::arg("per_layer") = t.per_layer, py::arg("kv") = t.kv,
                            py::arg("axes") = axes));
  }
  return py::dict(py::arg("tensors") = tensors, py::arg("layout") = std::string(layout_name(l.geometry.layout)),
                  py::arg("placement") = std::string(placement_name(l.geometry.placement)));
}

py::array codec_encode(const std::string& format, py::array_t<float, py::array::c_style | py::array::forcecast> x) {
  const float* in = x.data();
  const size_t n = static_cast<size_t>(x.size());
  std::vector<py::ssize_t> shape(x.shape(), x.shape() + x.ndim());
  const auto bytes = [&](auto encode) {
    py::array_t<uint8_t> out(shape);
    uint8_t* o = out.mutable_data();
    for (size_t i = 0; i < n; ++i) o[i] = static_cast<uint8_t>(encode(in[i]));
    return py::array(out);
  };
  if (format == "e4m3") return bytes([](float f) { return codec::f32_to_e4m3(f, codec::Saturation::finite); });
  if (format == "e4m3-nosat") return bytes([](float f) { return codec::f32_to_e4m3(f, codec::Saturation::none); });
  if (format == "e5m2") return bytes([](float f) { return codec::f32_to_e5m2(f, codec::Saturation::finite); });
  if (format == "e5m2-nosat") return bytes([](float f) { return codec::f32_to_e5m2(f, codec::Saturation::none); });
  if (format == "e2m1") return bytes([](float f) { return codec::f32_to_e2m1(f); });
  if (format == "int8") return bytes([](float f) { return static_cast<uint8_t>(codec::f32_to_int8(f)); });
  if (format == "bf16" || format == "fp16") {
    py::array_t<uint16_t> out(shape);
    uint16_t* o = out.mutable_data();
    for (size_t i = 0; i < n; ++i) o[i] = format == "bf16" ? codec::f32_to_bf16(in[i]) : codec::f32_to_f16(in[i]);
    return py::array(out);
  }
  fail(ErrorCode::bad_argument, "codec format '" + format + "': expected e4m3, e4m3-nosat, e5m2, e5m2-nosat, e2m1, int8, "
                                "bf16 or fp16");
}

py::array codec_decode(const std::string& format, py::array_t<uint16_t, py::array::c_style | py::array::forcecast> c) {
  const uint16_t* in = c.data();
  std::vector<py::ssize_t> shape(c.shape(), c.shape() + c.ndim());
  py::array_t<float> out(shape);
  float* o = out.mutable_data();
  for (py::ssize_t i = 0; i < c.size(); ++i) {
    const uint16_t v = in[i];
    if (format == "e4m3") o[i] = codec::e4m3_to_f32(static_cast<uint8_t>(v));
    else if (format == "e5m2") o[i] = codec::e5m2_to_f32(static_cast<uint8_t>(v));
    else if (format == "e2m1") o[i] = codec::e2m1_to_f32(static_cast<uint8_t>(v & 0xF));
    else if (format == "int8") o[i] = codec::int8_to_f32(static_cast<int8_t>(static_cast<uint8_t>(v)));
    else if (format == "bf16") o[i] = codec::bf16_to_f32(v);
    else if (format == "fp16") o[i] = codec::f16_to_f32(v);
    else fail(ErrorCode::bad_argument, "codec format '" + format + "': expected e4m3, e5m2, e2m1, int8, bf16 or fp16");
  }
  return py::array(out);
}

py::array_t<uint8_t> nvfp4_quantize(py::array_t<float, py::array::c_style | py::array::forcecast> x, float global_scale,
                                    py::array_t<uint8_t>& scales_out) {
  validate_global_scale(global_scale, "nvfp4_quantize: global_scale");
  if (x.size() % codec::kNvfp4BlockElems != 0)
    fail(ErrorCode::shape_mismatch, "nvfp4_quantize: the element count must be a multiple of 16");
  const py::ssize_t groups = x.size() / codec::kNvfp4BlockElems;
  py::array_t<uint8_t> packed = new_vector<uint8_t>(x.size() / 2);
  scales_out = new_vector<uint8_t>(groups);
  for (py::ssize_t gi = 0; gi < groups; ++gi)
    scales_out.mutable_data()[gi] =
        codec::nvfp4_quantize16(x.data() + gi * 16, global_scale, packed.mutable_data() + gi * 8);
  return packed;
}

// dump_dir non-empty: the run's outputs (queries and attention outputs of
// every op, final pools) are written there as kvsim run --dump does
// (docs/run.md); the Python side loads them.
py::dict replay(const std::string& path, const std::string& dump_dir) {
  const sim::Scenario s = sim::load_scenario_file(path);
  sim::ReplayOptions options;
  options.dump_dir = dump_dir;
  const sim::ScenarioReport r = sim::replay(s, cpu(), options);
  py::dict inv;
  for (const sim::InvariantReport& i : r.invariants)
    inv[py::str(std::string(sim::invariant_name(i.invariant)))] =
        py::make_tuple(std::string(sim::invariant_status_name(i.status)), i.detail);
  py::dict counters(py::arg("steps") = r.counters.steps, py::arg("prefill_tokens") = r.counters.prefill_tokens,
                    py::arg("decode_tokens") = r.counters.decode_tokens,
                    py::arg("reuse_hit_tokens") = r.counters.reuse_hit_tokens,
                    py::arg("evicted_blocks") = r.counters.evicted_blocks, py::arg("ops") = r.counters.ops);
  return py::dict(py::arg("name") = r.name, py::arg("ok") = r.ok, py::arg("content_hash") = r.content_hash,
                  py::arg("invariants") = inv, py::arg("counters") = counters,
                  py::arg("expectation_failures") = r.expectation_failures);
}

// KVSIM_SEGV_BACKTRACE=1: a fatal signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE,
// SIGABRT) prints the native stack (backtrace_symbols_fd: object file +
// offset, for addr2line) to stderr, then the signal goes on to the handler
// installed before ours (Python's faulthandler with PYTHONFAULTHANDLER=1,
// which adds the Python stack) or the default action. Only async-signal-safe
// calls. For machines without gdb (the GPU machine, docs/python.md).
constexpr int kFatalSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
struct sigaction previous_actions[std::size(kFatalSignals)];

// Writes "label 0x<hex> (object+0x<offset>)" with only write(2): no stdio in a handler.
void write_address(const char* label, const void* address) {
  char line[512];
  size_t n = 0;
  auto put = [&](const char* text) {
    while (*text != 0 && n + 1 < sizeof(line)) line[n++] = *text++;
  };
  auto put_hex = [&](std::uintptr_t v) {
    char digits[2 + 2 * sizeof(v) + 1];
    size_t k = sizeof(digits) - 1;
    digits[k] = 0;
    do {
      digits[--k] = "0123456789abcdef"[v & 15];
      v >>= 4;
    } while (v != 0 && k > 2);
    digits[--k] = 'x';
    digits[--k] = '0';
    put(digits + k);
  };
  put(label);
  put_hex(reinterpret_cast<std::uintptr_t>(address));
  Dl_info info = {};
  if (dladdr(address, &info) != 0 && info.dli_fname != nullptr) {
    put(" (");
    put(info.dli_fname);
    put("+");
    put_hex(reinterpret_cast<std::uintptr_t>(address) - reinterpret_cast<std::uintptr_t>(info.dli_fbase));
    if (info.dli_sname != nullptr) {
      put(" near ");
      put(info.dli_sname);
    }
    put(")");
  }
  put("\n");
  ssize_t ignored = write(STDERR_FILENO, line, n);
  (void)ignored;
}

void print_native_backtrace(int sig, siginfo_t* info, void* context) {
  static const char head[] = "\nkvsim: fatal signal, native backtrace (KVSIM_SEGV_BACKTRACE):\n";
  ssize_t ignored = write(STDERR_FILENO, head, sizeof(head) - 1);
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), STDERR_FILENO);
  // The unwinder cannot walk past a jump into data (a bad indirect call): the
  // faulting PC, the fault address and the word at the stack pointer (a call's
  // return address, i.e. the caller) name where it came from.
#if defined(__x86_64__) && defined(REG_RIP)
  if (context != nullptr) {
    const auto* uc = static_cast<const ucontext_t*>(context);
    write_address("kvsim: faulting pc ", reinterpret_cast<const void*>(uc->uc_mcontext.gregs[REG_RIP]));
    if (info != nullptr) write_address("kvsim: fault address ", info->si_addr);
    const auto* sp = reinterpret_cast<void* const*>(uc->uc_mcontext.gregs[REG_RSP]);
    for (int i = 0; i < 4; ++i) write_address("kvsim: stack word (return address?) ", sp[i]);
  }
#else
  (void)info;
  (void)context;
#endif
  for (size_t i = 0; i < std::size(kFatalSignals); ++i)
    if (kFatalSignals[i] == sig) sigaction(sig, &previous_actions[i], nullptr);
  (void)ignored;
  raise(sig);  // handled as before ours (re-delivered when this handler returns)
}

void install_backtrace_handler() {
  const char* on = std::getenv("KVSIM_SEGV_BACKTRACE");
  if (on == nullptr || std::string(on) != "1") return;
  void* warm[1];
  backtrace(warm, 1);  // loads libgcc's unwinder now, not inside the handler
  struct sigaction action = {};
  action.sa_sigaction = print_native_backtrace;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_NODEFER | SA_SIGINFO;
  for (size_t i = 0; i < std::size(kFatalSignals); ++i) sigaction(kFatalSignals[i], &action, &previous_actions[i]);
}

}  // namespace

PYBIND11_MODULE(_kvsim, m) {
  install_backtrace_handler();
  m.doc() = "kvsim's C++ oracle (see the kvsim package for the engine-shaped API)";
  // Every core ValidationError becomes the kvsim.Error subclass of its name
  // (kvsim/errors.py), so a test can catch kvsim.errors.SlotBeyondPool.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ValidationError& e) {
      py::object cls = py::module_::import("kvsim.errors").attr("error_class")(std::string(e.name()));
      PyErr_SetObject(cls.ptr(), py::str(e.what()).ptr());
    }
  });
  py::class_<EnginePools, std::shared_ptr<EnginePools>>(m, "EnginePools")
      .def_property_readonly("blocks", [](const EnginePools& p) { return p.pools.geometry.primary_blocks; })
      .def_property_readonly("geometry", [](const EnginePools& p) {
        const PoolGeometry& g = p.pools.geometry;
        return py::dict(py::arg("layers") = g.layers, py::arg("kv_heads") = g.kv_heads,
                        py::arg("page_size") = g.tokens_per_block, py::arg("head_dim") = g.head_dim,
                        py::arg("blocks") = g.primary_blocks, py::arg("secondary_blocks") = g.secondary_blocks,
                        py::arg("cache_dtype") = std::string(dtype_name(g.dtype)),
                        py::arg("layout") = std::string(layout_name(g.layout)),
                        py::arg("placement") = std::string(placement_name(g.placement)));
      })
      .def_property_readonly("strides", [](const EnginePools& p) {
        const PoolStrides& s = p.pools.strides[0];
        return py::make_tuple(s.block, s.layer, s.kv);
      });
  m.def("engine_pools", &engine_pools);
  m.def("append_paged", &append_paged);
  m.def("reshape_and_cache", &reshape_and_cache);
  m.def("decode_attention", &decode_attention);
  m.def("prefill_attention", &prefill_attention);
  m.def("csr_to_dense", &csr_to_dense);
  m.def("qkv_preprocess", &qkv_preprocess);
  m.def("gather", &gather);
  m.def("copy_blocks", &copy_blocks);
  m.def("partial_copy", &partial_copy);
  m.def("indexer_k_scatter", &indexer_k_scatter);
  m.def("latent_pools", &latent_pools);
  m.def("with_secondary", &with_secondary);
  m.def("append_mla", &append_mla);
  m.def("concat_and_cache_mla", &concat_and_cache_mla);
  m.def("mla_attention", &mla_attention);
  m.def("offload", [](const EnginePools& p, py::handle a, py::handle b) { move_blocks(p, a, b, true); });
  m.def("onboard", [](const EnginePools& p, py::handle a, py::handle b) { move_blocks(p, a, b, false); });
  m.def("explain", &explain);
  m.def("engine_info", &engine_info);
  m.def("codec_encode", &codec_encode);
  m.def("codec_decode", &codec_decode);
  m.def("nvfp4_quantize", [](py::array_t<float, py::array::c_style | py::array::forcecast> x, float g) {
    py::array_t<uint8_t> scales;
    py::array_t<uint8_t> packed = nvfp4_quantize(x, g, scales);
    return py::make_tuple(packed, scales);
  });
  m.def("replay", &replay);
  m.def("engines", [] {
    std::vector<std::string> names;
    for (Engine e : kEngines) names.emplace_back(engine_name(e));
    return names;
  });
  // Built with the CUDA backend: ops on CUDA tensors run there (backend_for); else the Python layer stages them.
  m.attr("has_cuda") = py::bool_(KVSIM_HAVE_CUDA != 0);
}
