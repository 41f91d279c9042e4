// Trace files (workload/lib/trace.cpp): every format read, arrival order,
// dense block ids and prompt tokens that share exactly what the hash chains
// share; every malformed input rejected as bad_trace with FILE:LINE and the
// field, before anything is replayed. And the import: a window of a trace
// becomes a scenario the scenario parser accepts, whose prompts share
// exactly the trace's prefixes.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "kvsim/validation/errors.hpp"
#include "kvsim/sim/scenario.hpp"
#include "kvsim/sim/scenario_file.hpp"
#include "kvsim/sim/synthetic_model.hpp"
#include "kvsim/workload/trace.hpp"
#include "kvsim/workload/trace_import.hpp"

using namespace kvsim::workload;

namespace {

std::string rejection(const std::string& text, TraceFormat f = TraceFormat::mooncake) {
  try {
    parse_trace(text, "t.jsonl", f);
  } catch (const kvsim::ValidationError& e) {
    CHECK(e.code() == kvsim::ErrorCode::bad_trace);
    return e.what();
  }
  FAIL("accepted: " << text);
  return "";
}

const char* kGood = "{\"timestamp\": 0, \"input_length\": 1500, \"output_length\": 2, \"hash_ids\": [7, 8, 9]}\n";

}  // namespace

TEST_CASE("each format's fields, units and block size") {
  const Trace m = parse_trace(
      "{\"timestamp\": 30, \"input_length\": 1000, \"output_length\": 5, \"hash_ids\": [4, 5]}\n"
      "\n"
      "{\"timestamp\": 10, \"input_length\": 600, \"output_length\": 0, \"hash_ids\": [4, 6]}\n"
      "{\"timestamp\": 10, \"input_length\": 1, \"output_length\": 0, \"hash_ids\": []}\n",
      "m.jsonl", TraceFormat::mooncake);
  CHECK(m.block_tokens == 512);
  REQUIRE(m.requests.size() == 3);
  // Arrival order, file order among equal timestamps.
  CHECK(m.requests[0].line == 3);
  CHECK(m.requests[1].line == 4);
  CHECK(m.requests[2].line == 1);
  // Dense ids in order of first appearance in the file; a block without a hash gets its own.
  CHECK(m.requests[2].blocks == std::vector<int32_t>{0, 1});
  CHECK(m.requests[0].blocks == std::vector<int32_t>{0, 2});
  CHECK(m.requests[1].blocks == std::vector<int32_t>{3});
  CHECK(m.distinct_blocks == 4);

  const Trace b = parse_trace(
      "{\"chat_id\": 3, \"parent_chat_id\": -1, \"timestamp\": 5.5, \"input_length\": 33, \"output_length\": 4, "
      "\"type\": \"text\", \"turn\": 1, \"hash_ids\": [1, 2, 3]}\n",
      "b.jsonl", TraceFormat::bailian);
  CHECK(b.block_tokens == 16);
  CHECK(b.requests[0].arrival_ms == 5500.0);  // the Bailian README: timestamp in seconds
  CHECK(b.requests[0].input_length == 33);

  const Trace s = parse_trace("{\"t\": 1.25, \"in\": 100, \"out\": 7, \"hash_ids\": [9, 10]}\n", "s.jsonl",
                              TraceFormat::semianalysis);
  CHECK(s.block_tokens == 64);
  CHECK(s.requests[0].arrival_ms == 1250.0);
  CHECK(s.requests[0].output_length == 7);
}

TEST_CASE("SemiAnalysis sessions: requests and subagents' requests in time order, hash ids local to a session") {
  // Two sessions (the cc-traces-weka shape), both starting at t = 0; both use hash ids 1, 2, which
  // are different blocks in each (hash_id_scope "local"); session 1 has a subagent with one request.
  const std::string one =
      "{\"id\": \"trace_0001\", \"models\": [\"m\"], \"block_size\": 64, \"hash_id_scope\": \"local\", "
      "\"tool_tokens\": 10, \"system_tokens\": 5, \"requests\": ["
      "{\"t\": 0.0, \"type\": \"n\", \"model\": \"m\", \"in\": 128, \"out\": 3, \"hash_ids\": [1, 2]}, "
      "{\"type\": \"subagent\", \"agent_id\": \"a1\", \"requests\": [{\"t\": 1.5, \"type\": \"s\", \"in\": 64, "
      "\"out\": 1, \"hash_ids\": [1]}]}, "
      "{\"t\": 2.0, \"type\": \"s\", \"model\": \"m\", \"in\": 192, \"out\": 4, \"hash_ids\": [1, 2, 3], "
      "\"api_time\": 1.2, \"think_time\": 0.1}]}\n";
  const std::string two =
      "{\"id\": \"trace_0002\", \"block_size\": 64, \"hash_id_scope\": \"local\", \"requests\": ["
      "{\"t\": 0.5, \"type\": \"n\", \"in\": 100, \"out\": 2, \"hash_ids\": [1, 2]}]}\n";
  const Trace s = parse_trace(one + two, "w.jsonl", TraceFormat::semianalysis);
  CHECK(s.block_tokens == 64);
  REQUIRE(s.requests.size() == 4);
  CHECK(s.requests[0].arrival_ms == 0.0);
  CHECK(s.requests[1].arrival_ms == 500.0);   // session 2's request
  CHECK(s.requests[1].line == 2);
  CHECK(s.requests[2].arrival_ms == 1500.0);  // the subagent's
  CHECK(s.requests[3].arrival_ms == 2000.0);
  CHECK(s.requests[0].blocks == std::vector<int32_t>{0, 1});
  CHECK(s.requests[2].blocks == std::vector<int32_t>{0});        // the same session: the same block 1
  CHECK(s.requests[3].blocks == std::vector<int32_t>{0, 1, 2});
  CHECK(s.requests[1].blocks == std::vector<int32_t>{3, 4});     // session 2's ids 1, 2 are blocks of its own
  CHECK(rejection(two.substr(0, two.size() - 3) + "], \"colour\": 1}\n", TraceFormat::semianalysis).rfind(
            "bad_trace: t.jsonl:1: colour: unknown field of a semianalysis session", 0) == 0);
  CHECK(rejection("{\"block_size\": 16, \"requests\": []}\n", TraceFormat::semianalysis) ==
        "bad_trace: t.jsonl:1: block_size: expected 64 (the semianalysis release's; --trace-block-size N for another), got 16");
  CHECK(rejection("{\"hash_id_scope\": \"global\", \"requests\": []}\n", TraceFormat::semianalysis).rfind(
            "bad_trace: t.jsonl:1: hash_id_scope: expected \"local\"", 0) == 0);
  CHECK(rejection("{\"requests\": [{\"t\": 0, \"in\": -5, \"out\": 1, \"hash_ids\": []}]}\n", TraceFormat::semianalysis) ==
        "bad_trace: t.jsonl:1: requests[0]: in: expected an integer >= 1, got -5");
  CHECK(rejection("{\"requests\": [{\"t\": 0, \"in\": 64, \"out\": 1, \"hash_ids\": [1, 2]}]}\n", TraceFormat::semianalysis) ==
        "bad_trace: t.jsonl:1: requests[0]: hash_ids: expected at most ceil(in / 64) = 1 ids (one per 64-token block of "
        "the prompt), got 2: a hash chain longer than the prompt");
  CHECK(rejection("{\"requests\": [{\"t\": 0, \"in\": 64, \"out\": 1, \"hash_ids\": [], \"prio\": 2}]}\n",
                  TraceFormat::semianalysis)
            .rfind("bad_trace: t.jsonl:1: requests[0]: prio: unknown field for the semianalysis format (expected t, type,", 0) == 0);
  CHECK(rejection("{\"requests\": [{\"type\": \"subagent\", \"requests\": [{\"t\": 0, \"type\": \"x\", \"in\": 1, "
                  "\"out\": 1, \"hash_ids\": []}]}]}\n",
                  TraceFormat::semianalysis) ==
        "bad_trace: t.jsonl:1: requests[0].requests[0]: type: expected \"n\", \"s\" or \"subagent\", got \"x\"");
}

TEST_CASE("prompt tokens agree exactly where the hash chains agree") {
  const Trace t = parse_trace(
      "{\"timestamp\": 0, \"input_length\": 40, \"output_length\": 0, \"hash_ids\": [1, 2, 3]}\n"
      "{\"timestamp\": 1, \"input_length\": 40, \"output_length\": 0, \"hash_ids\": [1, 2, 4]}\n",
      "p.jsonl", TraceFormat::mooncake, 16);
  const auto a = prompt_tokens(t.requests[0], 16, 40);
  const auto b = prompt_tokens(t.requests[1], 16, 40);
  for (int p = 0; p < 40; ++p) {
    CAPTURE(p);
    CHECK((a[p] == b[p]) == (p < 32));
  }
}

TEST_CASE("malformed traces are rejected with FILE:LINE and the field") {
  CHECK(rejection(std::string(kGood) + "{\"timestamp\": 1, \"input_length\": 40\n").rfind(
            "bad_trace: t.jsonl:2: json: expected one JSON value per line, got a malformed line", 0) == 0);
  CHECK(rejection(std::string(kGood) + "[1, 2]\n") == "bad_trace: t.jsonl:2: json: expected a JSON object, got [1,2]");
  CHECK(rejection("{\"timestamp\": 0, \"input_length\": 40, \"output_length\": 2, \"hash_ids\": [], \"prio\": 1}\n") ==
        "bad_trace: t.jsonl:1: prio: unknown field for the mooncake format (expected timestamp, input_length, "
        "output_length, hash_ids)");
  CHECK(rejection("{\"timestamp\": 0, \"input_length\": -3, \"output_length\": 2, \"hash_ids\": []}\n") ==
        "bad_trace: t.jsonl:1: input_length: expected an integer >= 1, got -3");
  CHECK(rejection("{\"timestamp\": 0, \"input_length\": 3, \"output_length\": -1, \"hash_ids\": []}\n") ==
        "bad_trace: t.jsonl:1: output_length: expected an integer >= 0, got -1");
  CHECK(rejection("{\"timestamp\": -1, \"input_length\": 3, \"output_length\": 1, \"hash_ids\": []}\n") ==
        "bad_trace: t.jsonl:1: timestamp: expected a finite number >= 0, got -1");
  CHECK(rejection("{\"input_length\": 3, \"output_length\": 1, \"hash_ids\": []}\n") ==
        "bad_trace: t.jsonl:1: timestamp: expected a finite number >= 0, got nothing (field missing)");
  CHECK(rejection("{\"timestamp\": 0, \"input_length\": 2.5, \"output_length\": 1, \"hash_ids\": []}\n") ==
        "bad_trace: t.jsonl:1: input_length: expected an integer >= 1, got 2.5");
  CHECK(rejection("{\"timestamp\": 0, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [1, 2]}\n") ==
        "bad_trace: t.jsonl:1: hash_ids: expected at most ceil(input_length / 512) = 1 ids (one per 512-token block of "
        "the prompt), got 2: a hash chain longer than the prompt");
  CHECK(rejection("{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [1, \"x\"]}\n") ==
        "bad_trace: t.jsonl:1: hash_ids[1]: expected an integer >= 0, got \"x\"");
  CHECK(rejection("{\"t\": 0, \"in\": 6, \"out\": 1, \"hash_ids\": [], \"timestamp\": 3}\n", TraceFormat::semianalysis) ==
        "bad_trace: t.jsonl:1: timestamp: unknown field for the semianalysis format (expected t, in, out, hash_ids)");
  try {
    load_trace("/nonexistent/kvsim/trace.jsonl", TraceFormat::mooncake);
    FAIL("accepted a missing file");
  } catch (const kvsim::ValidationError& e) {
    CHECK(std::string(e.what()) == "bad_trace: /nonexistent/kvsim/trace.jsonl:0: file: expected a readable trace file, got none");
  }
}

TEST_CASE("windows by request index and by arrival time") {
  const Trace t = parse_trace(
      "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 0, \"hash_ids\": []}\n"
      "{\"timestamp\": 100, \"input_length\": 1, \"output_length\": 0, \"hash_ids\": []}\n"
      "{\"timestamp\": 200, \"input_length\": 1, \"output_length\": 0, \"hash_ids\": []}\n",
      "w.jsonl", TraceFormat::mooncake);
  CHECK(select_window(t, "1:", "").begin == 1);
  CHECK(select_window(t, "1:", "").end == 3);
  CHECK(select_window(t, ":2", "").end == 2);
  CHECK(select_window(t, "", "50:200").begin == 1);
  CHECK(select_window(t, "", "50:200").end == 2);
  CHECK_THROWS_WITH_AS(select_window(t, "5:9", ""),
                       "bad_argument: the window (--requests '5:9', --time '') holds no request of w.jsonl (3 requests)",
                       kvsim::ValidationError);
  CHECK_THROWS_AS(select_window(t, "2:1", ""), kvsim::ValidationError);
  CHECK_THROWS_AS(select_window(t, "a:b", ""), kvsim::ValidationError);
}

TEST_CASE("an imported window is a valid scenario whose prompts share exactly the trace's prefixes") {
  const Trace t = parse_trace(
      "{\"timestamp\": 0, \"input_length\": 1100, \"output_length\": 64, \"hash_ids\": [1, 2, 3]}\n"
      "{\"timestamp\": 120, \"input_length\": 1024, \"output_length\": 32, \"hash_ids\": [1, 2]}\n"
      "{\"timestamp\": 260, \"input_length\": 700, \"output_length\": 1, \"hash_ids\": [5, 6]}\n",
      "imp.jsonl", TraceFormat::mooncake);
  TraceImportOptions o;
  o.scale = 1.0 / 32;  // 512-token blocks become 16 tokens
  o.step_ms = 50;
  o.page_size = 8;
  const kvsim::sim::Scenario s = kvsim::sim::parse_scenario(trace_scenario_toml(t, o), trace_scenario_name(t, o) + ".toml");
  CHECK(s.name == "imp_r0-2");
  CHECK(s.reuse.enabled);
  CHECK(s.cache.page_size == 8);
  REQUIRE(s.requests.size() == 3);
  CHECK(s.requests[0].arrival_step == 0);
  CHECK(s.requests[1].arrival_step == 2);
  CHECK(s.requests[2].arrival_step == 5);
  CHECK(s.requests[0].decode_tokens == 2);
  CHECK(s.requests[2].decode_tokens == 1);
  const auto p0 = kvsim::sim::build_prompt(s, s.requests[0]);
  const auto p1 = kvsim::sim::build_prompt(s, s.requests[1]);
  const auto p2 = kvsim::sim::build_prompt(s, s.requests[2]);
  CHECK(p0.size() == 35);  // ceil(1100 / 32)
  CHECK(p1.size() == 32);
  CHECK(p2.size() == 22);
  CHECK(std::equal(p1.begin(), p1.end(), p0.begin()));  // the shared two blocks
  for (size_t i = 0; i < p2.size(); ++i) CHECK(std::find(p0.begin(), p0.end(), p2[i]) == p0.end());
  // The whole window fits at once by default: pages of prompt + decode of each request.
  CHECK(s.cache.primary_blocks == (35 + 2 + 7) / 8 + (32 + 1 + 7) / 8 + (22 + 1 + 7) / 8);

  o.scale = 0.3;
  CHECK_THROWS_AS(trace_scenario_toml(t, o), kvsim::ValidationError);
  o.scale = 1.0 / 32;
  o.model_toml = "[cache]\npage_size = 4\n";
  o.model_source = "m.toml";
  CHECK_THROWS_WITH_AS(trace_scenario_toml(t, o),
                       "bad_argument: m.toml:1: expected only a [model] table in a --model-toml file, got [cache]",
                       kvsim::ValidationError);
  o.model_toml = "[model]\nlayers = 3\nhead_dim = 32\n";
  const kvsim::sim::Scenario m = kvsim::sim::parse_scenario(trace_scenario_toml(t, o), "m.toml");
  CHECK(m.model.layers == 3);
  CHECK(m.model.head_dim == 32);
}
