// The op list: every op of contract §5 written once. The Backend entry points
// and pure virtuals (backend.hpp), their definitions (backend.cpp), every
// backend's overrides (KVSIM_BACKEND_OP_OVERRIDES), the op ids and names, the
// differential backend's translate-and-compare and the corrupting test
// backend are generated from KVSIM_OPS and the per-op traits below. Adding an
// op: its line in KVSIM_OPS, its OpTraits, core's descriptor and work items,
// and each backend's run_<name> (docs/architecture.md, "A new op").
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <type_traits>

#include <kvsim/core.hpp>
#include <kvsim/core/ops/attention.hpp>
#include <kvsim/core/ops/mla_attention.hpp>
#include <kvsim/core/ops/qkv_preprocess.hpp>
#include <kvsim/core/ops/read_copy_ops.hpp>
#include <kvsim/core/ops/write_ops.hpp>

// X(name, Op, validate, form):
//   name     the entry point Backend::name(...) and the implementation run_name(...)
//   Op       core's descriptor
//   validate the host validation (kvsim/validation/ops/), called with the same arguments before run_name
//            (expanded only in backend.cpp, so the .cu files never include it)
//   form     pools:   name(const KvPools& pools, const Op& op)
//            tensors: name(const Op& op) (the op touches no pool)
//   impl     items:   every backend's run_name is generated (KVSIM_DEFINE_ITEM_OP_RUNS):
//                     core's make_<name>_items(pools, op) returns a functor with
//                     `int64_t count` and `KVSIM_HD void operator()(int64_t i)`,
//                     items independent (validation proves it); CUDA first uploads
//                     the spans OpTraits::uploads lists. A new op of this kind needs
//                     no backend file at all.
//            custom:  each backend writes run_name itself (fused or tiled kernels)
// The order is the generator's draw order (op_generator.cpp): appending keeps
// every generated sequence, and so every `kvsim diff --generated` count, as it is.
#define KVSIM_OPS(X)                                                                  \
  X(append_paged, AppendPagedOp, validate_append_paged, pools, custom)                 \
  X(reshape_and_cache, ReshapeAndCacheOp, validate_reshape_and_cache, pools, custom)   \
  X(qkv_preprocess_write, QkvPreprocessOp, validate_qkv_preprocess, pools, custom)     \
  X(append_mla, AppendMlaOp, validate_append_mla, pools, items)                        \
  X(indexer_k_scatter, IndexerKScatterOp, validate_indexer_k_scatter, tensors, items)  \
  X(gather_paged, GatherPagedOp, validate_gather_paged, pools, custom)                 \
  X(decode_attention, DecodeAttentionOp, validate_decode_attention, pools, custom)     \
  X(prefill_attention, PrefillAttentionOp, validate_prefill_attention, pools, custom)  \
  X(mla_attention, MlaAttentionOp, validate_mla_attention, pools, custom)              \
  X(partial_copy, PartialCopyOp, validate_partial_copy, pools, custom)                 \
  X(copy_blocks, CopyBlocksOp, validate_copy_blocks, pools, custom)                    \
  X(offload, MoveBlocksOp, validate_move_blocks, pools, custom)                        \
  X(onboard, MoveBlocksOp, validate_move_blocks, pools, custom)

// An op's parameter list and argument list by its form.
#define KVSIM_OP_PARAMS_pools(Op) const ::kvsim::KvPools &pools, const Op &op
#define KVSIM_OP_PARAMS_tensors(Op) const Op &op
#define KVSIM_OP_ARGS_pools pools, op
#define KVSIM_OP_ARGS_tensors op
#define KVSIM_OP_POOLS_pools pools
#define KVSIM_OP_POOLS_tensors ::kvsim::KvPools{}
#define KVSIM_OP_PARAMS(Op, form) KVSIM_OP_PARAMS_##form(Op)
#define KVSIM_OP_ARGS(form) KVSIM_OP_ARGS_##form
// The pools an op runs on (an empty KvPools for a tensors-form op).
#define KVSIM_OP_POOLS(form) KVSIM_OP_POOLS_##form

// Every backend's implementations, declared in its class: KVSIM_BACKEND_OP_OVERRIDES
// (then define run_<name> for each op of KVSIM_OPS).
#define KVSIM_DECLARE_RUN_OVERRIDE(name, Op, validate, form, impl) void run_##name(KVSIM_OP_PARAMS(Op, form)) override;
#define KVSIM_BACKEND_OP_OVERRIDES KVSIM_OPS(KVSIM_DECLARE_RUN_OVERRIDE)

// The run_<name> of every items-form op for the backend class KVSIM_ITEM_BACKEND
// names: each calls run_item_op<OpId::name>(*this, pools, op, make), the
// backend's one generic runner (defined before the expansion), with make =
// core's make_<name>_items. A custom-form op expands to nothing.
#define KVSIM_WHEN_IMPL_items(...) __VA_ARGS__
#define KVSIM_WHEN_IMPL_custom(...)
#define KVSIM_DEFINE_ITEM_OP_RUN(name, Op, validate, form, impl)                                            \
  KVSIM_WHEN_IMPL_##impl(void KVSIM_ITEM_BACKEND::run_##name(KVSIM_OP_PARAMS(Op, form)) {                 \
    run_item_op<OpId::name>(*this, KVSIM_OP_POOLS(form), op,                                              \
                            [](const ::kvsim::KvPools& p, const Op& o) { return make_##name##_items(p, o); }); \
  })
#define KVSIM_DEFINE_ITEM_OP_RUNS KVSIM_OPS(KVSIM_DEFINE_ITEM_OP_RUN)

namespace kvsim {

enum class OpId : uint8_t {
#define KVSIM_OP_ID(name, ...) name,
  KVSIM_OPS(KVSIM_OP_ID)
#undef KVSIM_OP_ID
};

inline constexpr OpId kOpIds[] = {
#define KVSIM_OP_ID(name, ...) OpId::name,
    KVSIM_OPS(KVSIM_OP_ID)
#undef KVSIM_OP_ID
};

constexpr std::string_view op_name(OpId id) {
  switch (id) {
#define KVSIM_OP_NAME(name, ...) \
  case OpId::name: return #name;
    KVSIM_OPS(KVSIM_OP_NAME)
#undef KVSIM_OP_NAME
  }
  return "?";
}

// ---- per-op traits: what an op reads and writes, beyond its pools' geometry.
//   Op          the descriptor (from KVSIM_OPS)
//   pool_write  the pool whose bytes the op may write (none: it only reads pools)
//   tensors     its TensorView members: read (inputs) or write (outputs, which
//               the differential backend compares after the op, in this order)
//   generated   drawn by the op generator (`kvsim diff --generated`, the
//               differential sweeps); mla_attention has its own fixture
//   uploads     its host spans (page tables, slot mappings) a device backend
//               copies to its memory before the op's items run (items-form ops;
//               a custom op uploads what its kernels read)
enum class Access : uint8_t { read, write };
enum class PoolWrite : uint8_t { none, primary, secondary };

template <class Op>
struct TensorField {
  const char* name;
  TensorView Op::*member;
  Access access;
};

template <OpId>
struct OpTraits;

template <OpId id>
using OpOf = typename OpTraits<id>::Op;

// The common part of every OpTraits: an op with no tensors unless it says.
template <class OpType, PoolWrite kPoolWrite, bool kGenerated = true>
struct OpTraitsOf {
  using Op = OpType;
  static constexpr PoolWrite pool_write = kPoolWrite;
  static constexpr bool generated = kGenerated;
  static constexpr std::array<TensorField<Op>, 0> tensors{};
  static constexpr std::tuple<> uploads{};
};
template <class Op, size_t n>
using Tensors = std::array<TensorField<Op>, n>;
inline constexpr Access kRead = Access::read, kWrite = Access::write;

template <>
struct OpTraits<OpId::append_paged> : OpTraitsOf<AppendPagedOp, PoolWrite::primary> {
  static constexpr Tensors<Op, 2> tensors{{{"k", &Op::k, kRead}, {"v", &Op::v, kRead}}};
};
template <>
struct OpTraits<OpId::reshape_and_cache> : OpTraitsOf<ReshapeAndCacheOp, PoolWrite::primary> {
  static constexpr Tensors<Op, 2> tensors{{{"key", &Op::key, kRead}, {"value", &Op::value, kRead}}};
};
template <>
struct OpTraits<OpId::qkv_preprocess_write> : OpTraitsOf<QkvPreprocessOp, PoolWrite::primary> {
  static constexpr Tensors<Op, 4> tensors{{{"qkv", &Op::qkv, kRead},
                                           {"bias", &Op::bias, kRead},
                                           {"q_out", &Op::q_out, kWrite},
                                           {"cos_sin", &Op::cos_sin, kRead}}};
};
template <>
struct OpTraits<OpId::append_mla> : OpTraitsOf<AppendMlaOp, PoolWrite::primary> {
  static constexpr Tensors<Op, 2> tensors{{{"ckv", &Op::ckv, kRead}, {"kpe", &Op::kpe, kRead}}};
  static constexpr std::tuple uploads{&Op::batch_indices, &Op::positions, &Op::indptr, &Op::indices,
                                      &Op::last_page_len};
};
template <>
struct OpTraits<OpId::indexer_k_scatter> : OpTraitsOf<IndexerKScatterOp, PoolWrite::none> {
  static constexpr Tensors<Op, 3> tensors{
      {{"k_fp8", &Op::k_fp8, kRead}, {"k_scale", &Op::k_scale, kRead}, {"cache", &Op::cache, kWrite}}};
  static constexpr std::tuple uploads{&Op::slot_mapping_fp8, &Op::slot_mapping_scale};
};
template <>
struct OpTraits<OpId::gather_paged> : OpTraitsOf<GatherPagedOp, PoolWrite::none> {
  static constexpr Tensors<Op, 1> tensors{{{"out", &Op::out, kWrite}}};
};
template <>
struct OpTraits<OpId::decode_attention> : OpTraitsOf<DecodeAttentionOp, PoolWrite::none> {
  static constexpr Tensors<Op, 3> tensors{{{"q", &Op::q, kRead}, {"out", &Op::out, kWrite}, {"lse", &Op::lse, kWrite}}};
};
template <>
struct OpTraits<OpId::prefill_attention> : OpTraitsOf<PrefillAttentionOp, PoolWrite::none> {
  static constexpr Tensors<Op, 3> tensors{{{"q", &Op::q, kRead}, {"out", &Op::out, kWrite}, {"lse", &Op::lse, kWrite}}};
};
// Not generated: MLA attention has its own fixture (tests/support/mla_attention_fixture.hpp).
template <>
struct OpTraits<OpId::mla_attention> : OpTraitsOf<MlaAttentionOp, PoolWrite::none, /*generated=*/false> {
  static constexpr Tensors<Op, 2> tensors{{{"q", &Op::q, kRead}, {"out", &Op::out, kWrite}}};
};
template <>
struct OpTraits<OpId::partial_copy> : OpTraitsOf<PartialCopyOp, PoolWrite::primary> {};
template <>
struct OpTraits<OpId::copy_blocks> : OpTraitsOf<CopyBlocksOp, PoolWrite::primary> {};
template <>
struct OpTraits<OpId::offload> : OpTraitsOf<MoveBlocksOp, PoolWrite::secondary> {};
template <>
struct OpTraits<OpId::onboard> : OpTraitsOf<MoveBlocksOp, PoolWrite::primary> {};

// The traits' descriptor agrees with the list's (a mismatch fails to compile).
#define KVSIM_OP_CHECK(name, Op, ...) \
  static_assert(std::is_same_v<OpOf<OpId::name>, Op>, "OpTraits<" #name "> names another descriptor");
KVSIM_OPS(KVSIM_OP_CHECK)
#undef KVSIM_OP_CHECK

// The ops the generator draws, in list order.
inline constexpr auto kGeneratedOpIds = [] {
  constexpr size_t n = (size_t{0}
#define KVSIM_OP_COUNT(name, ...) +(OpTraits<OpId::name>::generated ? 1 : 0)
                        KVSIM_OPS(KVSIM_OP_COUNT)
#undef KVSIM_OP_COUNT
  );
  std::array<OpId, n> ids{};
  size_t i = 0;
#define KVSIM_OP_PICK(name, ...) \
  if (OpTraits<OpId::name>::generated) ids[i++] = OpId::name;
  KVSIM_OPS(KVSIM_OP_PICK)
#undef KVSIM_OP_PICK
  return ids;
}();

}  // namespace kvsim
