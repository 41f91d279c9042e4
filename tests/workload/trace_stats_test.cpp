// `trace stats` on the shared Mooncake synthetic trace (traces/), held to an
// independent computation of hit rate against capacity written here: a
// trie over hash-id chains with an LRU list, following kvsim's rules (full
// blocks only, the last prompt token recomputed, free list before eviction,
// blocks released tail first, a block computed while an equal one is cached
// stays private) without the block manager, its token keys or the trace
// reader. Plus golden numbers, so a change of either side shows.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <list>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvsim/workload/trace.hpp"
#include "kvsim/workload/trace_stats.hpp"

namespace {

const std::string kTrace = std::string(KVSIM_SOURCE_DIR) + "/traces/mooncake_synthetic_trace.jsonl";

struct ModelRequest {
  double ts = 0;
  int64_t length = 0;
  std::vector<int64_t> nodes;  // trie node per 512-token block of the prompt
};

// Reads the file with nlohmann directly; every block of a chain is a trie
// node keyed by (parent node, hash id); blocks past the chain get nodes of
// their own.
std::vector<ModelRequest> model_requests(int64_t B) {
  std::ifstream in(kTrace);
  REQUIRE(in);
  std::map<std::pair<int64_t, uint64_t>, int64_t> trie;
  int64_t next = 1;
  std::vector<ModelRequest> out;
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    ModelRequest r;
    r.ts = j.at("timestamp").get<double>();
    r.length = j.at("input_length").get<int64_t>();
    int64_t parent = 0;
    for (const auto& h : j.at("hash_ids")) {
      auto [it, fresh] = trie.try_emplace({parent, h.get<uint64_t>()}, next);
      if (fresh) ++next;
      parent = it->second;
      r.nodes.push_back(parent);
    }
    while (static_cast<int64_t>(r.nodes.size()) * B < r.length) r.nodes.push_back(next++);
    out.push_back(std::move(r));
  }
  std::stable_sort(out.begin(), out.end(), [](const ModelRequest& a, const ModelRequest& b) { return a.ts < b.ts; });
  return out;
}

struct ModelResult {
  int64_t hits = 0, evicted = 0, unfit = 0;
};

ModelResult model_lru(const std::vector<ModelRequest>& reqs, int64_t B, int64_t capacity_blocks) {
  std::list<int64_t> lru;  // cached, unreferenced nodes, oldest first
  std::unordered_map<int64_t, std::list<int64_t>::iterator> cached;
  int64_t free_blocks = capacity_blocks;
  ModelResult res;
  for (const ModelRequest& r : reqs) {
    const int64_t pages = (r.length + B - 1) / B, full = r.length / B, limit = (r.length - 1) / B;
    int64_t m = 0;
    while (m < limit && cached.count(r.nodes[m])) ++m;
    for (int64_t j = 0; j < m; ++j) lru.erase(cached[r.nodes[j]]);  // referenced now: out of the LRU
    auto release = [&](int64_t node) { cached[node] = lru.insert(lru.end(), node); };
    if (pages - m > free_blocks + static_cast<int64_t>(lru.size())) {
      for (int64_t j = m - 1; j >= 0; --j) release(r.nodes[j]);
      ++res.unfit;
      continue;
    }
    for (int64_t k = m; k < pages; ++k) {
      if (free_blocks > 0) {
        --free_blocks;
      } else {
        cached.erase(lru.front());
        lru.pop_front();
        ++res.evicted;
      }
    }
    std::vector<bool> registered(static_cast<size_t>(pages), false);
    for (int64_t j = m; j < full; ++j)
      if (!cached.count(r.nodes[j])) {
        cached[r.nodes[j]] = lru.end();  // in the tree, referenced (not in the LRU)
        registered[j] = true;
      }
    for (int64_t j = pages - 1; j >= 0; --j) {  // tail first
      if (j < m || registered[j])
        release(r.nodes[j]);
      else
        ++free_blocks;
    }
    res.hits += m * B;
  }
  return res;
}

}  // namespace

TEST_CASE("trace stats on the Mooncake synthetic trace equals an independent LRU model at seven capacities") {
  const kvsim::workload::Trace t = kvsim::workload::load_trace(kTrace, kvsim::workload::TraceFormat::mooncake);
  REQUIRE(t.requests.size() == 3993);
  CHECK(t.prompt_tokens() == 61194628);
  const std::vector<int64_t> caps = {1000000, 3000000, 5000000, 10000000, 20000000, 30000000, 50000000};
  const kvsim::workload::TraceStats s = kvsim::workload::trace_stats(t, 512, caps);
  const std::vector<ModelRequest> reqs = model_requests(512);
  const ModelResult unbounded = model_lru(reqs, 512, int64_t{1} << 40);
  CHECK(s.unbounded.hit_tokens == unbounded.hits);
  CHECK(s.unbounded.evicted_blocks == 0);
  // Golden: the unbounded maximum and each capacity's reused tokens.
  CHECK(s.unbounded.hit_tokens == 39802880);
  const std::vector<int64_t> golden = {9178624, 19643392, 26731008, 35987456, 39802880, 39802880, 39802880};
  REQUIRE(s.capacities.size() == caps.size());
  for (size_t i = 0; i < caps.size(); ++i) {
    CAPTURE(caps[i]);
    const ModelResult m = model_lru(reqs, 512, caps[i] / 512);
    CHECK(s.capacities[i].hit_tokens == m.hits);
    CHECK(s.capacities[i].evicted_blocks == m.evicted);
    CHECK(s.capacities[i].unfit_requests == m.unfit);
    CHECK(s.capacities[i].hit_tokens == golden[i]);
    CHECK(s.capacities[i].fraction_of_max == doctest::Approx(static_cast<double>(m.hits) / unbounded.hits).epsilon(1e-12));
  }
  // The paper's Figure 9 shape: 3 M tokens reach under half the maximum, 50 M all of it.
  CHECK(s.capacities[1].fraction_of_max < 0.5);
  CHECK(s.capacities[6].fraction_of_max == 1.0);
}

TEST_CASE("cache blocks smaller than the trace's: 16-token pages reuse the same prefixes, pool pressure included") {
  const kvsim::workload::Trace full = kvsim::workload::load_trace(kTrace, kvsim::workload::TraceFormat::mooncake);
  kvsim::workload::Trace t = full;
  t.requests.resize(400);
  // With 16-token pages a prompt of L tokens can reuse up to floor((L - 1) / 16) pages,
  // more than with 512-token pages, never fewer: every 512-token hit is 32 page hits.
  const std::vector<int64_t> caps = {200000, 2000000};
  const auto s512 = kvsim::workload::trace_stats(t, 512, caps);
  const auto s16 = kvsim::workload::trace_stats(t, 16, caps);
  CHECK(s16.unbounded.hit_tokens >= s512.unbounded.hit_tokens);
  CHECK(s16.capacities[0].evicted_blocks > 0);
  CHECK(s16.capacities[0].hit_tokens < s16.unbounded.hit_tokens);
}

TEST_CASE("a prompt longer than the whole pool is counted as unfit and replayed with no hit") {
  const std::string text =
      "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 1, \"hash_ids\": [1, 2]}\n"
      "{\"timestamp\": 1, \"input_length\": 5000, \"output_length\": 1, \"hash_ids\": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}\n"
      "{\"timestamp\": 2, \"input_length\": 1000, \"output_length\": 1, \"hash_ids\": [1, 2]}\n";
  const auto t = kvsim::workload::parse_trace(text, "small.jsonl", kvsim::workload::TraceFormat::mooncake);
  const std::vector<int64_t> caps = {2048};
  const auto s = kvsim::workload::trace_stats(t, 512, caps);
  REQUIRE(s.capacities.size() == 1);
  CHECK(s.capacities[0].unfit_requests == 1);
  // Request 3 reuses the first block of request 1 (its second block holds the last prompt token).
  CHECK(s.capacities[0].hit_tokens == 512);
  CHECK(s.unbounded.hit_tokens == 512 + 512);  // request 2 hits block 1 too; request 1 registered only its one full block
}
