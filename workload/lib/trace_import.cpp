// Trace window -> scenario file: see trace_import.hpp for the mapping.
#include "kvsim/workload/trace_import.hpp"

#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>

#include <kvsim/core/errors.hpp>

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

std::string trace_scenario_toml(const Trace& t, const TraceImportOptions& o) {
  const TraceWindow w = select_window(t, o.requests, o.time);
  const int64_t B = t.block_tokens;
  const int64_t bs = scaled_block(t, o.scale);
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
  const double t0 = t.requests[static_cast<size_t>(w.begin)].arrival_ms;
  int64_t pages_all = 0, last_step = 0;
  std::map<int32_t, std::vector<int32_t>> prefixes;  // dense block id -> its Bs tokens
  for (int64_t i = w.begin; i < w.end; ++i) {
    const TraceRequest& r = t.requests[static_cast<size_t>(i)];
    const int64_t L = scaled(r.input_length, bs, B), O = scaled(r.output_length, bs, B);
    pages_all += (L + O + o.page_size - 1) / o.page_size;
    last_step = std::max<int64_t>(last_step, static_cast<int64_t>(std::floor((r.arrival_ms - t0) / o.step_ms)));
  }
  const int64_t primary = o.primary_blocks > 0 ? o.primary_blocks : std::max<int64_t>(pages_all, 1);

  std::ostringstream body;
  body << "# Imported from " << t.source << " (" << trace_format_name(t.format) << ", " << B
       << "-token trace blocks): requests " << w.begin << ".." << w.end - 1 << " of " << t.requests.size()
       << " in arrival order.\n"
       << "# Mapping: lengths x " << o.scale << " (a trace block is " << bs
       << " tokens), one [[prefix]] per distinct trace block, arrival_step = floor((arrival - " << t0 << " ms) / "
       << o.step_ms << " ms).\n"
       << "# Written by `kvsim trace import` (docs/traces.md).\n";
  if (!o.model_toml.empty()) body << "\n# [model] from " << o.model_source << "\n" << o.model_toml << "\n";
  body << "\n[cache]\npage_size = " << o.page_size << "\nprimary_blocks = " << primary << "\n\n[reuse]\nenabled = true\n\n"
       << "[scheduler]\ntoken_budget = " << o.token_budget << "\nmax_steps = " << std::max<int64_t>(100000, last_step + 100000)
       << "\n";
  std::ostringstream reqs;
  std::vector<int32_t> tokens;
  for (int64_t i = w.begin; i < w.end; ++i) {
    const TraceRequest& r = t.requests[static_cast<size_t>(i)];
    const int64_t L = scaled(r.input_length, bs, B), O = scaled(r.output_length, bs, B);
    prompt_tokens_into(r, static_cast<int32_t>(bs), L, tokens);
    const int64_t full = L / bs;
    reqs << "\n[[request]]\nid = \"t" << i << "\"\narrival_step = "
         << static_cast<int64_t>(std::floor((r.arrival_ms - t0) / o.step_ms)) << "\nprefixes = [";
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
