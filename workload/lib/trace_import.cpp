// Trace window -> scenario file: see trace_import.hpp for the mapping.
#include "kvsim/workload/trace_import.hpp"
#include "kvsim/workload/trace_schedule.hpp"

#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>

#include <kvsim/core/dtype.hpp>
#include <kvsim/validation/errors.hpp>

namespace kvsim::workload {

namespace {

int64_t scaled_block(const Trace& t, double scale) {
  const double bs = static_cast<double>(t.block_tokens) * scale;
  if (!(scale > 0) || !std::isfinite(scale) || bs < 1 || bs != std::floor(bs) || bs > 1024)
    fail(ErrorCode::bad_argument, "--scale = " + std::to_string(scale) + ": expected a factor that turns the trace's " +
                                      std::to_string(t.block_tokens) +
                                      "-token blocks into a whole number of 1..1024 tokens (e.g. 1/32 = 0.03125 gives " +
                                      std::to_string(t.block_tokens / 32 > 0 ? t.block_tokens / 32 : 1) + ")");
  return static_cast<int64_t>(bs);
}

int64_t scaled(int64_t n, int64_t bs, int64_t b) { return (n * bs + b - 1) / b; }

void token_array(std::ostringstream& out, const std::vector<int32_t>& tokens, size_t begin, size_t end) {
  out << '[';
  for (size_t i = begin; i < end; ++i) out << (i > begin ? ", " : "") << tokens[i];
  out << ']';
}

}  // namespace

std::string trace_scenario_name(const Trace& t, const TraceImportOptions& o) {
  const TraceWindow w = select_window(t, o.requests, o.time);
  return std::filesystem::path(t.source).stem().string() + "_r" + std::to_string(w.begin) + "-" +
         std::to_string(w.end - 1);
}

namespace {

struct PlannedRequest {
  int64_t index = 0;         // in Trace::requests
  int64_t prompt = 0;        // scaled lengths
  int64_t output = 0;
  int64_t arrival_step = 0;
};

// The options checked and the window mapped: what both the text and the
// in-memory scenario are written from.
struct ImportPlan {
  TraceWindow w;
  int64_t bs = 0;  // tokens per trace block after scaling
  double t0 = 0.0;
  int64_t primary = 0;
  int64_t max_steps = 0;
  std::vector<PlannedRequest> requests;
};

ImportPlan make_plan(const Trace& t, const TraceImportOptions& o) {
  ImportPlan p;
  p.w = select_window(t, o.requests, o.time);
  const int64_t B = t.block_tokens;
  p.bs = scaled_block(t, o.scale);
  if (!(o.step_ms > 0) || !std::isfinite(o.step_ms))
    fail(ErrorCode::bad_argument, "--step-ms = " + std::to_string(o.step_ms) + ": expected a finite number > 0");
  if (o.page_size < 1 || o.page_size > 1024)
    fail(ErrorCode::bad_argument, "--page-size = " + std::to_string(o.page_size) + ": expected 1..1024");
  if (!o.model_toml.empty()) {
    // Only a [model] table may come in: every other section is the import's.
    std::istringstream lines(o.model_toml);
    std::string line;
    int n = 0;
    while (std::getline(lines, line)) {
      ++n;
      const size_t first = line.find_first_not_of(" \t");
      if (first != std::string::npos && line[first] == '[' && line.compare(first, 7, "[model]") != 0)
        fail(ErrorCode::bad_argument, o.model_source + ":" + std::to_string(n) +
                                          ": expected only a [model] table in a --model-toml file, got " + line);
    }
  }
  if (!o.dtype.empty() && !parse_dtype(o.dtype))
    fail(ErrorCode::bad_argument, "--kv-dtype = '" + o.dtype +
                                      "': expected fp32, fp16, bf16, fp8_e4m3, fp8_e5m2, int8 or nvfp4");
  if (o.secondary_blocks < 0) fail(ErrorCode::bad_argument, "--secondary-blocks: expected >= 0");
  for (int32_t w : o.layer_windows)
    if (w < 0) fail(ErrorCode::bad_argument, "--layer-windows: expected windows >= 0 (0 = full attention), got " + std::to_string(w));
  p.t0 = t.requests[static_cast<size_t>(p.w.begin)].arrival_ms;
  int64_t pages_all = 0, last_step = 0;
  for (int64_t i = p.w.begin; i < p.w.end; ++i) {
    const TraceRequest& r = t.requests[static_cast<size_t>(i)];
    PlannedRequest q;
    q.index = i;
    q.prompt = scaled(r.input_length, p.bs, B);
    q.output = scaled(r.output_length, p.bs, B);
    q.arrival_step = static_cast<int64_t>(std::floor((r.arrival_ms - p.t0) / o.step_ms));
    if (q.arrival_step > INT32_MAX / 2 || q.output > INT32_MAX)
      fail(ErrorCode::bad_argument, "--step-ms = " + std::to_string(o.step_ms) + ": request " + std::to_string(i) +
                                        " would arrive at step " + std::to_string(q.arrival_step) + " (at most 2^30)");
    pages_all += (q.prompt + q.output + o.page_size - 1) / o.page_size;
    last_step = std::max(last_step, q.arrival_step);
    p.requests.push_back(q);
  }
  p.primary = o.primary_blocks > 0 ? o.primary_blocks : std::max<int64_t>(pages_all, 1);
  p.max_steps = std::max<int64_t>(100000, last_step + 100000);
  return p;
}

}  // namespace

sim::Scenario trace_scenario(const Trace& t, const TraceImportOptions& o) {
  const ImportPlan p = make_plan(t, o);
  sim::Scenario s;
  s.name = trace_scenario_name(t, o);
  s.cache.page_size = o.page_size;
  s.cache.primary_blocks = p.primary;
  s.reuse.enabled = true;
  if (!o.dtype.empty()) s.cache.dtype = *parse_dtype(o.dtype);  // checked by make_plan
  s.reuse.offload = o.secondary_blocks > 0;
  s.cache.secondary_blocks = o.secondary_blocks;
  s.cache.poison_nan = s.cache.zero_v_tail = o.poison_nan;
  if (!o.layer_windows.empty()) {
    s.layers.enabled = true;
    s.layers.windows = o.layer_windows;
  }
  s.scheduler.token_budget = o.token_budget;
  s.scheduler.max_steps = static_cast<int32_t>(std::min<int64_t>(p.max_steps, INT32_MAX));
  for (const PlannedRequest& q : p.requests) {
    sim::RequestSpec r;
    r.id = "t" + std::to_string(q.index);
    r.arrival_step = static_cast<int32_t>(q.arrival_step);
    r.tokens = prompt_tokens(t.requests[static_cast<size_t>(q.index)], static_cast<int32_t>(p.bs), q.prompt);
    r.decode_tokens = static_cast<int32_t>(q.output);
    s.requests.push_back(std::move(r));
  }
  return s;
}

std::string trace_scenario_toml(const Trace& t, const TraceImportOptions& o) {
  const ImportPlan p = make_plan(t, o);
  const TraceWindow w = p.w;
  const int64_t B = t.block_tokens, bs = p.bs;
  const double t0 = p.t0;
  const int64_t primary = p.primary;
  std::map<int32_t, std::vector<int32_t>> prefixes;  // dense block id -> its Bs tokens
  std::ostringstream body;
  body << "# Imported from " << t.source << " (" << trace_format_name(t.format) << ", " << B
       << "-token trace blocks): requests " << w.begin << ".." << w.end - 1 << " of " << t.requests.size()
       << " in arrival order.\n"
       << "# Mapping: lengths x " << o.scale << " (a trace block is " << bs
       << " tokens), one [[prefix]] per distinct trace block, arrival_step = floor((arrival - " << t0 << " ms) / "
       << o.step_ms << " ms).\n"
       << "# Written by `kvsim trace import` (docs/traces.md).\n";
  if (!o.model_toml.empty()) body << "\n# [model] from " << o.model_source << "\n" << o.model_toml << "\n";
  body << "\n[cache]\npage_size = " << o.page_size << "\nprimary_blocks = " << primary << "\n";
  if (!o.dtype.empty()) body << "dtype = \"" << o.dtype << "\"\n";
  if (o.secondary_blocks > 0) body << "secondary_blocks = " << o.secondary_blocks << "\n";
  if (o.poison_nan) body << "poison_nan = true\nzero_v_tail = true\n";
  if (!o.layer_windows.empty()) {
    body << "\n[layers]\nwindows = [";
    for (size_t i = 0; i < o.layer_windows.size(); ++i) body << (i ? ", " : "") << o.layer_windows[i];
    body << "]\nallocation = \"hybrid\"\n";
  }
  body << "\n[reuse]\nenabled = true\n" << (o.secondary_blocks > 0 ? "offload = true\n" : "") << "\n"
       << "[scheduler]\ntoken_budget = " << o.token_budget << "\nmax_steps = " << p.max_steps << "\n";
  std::ostringstream reqs;
  std::vector<int32_t> tokens;
  for (const PlannedRequest& q : p.requests) {
    const int64_t i = q.index, L = q.prompt, O = q.output;
    const TraceRequest& r = t.requests[static_cast<size_t>(i)];
    prompt_tokens_into(r, static_cast<int32_t>(bs), L, tokens);
    const int64_t full = L / bs;
    reqs << "\n[[request]]\nid = \"t" << i << "\"\narrival_step = " << q.arrival_step << "\nprefixes = [";
    for (int64_t j = 0; j < full; ++j) {
      const int32_t id = r.blocks[static_cast<size_t>(j)];
      reqs << (j ? ", " : "") << "\"b" << id << '"';
      prefixes.try_emplace(id, tokens.begin() + j * bs, tokens.begin() + (j + 1) * bs);
    }
    reqs << "]\n";
    if (full * bs < L) {
      reqs << "tokens = ";
      token_array(reqs, tokens, static_cast<size_t>(full * bs), static_cast<size_t>(L));
      reqs << '\n';
    }
    reqs << "decode_tokens = " << O << "\n";
  }
  for (const auto& [id, toks] : prefixes) {
    body << "\n[[prefix]]\nname = \"b" << id << "\"\ntokens = ";
    token_array(body, toks, 0, toks.size());
    body << '\n';
  }
  body << reqs.str();
  return body.str();
}

}  // namespace kvsim::workload
