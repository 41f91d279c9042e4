// ReplayRecorder (recorder.hpp): the replay's per-step changes as JSON.
#include "kvsim/report/recorder.hpp"

#include <algorithm>
#include <set>

namespace kvsim::report {

using nlohmann::json;

void ReplayRecorder::start(const sim::Scenario& s, const sim::BlockManager& bm,
                           const std::vector<sim::RequestState>& reqs) {
  const size_t blocks = static_cast<size_t>(s.cache.primary_blocks);
  owner_.assign(static_cast<size_t>(bm.pool_count()), std::vector<int32_t>(blocks, kFree));
  holders_.assign(owner_.size(), std::vector<int32_t>(blocks, 0));
  secondary_.assign(static_cast<size_t>(s.cache.secondary_blocks), 0);
  lengths_.assign(reqs.size(), 0);
  phases_.assign(reqs.size(), 0);
  json requests = json::array();
  for (const sim::RequestState& r : reqs)
    requests.push_back({{"id", r.id}, {"prompt", r.prompt_len}, {"final", r.final_len}, {"arrival", r.arrival_step}});
  json initial = json::array();  // blocks that do not start free (the null blocks)
  for (size_t p = 0; p < owner_.size(); ++p)
    for (size_t b = 0; b < blocks; ++b)
      if (bm.block_use(static_cast<int32_t>(p), static_cast<int32_t>(b)) == sim::BlockUse::reserved) {
        owner_[p][b] = kReserved;
        initial.push_back({p, b, kReserved, 0});
      }
  const std::vector<sim::KvGroup> kv = sim::kv_groups(s);
  json groups = json::array();
  windows_.clear();
  for (int32_t g = 0; g < bm.group_count(); ++g) {
    const WindowMapping& w = bm.window_mapping(g);
    windows_.push_back(w);
    groups.push_back({{"mode", std::string(sim::window_mode_name(bm.group(g).mode))},
                      {"window", w.window},
                      {"sinks", w.sinks},
                      {"bubble", w.bubble},
                      {"cyclic_len", w.linear ? 0 : w.cyclic_len},
                      {"one_more_block", w.one_more_block},
                      {"pool", bm.group(g).pool},
                      {"layers", g < static_cast<int32_t>(kv.size()) ? kv[g].layers : std::vector<int32_t>{}}});
  }
  doc_ = {{"requests", requests}, {"initial", initial}, {"pools", bm.pool_count()}, {"groups", groups},
          {"frames", json::array()}};
}

void ReplayRecorder::block_event(const sim::BlockEvent& e) {
  using K = sim::BlockEvent::Kind;
  if (e.kind == K::cancel) {  // not admitted: its hits and copies did not happen
    json kept = json::array();
    for (json& x : events_)
      if (!((x[0] == "hit" || x[0] == "partial_copy") && x[1] == e.seq)) kept.push_back(std::move(x));
    events_ = std::move(kept);
    return;
  }
  events_.push_back({std::string(sim::block_event_name(e.kind)), e.seq, e.block, e.secondary, e.source, e.tokens,
                     e.pool, e.group});
}

void ReplayRecorder::step_done(const sim::StepView& v) {
  const sim::BlockManager& bm = *v.blocks;
  const std::vector<sim::RequestState>& reqs = *v.requests;
  json f = {{"step", v.step}};
  const int64_t frame = frames();
  json prefill = json::array(), decode = json::array();
  for (const sim::ScheduledEntry& e : v.plan->prefill) prefill.push_back({e.request, e.start, e.n});
  for (const sim::ScheduledEntry& e : v.plan->decode) decode.push_back({e.request, e.start});
  for (const auto* list : {&v.plan->prefill, &v.plan->decode})
    for (const sim::ScheduledEntry& e : *list) chunks_.push_back({e.request, e.start, e.n, frame});
  f["prefill"] = prefill;
  f["decode"] = decode;

  // Tables and owners, per pool.
  std::vector<std::vector<int32_t>> owner(owner_.size()), holders(owner_.size());
  for (size_t p = 0; p < owner_.size(); ++p) {
    owner[p].assign(owner_[p].size(), kFree);
    holders[p].assign(owner_[p].size(), 0);
  }
  json tables = json::array();
  std::set<std::pair<int32_t, int32_t>> live;
  for (const sim::RequestState& r : reqs) {
    if (!bm.has_sequence(r.index)) continue;
    for (int32_t g = 0; g < bm.group_count(); ++g) {
      const int32_t pool = bm.group(g).pool;
      live.insert({r.index, g});
      const std::vector<int32_t>& t = bm.table(r.index, g);
      for (int32_t b : t) {
        if (bm.block_use(pool, b) == sim::BlockUse::reserved) continue;
        if (holders[pool][b]++ == 0) owner[pool][b] = r.index;
      }
      std::vector<int32_t>& old = tables_[{r.index, g}];
      json changed = json::array();
      for (size_t p = 0; p < t.size(); ++p)
        if (p >= old.size() || old[p] != t[p]) changed.push_back({p, t[p]});
      if (!changed.empty() || old.size() != t.size()) tables.push_back({r.index, g, t.size(), changed});
      old = t;
    }
  }
  for (auto it = tables_.begin(); it != tables_.end();)
    if (!live.count(it->first)) {
      tables.push_back({it->first.first, it->first.second, -1, json::array()});  // dropped (finished or preempted)
      it = tables_.erase(it);
    } else {
      ++it;
    }
  json primary = json::array();
  for (size_t p = 0; p < owner.size(); ++p)
    for (size_t b = 0; b < owner[p].size(); ++b) {
      const sim::BlockUse use = bm.block_use(static_cast<int32_t>(p), static_cast<int32_t>(b));
      if (use == sim::BlockUse::cached) owner[p][b] = kCached;
      if (use == sim::BlockUse::reserved) owner[p][b] = kReserved;
      if (owner[p][b] != owner_[p][b] || holders[p][b] != holders_[p][b])
        primary.push_back({p, b, owner[p][b], holders[p][b]});
    }
  owner_ = std::move(owner);
  holders_ = std::move(holders);

  // Prefix tree and the secondary pool.
  std::vector<int32_t> secondary(secondary_.size(), 0);
  json added = json::array(), removed = json::array();
  std::set<int32_t> seen;
  const std::vector<sim::CachedBlock> tree = bm.prefix_tree();
  for (const sim::CachedBlock& n : tree)
    if (!node_ids_.count(n.key)) node_ids_.emplace(n.key, static_cast<int32_t>(node_ids_.size()));
  for (const sim::CachedBlock& n : tree) {
    const int32_t id = node_ids_.at(n.key);
    const auto parent = node_ids_.find(n.parent);
    const std::array<int64_t, 5> now = {parent == node_ids_.end() ? -1 : parent->second,
                                        n.pool == PoolKind::primary ? 0 : 1, n.block, n.group, n.primary_pool};
    if (n.pool == PoolKind::secondary) secondary[n.block] = 1;
    seen.insert(id);
    auto it = nodes_.find(id);
    if (it == nodes_.end() || it->second != now) {
      added.push_back({id, now[0], now[1], now[2], now[3], now[4]});
      nodes_[id] = now;
    }
  }
  for (auto it = nodes_.begin(); it != nodes_.end();)
    if (!seen.count(it->first)) {
      removed.push_back(it->first);
      it = nodes_.erase(it);
    } else {
      ++it;
    }
  json sec = json::array();
  for (size_t b = 0; b < secondary.size(); ++b)
    if (secondary[b] != secondary_[b]) sec.push_back({b, secondary[b]});
  secondary_ = std::move(secondary);

  // Requests: lengths, phases, preemptions, each window's newest token.
  json lens = json::array(), ring = json::array();
  for (int32_t r : *v.preempted) events_.push_back({"preempt", r, -1, -1, -1, 0, 0, 0});
  for (const sim::RequestState& r : reqs) {
    const int phase = static_cast<int>(r.phase);
    if (r.computed != lengths_[r.index] || phase != phases_[r.index]) {
      lens.push_back({r.index, r.computed, phase});
      if (r.computed > 0)
        for (size_t g = 0; g < windows_.size(); ++g)
          if (windows_[g].enabled()) ring.push_back({r.index, g, r.computed - 1, windows_[g].cache_token(r.computed - 1)});
    }
    lengths_[r.index] = r.computed;
    phases_[r.index] = phase;
  }
  const sim::PoolCounts pc = bm.counts(PoolKind::primary), sc = bm.counts(PoolKind::secondary);
  f["p"] = primary;
  f["s"] = sec;
  f["t"] = tables;
  f["r"] = lens;
  f["ring"] = ring;
  f["tree"] = {{"add", added}, {"del", removed}};
  f["ev"] = std::move(events_);
  events_ = json::array();
  f["counts"] = {pc.free, pc.referenced, pc.cached, sc.cached};
  f["cons"] = v.conservation;
  doc_["frames"].push_back(std::move(f));
}

int64_t ReplayRecorder::frame_of(int32_t request, int64_t position) const {
  // The latest chunk: a preempted request computes its positions again, and that output is the one kept.
  for (auto it = chunks_.rbegin(); it != chunks_.rend(); ++it) {
    const auto& [r, start, n, frame] = *it;
    if (r == request && position >= start && position < start + n) return frame;
  }
  return -1;
}

int32_t ReplayRecorder::request_index(const std::string& id) const {
  const json& rs = doc_.at("requests");
  for (size_t i = 0; i < rs.size(); ++i)
    if (rs[i].at("id") == id) return static_cast<int32_t>(i);
  return -1;
}

std::vector<int32_t> ReplayRecorder::table_at(int64_t frame, int32_t request, int32_t group) const {
  std::vector<int32_t> t;
  const json& frames = doc_.at("frames");
  for (int64_t i = 0; i <= frame && i < static_cast<int64_t>(frames.size()); ++i)
    for (const json& row : frames[static_cast<size_t>(i)].at("t")) {
      if (row[0].get<int32_t>() != request || row[1].get<int32_t>() != group) continue;
      const int64_t len = row[2].get<int64_t>();
      if (len < 0) {
        t.clear();
        continue;
      }
      t.resize(static_cast<size_t>(len), -1);
      for (const json& c : row[3]) t[c[0].get<size_t>()] = c[1].get<int32_t>();
    }
  return t;
}

int64_t ReplayRecorder::length_at(int64_t frame, int32_t request) const {
  int64_t len = 0;
  const json& frames = doc_.at("frames");
  for (int64_t i = 0; i <= frame && i < static_cast<int64_t>(frames.size()); ++i)
    for (const json& row : frames[static_cast<size_t>(i)].at("r"))
      if (row[0].get<int32_t>() == request) len = row[1].get<int64_t>();
  return len;
}

}  // namespace kvsim::report
