// Published request traces (docs/traces.md): one JSON object per line with
// an arrival time, prompt and output lengths and one hash id per block of
// the prompt, where equal leading ids mean a shared prefix. No token ids are
// published; kvsim builds prompts whose equal hash-id prefixes are equal
// token blocks (prompt_tokens below), so its own block manager sees the
// trace's reuse structure.
//
// Every rejection is ValidationError(bad_trace, "FILE:LINE: FIELD: expected
// ..., got ..."), raised before anything is replayed.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvsim::workload {

enum class TraceFormat : uint8_t {
  // kvcache-ai/Mooncake FAST'25 release: timestamp (ms), input_length, output_length, hash_ids; 512-token blocks
  mooncake,
  // alibaba-edu/qwen-bailian-usagetraces-anon: chat_id, parent_chat_id, timestamp (s), input_length,
  // output_length, type, turn, hash_ids; 16-token blocks (qwen_*_blksz_16.jsonl)
  bailian,
  // semianalysisai/cc-traces-weka-*: one agent session per line, {id, models, block_size (64),
  // hash_id_scope, tool_tokens, system_tokens, requests[{t (s), type, model, in, out, hash_ids, ...}]},
  // hash ids local to their session; also one flat {t, in, out, hash_ids} request per line
  semianalysis,
};
std::string_view trace_format_name(TraceFormat f);
std::optional<TraceFormat> parse_trace_format(std::string_view s);
// Tokens per hash id the format's release uses.
int32_t default_trace_block_tokens(TraceFormat f);

struct TraceRequest {
  int64_t line = 0;          // 1-based line of the file
  double arrival_ms = 0.0;   // arrival time in milliseconds (the format's unit converted)
  int64_t input_length = 0;  // prompt tokens, >= 1
  int64_t output_length = 0; // generated tokens, >= 0
  std::vector<uint64_t> hash_ids;  // as published
  // Dense block ids, one per trace block of the prompt (ceil(input_length /
  // block_tokens)): equal hash ids get equal ids, in order of first
  // appearance; a block the file gives no hash for (a chain shorter than the
  // prompt) gets an id of its own, shared with nothing.
  std::vector<int32_t> blocks;
};

struct Trace {
  std::string source;  // the path (or name) used in messages
  TraceFormat format = TraceFormat::mooncake;
  int32_t block_tokens = 512;  // tokens per hash id
  std::vector<TraceRequest> requests;  // arrival order; file order among equal arrival times
  int64_t distinct_blocks = 0;         // dense ids in use
  int64_t prompt_tokens() const;
};

// Parses a whole trace. block_tokens = 0 takes the format's default.
Trace parse_trace(std::string_view text, const std::string& source, TraceFormat format, int32_t block_tokens = 0);
Trace load_trace(const std::string& path, TraceFormat format, int32_t block_tokens = 0);

// The prompt kvsim replays for a request: token p lies in trace block
// j = p / block_tokens at offset o = p % block_tokens and is
// blocks[j] * block_tokens + o. Two prompts therefore agree on a token
// exactly when their hash chains agree on its block, and a cache page of
// any size holds equal tokens exactly when the trace blocks it covers are
// equal. `scale` shrinks every length (see scaled_block_tokens): then
// block_tokens is the scaled one.
std::vector<int32_t> prompt_tokens(const TraceRequest& r, int32_t block_tokens, int64_t length);
void prompt_tokens_into(const TraceRequest& r, int32_t block_tokens, int64_t length, std::vector<int32_t>& out);

// A request window: indices [begin, end) of Trace::requests (arrival order).
struct TraceWindow {
  int64_t begin = 0;
  int64_t end = 0;
};
// "--requests A:B" (indices, B exclusive, either side may be empty) and/or
// "--time A:B" (arrival ms, [A, B)): the requests inside both.
TraceWindow select_window(const Trace& t, std::string_view requests_spec, std::string_view time_spec);

}  // namespace kvsim::workload
