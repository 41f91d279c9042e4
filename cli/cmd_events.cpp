// `kvsim events check FILE` and `kvsim events replay FILE --capacity-blocks N`:
// engines' KV-event streams (vLLM, SGLang, TensorRT-LLM; docs/traces.md).
// check reports each invariant of the stream with its first violation (exit
// 1 if one fails); replay rebuilds the prefix-content tree from the stores,
// drives kvsim's block manager with them and reports where its LRU would
// have evicted something else than the engine did.
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "kvsim/workload/kv_events.hpp"
#include "numbers.hpp"

namespace kvsim::cli {
namespace {

struct EventsOptions {
  std::string file;
  int64_t capacity_blocks = 0;
  bool json = false;
};

std::string stream_line(const workload::EventStream& s) {
  return s.source + ": " + s.engine + ", " + s.encoding + ", " + std::to_string(s.batches) + " batches, " +
         std::to_string(s.events.size()) + " events";
}

void run_check(const EventsOptions& o) {
  const workload::EventStream s = workload::load_event_stream(o.file);
  const workload::EventCheckReport r = workload::check_event_stream(s);
  if (o.json) {
    nlohmann::json inv = nlohmann::json::object();
    for (const auto& c : r.checks)
      inv[std::string(workload::event_invariant_name(c.invariant))] = {
          {"status", !c.applicable ? "n/a" : c.violations ? "fail" : "pass"}, {"violations", c.violations}, {"first", c.first}};
    std::cout << nlohmann::json{{"file", s.source},           {"engine", s.engine},
                                {"encoding", s.encoding},     {"batches", s.batches},
                                {"events", r.events},         {"stored_blocks", r.stored_blocks},
                                {"removed_blocks", r.removed_blocks}, {"clears", r.clears},
                                {"lost_batches", r.lost_batches}, {"invariants", inv},
                                {"ok", r.ok()}}
                     .dump(2)
              << '\n';
  } else {
    std::printf("%s (%lld stored blocks, %lld removed, %lld clears, %lld lost batches)\n", stream_line(s).c_str(),
                static_cast<long long>(r.stored_blocks), static_cast<long long>(r.removed_blocks),
                static_cast<long long>(r.clears), static_cast<long long>(r.lost_batches));
    for (const auto& c : r.checks) {
      const std::string name(workload::event_invariant_name(c.invariant));
      if (!c.applicable)
        std::printf("  %-26s n/a\n", name.c_str());
      else if (c.violations == 0)
        std::printf("  %-26s pass\n", name.c_str());
      else
        std::printf("  %-26s FAIL (%lld): first at %s\n", name.c_str(), static_cast<long long>(c.violations),
                    c.first.c_str());
    }
  }
  if (!r.ok()) throw ExitStatus{kExitCheckFailed};
}

double share(int64_t part, int64_t whole) {
  return whole ? static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}

nlohmann::json replay_json(const workload::EventReplayStream& r) {
  return {{"block_size", r.block_size},
          {"replayed_stores", r.replayed_stores},
          {"unrooted_stores", r.unrooted_stores},
          {"other_medium_stores", r.other_medium_stores},
          {"unfit_stores", r.unfit_stores},
          {"kvsim_evictions", r.kvsim_evictions},
          {"engine_removals", r.engine_removals},
          {"kvsim_evicted_engine_kept", r.kvsim_evicted_engine_kept},
          {"engine_removed_kvsim_kept", r.engine_removed_kvsim_kept},
          {"first_divergence", r.first_divergence},
          {"chain_tokens", r.chain_tokens},
          {"hit_tokens", r.hit_tokens},
          {"hit_rate", share(r.hit_tokens, r.chain_tokens)},
          {"engine_hit_tokens", r.engine_hit_tokens},
          {"engine_hit_rate", share(r.engine_hit_tokens, r.chain_tokens)}};
}

void print_replay(const workload::EventReplayStream& r, const char* indent) {
  std::printf("%sreplayed %lld stores (skipped: %lld unrooted, %lld other medium, %lld larger than the pool)\n", indent,
              static_cast<long long>(r.replayed_stores), static_cast<long long>(r.unrooted_stores),
              static_cast<long long>(r.other_medium_stores), static_cast<long long>(r.unfit_stores));
  std::printf("%sevictions: kvsim %lld, engine removals %lld; kvsim evicted what the engine kept: %lld, the engine removed "
              "what kvsim kept: %lld\n",
              indent, static_cast<long long>(r.kvsim_evictions), static_cast<long long>(r.engine_removals),
              static_cast<long long>(r.kvsim_evicted_engine_kept), static_cast<long long>(r.engine_removed_kvsim_kept));
  std::printf("%sfirst divergence: %s\n", indent, r.first_divergence.empty() ? "none" : r.first_divergence.c_str());
  std::printf("%shit rate of the stored chains: kvsim %.4f (%lld of %lld tokens), the engine %.4f\n", indent,
              share(r.hit_tokens, r.chain_tokens), static_cast<long long>(r.hit_tokens),
              static_cast<long long>(r.chain_tokens), share(r.engine_hit_tokens, r.chain_tokens));
}

void run_replay(const EventsOptions& o) {
  const workload::EventStream s = workload::load_event_stream(o.file);
  const workload::EventReplayReport r = workload::replay_event_stream(s, o.capacity_blocks);
  if (o.json) {
    nlohmann::json j = replay_json(r);
    j["file"] = s.source;
    j["engine"] = s.engine;
    j["capacity_blocks"] = o.capacity_blocks;
    j["streams"] = nlohmann::json::array();
    for (const workload::EventReplayStream& x : r.streams) {
      nlohmann::json row = replay_json(x);
      row["rank"] = x.rank;
      row["group"] = x.group;
      j["streams"].push_back(row);
    }
    j["other_media"] = nlohmann::json::array();
    for (const workload::EventMediumReport& m : r.other_media)
      j["other_media"].push_back({{"rank", m.rank},
                                  {"group", m.group},
                                  {"medium", m.medium},
                                  {"stored_blocks", m.stored_blocks},
                                  {"removed_blocks", m.removed_blocks},
                                  {"live_at_end", m.live_at_end},
                                  {"restored_blocks", m.restored_blocks}});
    std::cout << j.dump(2) << '\n';
    return;
  }
  if (r.streams.size() == 1) {
    std::printf("%s; blocks of %lld tokens, kvsim pool of %lld blocks\n", stream_line(s).c_str(),
                static_cast<long long>(r.block_size), static_cast<long long>(o.capacity_blocks));
    print_replay(r, "");
  } else {
    std::printf("%s; %zu (rank, group) streams, each replayed in a kvsim pool of %lld blocks\n", stream_line(s).c_str(),
                r.streams.size(), static_cast<long long>(o.capacity_blocks));
    for (const workload::EventReplayStream& x : r.streams) {
      std::printf("rank %lld group %lld, blocks of %lld tokens:\n", static_cast<long long>(x.rank),
                  static_cast<long long>(x.group), static_cast<long long>(x.block_size));
      print_replay(x, "  ");
    }
    std::printf("total:\n");
    print_replay(r, "  ");
  }
  for (const workload::EventMediumReport& m : r.other_media)
    std::printf("other medium %s (rank %lld group %lld, not replayed): %lld blocks stored, %lld removed, %lld live at the "
                "end; %lld primary stores of a block it held\n",
                m.medium.c_str(), static_cast<long long>(m.rank), static_cast<long long>(m.group),
                static_cast<long long>(m.stored_blocks), static_cast<long long>(m.removed_blocks),
                static_cast<long long>(m.live_at_end), static_cast<long long>(m.restored_blocks));
}

}  // namespace

void register_events(CLI::App& app) {
  CLI::App* events = app.add_subcommand("events", "Engines' KV-event streams (vLLM, SGLang, TensorRT-LLM): check, replay");
  events->require_subcommand(1);
  auto check = std::make_shared<EventsOptions>();
  CLI::App* c = events->add_subcommand("check", "Check a KV-event stream's invariants; exit 1 if one fails");
  c->add_option("file", check->file, "Event file: msgpack batches or ZMQ frame triples, JSON Lines, TensorRT-LLM JSON")->required();
  c->add_flag("--json", check->json, "Print one JSON object");
  c->callback([check] { run_check(*check); });
  auto replay = std::make_shared<EventsOptions>();
  CLI::App* r = events->add_subcommand("replay", "Replay a KV-event stream's stores through kvsim's block manager");
  r->add_option("file", replay->file, "Event file (as for check)")->required();
  add_int_option(*r, "--capacity-blocks", replay->capacity_blocks, "kvsim's primary pool in blocks", 1, int64_t{1} << 31)
      ->required();
  r->add_flag("--json", replay->json, "Print one JSON object");
  r->callback([replay] { run_replay(*replay); });
}

}  // namespace kvsim::cli
