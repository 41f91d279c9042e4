// One recorded replay (replay_run.hpp): the scheduler forms steps, the block
// manager builds every page table, the synthetic model makes the inputs, and
// each step becomes, for every layer, the scenario's write op
// (qkv_preprocess_write / append_paged / reshape_and_cache / append_mla),
// indexer_k_scatter when enabled, then prefill_attention over the step's
// prefill chunks and decode_attention over its decodes (MLA latent pools: mla_attention
// over every entry when mla.attention is set; read-backs in any case). With
// [layers], each layer uses its KV cache group's table, window and pool.
#include "kvsim/sim/replay_run.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <fstream>
#include <limits>
#include <optional>
#include <unordered_map>

#include <kvsim/core/recurrence.hpp>
#include <kvsim/validation/tensor.hpp>

#include "kvsim/sim/block_manager.hpp"
#include "kvsim/sim/dense_gemm.hpp"
#include "kvsim/sim/npy_dump.hpp"
#include "kvsim/sim/scheduler.hpp"
#include "kvsim/sim/step_observer.hpp"
#include "kvsim/sim/synthetic_model.hpp"

namespace kvsim::sim {

SpillFile::SpillFile() {
  const char* dir = std::getenv("TMPDIR");
  std::string path = std::string(dir && *dir ? dir : "/tmp") + "/kvsim-spill-XXXXXX";
  fd_ = mkstemp(path.data());
  if (fd_ < 0)
    fail(ErrorCode::insufficient_memory,
         "cannot create a spill file for the quantization invariant's outputs in " + path.substr(0, path.size() - 18) +
             ": " + std::strerror(errno) + " (set TMPDIR to a writable folder, or --invariants without quantization)");
  unlink(path.c_str());  // gone when closed, whatever happens to the run
}

SpillFile::~SpillFile() {
  if (fd_ >= 0) close(fd_);
}

int64_t SpillFile::append(const void* data, size_t bytes) {
  const int64_t at = size_;
  const auto* p = static_cast<const uint8_t*>(data);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = pwrite(fd_, p + done, bytes - done, static_cast<off_t>(at + static_cast<int64_t>(done)));
    if (n <= 0)
      fail(ErrorCode::insufficient_memory, std::string("the spill file of the quantization invariant's outputs cannot grow past ") +
                                               std::to_string(at + static_cast<int64_t>(done)) + " bytes: " +
                                               std::strerror(errno) + " (free disk space in TMPDIR)");
    done += static_cast<size_t>(n);
  }
  size_ += static_cast<int64_t>(bytes);
  return at;
}

std::vector<uint8_t> SpillFile::read(int64_t offset, size_t bytes) const {
  std::vector<uint8_t> out(bytes);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = pread(fd_, out.data() + done, bytes - done, static_cast<off_t>(offset + static_cast<int64_t>(done)));
    if (n <= 0) throw std::runtime_error("spill file: short read at offset " + std::to_string(offset));
    done += static_cast<size_t>(n);
  }
  return out;
}

void record(RunRecord& r, const OutputKey& key, const void* data, size_t bytes) {
  record(r, key, blake2b_128(data, bytes), data, bytes);
}

void record(RunRecord& r, const OutputKey& key, const Digest128& digest, const void* data, size_t bytes) {
  RecordedOutput o;
  o.key = key;
  o.digest = digest;
  o.bytes = static_cast<uint32_t>(bytes);
  o.order = static_cast<uint32_t>(r.outputs.size());
  if (r.spill && r.spill_kinds[static_cast<int>(key.kind)]) o.spill_offset = r.spill->append(data, bytes);
  if (r.capture_key && *r.capture_key == key) {
    const auto* p = static_cast<const uint8_t*>(data);
    r.captured = std::vector<uint8_t>(p, p + bytes);
  }
  r.outputs.push_back(std::move(o));
}

void RecordRows::push_back(RecordedOutput o) {
  // The first chunk grows as a vector does (1, 2, 4, ... kRowsPerChunk rows: a small record stays
  // small); a record that fills it is large, and each later chunk is reserved whole.
  if (size_ == chunks_.size() * kRowsPerChunk) {
    chunks_.emplace_back();
    if (chunks_.size() > 1) chunks_.back().reserve(kRowsPerChunk);
  }
  chunks_.back().push_back(std::move(o));
  ++size_;
}

void RecordRows::truncate(size_t n) {
  if (n >= size_) return;
  const size_t keep_chunks = (n + kRowsPerChunk - 1) / kRowsPerChunk;
  chunks_.resize(keep_chunks);
  if (keep_chunks > 0) chunks_.back().resize(n - (keep_chunks - 1) * kRowsPerChunk);
  size_ = n;
}

void finalize(RunRecord& r) {
  // Of equal keys the last production comes last (by order), and is the one kept.
  std::sort(r.outputs.begin(), r.outputs.end(), [](const RecordedOutput& a, const RecordedOutput& b) {
    return a.key < b.key || (a.key == b.key && a.order < b.order);
  });
  size_t kept = 0;
  for (size_t i = 0; i < r.outputs.size(); ++i) {
    if (i + 1 < r.outputs.size() && r.outputs[i + 1].key == r.outputs[i].key) continue;
    if (kept != i) r.outputs[kept] = std::move(r.outputs[i]);
    ++kept;
  }
  r.outputs.truncate(kept);
}

const RecordedOutput* find_output(const RunRecord& r, const OutputKey& key) {
  const auto it = std::lower_bound(r.outputs.begin(), r.outputs.end(), key,
                                   [](const RecordedOutput& o, const OutputKey& k) { return o.key < k; });
  return it != r.outputs.end() && it->key == key ? &*it : nullptr;
}

std::optional<std::vector<uint8_t>> output_bytes(const RunRecord& r, const RecordedOutput& o) {
  if (r.spill && o.spill_offset >= 0) return r.spill->read(o.spill_offset, o.bytes);
  if (r.captured && r.capture_key && *r.capture_key == o.key) return r.captured;
  return std::nullopt;
}

namespace {

constexpr int32_t kIndexerDim = 128;  // DeepSeek's indexer head_dim (fp8 bytes per token)

int32_t element_bytes(CacheDtype t) { return bits_per_element(t) / 8; }

bool has_fault(const Scenario& s, Fault f) { return std::find(s.faults.begin(), s.faults.end(), f) != s.faults.end(); }

// The dtype the scenario's write op takes its K/V (or latent) input in.
CacheDtype kv_input_dtype(const Scenario& s) {
  const CacheDtype cache = s.cache.dtype;
  if (cache == CacheDtype::nvfp4) return s.model.input_dtype;  // the op quantizes
  if (s.cache.write_path == WritePath::qkv_preprocess) return is_float_input(cache) ? cache : s.model.input_dtype;
  if (s.cache.write_path == WritePath::reshape_and_cache && is_fp8(cache))
    return s.model.input_dtype;  // vLLM's reshape_and_cache quantizes fp8 itself
  return cache;  // same dtype as the cache: float values, or codes the engine's quantize kernel made
}

// Stores x as element `i` of a host buffer of dtype t. fp8 / int8 codes are
// made with core's codecs the way vLLM's quantize kernels do: code(x / scale).
void put_value(std::vector<uint8_t>& buf, CacheDtype t, int64_t i, float x, float scale) {
  switch (t) {
    case CacheDtype::fp32:
    case CacheDtype::fp16:
    case CacheDtype::bf16: store_float(buf.data(), t, i, x); break;
    case CacheDtype::fp8_e4m3: buf[i] = codec::f32_to_e4m3(x / scale); break;
    case CacheDtype::fp8_e5m2: buf[i] = codec::f32_to_e5m2(x / scale); break;
    case CacheDtype::int8: buf[i] = static_cast<uint8_t>(codec::f32_to_int8(x / scale)); break;
    case CacheDtype::nvfp4: break;  // never an input dtype
  }
}

// put_value for n consecutive elements from i0 (the dtype chosen once per row).
void put_row(std::vector<uint8_t>& buf, CacheDtype t, int64_t i0, const float* x, int32_t n, float scale) {
  if (is_float_input(t)) return store_floats(buf.data(), t, i0, 1, n, x);
  for (int32_t i = 0; i < n; ++i) put_value(buf, t, i0 + i, x[i], scale);
}

// Runs body(i) for i in [0, n) on oneTBB's threads. Each i writes only its
// own elements, so the result is the same bytes in any order.
// Every row here is heavy (a token's inputs, an output row's digest, a dense
// check over a whole context): no grain, so a decode step's 8 or 16 rows
// spread over the threads (a grain of 8 had run them on one or two).
template <class Body>
void parallel_rows(int64_t n, const Body& body) {
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t i = r.begin(); i != r.end(); ++i) body(i);
  });
}

// The backend op a write path runs (the names notify() gives them).
std::string write_op_name(WritePath p) {
  return p == WritePath::qkv_preprocess ? "qkv_preprocess_write" : std::string(write_path_name(p));
}

// The synthetic model's per-(tensor, head, dim) hash for every element of one
// layer (SyntheticModel::dim_seed): made once per layer, then each value costs
// the position's part of the chain only.
struct LayerSeeds {
  std::array<std::vector<uint64_t>, 6> seed;  // by ModelTensor: [head * dims + dim]
  std::array<int32_t, 6> dims{};
  uint64_t of(ModelTensor t, int32_t head, int32_t dim) const {
    const auto i = static_cast<size_t>(t);
    return seed[i][static_cast<size_t>(head) * dims[i] + dim];
  }
};

struct Entry {
  const ScheduledEntry* e;
  RequestState* r;
  int64_t op_start;  // what the ops are told is already cached (the past_len_zero fault says 0)
  int32_t cache_len() const { return static_cast<int32_t>(op_start + e->n); }
};

class Runner final : public BlockMover {
 public:
  Runner(const Scenario& s, Backend& be, const ReplayOptions& opt)
      : s_(s), be_(be), opt_(opt), g_(pool_geometry(s)), model_(s.model), reqs_(make_requests(s)) {
    past_len_zero_ = has_fault(s, Fault::past_len_zero);
    k_scale_for_v_ = has_fault(s, Fault::k_scale_for_v);
    q_scale_dropped_ = has_fault(s, Fault::q_scale_dropped);
    stale_bad_page_ = has_fault(s, Fault::stale_bad_page);
    short_block_table_ = has_fault(s, Fault::short_block_table);
    offload_drops_scales_ = has_fault(s, Fault::offload_drops_scales);
    split_x_unwritten_ = has_fault(s, Fault::split_x_heads_unwritten);
    slot_page_size_fault_ = has_fault(s, Fault::slot_mapping_page_size);
    indexer_past_cache_ = has_fault(s, Fault::indexer_slot_past_cache);
    offload_before_copy_ = has_fault(s, Fault::offload_before_copy);
    const bool v_tail_fault = has_fault(s, Fault::v_tail_not_zeroed);
    zero_v_tail_ = s.cache.zero_v_tail && !v_tail_fault;
    rec_.poisoned = s.cache.poison_nan || v_tail_fault;
    if (opt_.content_hash) hash_ = std::make_unique<FnvStream>();
    if (s.mla.enabled != (s.cache.write_path == WritePath::append_mla))
      fail(ErrorCode::bad_scenario, "cache.write_path append_mla goes with mla.enabled (and only with it)");
    if (s.cache.write_path == WritePath::reshape_and_cache && s.cache.dtype == CacheDtype::nvfp4)
      fail(ErrorCode::bad_scenario, "reshape_and_cache does not write nvfp4 caches (vLLM has no such kernel)");
    groups_ = kv_groups(s);
    group_of_layer_.assign(static_cast<size_t>(s.model.layers), 0);
    pool_layer_of_.assign(static_cast<size_t>(s.model.layers), 0);
    for (size_t gi = 0; gi < groups_.size(); ++gi)
      for (size_t i = 0; i < groups_[gi].layers.size(); ++i) {
        group_of_layer_[groups_[gi].layers[i]] = static_cast<int32_t>(gi);
        pool_layer_of_[groups_[gi].layers[i]] = static_cast<int32_t>(i);
      }
    bm_ = std::make_unique<BlockManager>(BlockManagerConfig::from(s), this);
    for (int32_t gi = 0; gi < bm_->group_count(); ++gi) {
      const WindowMapping& w = bm_->window_mapping(gi);
      write_maps_.push_back(w);
      WindowMapping read = w;
      const bool ring = w.enabled() && !w.linear;
      // The fault: the reader's mapping forgets the sinks (and with them the bubble).
      if (has_fault(s, Fault::window_mismatch) && ring)
        read = WindowMapping::make(w.window, 0, w.tokens_per_block, w.one_more_block);
      // tt-metal PR #45184: the ring-sized table is indexed by the absolute position.
      if (has_fault(s, Fault::window_table_absolute) && ring)
        read = WindowMapping::make_linear(w.window, w.sinks, w.tokens_per_block);
      read_maps_.push_back(read);
    }
    // vLLM PR #51756: a full-attention layer reads with the model's sliding
    // window (its group's spec taken for the layer's own).
    if (has_fault(s, Fault::group_window_for_layer))
      for (int32_t gi = 0; gi < bm_->group_count(); ++gi)
        if (!write_maps_[gi].enabled())
          for (const WindowMapping& w : write_maps_)
            if (w.enabled()) {
              read_maps_[gi] = WindowMapping::make_linear(w.window, 0, w.tokens_per_block);
              break;
            }
    write_map_ = write_maps_[0];
    read_map_ = read_maps_[0];
    if (s.recurrent.layers > 0) {
      recurrent_.assign(reqs_.size() * static_cast<size_t>(s.recurrent.layers) * s.recurrent.state_size, 0.0f);
      recurrent_pos_.assign(reqs_.size(), -1);
      snapshot_off_boundary_ = has_fault(s, Fault::snapshot_off_block_boundary);
      // A hit may stop only where every recurrent layer's state has a snapshot.
      if (s.reuse.enabled)
        bm_->set_hit_filter([this](BlockManager::SeqId seq, int64_t tokens) {
          return snapshots_.count(reqs_[seq].hashes[tokens - 1]) != 0;
        });
    }
    sched_ = std::make_unique<Scheduler>(s, *bm_, reqs_);
    if (opt.observer) {
      bm_->set_event_listener([o = opt.observer](const BlockEvent& e) { o->block_event(e); });
      opt.observer->start(s, *bm_, reqs_);
    }
    // The dump folder before any pool: a folder that cannot be made is refused with nothing allocated.
    if (!opt.dump_dir.empty()) dump_ = std::make_unique<NpyDump>(opt.dump_dir);
    allocate_pools();
    // A throw past here skips ~Runner (the object never finished): the pools go back first.
    try {
      finish_setup(s, opt);
    } catch (...) {
      release_owned_pools();
      throw;
    }
  }
  void release_owned_pools() noexcept {
    if (own_pools_)
      for (KvPools& p : pool_sets_) be_.release_pools(p);
    own_pools_ = false;
  }
  void finish_setup(const Scenario& s, const ReplayOptions& opt) {
    sm_scale_ = 1.0f / std::sqrt(static_cast<float>(g_.head_dim));
    if (is_quantized(g_.dtype) && g_.dtype != CacheDtype::nvfp4) {
      scales_.k_scale = s.cache.k_scale;
      scales_.v_scale = s.cache.v_scale;
    }
    if (g_.dtype == CacheDtype::nvfp4) {
      scales_.k_global_scale = s.cache.k_global_scale;
      scales_.v_global_scale = s.cache.v_global_scale;
    }
    scales_.sm_scale = sm_scale_;
    order_ = s.attention.order;
    if (s.cache.write_path == WritePath::qkv_preprocess && s.model.rope != RopeStyle::none) {
      rotary_dim_ = s.model.rotary_dim > 0 ? s.model.rotary_dim : s.model.head_dim;
      int64_t max_len = 1;
      for (const RequestState& r : reqs_) max_len = std::max(max_len, r.final_len);
      const RopeTable t = build_rope_table(rotary_dim_, max_len, s.model.rope_theta);
      rope_rows_ = max_len;
      rope_ = BackendBuffer(be_, t.cos_sin.size() * 4);
      transfer(t.cos_sin.size() * 4, [&] { rope_.upload(t.cos_sin.data(), t.cos_sin.size() * 4); });
    }
    if (s.indexer_k_scatter) {
      indexer_row_ = kIndexerDim + kIndexerScaleBytes;
      for (int32_t l = 0; l < g_.layers; ++l) {
        const size_t bytes = static_cast<size_t>(g_.primary_blocks * g_.tokens_per_block * indexer_row_);
        indexer_.emplace_back(be_, bytes);
        be_.fill(indexer_.back().get(), 0, bytes);
      }
    }
    if (opt.spill_attention) {
      rec_.spill = std::make_shared<SpillFile>();
      rec_.spill_kinds[static_cast<int>(OutputKind::attention)] = true;
    }
    rec_.capture_key = opt.capture;
  }
  ~Runner() override { release_owned_pools(); }

  RunRecord run();

  // ---- BlockMover: the block manager's byte moves, with the offload round trip checked
  // `pool`: the pool set of pool_sets_ (VSWA: a window size's); 0 without [layers].
  void partial_copy(int32_t pool, int32_t src, int32_t dst, int32_t tokens) override {
    PartialCopyOp op;
    op.src_block = src;
    op.dst_block = dst;
    op.num_tokens = tokens;
    notify("partial_copy", 0, std::vector<std::string>{});
    dump_move("partial_copy", {{"blocks", {src, dst}}, {"num_tokens", {tokens}}}, pool);
    op_call([&] { be_.partial_copy(pool_sets_[pool], op); });
  }
  void offload(int32_t pool, int32_t primary, int32_t secondary) override { move(pool, primary, secondary, true); }
  void onboard(int32_t pool, int32_t secondary, int32_t primary) override { move(pool, primary, secondary, false); }

 private:
  void allocate_pools();
  void allocate_engine_pools(Engine engine, uint8_t fill);
  void move(int32_t pool, int32_t primary, int32_t secondary, bool to_secondary);
  std::vector<uint8_t> block_bytes(int32_t pool, PoolKind kind, int32_t block);
  void notify(const std::string& op, int32_t layer, const std::vector<Entry>& entries);
  void notify(const std::string& op, int32_t layer, std::vector<std::string> sequence_ids);
  void execute(const StepPlan& plan);
  // One layer's writes of a step: the tables and tokens (plan_layer_write),
  // then the scenario's write path, then the indexer K.
  struct StepToken {
    size_t entry;                 // index into the step's entries
    const RequestState* request;
    int64_t position, op_position;  // true position; the one the ops are told
    bool reaches;                 // its K/V reach the cache (a window may skip it)
  };
  struct LayerWrite {
    int32_t layer = 0;
    int64_t nnz = 0;
    CacheDtype input_dtype = CacheDtype::bf16;
    int32_t columns = 1;               // table row width
    std::vector<int32_t> table;        // one row of `columns` entries per step entry
    std::vector<int32_t> seq_lens, cache_lens;
    std::vector<int32_t> indptr{0}, indices, last_page_len;  // the same tables as CSR
    std::vector<StepToken> toks;
    const LayerSeeds* seeds = nullptr;  // the synthetic model's for this layer
  };
  struct AppendInputs {
    int64_t n = 0;
    int32_t a_dim = 0, b_dim = 0;
    BackendBuffer a, b;  // K and V, or ckv and kpe
    std::vector<int32_t> batch, positions;
  };
  void write_layer(int32_t layer, const std::vector<Entry>& es, int64_t nnz, BackendBuffer& q_buf, CacheDtype& q_dtype);
  LayerWrite plan_layer_write(int32_t layer, const std::vector<Entry>& es, int64_t nnz) const;
  // The synthetic model's values of token k for dims 0 .. n - 1 of one head of t, into out.
  void token_row(const LayerWrite& w, ModelTensor t, int32_t head, int32_t n, const StepToken& k, float* out) const;
  void cache_slot(const LayerWrite& w, const StepToken& k, int64_t& block, int32_t& entry) const;
  void upload_model_q(const LayerWrite& w, BackendBuffer& q_buf, CacheDtype& q_dtype);
  void write_qkv_preprocess(const LayerWrite& w, const std::vector<Entry>& es, BackendBuffer& q_buf, CacheDtype& q_dtype);
  AppendInputs append_inputs(const LayerWrite& w, bool mla);
  template <class Op>
  void set_append_tables(Op& op, const LayerWrite& w, const AppendInputs& in) const;
  void write_append_paged(const LayerWrite& w, const std::vector<Entry>& es);
  void write_append_mla(const LayerWrite& w, const std::vector<Entry>& es);
  void write_reshape_and_cache(const LayerWrite& w, const std::vector<Entry>& es);
  void scatter_indexer_k(const LayerWrite& w, const std::vector<Entry>& es);
  void attend(int32_t layer, const std::vector<Entry>& es, size_t first, size_t last, int64_t row0,
              const BackendBuffer& q_buf, CacheDtype q_dtype, bool decode);
  void attend_mla(int32_t layer, const std::vector<Entry>& es);
  struct AttentionTables {
    int32_t columns = 1;
    std::vector<int32_t> table, seq_lens, q_indptr{0};
  };
  AttentionTables attention_tables(const std::vector<Entry>& batch, bool drop_last_column) const;
  void check_dense(int32_t layer, const std::vector<Entry>& es, size_t first, size_t last,
                   const std::vector<float>& q, const std::vector<float>& out, int32_t hq);
  bool dense_checks_row(const Entry& e, int32_t i) const;
  static constexpr int64_t kDenseEveryDecodeBelow = 1024;  // dense_checks_row
  static constexpr int64_t kDenseTile = 64;  // slots per tile of the dense check's double arithmetic (L1-sized at D = 128)
  static constexpr int64_t kDenseColumns = 64;  // query heads (rows x group) sharing one pass over the keys
  void read_back(RequestState& r);
  std::unique_ptr<float[]> gather_rows(int32_t layer, int32_t kv, const std::vector<int32_t>& ids, int64_t slots,
                                 const AttentionScales& sc, const std::string& request_id);
  // The write invariant: layer `layer`'s read-back rows (K or latent kv = 0,
  // V kv = 1), keys[i]'s token in rows[i], against the values their write ops were given.
  void check_written_rows(int32_t layer, int32_t kv, const RequestState& r, const std::vector<OutputKey>& keys,
                          const std::vector<const float*>& rows);
  void check_indexer_rows(int32_t layer, const RequestState& r);
  bool expected_row(const LayerSeeds& seeds, int32_t kv, const RequestState& r, int64_t t, std::vector<float>& out) const;
  // DeepSeek's indexer row of a token: 128 fp8 bytes, then its fp32 scale's 4 bytes.
  void indexer_row(int32_t layer, int64_t position, uint64_t hash, uint8_t* bytes, uint8_t* scale) const;
  using SubBlocks = std::map<int64_t, std::array<std::vector<uint8_t>, 2>>;  // block -> its K and V bytes
  void leave_split_x_heads_unwritten(int32_t pool_layer, const std::vector<std::pair<int64_t, int32_t>>& targets,
                                     const SubBlocks& before);
  std::vector<uint8_t> sub_block_bytes(int64_t block, int32_t layer, int32_t kv);
  void finish_pending_offloads();
  // [recurrent]: folds each entry's tokens into its request's states, taking
  // the snapshots at block boundaries; restore_state resumes a request at
  // token `at` > 0 from its snapshot (the state_hit and state_restore checks).
  void advance_recurrent(const std::vector<Entry>& es);
  void restore_state(const RequestState& r, int64_t at, float* state);
  std::vector<float> recompute_state(const RequestState& r, int64_t tokens) const;
  void fold_token(const RequestState& r, int64_t t, float* state) const;
  std::vector<int32_t> table_row(const RequestState& r, int32_t columns) const;
  // Points pools_, write_map_, read_map_ and group_ at the layer's KV cache group.
  void select_layer(int32_t layer);
  void fill_fresh_pages(const KvPools& p, float value);
  // Output rows of one op, each `bytes` long: digested in parallel (each row
  // its own digest), recorded in the order given.
  void record_rows(const std::vector<OutputKey>& keys, const std::vector<const float*>& rows, size_t bytes);
  void hash_content(const void* data, size_t bytes);
  // --dump: what another kernel needs to be driven from the files, per op
  // (stepS_layerL_OP_NAME.npy): its input tensors, index tables and scales.
  std::string dump_stem(int32_t layer, const std::string& op) const {
    return "step" + std::to_string(step_) + "_layer" + std::to_string(layer) + "_" + op;
  }
  template <class T>
  void dump_table(int32_t layer, const std::string& op, const std::string& name, const std::vector<T>& values,
                  std::vector<int64_t> shape = {}) {
    if (shape.empty()) shape = {static_cast<int64_t>(values.size())};
    dump_->write_table(dump_stem(layer, op) + "_" + name + ".npy", values, shape, step_, op, layer);
  }
  void dump_tensor(int32_t layer, const std::string& op, const std::string& name, const std::vector<uint8_t>& bytes,
                   CacheDtype t, const std::vector<int64_t>& shape) {
    dump_->write(dump_stem(layer, op) + "_" + name + ".npy", bytes.data(), bytes.size(), NpyDump::descr_for(t), shape,
                 step_, op, layer, t);
  }
  // A write op's tables (every write path): the step's block table, new and
  // cached lengths per sequence, each token's position and cache slot.
  void dump_write_tables(const LayerWrite& w, const std::string& op);
  // A block move's ids (partial_copy, offload, onboard: no layer, several a
  // step): stepS_OPk_NAME.npy, k counting that op's moves within the step;
  // with several pool sets, its pool too.
  void dump_move(const std::string& op, std::vector<std::pair<std::string, std::vector<int32_t>>> tables,
                 int32_t pool) {
    if (!dump_) return;
    if (pool_sets_.size() > 1) tables.push_back({"pool", {pool}});
    const Phase dumping(clock_, &rec_.timings.recording);
    if (moves_step_ != step_) {
      moves_step_ = step_;
      moves_in_step_.clear();
    }
    const std::string stem = "step" + std::to_string(step_) + "_" + op + std::to_string(moves_in_step_[op]++);
    for (const auto& [name, values] : tables)
      dump_->write_table(stem + "_" + name + ".npy", values, {static_cast<int64_t>(values.size())}, step_, op, -1);
  }
  int64_t moves_step_ = -1;
  std::map<std::string, int32_t> moves_in_step_;
  const LayerSeeds& layer_seeds(int32_t layer) const;
  // One backend op; its time goes to kernels, and with the backend's kernel
  // timing on, the rest of the call (validation, index uploads) to op_host.
  template <class Run>
  void op_call(const Run& run) {
    const auto t0 = std::chrono::steady_clock::now();
    {
      Phase p(clock_, &rec_.timings.kernels);
      run();
    }
    if (!be_.kernel_timing()) return;
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double host = std::max(0.0, wall - be_.last_kernel_seconds());
    rec_.timings.kernels -= host;
    rec_.timings.op_host += host;
  }
  template <class Copy>
  void transfer(size_t bytes, const Copy& copy) {
    Phase p(clock_, &rec_.timings.transfers);
    copy();
    rec_.timings.transfer_bytes += static_cast<double>(bytes);
  }
  void hash_final_state();

  const Scenario& s_;
  Backend& be_;
  const ReplayOptions& opt_;
  PoolGeometry g_;
  SyntheticModel model_;
  std::vector<RequestState> reqs_;
  std::unique_ptr<BlockManager> bm_;
  std::unique_ptr<Scheduler> sched_;
  KvPools pools_;  // the current layer's pool set (select_layer)
  std::vector<KvPools> pool_sets_;  // one per pool (VSWA: per window size)
  std::vector<KvGroup> groups_;
  std::vector<int32_t> group_of_layer_, pool_layer_of_;
  std::vector<WindowMapping> write_maps_, read_maps_;  // per group
  int32_t group_ = 0;
  bool own_pools_ = false;
  std::vector<BackendBuffer> pool_memory_;  // shared [pages, 2, ...] allocations
  WindowMapping write_map_, read_map_;  // the current layer's group's
  AttentionScales scales_;
  AttentionOrder order_ = AttentionOrder::fp32;
  float sm_scale_ = 1.0f;
  bool past_len_zero_ = false, k_scale_for_v_ = false, stale_bad_page_ = false, zero_v_tail_ = true;
  bool q_scale_dropped_ = false;
  bool short_block_table_ = false, offload_drops_scales_ = false;
  bool split_x_unwritten_ = false, slot_page_size_fault_ = false, indexer_past_cache_ = false;
  bool offload_before_copy_ = false;
  // [recurrent]: the live states, [requests][recurrent layers][state_size]
  // fp32, how many tokens each request's state has folded (-1: none yet), and
  // the snapshots by the hash of the prefix they end (tokens 0..b-1 of a
  // block boundary b), every layer's state back to back.
  std::vector<float> recurrent_;
  std::vector<int64_t> recurrent_pos_;
  std::unordered_map<uint64_t, std::vector<float>> snapshots_;
  bool snapshot_off_boundary_ = false;
  // offload_before_copy: offloads issued this step whose copy runs only at
  // the step's end (vLLM #45704: the store stream is not waited for).
  struct PendingOffload {
    int32_t pool, primary, secondary;
  };
  std::vector<PendingOffload> pending_offloads_;
  // What each (pool, secondary block) was given by its last offload: an
  // onboard must return exactly that (the offload invariant, end to end).
  std::map<std::pair<int32_t, int32_t>, Digest128> offloaded_digest_;
  int32_t rotary_dim_ = 0;
  int64_t rope_rows_ = 0;
  BackendBuffer rope_;
  int64_t indexer_row_ = 0;
  std::vector<BackendBuffer> indexer_;
  std::map<std::pair<int32_t, int32_t>, std::vector<int32_t>> previous_tables_;  // (request, group): the stale_bad_page fault's reader tables
  int64_t step_ = 0;
  RunRecord rec_;
  std::unique_ptr<FnvStream> hash_;  // the content hash, when opt_.content_hash
  std::unique_ptr<NpyDump> dump_;
  mutable std::map<int32_t, LayerSeeds> seeds_;  // by layer, made when first asked for (layer_seeds)
  PhaseClock clock_{&rec_.timings.other};  // after rec_: it charges rec_.timings
};

const LayerSeeds& Runner::layer_seeds(int32_t layer) const {
  auto [it, fresh] = seeds_.try_emplace(layer);
  if (!fresh) return it->second;
  LayerSeeds& ls = it->second;
  const int32_t D = g_.head_dim;
  const std::pair<int32_t, int32_t> shape[6] = {{s_.model.q_heads, s_.mla.enabled ? s_.mla.d_ckv + s_.mla.d_kpe : D},
                                                {g_.kv_heads, D},
                                                {g_.kv_heads, D},
                                                {1, s_.mla.d_ckv},
                                                {1, s_.mla.d_kpe},
                                                {1, kIndexerDim}};
  for (int t = 0; t < 6; ++t) {
    const auto [heads, dims] = shape[t];
    ls.dims[t] = dims;
    if (!s_.mla.enabled && (t == 3 || t == 4)) continue;
    ls.seed[t].resize(static_cast<size_t>(heads) * std::max(dims, 0));
    for (int32_t h = 0; h < heads; ++h)
      for (int32_t d = 0; d < dims; ++d)
        ls.seed[t][static_cast<size_t>(h) * dims + d] = model_.dim_seed(static_cast<ModelTensor>(t), layer, h, d);
  }
  return ls;
}

void Runner::allocate_pools() {
  const uint8_t fill = rec_.poisoned ? 0xFF : 0x00;  // 0xFF: NaN in fp32/fp16/bf16/fp8, -max in e2m1 with a NaN scale
  if (s_.cache.engine) {
    allocate_engine_pools(*s_.cache.engine, fill);
    return;
  }
  if (!s_.cache.shared_kv_allocation) {
    for (int32_t p = 0; p < kv_pool_count(groups_); ++p)
      pool_sets_.push_back(be_.allocate_pools(s_.layers.enabled ? kv_pool_geometry(s_, groups_, p) : g_, fill));
    own_pools_ = true;
    pools_ = pool_sets_[0];
    if (s_.cache.fresh_page_fill)
      for (const KvPools& p : pool_sets_) fill_fresh_pages(p, *s_.cache.fresh_page_fill);
    return;
  }
  // FlashInfer: one [pages, 2, P, H, D] tensor per layer, layers back to back;
  // K and V are strided views into it. One spare page per layer shows that
  // strides are checked against the allocation, not the pool's dense size.
  const int64_t pages = g_.primary_blocks + 1;
  SharedKvAllocation primary, secondary;
  const int64_t elements = g_.layers * pages * 2 * g_.inner_elements();
  pool_memory_.emplace_back(be_, static_cast<size_t>(g_.bytes_for(elements)));
  be_.fill(pool_memory_.back().get(), fill, pool_memory_.back().bytes());
  primary.data = pool_memory_.back().get();
  primary.pages = pages;
  if (g_.has_scale_pool()) {
    const PoolGeometry sg = g_.scale_geometry();
    pool_memory_.emplace_back(be_, static_cast<size_t>(sg.bytes_for(sg.layers * pages * 2 * sg.inner_elements())));
    be_.fill(pool_memory_.back().get(), fill, pool_memory_.back().bytes());
    primary.scales = pool_memory_.back().get();
  }
  if (g_.secondary_blocks > 0) {
    secondary.pages = g_.secondary_blocks;
    pool_memory_.emplace_back(be_, static_cast<size_t>(g_.bytes_for(g_.layers * secondary.pages * 2 * g_.inner_elements())));
    be_.fill(pool_memory_.back().get(), fill, pool_memory_.back().bytes());
    secondary.data = pool_memory_.back().get();
    if (g_.has_scale_pool()) {
      const PoolGeometry sg = g_.scale_geometry();
      pool_memory_.emplace_back(be_, static_cast<size_t>(sg.bytes_for(sg.layers * secondary.pages * 2 * sg.inner_elements())));
      be_.fill(pool_memory_.back().get(), fill, pool_memory_.back().bytes());
      secondary.scales = pool_memory_.back().get();
    }
  }
  pool_sets_.push_back(make_shared_kv_pools(g_, primary, secondary));
  pools_ = pool_sets_[0];
}

// Every element of every pool holds the code of `value` (cache.fresh_page_fill).
void Runner::fill_fresh_pages(const KvPools& p, float value) {
  const CacheDtype t = p.geometry.dtype;
  std::vector<uint8_t> chunk(size_t{1} << 20);
  const int32_t eb = element_bytes(t);
  for (size_t i = 0; i < chunk.size() / eb; ++i) {
    if (is_float_input(t)) store_float(chunk.data(), t, static_cast<int64_t>(i), value);
    else if (t == CacheDtype::fp8_e4m3) chunk[i] = codec::f32_to_e4m3(value);
    else if (t == CacheDtype::fp8_e5m2) chunk[i] = codec::f32_to_e5m2(value);
    else chunk[i] = static_cast<uint8_t>(codec::f32_to_int8(value));
  }
  for (PoolKind kind : {PoolKind::primary, PoolKind::secondary}) {
    const int64_t bytes = p.geometry.pool_bytes(kind);
    auto* base = static_cast<uint8_t*>(p.data[static_cast<int>(kind)]);
    for (int64_t at = 0; base && at < bytes; at += static_cast<int64_t>(chunk.size()))
      transfer(static_cast<size_t>(std::min<int64_t>(bytes - at, chunk.size())), [&] { be_.to_backend(base + at, chunk.data(), static_cast<size_t>(std::min<int64_t>(bytes - at, chunk.size()))); });
  }
}

void Runner::select_layer(int32_t layer) {
  group_ = group_of_layer_[layer];
  pools_ = pool_sets_[groups_[group_].pool];
  write_map_ = write_maps_[group_];
  read_map_ = read_maps_[group_];
}

// An engine's tensors (validation/engine_presets.hpp) laid in one allocation per
// pool kind, with the engine's strides; the nvfp4 scales likewise.
void Runner::allocate_engine_pools(Engine engine, uint8_t fill) {
  pools_ = KvPools{};
  pools_.geometry = g_;
  for (const PoolKind kind : {PoolKind::primary, PoolKind::secondary}) {
    if (g_.blocks(kind) == 0) continue;
    const int k = static_cast<int>(kind);
    const auto take = [&](const PoolGeometry& g, const EngineLayout& l, void*& data, PoolStrides& strides,
                          int64_t& allocation) {
      pool_memory_.emplace_back(be_, static_cast<size_t>(g.bytes_for(l.allocation_elements)));
      be_.fill(pool_memory_.back().get(), fill, pool_memory_.back().bytes());
      data = pool_memory_.back().get();
      strides = l.strides;
      allocation = l.allocation_elements;
    };
    take(g_, engine_layout(engine, g_, kind), pools_.data[k], pools_.strides[k], pools_.allocation_elements[k]);
    if (g_.has_scale_pool())
      take(g_.scale_geometry(), engine_scale_layout(engine, g_, kind), pools_.scales[k], pools_.scale_strides[k],
           pools_.scale_allocation_elements[k]);
    validate_pool(pools_, kind, "engine " + std::string(engine_name(engine)) + " pools: ");
  }
  pool_sets_.push_back(pools_);
  if (s_.cache.fresh_page_fill) fill_fresh_pages(pools_, *s_.cache.fresh_page_fill);
}

// Every byte of one block: each (layer, kv) sub-block, data and nvfp4 scales,
// located by element_offset / scale_offset.
std::vector<uint8_t> Runner::block_bytes(int32_t pool, PoolKind kind, int32_t block) {
  std::vector<uint8_t> out;
  const KvPools& ps = pool_sets_[pool];
  const PoolGeometry& g = ps.geometry;
  const int k = static_cast<int>(kind);
  for (int32_t l = 0; l < g.layers; ++l)
    for (int32_t kv = 0; kv < g.kv_factor; ++kv) {
      const int64_t first = element_byte_offset(element_offset(ps.strides[k], block, l, kv, 0, 0, 0), g.dtype);
      const size_t n = static_cast<size_t>(g.bytes_for(g.inner_elements()));
      const size_t at = out.size();
      out.resize(at + n);
      transfer(n, [&] { be_.to_host(out.data() + at, static_cast<uint8_t*>(ps.data[k]) + first, n); });
      if (g.has_scale_pool()) {
        const int64_t sfirst = scale_offset(ps.scale_strides[k], block, l, kv, 0, 0, 0);
        const size_t sn = static_cast<size_t>(g.scale_geometry().inner_elements());
        const size_t sat = out.size();
        out.resize(sat + sn);
        transfer(sn, [&] { be_.to_host(out.data() + sat, static_cast<uint8_t*>(ps.scales[k]) + sfirst, sn); });
      }
    }
  return out;
}

void Runner::move(int32_t pool, int32_t primary, int32_t secondary, bool to_secondary) {
  const std::vector<uint8_t> before = to_secondary ? block_bytes(pool, PoolKind::primary, primary)
                                                   : block_bytes(pool, PoolKind::secondary, secondary);
  ++rec_.offload_round_trips;
  if (to_secondary) {
    const Phase checking(clock_, &rec_.timings.checks);
    offloaded_digest_[{pool, secondary}] = blake2b_128(before.data(), before.size());
  }
  if (to_secondary && offload_before_copy_) {
    // vLLM #45704: the GPU -> CPU store runs on a stream nobody waits for; it
    // lands at the end of the step, after this step's writes to the block.
    pending_offloads_.push_back({pool, primary, secondary});
    return;
  }
  MoveBlocksOp op;
  op.primary = std::span<const int32_t>(&primary, 1);
  op.secondary = std::span<const int32_t>(&secondary, 1);
  notify(to_secondary ? "offload" : "onboard", 0, std::vector<std::string>{});
  dump_move(to_secondary ? "offload" : "onboard", {{"primary", {primary}}, {"secondary", {secondary}}}, pool);
  const KvPools& ps = pool_sets_[pool];
  if (to_secondary)
    op_call([&] { be_.offload(ps, op); });
  else
    op_call([&] { be_.onboard(ps, op); });
  if (to_secondary && offload_drops_scales_ && ps.geometry.has_scale_pool()) {
    // vLLM #48412: the offload moved the nvfp4 data but dropped the packed scales.
    const int k = static_cast<int>(PoolKind::secondary);
    const Phase writing(clock_, &rec_.timings.transfers);
    for (int32_t l = 0; l < ps.geometry.layers; ++l)
      for (int32_t kv = 0; kv < ps.geometry.kv_factor; ++kv)
        be_.fill(static_cast<uint8_t*>(ps.scales[k]) + scale_offset(ps.scale_strides[k], secondary, l, kv, 0, 0, 0), 0,
                 static_cast<size_t>(ps.geometry.scale_geometry().inner_elements()));
  }
  const std::vector<uint8_t> after = to_secondary ? block_bytes(pool, PoolKind::secondary, secondary)
                                                  : block_bytes(pool, PoolKind::primary, primary);
  if (!rec_.offload_violation.empty()) return;
  const Phase checking(clock_, &rec_.timings.checks);
  const std::string which = std::string(to_secondary ? "offload" : "onboard") +
                            (pool_sets_.size() > 1 ? " in pool " + std::to_string(pool) : std::string()) + " of primary block " +
                            std::to_string(primary) + " <-> secondary block " + std::to_string(secondary) + " at step " +
                            std::to_string(step_);
  if (after != before) {
    size_t i = 0;
    while (before[i] == after[i]) ++i;
    rec_.offload_violation = which + ": byte " + std::to_string(i) + " of the block is " + std::to_string(after[i]) +
                             ", was " + std::to_string(before[i]);
    return;
  }
  // End to end: an onboard returns exactly what the block's offload was given.
  const auto it = offloaded_digest_.find({pool, secondary});
  if (!to_secondary && it != offloaded_digest_.end() && blake2b_128(after.data(), after.size()) != it->second)
    rec_.offload_violation = which + ": the onboarded bytes differ from the bytes its offload was given (BLAKE2b-128)";
}

// offload_before_copy: the copies issued this step land now, reading the
// primary blocks as this step's writes left them.
void Runner::finish_pending_offloads() {
  for (const PendingOffload& o : pending_offloads_) {
    MoveBlocksOp op;
    op.primary = std::span<const int32_t>(&o.primary, 1);
    op.secondary = std::span<const int32_t>(&o.secondary, 1);
    notify("offload", 0, std::vector<std::string>{});
    dump_move("offload", {{"primary", {o.primary}}, {"secondary", {o.secondary}}}, o.pool);
    op_call([&] { be_.offload(pool_sets_[o.pool], op); });
  }
  pending_offloads_.clear();
}

void Runner::notify(const std::string& op, int32_t layer, const std::vector<Entry>& entries) {
  std::vector<std::string> ids;
  for (const Entry& e : entries) ids.push_back(e.r->id);
  notify(op, layer, std::move(ids));
}

void Runner::notify(const std::string& op, int32_t layer, std::vector<std::string> sequence_ids) {
  ++rec_.counters.ops;
  if (!opt_.before_op) return;
  OpContext c;
  c.step = step_;
  c.layer = layer;
  c.op = op;
  c.sequence_ids = std::move(sequence_ids);
  opt_.before_op(c);
}

std::vector<int32_t> Runner::table_row(const RequestState& r, int32_t columns) const {
  std::vector<int32_t> row(static_cast<size_t>(columns), kBadPage);
  const auto& t = bm_->table(r.index, group_);
  std::copy(t.begin(), t.begin() + std::min<std::ptrdiff_t>(columns, static_cast<std::ptrdiff_t>(t.size())), row.begin());
  return row;
}

void Runner::record_rows(const std::vector<OutputKey>& keys, const std::vector<const float*>& rows, size_t bytes) {
  if (!opt_.record_outputs) return;
  Phase p(clock_, &rec_.timings.recording);
  std::vector<Digest128> digests(rows.size());
  constexpr int64_t kGroup = 8;  // rows per task: blake2b_128_each's AVX-512 lanes
  const int64_t n = static_cast<int64_t>(rows.size());
  parallel_rows((n + kGroup - 1) / kGroup, [&](int64_t g) {
    const void* group[kGroup];
    const int64_t first = g * kGroup, count = std::min(kGroup, n - first);
    for (int64_t i = 0; i < count; ++i) group[i] = rows[static_cast<size_t>(first + i)];
    blake2b_128_each(group, static_cast<size_t>(count), bytes, digests.data() + first);
  });
  for (size_t i = 0; i < rows.size(); ++i) record(rec_, keys[i], digests[i], rows[i], bytes);
}

void Runner::hash_content(const void* data, size_t bytes) {
  if (!hash_) return;
  Phase p(clock_, &rec_.timings.recording);
  hash_->add(data, bytes);
}

RunRecord Runner::run() {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    for (step_ = 0; !sched_->done(); ++step_) {
      if (step_ >= s_.scheduler.max_steps) {
        rec_.finished = false;
        break;
      }
      std::optional<Phase> scheduling(std::in_place, clock_, &rec_.timings.scheduling);
      const StepPlan plan = sched_->schedule(step_);
      if (plan.empty()) {
        const int64_t next = sched_->next_arrival(step_);
        if (next < 0) fail(ErrorCode::bad_scenario, "no request can be scheduled and none is still to arrive");
        step_ = next - 1;  // idle until the next arrival
        continue;
      }
      scheduling.reset();
      execute(plan);
      finish_pending_offloads();
      scheduling.emplace(clock_, &rec_.timings.scheduling);
      const std::vector<int32_t> finished = sched_->finish_step(plan);
      {
        Phase read_backs(clock_, &rec_.timings.other);
        for (int32_t i : finished) read_back(reqs_[i]);
      }
      sched_->free_finished(finished);
      for (const auto* list : {&plan.prefill, &plan.decode})
        for (const ScheduledEntry& e : *list)
          if (bm_->has_sequence(e.request))
            for (int32_t gi = 0; gi < bm_->group_count(); ++gi)
              previous_tables_[{e.request, gi}] = bm_->table(e.request, gi);
      ++rec_.counters.steps;
      const std::string err = bm_->check_conservation();
      ++rec_.conservation_checks;
      if (!err.empty() && rec_.conservation_violation.empty())
        rec_.conservation_violation = "step " + std::to_string(step_) + ": " + err;
      scheduling.reset();
      if (opt_.observer) opt_.observer->step_done({step_, &plan, bm_.get(), &reqs_, &sched_->preempted_in_step, err});
      rec_.counters.preemptions = sched_->preemptions;
      rec_.counters.prefill_tokens = sched_->prefill_tokens;
      rec_.counters.decode_tokens = sched_->decode_tokens;
      if (opt_.after_step) opt_.after_step(step_, rec_.counters);
    }
  } catch (const ValidationError& e) {
    if (s_.faults.empty() || e.code() == ErrorCode::bad_scenario) throw;
    rec_.op_rejection = std::string("step ") + std::to_string(step_) + ": " + e.what();
  }
  const BlockManagerCounters& c = bm_->counters();
  rec_.counters.preemptions = sched_->preemptions;
  rec_.counters.prefill_tokens = sched_->prefill_tokens;
  rec_.counters.decode_tokens = sched_->decode_tokens;
  rec_.counters.reuse_hit_tokens = c.reuse_hit_tokens;
  rec_.counters.partial_reuse_tokens = c.partial_reuse_tokens;
  rec_.counters.evicted_blocks = c.evicted_blocks;
  rec_.counters.offloaded_blocks = c.offloaded_blocks;
  rec_.counters.onboarded_blocks = c.onboarded_blocks;
  hash_final_state();
  if (hash_) {
    const Phase p(clock_, &rec_.timings.recording);
    rec_.content_hash = hash_->value();
  } else {
    rec_.content_hash = kFnvOffset;
  }
  finalize(rec_);
  if (dump_) dump_->write_manifest();
  rec_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  clock_.stop();
  return std::move(rec_);
}

void Runner::execute(const StepPlan& plan) {
  std::vector<Entry> es;
  for (const auto* list : {&plan.prefill, &plan.decode})
    for (const ScheduledEntry& e : *list) {
      Entry x{&e, &reqs_[e.request], e.start};
      if (past_len_zero_ && e.continuation) x.op_start = 0;  // the fault: the chunk is told nothing is cached
      es.push_back(x);
    }
  int64_t nnz = 0;
  for (const Entry& e : es) nnz += e.e->n;
  const int64_t nnz_prefill = nnz - static_cast<int64_t>(plan.decode.size());
  for (int32_t layer = 0; layer < g_.layers; ++layer) {
    select_layer(layer);
    BackendBuffer q_buf;
    CacheDtype q_dtype = s_.model.input_dtype;
    write_layer(layer, es, nnz, q_buf, q_dtype);
    if (s_.mla.enabled) {
      if (s_.mla.attention) attend_mla(layer, es);
      continue;
    }
    if (!plan.prefill.empty()) attend(layer, es, 0, plan.prefill.size(), 0, q_buf, q_dtype, false);
    if (!plan.decode.empty()) attend(layer, es, plan.prefill.size(), es.size(), nnz_prefill, q_buf, q_dtype, true);
  }
  if (s_.recurrent.layers > 0) advance_recurrent(es);
  rec_.counters.token_layers += nnz * g_.layers;
}

// The step's page tables and tokens, as every write path of one layer needs them.
Runner::LayerWrite Runner::plan_layer_write(int32_t layer, const std::vector<Entry>& es, int64_t nnz) const {
  const int32_t P = g_.tokens_per_block;
  LayerWrite w;
  w.layer = layer;
  w.nnz = nnz;
  w.input_dtype = kv_input_dtype(s_);
  w.seeds = &layer_seeds(layer);
  for (const Entry& e : es)
    w.columns = std::max<int32_t>(w.columns, static_cast<int32_t>(bm_->table(e.r->index, group_).size()));
  for (const Entry& e : es) {
    const auto row = table_row(*e.r, w.columns);
    w.table.insert(w.table.end(), row.begin(), row.end());
    w.seq_lens.push_back(e.e->n);
    w.cache_lens.push_back(e.cache_len());
  }
  for (size_t i = 0; i < es.size(); ++i)
    for (int32_t j = 0; j < es[i].e->n; ++j) {
      const int64_t op_pos = es[i].op_start + j;
      w.toks.push_back({i, es[i].r, es[i].e->start + j, op_pos,
                        qkv_token_reaches_cache(write_map_, es[i].cache_len(), op_pos)});
    }
  // CSR view of the step's tables (FlashInfer ops): pages covering each sequence's cache slots.
  for (size_t i = 0; i < es.size(); ++i) {
    const int64_t slots = write_map_.cache_length(es[i].cache_len());
    const int32_t pages = static_cast<int32_t>((slots + P - 1) / P);
    for (int32_t p = 0; p < pages; ++p) w.indices.push_back(w.table[i * w.columns + p]);
    w.indptr.push_back(static_cast<int32_t>(w.indices.size()));
    w.last_page_len.push_back(static_cast<int32_t>(slots - static_cast<int64_t>(pages - 1) * P));
  }
  return w;
}

void Runner::token_row(const LayerWrite& w, ModelTensor t, int32_t head, int32_t n, const StepToken& k,
                       float* out) const {
  const auto ti = static_cast<size_t>(t);
  model_.row_from_seeds(t, w.seeds->seed[ti].data() + static_cast<size_t>(head) * w.seeds->dims[ti], n, k.position,
                        k.request->hashes[k.position], out);
}

void Runner::cache_slot(const LayerWrite& w, const StepToken& k, int64_t& block, int32_t& entry) const {
  const int32_t P = g_.tokens_per_block;
  const int64_t slot = write_map_.cache_token(k.op_position);
  block = BlockRef{w.table[k.entry * w.columns + slot / P]}.block();
  entry = static_cast<int32_t>(slot % P);
}

void Runner::write_layer(int32_t layer, const std::vector<Entry>& es, int64_t nnz, BackendBuffer& q_buf,
                         CacheDtype& q_dtype) {
  const LayerWrite w = plan_layer_write(layer, es, nnz);
  if (dump_) {
    const Phase dumping(clock_, &rec_.timings.recording);
    dump_write_tables(w, write_op_name(s_.cache.write_path));
  }
  switch (s_.cache.write_path) {
    case WritePath::qkv_preprocess: write_qkv_preprocess(w, es, q_buf, q_dtype); break;
    case WritePath::append_paged:
      write_append_paged(w, es);
      upload_model_q(w, q_buf, q_dtype);
      break;
    case WritePath::append_mla: write_append_mla(w, es); break;
    case WritePath::reshape_and_cache:
      write_reshape_and_cache(w, es);
      upload_model_q(w, q_buf, q_dtype);
      break;
  }
  if (s_.indexer_k_scatter) scatter_indexer_k(w, es);
}

void Runner::dump_write_tables(const LayerWrite& w, const std::string& op) {
  const int32_t P = g_.tokens_per_block;
  dump_table(w.layer, op, "block_table", w.table, {static_cast<int64_t>(w.seq_lens.size()), w.columns});
  dump_table(w.layer, op, "seq_lens", w.seq_lens);
  dump_table(w.layer, op, "cache_lens", w.cache_lens);
  std::vector<int64_t> positions, slots;
  for (const StepToken& t : w.toks) {
    positions.push_back(t.op_position);
    int64_t block = 0;
    int32_t entry = 0;
    if (t.reaches) cache_slot(w, t, block, entry);
    slots.push_back(t.reaches ? block * P + entry : -1);
  }
  dump_table(w.layer, op, "positions", positions);
  dump_table(w.layer, op, "slots", slots);
  dump_table(w.layer, op, "indptr", w.indptr);
  dump_table(w.layer, op, "indices", w.indices);
  dump_table(w.layer, op, "last_page_len", w.last_page_len);
  dump_table(w.layer, op, "scales",
             std::vector<float>{s_.cache.k_scale, s_.cache.v_scale, s_.cache.k_global_scale, s_.cache.v_global_scale});
}

// Q for attention when the write op does not produce it.
void Runner::upload_model_q(const LayerWrite& w, BackendBuffer& q_buf, CacheDtype& q_dtype) {
  const int32_t D = g_.head_dim, Hq = s_.model.q_heads;
  q_dtype = s_.model.input_dtype;
  std::vector<uint8_t> q(static_cast<size_t>(w.nnz * Hq * D * element_bytes(q_dtype)));
  {
    Phase inputs(clock_, &rec_.timings.inputs);
    parallel_rows(static_cast<int64_t>(w.toks.size()), [&](int64_t t) {
      std::vector<float> row(static_cast<size_t>(D));
      for (int32_t h = 0; h < Hq; ++h) {
        token_row(w, ModelTensor::q, h, D, w.toks[t], row.data());
        put_row(q, q_dtype, (t * Hq + h) * D, row.data(), D, 1.0f);
      }
    });
  }
  q_buf = BackendBuffer(be_, q.size());
  transfer(q.size(), [&] { q_buf.upload(q.data(), q.size()); });
}

void Runner::write_qkv_preprocess(const LayerWrite& w, const std::vector<Entry>& es, BackendBuffer& q_buf,
                                  CacheDtype& q_dtype) {
  const int32_t H = g_.kv_heads, D = g_.head_dim, Hq = s_.model.q_heads;
  const CacheDtype in_t = w.input_dtype;
  const int32_t in_b = element_bytes(in_t);
  const int64_t width = static_cast<int64_t>(Hq + 2 * H) * D;
  std::vector<uint8_t> qkv(static_cast<size_t>(w.nnz * width * in_b));
  std::optional<Phase> inputs(std::in_place, clock_, &rec_.timings.inputs);
  parallel_rows(static_cast<int64_t>(w.toks.size()), [&](int64_t t) {
    const int64_t row = t * width;
    std::vector<float> values(static_cast<size_t>(D));
    auto put = [&](ModelTensor which, int32_t h, int64_t at) {
      token_row(w, which, h, D, w.toks[t], values.data());
      put_row(qkv, in_t, at, values.data(), D, 1);
    };
    for (int32_t h = 0; h < Hq; ++h) put(ModelTensor::q, h, row + h * D);
    for (int32_t h = 0; h < H; ++h) {
      put(ModelTensor::k, h, row + (Hq + h) * D);
      put(ModelTensor::v, h, row + (Hq + H + h) * D);
    }
  });
  inputs.reset();
  if (dump_) {
    const Phase dumping(clock_, &rec_.timings.recording);
    dump_tensor(w.layer, "qkv_preprocess_write", "qkv", qkv, in_t, {w.nnz, width});
  }
  BackendBuffer qkv_b(be_, qkv.size());
  transfer(qkv.size(), [&] { qkv_b.upload(qkv.data(), qkv.size()); });
  q_dtype = in_t;
  q_buf = BackendBuffer(be_, static_cast<size_t>(w.nnz * Hq * D * in_b));
  QkvPreprocessOp op;
  op.layer = pool_layer_of_[w.layer];
  op.num_q_heads = Hq;
  op.qkv = contiguous_view(qkv_b.get(), in_t, {w.nnz, width});
  op.q_out = contiguous_view(q_buf.get(), in_t, {w.nnz, Hq, D});
  if (rotary_dim_ > 0) {
    op.rope_style = s_.model.rope;
    op.rotary_dim = rotary_dim_;
    op.cos_sin = contiguous_view(rope_.get(), CacheDtype::fp32, {rope_rows_, rotary_dim_});
  }
  op.seq_lens = w.seq_lens;
  op.cache_lens = w.cache_lens;
  op.block_table = w.table;
  op.max_blocks_per_seq = w.columns;
  op.window = write_map_;
  // kvsim zeroes the V tail at every write, decode included: its decode
  // reads whole pages, so a block a decode opens needs it as much as a
  // context step's last block (TensorRT-LLM's MMHA stops at the length).
  op.context_phase = true;
  op.zero_v_tail = zero_v_tail_;
  if (is_quantized(g_.dtype) && g_.dtype != CacheDtype::nvfp4) {
    op.scale_orig_quant[1] = 1.0f / s_.cache.k_scale;  // TensorRT-LLM encodes with the reciprocal of the decode scale
    op.scale_orig_quant[2] = 1.0f / s_.cache.v_scale;
  }
  op.nvfp4_global_scale[1] = s_.cache.k_global_scale;
  op.nvfp4_global_scale[2] = s_.cache.v_global_scale;
  notify("qkv_preprocess_write", w.layer, es);
  op_call([&] { be_.qkv_preprocess_write(pools_, op); });
}

// FlashInfer's append ops take the tokens that reach the cache as two tensors
// (K and V, or the latent's ckv and kpe), their batch indices and positions,
// and the CSR tables.
Runner::AppendInputs Runner::append_inputs(const LayerWrite& w, bool mla) {
  const int32_t H = g_.kv_heads, D = g_.head_dim;
  const CacheDtype in_t = w.input_dtype;
  const int32_t in_b = element_bytes(in_t);
  const float k_code_scale = s_.cache.k_scale, v_code_scale = s_.cache.v_scale;
  AppendInputs in;
  std::vector<const StepToken*> written;
  for (const StepToken& t : w.toks)
    if (t.reaches) {
      written.push_back(&t);
      in.batch.push_back(static_cast<int32_t>(t.entry));
      in.positions.push_back(static_cast<int32_t>(write_map_.cache_token(t.op_position)));
    }
  in.n = static_cast<int64_t>(written.size());
  in.a_dim = mla ? s_.mla.d_ckv : D;
  in.b_dim = mla ? s_.mla.d_kpe : D;
  const int32_t heads = mla ? 1 : H;
  std::vector<uint8_t> a(static_cast<size_t>(in.n * heads * in.a_dim * in_b)),
      b(static_cast<size_t>(in.n * heads * in.b_dim * in_b));
  std::optional<Phase> inputs(std::in_place, clock_, &rec_.timings.inputs);
  parallel_rows(in.n, [&](int64_t i) {
    std::vector<float> values(static_cast<size_t>(std::max(in.a_dim, in.b_dim)));
    for (int32_t h = 0; h < heads; ++h) {
      token_row(w, mla ? ModelTensor::ckv : ModelTensor::k, h, in.a_dim, *written[i], values.data());
      put_row(a, in_t, (i * heads + h) * in.a_dim, values.data(), in.a_dim, k_code_scale);
      token_row(w, mla ? ModelTensor::kpe : ModelTensor::v, h, in.b_dim, *written[i], values.data());
      put_row(b, in_t, (i * heads + h) * in.b_dim, values.data(), in.b_dim, mla ? k_code_scale : v_code_scale);
    }
  });
  inputs.reset();
  if (dump_) {
    const Phase dumping(clock_, &rec_.timings.recording);
    const std::string op = mla ? "append_mla" : "append_paged";
    dump_tensor(w.layer, op, mla ? "ckv" : "k", a, in_t, {in.n, heads, in.a_dim});
    dump_tensor(w.layer, op, mla ? "kpe" : "v", b, in_t, {in.n, heads, in.b_dim});
    dump_table(w.layer, op, "batch_indices", in.batch);
    dump_table(w.layer, op, "append_positions", in.positions);
  }
  in.a = BackendBuffer(be_, a.size());
  in.b = BackendBuffer(be_, b.size());
  transfer(a.size(), [&] { in.a.upload(a.data(), a.size()); });
  transfer(b.size(), [&] { in.b.upload(b.data(), b.size()); });
  return in;
}

template <class Op>
void Runner::set_append_tables(Op& op, const LayerWrite& w, const AppendInputs& in) const {
  op.layer = pool_layer_of_[w.layer];
  op.coordinates() = {in.batch, in.positions, w.indptr, w.indices, w.last_page_len};
}

void Runner::write_append_paged(const LayerWrite& w, const std::vector<Entry>& es) {
  const AppendInputs in = append_inputs(w, false);
  const int32_t H = g_.kv_heads, D = g_.head_dim;
  AppendPagedOp op;
  set_append_tables(op, w, in);
  op.k = contiguous_view(in.a.get(), w.input_dtype, {in.n, H, D});
  op.v = contiguous_view(in.b.get(), w.input_dtype, {in.n, H, D});
  op.k_global_scale = s_.cache.k_global_scale;
  op.v_global_scale = s_.cache.v_global_scale;
  notify("append_paged", w.layer, es);
  op_call([&] { be_.append_paged(pools_, op); });
}

void Runner::write_append_mla(const LayerWrite& w, const std::vector<Entry>& es) {
  const AppendInputs in = append_inputs(w, true);
  AppendMlaOp op;
  set_append_tables(op, w, in);
  op.ckv = contiguous_view(in.a.get(), w.input_dtype, {in.n, in.a_dim});
  op.kpe = contiguous_view(in.b.get(), w.input_dtype, {in.n, in.b_dim});
  op.ckv_global_scale = s_.cache.k_global_scale;
  op.kpe_scale = s_.cache.k_scale;
  notify("append_mla", w.layer, es);
  op_call([&] { be_.append_mla(pools_, op); });
}

void Runner::write_reshape_and_cache(const LayerWrite& w, const std::vector<Entry>& es) {
  const int32_t H = g_.kv_heads, D = g_.head_dim, P = g_.tokens_per_block;
  const CacheDtype in_t = w.input_dtype;
  const float k_code_scale = s_.cache.k_scale, v_code_scale = s_.cache.v_scale;
  std::vector<int64_t> slots;
  for (const StepToken& t : w.toks) {
    int64_t block = 0;
    int32_t entry = 0;
    if (t.reaches) cache_slot(w, t, block, entry);
    // vLLM PR #47056: the slot computed for pages of 2P, the kernel's pages hold P.
    const int64_t page = slot_page_size_fault_ ? 2 * static_cast<int64_t>(P) : P;
    slots.push_back(t.reaches ? block * page + entry : -1);
  }
  std::vector<uint8_t> k(static_cast<size_t>(w.nnz * H * D * element_bytes(in_t))), v(k.size());
  std::optional<Phase> inputs(std::in_place, clock_, &rec_.timings.inputs);
  parallel_rows(static_cast<int64_t>(w.toks.size()), [&](int64_t t) {
    std::vector<float> values(static_cast<size_t>(D));
    for (int32_t h = 0; h < H; ++h) {
      const int64_t i = (t * H + h) * D;
      token_row(w, ModelTensor::k, h, D, w.toks[t], values.data());
      put_row(k, in_t, i, values.data(), D, k_code_scale);
      token_row(w, ModelTensor::v, h, D, w.toks[t], values.data());
      put_row(v, in_t, i, values.data(), D, v_code_scale);
    }
  });
  inputs.reset();
  if (dump_) {
    const Phase dumping(clock_, &rec_.timings.recording);
    dump_tensor(w.layer, "reshape_and_cache", "k", k, in_t, {w.nnz, H, D});
    dump_tensor(w.layer, "reshape_and_cache", "v", v, in_t, {w.nnz, H, D});
    dump_table(w.layer, "reshape_and_cache", "slot_mapping", slots);  // as the op is given it (a fault's included)
  }
  BackendBuffer k_b(be_, k.size()), v_b(be_, v.size());
  transfer(k.size(), [&] { k_b.upload(k.data(), k.size()); });
  transfer(v.size(), [&] { v_b.upload(v.data(), v.size()); });
  ReshapeAndCacheOp op;
  op.layer = pool_layer_of_[w.layer];
  op.key = contiguous_view(k_b.get(), in_t, {w.nnz, H, D});
  op.value = contiguous_view(v_b.get(), in_t, {w.nnz, H, D});
  op.slot_mapping = slots;
  op.k_scale = k_code_scale;
  op.v_scale = v_code_scale;
  // split_x_heads_unwritten: the (block, entry) of every written token, and
  // the blocks' K and V bytes before the write, to put back the heads the
  // faulty kernel never reaches.
  std::vector<std::pair<int64_t, int32_t>> targets;
  SubBlocks before;
  if (split_x_unwritten_) {
    for (const int64_t slot : slots)
      if (slot >= 0) targets.push_back({slot / P, static_cast<int32_t>(slot % P)});
    for (const auto& [block, entry] : targets)
      if (!before.count(block))
        for (int32_t kv = 0; kv < 2; ++kv) before[block][kv] = sub_block_bytes(block, pool_layer_of_[w.layer], kv);
  }
  notify("reshape_and_cache", w.layer, es);
  op_call([&] { be_.reshape_and_cache(pools_, op); });
  if (split_x_unwritten_) leave_split_x_heads_unwritten(pool_layer_of_[w.layer], targets, before);
}

// DeepSeek's indexer cache per layer: [blocks, P, 1, D + 4] bytes; a block
// holds its P tokens' fp8 bytes, then their P fp32 scales.
void Runner::scatter_indexer_k(const LayerWrite& w, const std::vector<Entry>& es) {
  const int32_t P = g_.tokens_per_block;
  std::vector<uint8_t> kb, sb;
  std::vector<int64_t> map_k, map_s;
  for (const StepToken& t : w.toks) {
    if (!t.reaches) continue;
    int64_t block = 0;
    int32_t entry = 0;
    cache_slot(w, t, block, entry);
    const size_t at = kb.size(), sat = sb.size();
    kb.resize(at + kIndexerDim);
    sb.resize(sat + kIndexerScaleBytes);
    indexer_row(w.layer, t.position, t.request->hashes[t.position], kb.data() + at, sb.data() + sat);
    map_k.push_back(block * P * indexer_row_ + static_cast<int64_t>(entry) * kIndexerDim);
    map_s.push_back(block * P * indexer_row_ + static_cast<int64_t>(P) * kIndexerDim + entry * 4);
  }
  const int64_t T = static_cast<int64_t>(map_k.size());
  if (T == 0) return;
  BackendBuffer kb_b(be_, kb.size()), sb_b(be_, sb.size());
  transfer(kb.size(), [&] { kb_b.upload(kb.data(), kb.size()); });
  transfer(sb.size(), [&] { sb_b.upload(sb.data(), sb.size()); });
  IndexerKScatterOp op;
  op.k_fp8 = contiguous_view(kb_b.get(), CacheDtype::fp8_e4m3, {T, kIndexerDim});
  op.k_scale = contiguous_view(sb_b.get(), CacheDtype::fp8_e4m3, {T, 4});
  op.slot_mapping_fp8 = map_k;
  op.slot_mapping_scale = map_s;
  // TRT-LLM #15295: the indexer cache handed to the kernel holds half the
  // KV pool's blocks, so a token in the upper half gets a slot past it.
  const int64_t indexer_blocks = indexer_past_cache_ ? g_.primary_blocks / 2 : g_.primary_blocks;
  op.cache = contiguous_view(indexer_[w.layer].get(), CacheDtype::fp8_e4m3, {indexer_blocks, P, 1, indexer_row_});
  notify("indexer_k_scatter", w.layer, es);
  if (dump_) {
    const Phase dumping(clock_, &rec_.timings.recording);
    dump_tensor(w.layer, "indexer_k_scatter", "k_fp8", kb, CacheDtype::fp8_e4m3, {T, kIndexerDim});
    dump_tensor(w.layer, "indexer_k_scatter", "k_scale", sb, CacheDtype::fp8_e4m3, {T, kIndexerScaleBytes});
    dump_table(w.layer, "indexer_k_scatter", "slot_mapping_fp8", map_k);
    dump_table(w.layer, "indexer_k_scatter", "slot_mapping_scale", map_s);
  }
  op_call([&] { be_.indexer_k_scatter(op); });
}

// An attention op's tables over `batch`: dense rows as wide as the longest
// (one column fewer with the short_block_table fault), cache lengths, query
// row offsets.
Runner::AttentionTables Runner::attention_tables(const std::vector<Entry>& batch, bool drop_last_column) const {
  AttentionTables t;
  for (const Entry& e : batch)
    t.columns = std::max<int32_t>(t.columns, static_cast<int32_t>(bm_->table(e.r->index, group_).size()));
  if (drop_last_column && t.columns > 1) --t.columns;
  for (const Entry& e : batch) {
    const auto row = table_row(*e.r, t.columns);
    t.table.insert(t.table.end(), row.begin(), row.end());
    t.seq_lens.push_back(e.cache_len());
    t.q_indptr.push_back(t.q_indptr.back() + e.e->n);
  }
  return t;
}

namespace {
// The exact value of an fp8 code (e4m3 or e5m2).
float fp8_value(CacheDtype t, uint8_t code) {
  return t == CacheDtype::fp8_e4m3 ? codec::e4m3_to_f32(code) : codec::e5m2_to_f32(code);
}
}  // namespace

void Runner::attend(int32_t layer, const std::vector<Entry>& es, size_t first, size_t last, int64_t row0,
                    const BackendBuffer& q_buf, CacheDtype q_dtype, bool decode) {
  const int32_t Hq = s_.model.q_heads, D = g_.head_dim;
  std::vector<Entry> batch(es.begin() + static_cast<std::ptrdiff_t>(first), es.begin() + static_cast<std::ptrdiff_t>(last));
  // vLLM PR #54296: the reader's table lacks the last page.
  // Named fields, not a structured binding: clang 14 (Debian 12) cannot capture bindings in `fill`.
  const AttentionTables tables = attention_tables(batch, short_block_table_);
  const std::vector<int32_t>& q_indptr = tables.q_indptr;
  const int64_t rows = q_indptr.back();
  const int32_t qb = element_bytes(q_dtype);
  void* q_data = static_cast<uint8_t*>(q_buf.get()) + row0 * Hq * D * qb;
  BackendBuffer out_b(be_, static_cast<size_t>(rows * Hq * D * 4));
  AttentionScales sc = scales_;
  if (k_scale_for_v_) {  // the fault: V is dequantized with K's scale
    sc.v_scale = sc.k_scale;
    sc.v_global_scale = sc.k_global_scale;
  }
  const size_t q_elems = static_cast<size_t>(rows * Hq * D);
  const std::optional<CacheDtype> fp8_q = s_.model.query_dtype;
  // Who reads Q and the output on the host: the fp8 query conversion, the dump, the dense check,
  // the recorded digests, the content hash, the NaN scan. With none of them (a replay with
  // --invariants none) neither is downloaded.
  const bool host_reads_q = fp8_q || dump_ || opt_.dense_check;
  const bool host_reads_out = dump_ || opt_.dense_check || hash_ || opt_.record_outputs || rec_.poisoned;
  std::vector<uint8_t> q_bytes(host_reads_q ? q_elems * static_cast<size_t>(qb) : 0);
  if (host_reads_q) transfer(q_bytes.size(), [&] { be_.to_host(q_bytes.data(), q_data, q_bytes.size()); });
  TensorView qv = contiguous_view(q_data, q_dtype, {rows, Hq, D});
  // fp8 queries (model.query_dtype): Q quantized per tensor with core's
  // encoder, code = fp8(q / q_scale) (saturating), attention run on the codes'
  // exact values (bf16 holds every e4m3 and e5m2 value exactly) with q_scale
  // folded into the softmax scale: bmm1 = sm_scale * q_scale, times k_scale as
  // always (TensorRT-LLM's FP8 FMHA, FlashInfer's trtllm-gen bmm1_scale).
  std::vector<uint8_t> q_codes;
  BackendBuffer q_fp8_b;
  if (fp8_q) {
    std::vector<uint16_t> exact(q_elems);
    {
      Phase inputs(clock_, &rec_.timings.inputs);
      q_codes.resize(q_elems);
      for (size_t i = 0; i < q_elems; ++i) {
        const float x = load_float(q_bytes.data(), q_dtype, static_cast<int64_t>(i)) / s_.model.q_scale;
        q_codes[i] = *fp8_q == CacheDtype::fp8_e4m3 ? codec::f32_to_e4m3(x) : codec::f32_to_e5m2(x);
        exact[i] = codec::f32_to_bf16(fp8_value(*fp8_q, q_codes[i]));
      }
    }
    q_fp8_b = BackendBuffer(be_, q_elems * 2);
    transfer(q_elems * 2, [&] { q_fp8_b.upload(exact.data(), q_elems * 2); });
    qv = contiguous_view(q_fp8_b.get(), CacheDtype::bf16, {rows, Hq, D});
    // SGLang PR #28144, the fault: the kernel sees fp8 Q with q_scale = 1.
    if (!q_scale_dropped_) sc.sm_scale = sc.sm_scale * s_.model.q_scale;
  }
  const TensorView ov = contiguous_view(out_b.get(), CacheDtype::fp32, {rows, Hq, D});
  // The fields both attention ops share.
  const PagedAttentionQuery query{.layer = pool_layer_of_[layer], .q = qv, .out = ov, .seq_lens = tables.seq_lens,
                                  .block_table = tables.table, .max_blocks_per_seq = tables.columns, .scales = sc,
                                  .window = read_map_, .order = order_};
  if (decode) {
    DecodeAttentionOp op;
    op.query() = query;
    notify("decode_attention", layer, batch);
    op_call([&] { be_.decode_attention(pools_, op); });
  } else {
    PrefillAttentionOp op;
    op.query() = query;
    op.q_indptr = q_indptr;
    notify("prefill_attention", layer, batch);
    op_call([&] { be_.prefill_attention(pools_, op); });
  }
  if (!host_reads_out) return;
  std::vector<float> out(static_cast<size_t>(rows * Hq * D));
  transfer(out.size() * 4, [&] { out_b.download(out.data(), out.size() * 4); });
  hash_content(out.data(), out.size() * 4);
  const std::string op_name = decode ? "decode_attention" : "prefill_attention";
  if (dump_) {
    const Phase dumping(clock_, &rec_.timings.recording);
    const std::string stem = "step" + std::to_string(step_) + "_layer" + std::to_string(layer) + "_" + op_name;
    if (fp8_q)  // the codes; their scale is the last entry of _scales
      dump_->write(stem + "_q.npy", q_codes.data(), q_codes.size(), NpyDump::descr_for(*fp8_q), {rows, Hq, D}, step_,
                   op_name, layer, *fp8_q);
    else
      dump_->write(stem + "_q.npy", q_bytes.data(), q_bytes.size(), NpyDump::descr_for(q_dtype), {rows, Hq, D}, step_,
                   op_name, layer, q_dtype);
    dump_->write(stem + "_out.npy", out.data(), out.size() * 4, "<f4", {rows, Hq, D}, step_, op_name, layer,
                 CacheDtype::fp32);
    dump_table(layer, op_name, "block_table", tables.table,
               {static_cast<int64_t>(batch.size()), static_cast<int64_t>(tables.columns)});
    dump_table(layer, op_name, "seq_lens", tables.seq_lens);
    dump_table(layer, op_name, "q_indptr", q_indptr);
    std::vector<int64_t> positions;
    for (const Entry& e : batch)
      for (int32_t i = 0; i < e.e->n; ++i) positions.push_back(e.e->start + i);
    dump_table(layer, op_name, "positions", positions);
    std::vector<float> scales{sc.k_scale, sc.v_scale, sc.k_global_scale, sc.v_global_scale, sc.sm_scale};
    if (fp8_q) scales.push_back(s_.model.q_scale);
    dump_table(layer, op_name, "scales", scales);
  }
  const size_t row_elems = static_cast<size_t>(Hq) * D;
  std::vector<OutputKey> keys;
  std::vector<const float*> rows_at;
  for (size_t b = 0; b < batch.size(); ++b)
    for (int32_t i = 0; i < batch[b].e->n; ++i) {
      keys.push_back({batch[b].r->id, layer, OutputKind::attention, batch[b].e->start + i});
      rows_at.push_back(out.data() + (q_indptr[b] + i) * row_elems);
    }
  record_rows(keys, rows_at, row_elems * 4);
  std::optional<Phase> nan_scan(std::in_place, clock_, &rec_.timings.recording);
  for (size_t b = 0; b < batch.size() && rec_.poisoned; ++b)
    for (int32_t i = 0; i < batch[b].e->n; ++i) {
      const int64_t position = batch[b].e->start + i;
      const float* o = out.data() + (q_indptr[b] + i) * row_elems;
      if (rec_.nan_found.empty())
        for (size_t k = 0; k < row_elems; ++k)
          if (std::isnan(o[k])) {
            rec_.nan_found = op_name + " at step " + std::to_string(step_) + ", layer " + std::to_string(layer) +
                             ": request " + batch[b].r->id + ", position " + std::to_string(position) + ", head " +
                             std::to_string(k / D) + ", dim " + std::to_string(k % D) + " is NaN";
            break;
          }
    }
  nan_scan.reset();
  if (!opt_.dense_check) return;
  Phase dense(clock_, &rec_.timings.dense);
  // The reference attends with the query the codes stand for: code * q_scale.
  std::vector<float> q(q_elems);
  for (size_t i = 0; i < q.size(); ++i)
    q[i] = fp8_q ? fp8_value(*fp8_q, q_codes[i]) * s_.model.q_scale
                 : load_float(q_bytes.data(), q_dtype, static_cast<int64_t>(i));
  if (opt_.dense_check) check_dense(layer, batch, 0, batch.size(), q, out, Hq);
}

// mla_attention over the step's entries, prefill chunks and decodes as one
// ragged batch (a decode is a one-token chunk: the same bytes).
void Runner::attend_mla(int32_t layer, const std::vector<Entry>& es) {
  const int32_t Hq = s_.model.q_heads, d_ckv = s_.mla.d_ckv, d_kpe = s_.mla.d_kpe, dq = d_ckv + d_kpe;
  auto [columns, table, seq_lens, q_indptr] = attention_tables(es, false);
  const int64_t rows = q_indptr.back();
  const CacheDtype q_dtype = s_.model.input_dtype;
  std::vector<uint8_t> q(static_cast<size_t>(rows * Hq * dq * element_bytes(q_dtype)));
  int64_t r = 0;
  const LayerSeeds& seeds = layer_seeds(layer);
  std::vector<float> values(static_cast<size_t>(dq));
  std::optional<Phase> inputs(std::in_place, clock_, &rec_.timings.inputs);
  for (const Entry& e : es)
    for (int32_t i = 0; i < e.e->n; ++i, ++r) {
      const int64_t position = e.e->start + i;
      for (int32_t h = 0; h < Hq; ++h) {
        model_.row_from_seeds(ModelTensor::q, &seeds.seed[static_cast<size_t>(ModelTensor::q)][static_cast<size_t>(h) * dq],
                              dq, position, e.r->hashes[position], values.data());
        put_row(q, q_dtype, (r * Hq + h) * dq, values.data(), dq, 1.0f);
      }
    }
  inputs.reset();
  BackendBuffer q_b(be_, q.size()), out_b(be_, static_cast<size_t>(rows * Hq * d_ckv * 4));
  transfer(q.size(), [&] { q_b.upload(q.data(), q.size()); });
  MlaAttentionOp op;
  op.layer = pool_layer_of_[layer];
  op.q = contiguous_view(q_b.get(), q_dtype, {rows, Hq, dq});
  op.out = contiguous_view(out_b.get(), CacheDtype::fp32, {rows, Hq, d_ckv});
  op.q_indptr = q_indptr;
  op.seq_lens = seq_lens;
  op.block_table = table;
  op.max_blocks_per_seq = columns;
  op.d_ckv = d_ckv;
  op.d_kpe = d_kpe;
  op.sm_scale = 1.0f / std::sqrt(static_cast<float>(dq));
  const bool coded = has_tensor_scale(g_.dtype);
  op.scale = coded ? s_.cache.k_scale : 1.0f;
  op.ckv_global_scale = s_.cache.k_global_scale;
  op.kpe_scale = s_.cache.k_scale;  // append_mla's kpe_scale
  notify("mla_attention", layer, es);
  op_call([&] { be_.mla_attention(pools_, op); });
  std::vector<float> out(static_cast<size_t>(rows * Hq * d_ckv));
  transfer(out.size() * 4, [&] { out_b.download(out.data(), out.size() * 4); });
  hash_content(out.data(), out.size() * 4);
  if (dump_) {
    const Phase dumping(clock_, &rec_.timings.recording);
    dump_tensor(layer, "mla_attention", "q", q, q_dtype, {rows, Hq, dq});
    dump_->write(dump_stem(layer, "mla_attention") + "_out.npy", out.data(), out.size() * 4, "<f4", {rows, Hq, d_ckv},
                 step_, "mla_attention", layer, CacheDtype::fp32);
    dump_table(layer, "mla_attention", "block_table", table, {static_cast<int64_t>(seq_lens.size()), columns});
    dump_table(layer, "mla_attention", "seq_lens", seq_lens);
    dump_table(layer, "mla_attention", "q_indptr", q_indptr);
    std::vector<int64_t> positions;
    for (const Entry& e : es)
      for (int32_t i = 0; i < e.e->n; ++i) positions.push_back(e.e->start + i);
    dump_table(layer, "mla_attention", "positions", positions);
    dump_table(layer, "mla_attention", "scales",
               std::vector<float>{op.sm_scale, op.scale, op.ckv_global_scale, op.kpe_scale});
  }
  const size_t row_elems = static_cast<size_t>(Hq) * d_ckv;
  std::vector<OutputKey> keys;
  std::vector<const float*> rows_at;
  r = 0;
  for (const Entry& e : es)
    for (int32_t i = 0; i < e.e->n; ++i, ++r) {
      keys.push_back({e.r->id, layer, OutputKind::attention, e.e->start + i});
      rows_at.push_back(out.data() + r * row_elems);
    }
  record_rows(keys, rows_at, row_elems * 4);
}

// dense: each checked query's output against attention in double (dense_gemm.hpp's products) over
// the K/V that gather_paged reads back through the sequence's table, keys
// chosen by core's make_key_list. Bound per element, for fp32 outputs:
//   |out - ref| <= max|V| * (1e-5 + 4 * D * 2^-24 * sm_scale * max_j sum_d |q_d k_jd|)
// (the fp32 dot product's error is <= D * 2^-24 * sum |q k| per score; a
// score error e moves each softmax weight by a factor within exp(+-2e); 1e-5
// covers exp (~1 ulp), the fp32 sums and the final division, as in
// tests/oracle/attention_test.cpp). Rows whose output holds NaN are left to no_nan.
// Which rows: dense_checks_row(). Each (group of up to kDenseColumns / G
// checked rows, KV head) is one task on oneTBB's threads; the group's keys go
// through the double arithmetic in tiles of kDenseTile slots, each tile
// converted once for all the group's query heads, with the softmax's max and
// sum kept running (rescaled when the max grows), so nothing of the size of
// the context is held in double.
void Runner::check_dense(int32_t layer, const std::vector<Entry>& es, size_t first, size_t last,
                         const std::vector<float>& q, const std::vector<float>& out, int32_t hq) {
  Phase dense(clock_, &rec_.timings.dense);
  const int32_t H = g_.kv_heads, D = g_.head_dim, G = hq / H, P = g_.tokens_per_block;
  int64_t row = 0;
  AttentionScales sc = scales_;
  if (k_scale_for_v_) {
    sc.v_scale = sc.k_scale;
    sc.v_global_scale = sc.k_global_scale;
  }
  for (size_t b = first; b < last; ++b) {
    const Entry& e = es[b];
    const int32_t n = e.e->n;
    std::vector<int32_t> checked;
    for (int32_t i = 0; i < n; ++i)
      if (dense_checks_row(e, i)) checked.push_back(i);
    if (checked.empty()) {
      row += n;
      continue;
    }
    const int32_t len = e.cache_len();
    const int64_t slots = read_map_.cache_length(len);
    std::vector<int32_t> ids = bm_->table(e.r->index, group_);
    if (stale_bad_page_) {  // the fault: the reader's table is the previous step's, BAD_PAGE where a block now lives
      const auto it = previous_tables_.find({e.r->index, group_});
      std::vector<int32_t> stale(ids.size(), kBadPage);
      if (it != previous_tables_.end())
        for (size_t i = 0; i < std::min(ids.size(), it->second.size()); ++i) stale[i] = it->second[i];
      ids = stale;
    }
    const int64_t pages = (slots + P - 1) / P;
    if (static_cast<int64_t>(ids.size()) < pages) ids.resize(static_cast<size_t>(pages), kBadPage);
    const std::unique_ptr<float[]> gathered[2] = {gather_rows(layer, 0, ids, slots, sc, e.r->id),
                                                  gather_rows(layer, 1, ids, slots, sc, e.r->id)};  // K then V
    struct Finding {
      int64_t checked_rows = 0;
      double worst_ratio = 0.0;
      std::string violation;
    };
    // Each checked row's keys (core's make_key_list), once for all its KV heads.
    std::vector<std::vector<int64_t>> row_keys(checked.size());
    for (size_t c = 0; c < checked.size(); ++c) {
      const KeyList kl = make_key_list(static_cast<int64_t>(len) - n + checked[c], read_map_, g_.page_divider());
      for (int64_t j = 0; j < kl.n_attended; ++j) {
        bool masked = false;
        row_keys[c].push_back(kl.slot(j, read_map_, masked));
      }
    }
    // Rows go through the keys together, up to kDenseColumns query heads at once: each K and V
    // tile is converted to double once for all of them, and the GEMMs are [tile, D] x [D, heads]
    // with that many columns. A group's keys are the union of its rows' (sorted slots); member
    // says which of them each row attends (the rows of a chunk without a window: prefixes).
    // Groups enough for the tasks (groups x KV heads) to keep every thread busy twice over: on 16
    // threads with 8 KV heads a chunk's 17 checked rows go as 4 groups, on 2 threads as one.
    const int64_t threads = tbb::this_task_arena::max_concurrency();
    const int64_t want_groups = (2 * threads + H - 1) / H;
    const size_t rows_per_group = static_cast<size_t>(std::clamp<int64_t>(
        (static_cast<int64_t>(checked.size()) + want_groups - 1) / want_groups, 1, std::max<int64_t>(1, kDenseColumns / G)));
    struct RowGroup {
      size_t first = 0, count = 0;
      std::vector<int64_t> keys;   // sorted slots
      std::vector<uint8_t> member;  // [key][row of the group]
    };
    std::vector<RowGroup> groups;
    for (size_t c0 = 0; c0 < checked.size(); c0 += rows_per_group) {
      RowGroup rg;
      rg.first = c0;
      rg.count = std::min(rows_per_group, checked.size() - c0);
      for (size_t r = 0; r < rg.count; ++r) rg.keys.insert(rg.keys.end(), row_keys[c0 + r].begin(), row_keys[c0 + r].end());
      std::sort(rg.keys.begin(), rg.keys.end());
      rg.keys.erase(std::unique(rg.keys.begin(), rg.keys.end()), rg.keys.end());
      rg.member.assign(rg.keys.size() * rg.count, 0);
      for (size_t r = 0; r < rg.count; ++r)
        for (int64_t slot : row_keys[c0 + r]) {
          const auto u = std::lower_bound(rg.keys.begin(), rg.keys.end(), slot) - rg.keys.begin();
          rg.member[static_cast<size_t>(u) * rg.count + r] = 1;
        }
      groups.push_back(std::move(rg));
    }
    // Task t = (row group t / H, KV head t % H); its findings go to found[checked row * H + KV
    // head], merged in that order, so the first violation named is the sequential one.
    std::vector<Finding> found(checked.size() * static_cast<size_t>(H));
    parallel_rows(
        static_cast<int64_t>(groups.size()) * H,
        [&](int64_t t) {
          const RowGroup& rg = groups[static_cast<size_t>(t / H)];
          const int32_t kvh = static_cast<int32_t>(t % H);
          // Columns: (row of the group, query head) whose output holds no NaN (those are no_nan's).
          std::vector<std::pair<size_t, int32_t>> col_of;
          for (size_t r = 0; r < rg.count; ++r) {
            const int32_t i = checked[rg.first + r];
            for (int32_t h = kvh * G; h < (kvh + 1) * G; ++h) {
              const float* o = out.data() + ((row + i) * hq + h) * D;
              bool nan = false;
              for (int32_t d = 0; d < D; ++d) nan = nan || std::isnan(o[d]);
              if (!nan) col_of.emplace_back(r, h);
            }
          }
          if (col_of.empty()) return;
          const auto cols = static_cast<int64_t>(col_of.size());
          const auto keys = static_cast<int64_t>(rg.keys.size());
          // Q and |Q| as [D, heads], double.
          std::vector<double> qd(static_cast<size_t>(D * cols)), q_abs(qd.size());
          for (int64_t c = 0; c < cols; ++c) {
            const auto [r, h] = col_of[static_cast<size_t>(c)];
            for (int32_t d = 0; d < D; ++d) {
              qd[d * cols + c] = q[((row + checked[rg.first + r]) * hq + h) * D + d];
              q_abs[d * cols + c] = std::fabs(qd[d * cols + c]);
            }
          }
          // One tile of K or V rows in double, [kDenseTile, D], from the gathered floats (and |K|);
          // returns the tile's max |x|. Each key's row is H * D floats from the next one's (one
          // 4 KiB page each at H = 8, D = 128, so the hardware prefetcher does not follow): the
          // rows a few keys ahead are prefetched.
          std::vector<double> tile(static_cast<size_t>(kDenseTile * D)), tile_abs(tile.size());
          const auto row_at = [&](int32_t kv, int64_t j) {
            return gathered[kv].get() + (rg.keys[static_cast<size_t>(j)] * H + kvh) * D;
          };
          auto fill = [&](int32_t kv, int64_t j0, int64_t m) {
            constexpr int64_t kAhead = 4;
            // max |x| as the largest magnitude bits, NaN left out (a NaN V makes ref NaN anyway):
            // an integer maximum, which the compiler vectorizes.
            int32_t max_bits = 0;  // magnitudes as int32: SSE2 compares them (it has no unsigned max)
            for (int64_t jj = 0; jj < m; ++jj) {
              if (j0 + jj + kAhead < keys)
                for (int32_t d = 0; d < D; d += 16) __builtin_prefetch(row_at(kv, j0 + jj + kAhead) + d);
              const float* src = row_at(kv, j0 + jj);
              for (int32_t d = 0; d < D; ++d) tile[jj * D + d] = static_cast<double>(src[d]);
              for (int32_t d = 0; d < D; ++d) {
                int32_t u;
                std::memcpy(&u, src + d, 4);
                u &= 0x7FFFFFFF;
                u = u > 0x7F800000 ? 0 : u;
                max_bits = u > max_bits ? u : max_bits;
              }
            }
            float abs_max;
            std::memcpy(&abs_max, &max_bits, 4);
            return static_cast<double>(abs_max);
          };
          // Softmax over each column's keys in one pass (double): the running max, sum and
          // weighted V rescaled when the max grows (exact up to double rounding, ~1e-16 of the bound).
          const double ninf = -std::numeric_limits<double>::infinity();
          std::vector<double> dot_abs(static_cast<size_t>(cols), 0.0), mx(static_cast<size_t>(cols), ninf),
              sum(static_cast<size_t>(cols), 0.0);
          std::vector<double> ref(static_cast<size_t>(D * cols), 0.0);  // [D, heads]
          std::vector<double> s(static_cast<size_t>(kDenseTile * cols)), a(s.size());  // [tile, heads]
          double v_max = 0.0;
          for (int64_t j0 = 0; j0 < keys; j0 += kDenseTile) {
            const int64_t m = std::min<int64_t>(kDenseTile, keys - j0);
            fill(0, j0, m);
            for (int64_t i = 0; i < m * D; ++i) tile_abs[i] = std::fabs(tile[i]);
            dense_gemm({m, cols, D, tile.data(), D, 1, qd.data(), cols, s.data(), cols, false});
            dense_gemm({m, cols, D, tile_abs.data(), D, 1, q_abs.data(), cols, a.data(), cols, false});
            for (int64_t c = 0; c < cols; ++c) {
              const size_t r = col_of[static_cast<size_t>(c)].first;
              double tile_max = ninf;
              for (int64_t jj = 0; jj < m; ++jj) {
                double& sc = s[jj * cols + c];
                if (rg.member[static_cast<size_t>(j0 + jj) * rg.count + r] == 0) {
                  sc = ninf;
                  continue;
                }
                sc *= static_cast<double>(sm_scale_);
                tile_max = std::max(tile_max, sc);
                dot_abs[c] = std::max(dot_abs[c], a[jj * cols + c]);
              }
              if (tile_max > mx[c]) {  // rescale what came before (nothing while mx is -inf)
                const double w = mx[c] == ninf ? 0.0 : std::exp(mx[c] - tile_max);
                sum[c] *= w;
                for (int32_t d = 0; d < D; ++d) ref[d * cols + c] *= w;
                mx[c] = tile_max;
              }
              for (int64_t jj = 0; jj < m; ++jj) {
                double& sc = s[jj * cols + c];
                sc = sc == ninf ? 0.0 : std::exp(sc - mx[c]);
                sum[c] += sc;
              }
            }
            v_max = std::max(v_max, fill(1, j0, m));
            dense_gemm({D, cols, m, tile.data(), 1, D, s.data(), cols, ref.data(), cols, true});  // ref += V^T P
          }
          for (int64_t c = 0; c < cols; ++c)
            for (int32_t d = 0; d < D; ++d) ref[d * cols + c] /= sum[c];
          for (int64_t c = 0; c < cols; ++c) {
            const auto [r, h] = col_of[static_cast<size_t>(c)];
            const int32_t i = checked[rg.first + r];
            Finding& f = found[(rg.first + r) * static_cast<size_t>(H) + static_cast<size_t>(kvh)];
            const int64_t p = static_cast<int64_t>(len) - n + i;
            const float* o = out.data() + ((row + i) * hq + h) * D;
            const double bound = v_max * (1e-5 + 4.0 * D * std::ldexp(1.0, -24) * sm_scale_ * dot_abs[c]) + 1e-30;
            ++f.checked_rows;
            for (int32_t d = 0; d < D; ++d) {
              const double r_d = ref[d * cols + c];
              const double err = std::fabs(static_cast<double>(o[d]) - r_d);
              const double ratio = std::isnan(r_d) ? 1e300 : err / bound;
              f.worst_ratio = std::max(f.worst_ratio, ratio);
              if (ratio > 1.0 && f.violation.empty()) {
                char buf[160];
                std::snprintf(buf, sizeof buf, ": out %.9g, double reference %.9g, |diff| %.3g > bound %.3g", o[d], r_d, err,
                              bound);
                f.violation = "step " + std::to_string(step_) + ", layer " + std::to_string(layer) + ", request " +
                              e.r->id + ", position " + std::to_string(p) + ", head " + std::to_string(h) + ", dim " +
                              std::to_string(d) + buf;
              }
            }
          }
        });
    for (const Finding& f : found) {
      rec_.dense_checked_rows += f.checked_rows;
      rec_.dense_worst_ratio = std::max(rec_.dense_worst_ratio, f.worst_ratio);
      if (rec_.dense_violation.empty()) rec_.dense_violation = f.violation;
    }
    row += n;
  }
}

// Which query rows of an entry the dense check takes. A prefill chunk: up to
// ~16 rows spread over it, always its last. A decode: every one while its
// position is below kDenseEveryDecodeBelow; past it (where each check gathers
// and computes over the whole context, so that checking every decode made the
// check O(steps x context), most of a real-size replay), the decodes whose
// position starts a page (the step that put a new page into the table),
// every (P + 1)-th (so, over a long decode, every offset within a page) and
// the request's last: about 2 in P + 1. With P = 1 every decode.
bool Runner::dense_checks_row(const Entry& e, int32_t i) const {
  const int32_t n = e.e->n;
  if (n > 1 || !e.e->decode) {
    const int32_t stride = n > 16 ? n / 16 : 1;
    return i % stride == 0 || i == n - 1;
  }
  const int64_t p = e.e->start, P = g_.tokens_per_block;
  return p < kDenseEveryDecodeBelow || p % P == 0 || p % (P + 1) == 0 || p + 1 >= e.r->final_len;
}

// One sequence's K (kv 0) or V (kv 1) rows of `layer`, [slots, H, D] fp32,
// read through `ids` with gather_paged (BAD_PAGE entries read as zeros).
// Not value-initialized (new float[n], not std::vector's zeros): the download
// writes every element, and zeroing 13 MiB first (the 8B slice's 3,200 slots)
// was a pass of its own, on one thread, twice per checked entry.
std::unique_ptr<float[]> Runner::gather_rows(int32_t layer, int32_t kv, const std::vector<int32_t>& ids,
                                             int64_t slots, const AttentionScales& sc, const std::string& request_id) {
  const int32_t H = g_.kv_heads, D = g_.head_dim;
  const size_t n = static_cast<size_t>(slots * H * D);
  std::unique_ptr<float[]> g(new float[n]);
  BackendBuffer gb(be_, n * 4);
  GatherPagedOp op;
  op.layer = pool_layer_of_[layer];
  op.kv = kv;
  op.block_ids = ids;
  op.num_tokens = slots;
  op.out = contiguous_view(gb.get(), CacheDtype::fp32, {slots, H, D});
  op.scale = kv == 0 ? sc.k_scale : sc.v_scale;
  op.global_scale = kv == 0 ? sc.k_global_scale : sc.v_global_scale;
  notify("gather_paged", layer, std::vector<std::string>{request_id});
  op_call([&] { be_.gather_paged(pools_, op); });
  transfer(n * 4, [&] { gb.download(g.get(), n * 4); });
  return g;
}

// A finished request's cache, read back through its table with gather_paged:
// each token still in the cache (sinks and the ring's tokens; not the blocks
// release mode gave back), by position.
void Runner::read_back(RequestState& r) {
  if (s_.recurrent.layers > 0) {
    const int32_t n = s_.recurrent.state_size;
    const float* state = recurrent_.data() + static_cast<size_t>(r.index) * s_.recurrent.layers * n;
    for (int32_t l = 0; l < s_.recurrent.layers; ++l) {
      record_rows({OutputKey{r.id, l, OutputKind::recurrent_state, recurrent_pos_[r.index]}},
                  {state + static_cast<size_t>(l) * n}, static_cast<size_t>(n) * 4);
      hash_content(state + static_cast<size_t>(l) * n, static_cast<size_t>(n) * 4);
    }
  }
  const int32_t H = g_.kv_heads, D = g_.head_dim, P = g_.tokens_per_block;
  for (int32_t layer = 0; layer < g_.layers; ++layer) {
    if (s_.indexer_k_scatter && opt_.write_check) {
      select_layer(layer);
      check_indexer_rows(layer, r);
    }
    for (int32_t kv = 0; kv < g_.kv_factor; ++kv) {
      select_layer(layer);
      const std::vector<int32_t>& ids = bm_->table(r.index, group_);
      const int64_t slots = write_map_.cache_length(r.final_len);
      const WindowMode mode = groups_[group_].mode;
      const bool release = mode == WindowMode::release || mode == WindowMode::sliding;
      std::vector<int32_t> readable(ids);
      if (release)
        for (int32_t& id : readable)
          if (id == BlockManager::kNullBlock) id = kBadPage;  // reads as zeros; never recorded
      const std::unique_ptr<float[]> g = gather_rows(layer, kv, readable, slots, scales_, r.id);
      // Release mode may have given a page back and taken a fresh block for
      // it since an old token was written: only the last query's window (and
      // the sinks) is certainly still there.
      const int64_t recent = static_cast<int64_t>(write_map_.window) - write_map_.sinks;
      const int64_t kept_from = release ? r.final_len - recent : 0;
      std::vector<OutputKey> keys;
      std::vector<const float*> rows;
      for (int64_t t = 0; t < r.final_len; ++t) {
        if (!qkv_token_reaches_cache(write_map_, r.final_len, t)) continue;
        if (release && t >= write_map_.sinks && t < kept_from) continue;
        const int64_t slot = write_map_.cache_token(t);
        if (readable[slot / P] == kBadPage) continue;
        keys.push_back({r.id, layer, kv == 0 ? OutputKind::k_cache : OutputKind::v_cache, t});
        rows.push_back(g.get() + slot * H * D);
      }
      const size_t row_bytes = static_cast<size_t>(H * D) * 4;
      record_rows(keys, rows, row_bytes);
      if (opt_.write_check) check_written_rows(layer, kv, r, keys, rows);
      for (size_t i = 0; i < rows.size(); ++i) hash_content(rows[i], row_bytes);
    }
  }
}

// One (block, layer, kv) sub-block of the current pool set's primary pool, as bytes.
std::vector<uint8_t> Runner::sub_block_bytes(int64_t block, int32_t pool_layer, int32_t kv) {
  const int64_t first = element_byte_offset(element_offset(pools_.strides[0], block, pool_layer, kv, 0, 0, 0), g_.dtype);
  std::vector<uint8_t> out(static_cast<size_t>(g_.bytes_for(g_.inner_elements())));
  transfer(out.size(), [&] { be_.to_host(out.data(), static_cast<uint8_t*>(pools_.data[0]) + first, out.size()); });
  return out;
}

// The split_x_heads_unwritten fault: every KV head from 512 / (D / x) on
// holds, for each token just written, the bytes it held before the write.
void Runner::leave_split_x_heads_unwritten(int32_t pool_layer, const std::vector<std::pair<int64_t, int32_t>>& targets,
                                           const SubBlocks& before) {
  const int64_t written = split_x_written_heads(g_.dtype, g_.head_dim);
  const int32_t eb = element_bytes(g_.dtype);
  const PoolStrides& st = pools_.strides[0];
  for (const auto& [block, old] : before)
    for (int32_t kv = 0; kv < 2; ++kv) {
      std::vector<uint8_t> now = sub_block_bytes(block, pool_layer, kv);
      const int64_t base = element_offset(st, block, pool_layer, kv, 0, 0, 0);
      for (const auto& [b, entry] : targets) {
        if (b != block) continue;
        for (int64_t h = written; h < g_.kv_heads; ++h)
          for (int32_t d = 0; d < g_.head_dim; ++d) {
            const int64_t e = element_offset(st, block, pool_layer, kv, static_cast<int32_t>(h), entry, d) - base;
            std::memcpy(now.data() + e * eb, old[kv].data() + e * eb, static_cast<size_t>(eb));
          }
      }
      transfer(now.size(), [&] { be_.to_backend(static_cast<uint8_t*>(pools_.data[0]) + element_byte_offset(base, g_.dtype), now.data(), now.size()); });
    }
}

void Runner::indexer_row(int32_t layer, int64_t position, uint64_t hash, uint8_t* bytes, uint8_t* scale) const {
  float amax = 0.0f;
  float x[kIndexerDim];
  for (int32_t d = 0; d < kIndexerDim; ++d) {
    x[d] = model_.value(ModelTensor::indexer_k, layer, 0, d, position, hash);
    amax = std::max(amax, std::fabs(x[d]));
  }
  const float s = amax > 0.0f ? amax / 448.0f : 1.0f;  // DeepSeek's per-token fp8 scale
  for (int32_t d = 0; d < kIndexerDim; ++d) bytes[d] = codec::f32_to_e4m3(x[d] / s);
  std::memcpy(scale, &s, kIndexerScaleBytes);
}

// The value gather_paged must read back for token t's row (kv 0: K or the MLA
// latent, 1: V), computed from the synthetic model the way the scenario's
// write op encodes it (core's codecs), never from a pool. false: not modelled
// (K rotated by qkv_preprocess's RoPE; an nvfp4 MLA latent row).
bool Runner::expected_row(const LayerSeeds& seeds, int32_t kv, const RequestState& r, int64_t t,
                          std::vector<float>& out) const {
  const int32_t H = g_.kv_heads, D = g_.head_dim;
  const CacheDtype cache = g_.dtype, in_t = kv_input_dtype(s_);
  const bool mla = s_.mla.enabled;
  if (mla && cache == CacheDtype::nvfp4) return false;
  if (!mla && kv == 0 && s_.cache.write_path == WritePath::qkv_preprocess && rotary_dim_ > 0) return false;
  const float code_scale = kv == 0 || mla ? s_.cache.k_scale : s_.cache.v_scale;
  const float read_scale = kv == 0 ? scales_.k_scale : scales_.v_scale;
  const float global_scale = kv == 0 ? scales_.k_global_scale : scales_.v_global_scale;
  out.assign(static_cast<size_t>(H) * D, 0.0f);
  std::vector<uint8_t> in(4);
  std::vector<float> x(static_cast<size_t>(D));
  for (int32_t h = 0; h < H; ++h) {
    for (int32_t d = 0; d < D; ++d) {
      ModelTensor which = kv == 0 ? ModelTensor::k : ModelTensor::v;
      int32_t dim = d;
      if (mla) {
        which = d < s_.mla.d_ckv ? ModelTensor::ckv : ModelTensor::kpe;
        dim = d < s_.mla.d_ckv ? d : d - s_.mla.d_ckv;
      }
      put_value(in, in_t, 0, model_.value_from_seed(which, seeds.of(which, h, dim), t, r.hashes[t]),
                code_scale);  // the input as uploaded
      if (cache == CacheDtype::nvfp4) {
        x[d] = load_float(in.data(), in_t, 0);
        continue;
      }
      float code_value = 0.0f;
      if (in_t == cache) {
        code_value = load_cache_code_value(in.data(), cache, 0);  // bytes copied
      } else {  // a float input the op quantizes: TensorRT-LLM multiplies by 1 / scale, vLLM divides
        const float xin = load_float(in.data(), in_t, 0);
        const float q = s_.cache.write_path == WritePath::qkv_preprocess ? xin * (1.0f / code_scale) : xin / code_scale;
        uint8_t code = 0;
        if (cache == CacheDtype::fp8_e4m3) code = codec::f32_to_e4m3(q);
        else if (cache == CacheDtype::fp8_e5m2) code = codec::f32_to_e5m2(q);
        else code = static_cast<uint8_t>(codec::f32_to_int8(q));
        code_value = load_cache_code_value(&code, cache, 0);
      }
      out[static_cast<size_t>(h) * D + d] = is_quantized(cache) ? canonical_nan(code_value * read_scale) : code_value;
    }
    if (cache == CacheDtype::nvfp4)
      for (int32_t g0 = 0; g0 < D; g0 += codec::kNvfp4BlockElems) {
        uint8_t packed[codec::kNvfp4BlockElems / 2];
        const uint8_t sc = codec::nvfp4_quantize16(x.data() + g0, global_scale, packed);
        for (int32_t j = 0; j < codec::kNvfp4BlockElems; ++j)
          out[static_cast<size_t>(h) * D + g0 + j] =
              canonical_nan(codec::nvfp4_decode(static_cast<uint8_t>((packed[j / 2] >> (4 * (j & 1))) & 0xF), sc, global_scale));
      }
  }
  return true;
}

// The write invariant over one read-back (layer, K or V) of a request: each
// row against its expected_row, the rows on oneTBB's threads (each expected row
// is the synthetic model's values through the write path's codecs, H x D of
// them), the verdicts merged in row order, so the count and the first
// violation named are the sequential ones.
void Runner::check_written_rows(int32_t layer, int32_t kv, const RequestState& r, const std::vector<OutputKey>& keys,
                                const std::vector<const float*>& rows) {
  const Phase checking(clock_, &rec_.timings.checks);
  const LayerSeeds& seeds = layer_seeds(layer);  // made here, before the threads read it
  const int32_t D = g_.head_dim;
  struct Verdict {
    bool checked = false;
    std::string violation;
  };
  std::vector<Verdict> verdicts(rows.size());
  parallel_rows(static_cast<int64_t>(rows.size()), [&](int64_t n) {
    std::vector<float> want;
    const int64_t t = keys[static_cast<size_t>(n)].position;
    if (!expected_row(seeds, kv, r, t, want)) return;
    Verdict& v = verdicts[static_cast<size_t>(n)];
    v.checked = true;
    const float* row = rows[static_cast<size_t>(n)];
    for (size_t i = 0; i < want.size(); ++i) {
      const bool same = (std::isnan(row[i]) && std::isnan(want[i])) || std::memcmp(&row[i], &want[i], 4) == 0;
      if (same) continue;
      char buf[128];
      std::snprintf(buf, sizeof buf, ": the cache holds %.9g, its write op was given %.9g", row[i], want[i]);
      v.violation = "request " + r.id + ", layer " + std::to_string(layer) + ", " +
                    (s_.mla.enabled ? "latent" : kv == 0 ? "K" : "V") + " of position " + std::to_string(t) +
                    ", head " + std::to_string(i / D) + ", dim " + std::to_string(i % D) + buf;
      return;
    }
  });
  for (const Verdict& v : verdicts) {
    if (!v.checked) continue;
    ++rec_.write_checked_rows;
    if (rec_.write_violation.empty()) rec_.write_violation = v.violation;
  }
}

// The write invariant for the indexer K cache: each cached token's 128 fp8
// bytes and 4 scale bytes where its slot says, as the model made them.
void Runner::check_indexer_rows(int32_t layer, const RequestState& r) {
  const int32_t P = g_.tokens_per_block;
  const Phase checking(clock_, &rec_.timings.checks);
  std::vector<uint8_t> cache(indexer_[layer].bytes());
  transfer(cache.size(), [&] { be_.to_host(cache.data(), indexer_[layer].get(), cache.size()); });
  const std::vector<int32_t>& ids = bm_->table(r.index, group_);
  uint8_t want[kIndexerDim + kIndexerScaleBytes];
  for (int64_t t = 0; t < r.final_len; ++t) {
    if (!qkv_token_reaches_cache(write_map_, r.final_len, t)) continue;
    const int64_t slot = write_map_.cache_token(t);
    const int64_t block = BlockRef{ids[static_cast<size_t>(slot / P)]}.block();
    const int64_t entry = slot % P;
    indexer_row(layer, t, r.hashes[t], want, want + kIndexerDim);
    const uint8_t* data = cache.data() + block * P * indexer_row_ + entry * kIndexerDim;
    const uint8_t* scale = cache.data() + block * P * indexer_row_ + static_cast<int64_t>(P) * kIndexerDim + entry * kIndexerScaleBytes;
    ++rec_.write_checked_rows;
    if (!rec_.write_violation.empty()) continue;
    if (std::memcmp(data, want, kIndexerDim) != 0 || std::memcmp(scale, want + kIndexerDim, kIndexerScaleBytes) != 0)
      rec_.write_violation = "request " + r.id + ", layer " + std::to_string(layer) + ", indexer K of position " +
                             std::to_string(t) + " (block " + std::to_string(block) + ", entry " +
                             std::to_string(entry) + "): the cache's bytes are not the ones indexer_k_scatter was given";
  }
}

void Runner::fold_token(const RequestState& r, int64_t t, float* state) const {
  const int32_t n = s_.recurrent.state_size;
  for (int32_t l = 0; l < s_.recurrent.layers; ++l)
    recurrent_step(state + static_cast<size_t>(l) * n, n, s_.model.seed, l, r.hashes[static_cast<size_t>(t)]);
}

std::vector<float> Runner::recompute_state(const RequestState& r, int64_t tokens) const {
  std::vector<float> state(static_cast<size_t>(s_.recurrent.layers) * s_.recurrent.state_size, 0.0f);
  for (int64_t t = 0; t < tokens; ++t) fold_token(r, t, state.data());
  return state;
}

void Runner::restore_state(const RequestState& r, int64_t at, float* state) {
  const size_t n = static_cast<size_t>(s_.recurrent.layers) * s_.recurrent.state_size;
  const Phase checking(clock_, &rec_.timings.checks);
  const std::vector<float> recomputed = recompute_state(r, at);
  ++rec_.state_resumes;
  const auto it = snapshots_.find(r.hashes[static_cast<size_t>(at - 1)]);
  if (it == snapshots_.end()) {
    if (rec_.state_hit_violation.empty()) {
      const int64_t P = g_.tokens_per_block;
      int64_t deepest = (at / P) * P;
      while (deepest > 0 && !snapshots_.count(r.hashes[static_cast<size_t>(deepest - 1)])) deepest -= P;
      rec_.state_hit_violation = "step " + std::to_string(step_) + ": request " + r.id + " resumes at token " +
                                 std::to_string(at) + ", past the deepest valid snapshot of its prefix (token " +
                                 std::to_string(deepest) + ")";
    }
    std::copy(recomputed.begin(), recomputed.end(), state);
    return;
  }
  ++rec_.state_restores;
  if (rec_.state_restore_violation.empty())
    for (size_t i = 0; i < n; ++i)
      if (std::memcmp(&it->second[i], &recomputed[i], 4) != 0) {
        char buf[96];
        std::snprintf(buf, sizeof buf, " is %.9g, recomputed from token 0: %.9g", it->second[i], recomputed[i]);
        rec_.state_restore_violation = "step " + std::to_string(step_) + ": request " + r.id + " restored at token " +
                                       std::to_string(at) + ": recurrent layer " +
                                       std::to_string(i / s_.recurrent.state_size) + ", element " +
                                       std::to_string(i % s_.recurrent.state_size) + buf;
        break;
      }
  std::copy(it->second.begin(), it->second.end(), state);
}

// vLLM's mamba_cache_mode "all" snapshots every block boundary a request
// passes; "align" only the last one before its prompt's end (the hit point
// cannot pass the last prompt token). snapshot_off_block_boundary: a chunk
// that crosses boundaries stores its end state under the deepest one.
void Runner::advance_recurrent(const std::vector<Entry>& es) {
  const int64_t P = g_.tokens_per_block;
  const size_t n = static_cast<size_t>(s_.recurrent.layers) * s_.recurrent.state_size;
  const Phase folding(clock_, &rec_.timings.inputs);  // the synthetic model's recurrent layers
  for (const Entry& e : es) {
    const RequestState& r = *e.r;
    float* state = recurrent_.data() + static_cast<size_t>(r.index) * n;
    const int64_t start = e.e->start;
    if (recurrent_pos_[r.index] != start) {  // admitted, a prefix hit, or a preemption's restart
      if (start == 0)
        std::fill(state, state + n, 0.0f);
      else
        restore_state(r, start, state);
    }
    const int64_t align_at = ((r.prompt_len - 1) / P) * P;
    int64_t crossed = 0;
    for (int64_t t = start; t < start + e.e->n; ++t) {
      fold_token(r, t, state);
      const int64_t boundary = t + 1;
      if (!s_.reuse.enabled || boundary % P != 0) continue;
      if (s_.recurrent.snapshots == SnapshotMode::align && boundary != align_at) continue;
      if (snapshot_off_boundary_)
        crossed = boundary;
      else
        snapshots_[r.hashes[static_cast<size_t>(t)]] = std::vector<float>(state, state + n);
    }
    if (crossed > 0) snapshots_[r.hashes[static_cast<size_t>(crossed - 1)]] = std::vector<float>(state, state + n);
    recurrent_pos_[r.index] = start + e.e->n;
  }
}

void Runner::hash_final_state() {
  // In chunks of 64 MiB: a pool as large as the machine is never copied whole.
  constexpr size_t kChunk = size_t{64} << 20;
  std::vector<uint8_t> host;
  auto add = [&](const void* data, int64_t bytes, const std::string& file, const std::string& descr,
                 const std::vector<int64_t>& shape, const std::string& what, int32_t layer, CacheDtype t) {
    if (!data || bytes <= 0 || (!opt_.content_hash && !dump_)) return;
    std::unique_ptr<std::ofstream> out;
    if (dump_) out = dump_->begin(file, descr, shape, step_, what, layer, t);
    for (int64_t at = 0; at < bytes; at += static_cast<int64_t>(kChunk)) {
      const size_t n = static_cast<size_t>(std::min<int64_t>(bytes - at, static_cast<int64_t>(kChunk)));
      host.resize(n);
      transfer(n, [&] { be_.to_host(host.data(), static_cast<const uint8_t*>(data) + at, n); });
      hash_content(host.data(), n);
      if (!out) continue;
      const Phase dumping(clock_, &rec_.timings.recording);
      NpyDump::append(*out, host.data(), n, file);
    }
  };
  for (PoolKind kind : {PoolKind::primary, PoolKind::secondary}) {
    const int k = static_cast<int>(kind);
    const char* name = kind == PoolKind::primary ? "primary" : "secondary";
    if (!own_pools_) continue;
    for (size_t p = 0; p < pool_sets_.size(); ++p) {
      const KvPools& ps = pool_sets_[p];
      const PoolGeometry& pg = ps.geometry;
      const std::string suffix = pool_sets_.size() > 1 ? std::to_string(p) : "";
      const int64_t bytes = pg.pool_bytes(kind);
      add(ps.data[k], bytes, std::string("pool_") + name + suffix + ".npy", NpyDump::descr_for(pg.dtype),
          {pg.dtype == CacheDtype::nvfp4 ? bytes : bytes / element_bytes(pg.dtype)}, "pool", -1, pg.dtype);
      if (pg.has_scale_pool()) {
        const int64_t sbytes = scale_pool_bytes(pg, kind);
        add(ps.scales[k], sbytes, std::string("scales_") + name + suffix + ".npy",
            NpyDump::descr_for(CacheDtype::fp8_e4m3), {sbytes}, "scale_pool", -1, CacheDtype::fp8_e4m3);
      }
    }
  }
  if (!own_pools_)
    for (size_t i = 0; i < pool_memory_.size(); ++i) {
      const auto bytes = static_cast<int64_t>(pool_memory_[i].bytes());
      add(pool_memory_[i].get(), bytes, "allocation" + std::to_string(i) + ".npy", "|u1", {bytes},
          "shared_kv_allocation", -1, CacheDtype::fp8_e4m3);
    }
  for (size_t l = 0; l < indexer_.size(); ++l)
    add(indexer_[l].get(), static_cast<int64_t>(indexer_[l].bytes()), "indexer_layer" + std::to_string(l) + ".npy",
        "|u1", {g_.primary_blocks, g_.tokens_per_block, 1, indexer_row_}, "indexer_k_cache", static_cast<int32_t>(l),
        CacheDtype::fp8_e4m3);
}

}  // namespace

RunRecord run_scenario(const Scenario& s, Backend& backend, const ReplayOptions& options) {
  Runner runner(s, backend, options);
  return runner.run();
}

}  // namespace kvsim::sim
