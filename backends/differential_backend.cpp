#include "backends/differential_backend.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>

namespace kvsim {

namespace {

std::string hex_of(const uint8_t* p, int bytes) {
  // Little-endian element bytes as one number.
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%0*llX", bytes * 2, static_cast<unsigned long long>(v));
  return buf;
}

std::string float_text(float f) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(f));
  return buf;
}

// Decoded value of one element's bytes (nvfp4: the e2m1 code's value, before its block scale).
std::string decoded(CacheDtype t, const uint8_t* p, int nibble) {
  switch (t) {
    case CacheDtype::fp32: {
      float f;
      std::memcpy(&f, p, 4);
      return float_text(f);
    }
    case CacheDtype::fp16: return float_text(codec::f16_to_f32(static_cast<uint16_t>(p[0] | p[1] << 8)));
    case CacheDtype::bf16: return float_text(codec::bf16_to_f32(static_cast<uint16_t>(p[0] | p[1] << 8)));
    case CacheDtype::fp8_e4m3: return float_text(codec::e4m3_to_f32(p[0]));
    case CacheDtype::fp8_e5m2: return float_text(codec::e5m2_to_f32(p[0]));
    case CacheDtype::int8: return std::to_string(static_cast<int8_t>(p[0]));
    case CacheDtype::nvfp4:
      return float_text(codec::e2m1_to_f32(static_cast<uint8_t>(nibble ? p[0] >> 4 : p[0] & 0xF))) +
             " (e2m1, before the block scale)";
  }
  return "?";
}

// Inverts element_offset() for one pool: the coordinates whose offset is e.
// Validated strides are non-overlapping (sorted, each stride exceeds the span
// of the smaller ones), so a greedy division by decreasing stride finds the
// only candidate; element_offset() then confirms it.
std::optional<PoolCoordinates> invert_offset(const PoolGeometry& g, const PoolStrides& s, PoolKind kind, int64_t e) {
  for (int32_t kv = 0; kv < g.kv_factor; ++kv) {
    const InnerStrides& in = s.inner[kv];
    struct Dim {
      int64_t stride, extent;
      int id;
    } dims[] = {{s.block, g.blocks(kind), 0},     {s.layer, g.layers, 1},          {in.head, g.kv_heads, 2},
                {in.token, g.tokens_per_block, 3}, {in.dim_outer, g.head_dim / in.x, 4}, {in.dim_inner, in.x, 5}};
    std::stable_sort(std::begin(dims), std::end(dims), [](const Dim& a, const Dim& b) { return a.stride > b.stride; });
    int64_t rest = e - static_cast<int64_t>(kv) * s.kv;
    if (rest < 0) continue;
    int64_t v[6] = {};
    for (const Dim& d : dims) {
      if (d.stride <= 0 || d.extent <= 1) continue;
      v[d.id] = std::min(rest / d.stride, d.extent - 1);
      rest -= v[d.id] * d.stride;
    }
    PoolCoordinates c;
    c.block = v[0];
    c.layer = static_cast<int32_t>(v[1]);
    c.kv = kv;
    c.head = static_cast<int32_t>(v[2]);
    c.entry = static_cast<int32_t>(v[3]);
    c.dim = static_cast<int32_t>(v[4] * in.x + v[5]);
    if (rest == 0 && element_offset(s, c.block, c.layer, c.kv, c.head, c.entry, c.dim) == e) return c;
  }
  return std::nullopt;
}

std::string explain_offset(const PoolStrides& s, const PoolCoordinates& c, CacheDtype t, const char* what) {
  const InnerStrides& in = s.inner[c.kv];
  int32_t outer = 0, inner = 0;
  split_dim(c.dim, in.x, outer, inner);
  const int64_t e = element_offset(s, c.block, c.layer, c.kv, c.head, c.entry, c.dim);
  std::ostringstream o;
  o << what << " element_offset = block " << c.block << " * " << s.block << " + layer " << c.layer << " * "
    << s.layer << " + kv " << c.kv << " * " << s.kv << " + head " << c.head << " * " << in.head << " + token "
    << c.entry << " * " << in.token << " + (dim " << c.dim << " / x " << in.x << " = " << outer << ") * "
    << in.dim_outer << " + (dim % x = " << inner << ") * " << in.dim_inner << " = " << e;
  if (t == CacheDtype::nvfp4)
    o << "; byte = " << e << " >> 1 = " << (e >> 1) << ", " << ((e & 1) ? "high" : "low") << " nibble";
  else
    o << "; byte = " << e << " * " << bits_per_element(t) / 8 << " = " << e * (bits_per_element(t) / 8);
  return o.str();
}

// Index of element `e` of a tensor (greedy over decreasing strides, confirmed).
std::vector<int64_t> tensor_index_of(const TensorView& t, int64_t e) {
  std::vector<int> order(static_cast<size_t>(t.rank));
  for (int i = 0; i < t.rank; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return t.stride[a] > t.stride[b]; });
  std::vector<int64_t> idx(static_cast<size_t>(t.rank), 0);
  int64_t rest = e;
  for (int i : order) {
    if (t.stride[i] <= 0 || t.shape[i] <= 1) continue;
    idx[i] = std::min(rest / t.stride[i], t.shape[i] - 1);
    rest -= idx[i] * t.stride[i];
  }
  if (rest != 0) return {};
  return idx;
}

// (sequence, token) of a pool element through the op's table.
void locate_token(const DifferentialBackend::TokenMap& m, const PoolGeometry& g, const PoolCoordinates& c,
                  DiffReport& r) {
  using Kind = DifferentialBackend::TokenMap::Kind;
  const int64_t P = g.tokens_per_block;
  switch (m.kind) {
    case Kind::none: return;
    case Kind::csr:
      for (size_t b = 0; b + 1 < m.indptr.size(); ++b)
        for (int32_t p = m.indptr[b]; p < m.indptr[b + 1]; ++p)
          if (static_cast<size_t>(p) < m.indices.size() && !BlockRef{m.indices[p]}.is_bad() &&
              BlockRef{m.indices[p]}.block() == c.block) {
            r.sequence = static_cast<int32_t>(b);
            r.token = (p - m.indptr[b]) * P + c.entry;
            r.token_meaning = "token position";
            return;
          }
      return;
    case Kind::dense: {
      if (m.max_blocks <= 0) return;
      const size_t batch = m.table.size() / static_cast<size_t>(m.max_blocks);
      for (size_t b = 0; b < batch; ++b)
        for (int32_t col = 0; col < m.max_blocks; ++col) {
          const BlockRef ref{m.table[b * m.max_blocks + col]};
          if (!ref.is_bad() && ref.block() == c.block) {
            r.sequence = static_cast<int32_t>(b);
            r.token = col * P + c.entry;
            r.token_meaning = m.window.enabled() ? "cache slot (window ring)" : "token position";
            return;
          }
        }
      return;
    }
    case Kind::slots:
      for (size_t t = 0; t < m.slots.size(); ++t)
        if (m.slots[t] == c.block * P + c.entry) {
          r.token = static_cast<int64_t>(t);
          r.token_meaning = "input token (slot_mapping row)";
          return;
        }
      return;
  }
}

}  // namespace

std::string DiffReport::text() const {
  std::ostringstream o;
  o << "first difference: op " << op;
  if (!context.empty()) o << " (" << context << ")";
  o << "\n  buffer: " << buffer << " (" << dtype_name(dtype) << "), byte offset " << byte_offset;
  if (element >= 0) o << ", element " << element;
  if (pool_at)
    o << "\n  at: block " << pool_at->block << ", layer " << pool_at->layer << ", kv " << pool_at->kv
      << (pool_at->kv == 0 ? " (K)" : " (V)") << ", head " << pool_at->head << ", entry " << pool_at->entry
      << ", dim " << pool_at->dim;
  if (!tensor_index.empty()) {
    o << "\n  at: index [";
    for (size_t i = 0; i < tensor_index.size(); ++i) o << (i ? ", " : "") << tensor_index[i];
    o << "]";
  }
  if (sequence >= 0 || token >= 0) {
    o << "\n  ";
    if (sequence >= 0) o << "sequence " << sequence << (sequence_id.empty() ? "" : " (" + sequence_id + ")") << ", ";
    o << token_meaning << " " << token;
  }
  if (head >= 0) o << "\n  head " << head << ", dim " << dim;
  o << "\n  reference: " << reference_hex << " (" << reference_value << ")";
  o << "\n  candidate: " << candidate_hex << " (" << candidate_value << ")";
  if (!explain.empty()) o << "\n  explain: " << explain;
  return o.str();
}

DifferentialBackend::DifferentialBackend(std::unique_ptr<Backend> reference, std::unique_ptr<Backend> candidate) {
  if (!reference || !candidate) throw BackendUnavailable("diff: needs a reference and a candidate backend");
  name_ = "diff(" + std::string(reference->name()) + "," + std::string(candidate->name()) + ")";
  backends_[0] = std::move(reference);
  backends_[1] = std::move(candidate);
}

DifferentialBackend::~DifferentialBackend() {
  for (auto& [base, a] : allocations_) {
    backends_[0]->release(a.side[0]);
    backends_[1]->release(a.side[1]);
    munmap(reinterpret_cast<void*>(base), a.bytes);
  }
}

void DifferentialBackend::set_context(std::string label, std::vector<std::string> sequence_ids) {
  context_ = std::move(label);
  sequence_ids_ = std::move(sequence_ids);
}

// Address space only: PROT_NONE, never backed, so a stray host dereference of a
// shadow pointer faults instead of reading something plausible.
void* DifferentialBackend::reserve_shadow(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return p;
}

void* DifferentialBackend::add_allocation(size_t bytes, void* reference, void* candidate) {
  void* shadow = reserve_shadow(bytes);
  Allocation a;
  a.bytes = bytes;
  a.side[0] = reference;
  a.side[1] = candidate;
  allocations_[reinterpret_cast<uintptr_t>(shadow)] = a;
  // Zero both sides: bytes no op writes then compare equal.
  backends_[0]->fill(reference, 0, bytes);
  backends_[1]->fill(candidate, 0, bytes);
  return shadow;
}

void* DifferentialBackend::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* r = backends_[0]->allocate(bytes);
  void* c = nullptr;
  try {
    c = backends_[1]->allocate(bytes);
  } catch (...) {
    backends_[0]->release(r);
    throw;
  }
  return add_allocation(bytes, r, c);
}

void* DifferentialBackend::allocate_pool_memory(size_t bytes, PoolKind kind) {
  if (bytes == 0) return nullptr;
  void* r = backends_[0]->allocate_pool_memory(bytes, kind);
  void* c = nullptr;
  try {
    c = backends_[1]->allocate_pool_memory(bytes, kind);
  } catch (...) {
    backends_[0]->release(r);
    throw;
  }
  return add_allocation(bytes, r, c);
}

void DifferentialBackend::release(void* p) noexcept {
  auto it = allocations_.find(reinterpret_cast<uintptr_t>(p));
  if (it == allocations_.end()) return;
  backends_[0]->release(it->second.side[0]);
  backends_[1]->release(it->second.side[1]);
  munmap(p, it->second.bytes);
  allocations_.erase(it);
}

std::pair<const DifferentialBackend::Allocation*, size_t> DifferentialBackend::find(const void* p,
                                                                                   const char* what) const {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  auto it = allocations_.upper_bound(addr);
  if (it != allocations_.begin()) {
    --it;
    if (addr < it->first + it->second.bytes) return {&it->second, addr - it->first};
  }
  throw BackendError("diff: " + std::string(what) + ": pointer " + std::to_string(addr) +
                     " is not inside memory allocated by this backend");
}

void* DifferentialBackend::translate(const void* p, int side) const {
  if (!p) return nullptr;
  const auto [a, offset] = find(p, "translate");
  return static_cast<uint8_t*>(a->side[side]) + offset;
}

KvPools DifferentialBackend::translate(const KvPools& pools, int side) const {
  KvPools t = pools;
  for (int i = 0; i < 2; ++i) {
    t.data[i] = translate(pools.data[i], side);
    t.scales[i] = translate(pools.scales[i], side);
  }
  return t;
}

TensorView DifferentialBackend::translate(TensorView t, int side) const {
  t.data = translate(t.data, side);
  return t;
}

void DifferentialBackend::to_backend(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  for (int s = 0; s < 2; ++s) backends_[s]->to_backend(translate(dst, s), src, bytes);
}

void DifferentialBackend::to_host(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  backends_[0]->to_host(dst, translate(src, 0), bytes);
}

void DifferentialBackend::fill(void* dst, uint8_t byte, size_t bytes) {
  if (bytes == 0) return;
  for (int s = 0; s < 2; ++s) backends_[s]->fill(translate(dst, s), byte, bytes);
}

void DifferentialBackend::synchronize() {
  backends_[0]->synchronize();
  backends_[1]->synchronize();
}

int64_t DifferentialBackend::compare_bytes(const void* p, size_t bytes, std::vector<uint8_t>& ref,
                                           std::vector<uint8_t>& cand) {
  ref.resize(bytes);
  cand.resize(bytes);
  backends_[0]->to_host(ref.data(), translate(p, 0), bytes);
  backends_[1]->to_host(cand.data(), translate(p, 1), bytes);
  counters_.bytes_compared += static_cast<int64_t>(bytes);
  if (std::memcmp(ref.data(), cand.data(), bytes) == 0) return -1;
  return std::mismatch(ref.begin(), ref.end(), cand.begin()).first - ref.begin();
}

void DifferentialBackend::compare_pools(const char* op, const KvPools& pools, PoolKind kind, const TokenMap& map) {
  const int k = static_cast<int>(kind);
  const char* kind_name = kind == PoolKind::primary ? "primary" : "secondary";
  std::vector<uint8_t> ref, cand;
  for (int scale = 0; scale < 2; ++scale) {
    const void* p = scale ? pools.scales[k] : pools.data[k];
    if (!p) continue;
    const auto [alloc, offset] = find(p, op);
    const size_t bytes = alloc->bytes - offset;  // the pool runs to the end of its allocation
    const int64_t at = compare_bytes(p, bytes, ref, cand);
    if (at < 0 || first_) continue;
    const PoolGeometry g = scale ? pools.geometry.scale_geometry() : pools.geometry;
    const PoolStrides& s = scale ? pools.scale_strides[k] : pools.strides[k];
    DiffReport r;
    r.op = op;
    r.context = context_;
    r.buffer = std::string(kind_name) + (scale ? " scale pool" : " pool");
    r.dtype = g.dtype;
    r.byte_offset = at;
    const int elem_bytes = std::max(1, bits_per_element(g.dtype) / 8);
    const int64_t first_byte = at / elem_bytes * elem_bytes;
    int nibble = 0;
    if (g.dtype == CacheDtype::nvfp4) {
      nibble = (ref[at] & 0xF) == (cand[at] & 0xF) ? 1 : 0;
      r.element = at * 2 + nibble;
      r.reference_hex = hex_of(&ref[at], 1) + (nibble ? " (high nibble)" : " (low nibble)");
      r.candidate_hex = hex_of(&cand[at], 1) + (nibble ? " (high nibble)" : " (low nibble)");
    } else {
      r.element = at / elem_bytes;
      r.reference_hex = hex_of(&ref[first_byte], elem_bytes);
      r.candidate_hex = hex_of(&cand[first_byte], elem_bytes);
    }
    r.reference_value = decoded(g.dtype, &ref[first_byte], nibble);
    r.candidate_value = decoded(g.dtype, &cand[first_byte], nibble);
    r.pool_at = invert_offset(g, s, kind, r.element);
    if (r.pool_at) {
      r.head = r.pool_at->head;
      r.dim = scale ? r.pool_at->dim * codec::kNvfp4BlockElems : r.pool_at->dim;
      r.explain = explain_offset(s, *r.pool_at, g.dtype, scale ? "scale pool (dim / 16)" : "pool");
      if (kind == PoolKind::primary) locate_token(map, pools.geometry, *r.pool_at, r);
      if (r.sequence >= 0 && static_cast<size_t>(r.sequence) < sequence_ids_.size())
        r.sequence_id = sequence_ids_[r.sequence];
    } else {
      r.explain = "byte " + std::to_string(at) + " belongs to no element of the pool's strides (padding)";
    }
    first_ = std::move(r);
  }
}

void DifferentialBackend::compare_tensor(const char* op, const char* name, const TensorView& t) {
  if (t.empty() || t.rank == 0 || t.numel() == 0) return;
  const size_t bytes = static_cast<size_t>(t.span_bytes());
  std::vector<uint8_t> ref, cand;
  const int64_t at = compare_bytes(t.data, bytes, ref, cand);
  if (at < 0 || first_) return;
  DiffReport r;
  r.op = op;
  r.context = context_;
  r.buffer = name;
  r.dtype = t.dtype;
  r.byte_offset = at;
  const int elem_bytes = std::max(1, bits_per_element(t.dtype) / 8);
  const int64_t first_byte = at / elem_bytes * elem_bytes;
  r.element = at / elem_bytes;
  r.reference_hex = hex_of(&ref[first_byte], elem_bytes);
  r.candidate_hex = hex_of(&cand[first_byte], elem_bytes);
  r.reference_value = decoded(t.dtype, &ref[first_byte], 0);
  r.candidate_value = decoded(t.dtype, &cand[first_byte], 0);
  r.tensor_index = tensor_index_of(t, r.element);
  std::ostringstream o;
  o << name << " offset = ";
  for (size_t i = 0; i < r.tensor_index.size(); ++i)
    o << (i ? " + " : "") << "i" << i << " " << r.tensor_index[i] << " * " << t.stride[i];
  o << " = " << r.element << "; byte = " << r.element << " * " << elem_bytes << " = " << r.element * elem_bytes;
  r.explain = o.str();
  if (t.rank == 3 && !r.tensor_index.empty()) {
    r.head = static_cast<int32_t>(r.tensor_index[1]);
    r.dim = static_cast<int32_t>(r.tensor_index[2]);
  }
  first_ = std::move(r);
}

// ---------------------------------------------------------------- ops
// Every op (run_op below): run on both sides with its tensors translated, then
// compare what its traits say it may write (op_list.hpp: its pool, then its
// written tensors). The overloads here only name (sequence, token) in a report.

namespace {

using TokenMap = DifferentialBackend::TokenMap;

// The table through which a pool byte maps to (sequence, token); none by default.
template <class Op>
TokenMap token_map(const Op&) {
  return {};
}
TokenMap csr_token_map(std::span<const int32_t> indptr, std::span<const int32_t> indices) {
  TokenMap m;
  m.kind = TokenMap::Kind::csr;
  m.indptr = indptr;
  m.indices = indices;
  return m;
}
TokenMap token_map(const AppendPagedOp& op) { return csr_token_map(op.indptr, op.indices); }
TokenMap token_map(const AppendMlaOp& op) { return csr_token_map(op.indptr, op.indices); }
TokenMap token_map(const ReshapeAndCacheOp& op) {
  TokenMap m;
  m.kind = TokenMap::Kind::slots;
  m.slots = op.slot_mapping;
  return m;
}
TokenMap token_map(const QkvPreprocessOp& op) {
  TokenMap m;
  m.kind = TokenMap::Kind::dense;
  m.table = op.block_table;
  m.max_blocks = op.max_blocks_per_seq;
  m.window = op.window;
  return m;
}

// An output row's (sequence, query position), for the attention ops; nothing by default.
template <class Op>
void locate_row(const Op&, int64_t, DiffReport&) {}
void locate_row(const DecodeAttentionOp& op, int64_t row, DiffReport& r) {  // row i of out is batch entry i
  r.sequence = static_cast<int32_t>(row);
  r.token = op.seq_lens[r.sequence] - 1;
  r.token_meaning = "query position";
}
void locate_row(const PrefillAttentionOp& op, int64_t row, DiffReport& r) {
  for (size_t b = 0; b + 1 < op.q_indptr.size(); ++b)
    if (row >= op.q_indptr[b] && row < op.q_indptr[b + 1]) {
      r.sequence = static_cast<int32_t>(b);
      r.token = prefill_position(op.seq_lens[b], op.q_indptr[b], op.q_indptr[b + 1], row);
      r.token_meaning = "query position";
    }
}
void locate_row(const MlaAttentionOp& op, int64_t row, DiffReport& r) {
  const MlaRows rows = make_mla_rows(op);
  if (row >= static_cast<int64_t>(rows.seq.size())) return;
  r.sequence = rows.seq[row];
  r.token = rows.position[row];
  r.token_meaning = "query position";
}

}  // namespace

template <OpId id>
void DifferentialBackend::run_op(const KvPools& pools, const OpOf<id>& op) {
  using Traits = OpTraits<id>;
  for (int s = 0; s < 2; ++s) {
    OpOf<id> o = op;
    for (const auto& t : Traits::tensors) o.*t.member = translate(op.*t.member, s);
    call_op<id>(*backends_[s], translate(pools, s), o);
  }
  ++counters_.ops;
  const char* name = op_name(id).data();  // a string literal: NUL-terminated
  if constexpr (Traits::pool_write != PoolWrite::none)
    compare_pools(name, pools, Traits::pool_write == PoolWrite::primary ? PoolKind::primary : PoolKind::secondary,
                  token_map(op));
  const bool had = first_.has_value();
  for (const auto& t : Traits::tensors)
    if (t.access == Access::write) compare_tensor(name, t.name, op.*t.member);
  if (!had && first_ && !first_->tensor_index.empty()) {
    locate_row(op, first_->tensor_index[0], *first_);
    if (first_->sequence >= 0 && static_cast<size_t>(first_->sequence) < sequence_ids_.size())
      first_->sequence_id = sequence_ids_[first_->sequence];
  }
}

#define KVSIM_DIFF_RUN(name, Op, validate, form, impl) \
  void DifferentialBackend::run_##name(KVSIM_OP_PARAMS(Op, form)) { run_op<OpId::name>(KVSIM_OP_POOLS(form), op); }
KVSIM_OPS(KVSIM_DIFF_RUN)
#undef KVSIM_DIFF_RUN

}  // namespace kvsim
