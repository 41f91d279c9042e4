// `kvsim mma-check [--type T] [--count N] [--targeted N] [--seed S] [--json]`:
// the real tensor-core instruction (mma.sync, inline PTX) against core's model
// of it (core/include/kvsim/core/mma_model.hpp), bit for bit, on N random and
// N targeted inner products per input type. Also reports how many of the same
// products each alternative rule (the model with one step changed) gets wrong:
// the evidence that fixed each step. Exit 0 when the model matches every
// result, 1 on any difference, 2 without a CUDA device or for bad input.
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <kvsim/core/mma_model.hpp>

#include "backends/backend.hpp"
#include "commands.hpp"
#include "numbers.hpp"

#ifndef KVSIM_HAVE_CUDA
#define KVSIM_HAVE_CUDA 0
#endif
#if KVSIM_HAVE_CUDA
#include "backends/cuda/mma_check.hpp"
#endif

namespace kvsim::cli {
namespace {

struct MmaCheckCliOptions {
  std::string type = "all";
  int64_t count = 100'000'000;
  int64_t targeted = 25'000'000;
  int64_t seed = 2026;
  int64_t alternatives_every = 8;
  std::string dump;
  bool json = false;
};

const char* instruction_name(mma::Operand op) {
  switch (op) {
    case mma::Operand::bf16: return "mma.sync.m16n8k16.f32.bf16.bf16.f32";
    case mma::Operand::fp16: return "mma.sync.m16n8k16.f32.f16.f16.f32";
    case mma::Operand::e4m3: return "mma.sync.m16n8k32.f32.e4m3.e4m3.f32";
    case mma::Operand::e5m2: return "mma.sync.m16n8k32.f32.e5m2.e5m2.f32";
  }
  return "?";
}

std::string dump_file(const std::string& prefix, mma::Operand op) {
  return prefix + "." + mma::operand_name(op) + ".bin";
}

#if KVSIM_HAVE_CUDA
using nlohmann::ordered_json;

ordered_json report_json(const cuda::MmaCheckReport& r) {
  ordered_json j;
  j["type"] = mma::operand_name(r.operand);
  j["instruction"] = instruction_name(r.operand);
  j["products"] = r.total_products();
  j["differences"] = r.total_differences();
  ordered_json families = ordered_json::array();
  for (int f = 0; f < cuda::kMmaFamilies; ++f)
    families.push_back({{"family", cuda::mma_family_name(f)}, {"products", r.products[f]}, {"differences", r.differences[f]}});
  j["families"] = families;
  j["host_model"] = {{"products", r.host_products}, {"differences", r.host_differences}};
  ordered_json alternatives = ordered_json::array();
  for (int a = 0; a < mma::kMmaRuleAlternatives; ++a)
    alternatives.push_back({{"rule", mma::mma_rule_alternative(a).step}, {"differences", r.alternative_differences[a]}});
  j["alternatives"] = {{"products", r.alternative_products}, {"rules", alternatives}};
  ordered_json firsts = ordered_json::array();
  for (const cuda::MmaVector& v : r.first_differences) {
    const int k = mma::instruction_k(r.operand);
    firsts.push_back({{"family", cuda::mma_family_name(v.family)},
                      {"a", std::vector<uint32_t>(v.a, v.a + k)},
                      {"b", std::vector<uint32_t>(v.b, v.b + k)},
                      {"c", v.c},
                      {"hardware", v.hardware},
                      {"model", v.model}});
  }
  j["first_differences"] = firsts;
  return j;
}

std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

void print_report(std::ostream& out, const cuda::MmaCheckReport& r, int64_t seed, int64_t every) {
  char line[160];
  out << "kvsim mma-check: " << mma::operand_name(r.operand) << ", " << instruction_name(r.operand) << ", seed " << seed
      << "\n";
  std::snprintf(line, sizeof line, "  %-46s %12s %10s\n", "inner products", "count", "differ");
  out << line;
  for (int f = 0; f < cuda::kMmaFamilies; ++f) {
    std::snprintf(line, sizeof line, "  %-46s %12llu %10llu\n", cuda::mma_family_name(f),
                  static_cast<unsigned long long>(r.products[f]), static_cast<unsigned long long>(r.differences[f]));
    out << line;
  }
  std::snprintf(line, sizeof line, "  %-46s %12llu %10llu\n", "all (model on the device)",
                static_cast<unsigned long long>(r.total_products()), static_cast<unsigned long long>(r.total_differences()));
  out << line;
  std::snprintf(line, sizeof line, "  %-46s %12llu %10llu\n", "model built for the host (the CPU oracle's)",
                static_cast<unsigned long long>(r.host_products), static_cast<unsigned long long>(r.host_differences));
  out << line;
  out << "  each step's alternative, on every " << every << "th tile (" << r.alternative_products
      << " inner products): differences\n";
  for (int a = 0; a < mma::kMmaRuleAlternatives; ++a) {
    std::snprintf(line, sizeof line, "    %-44s %12llu\n", mma::mma_rule_alternative(a).step,
                  static_cast<unsigned long long>(r.alternative_differences[a]));
    out << line;
  }
  const int k = mma::instruction_k(r.operand);
  for (const cuda::MmaVector& v : r.first_differences) {
    out << "  differs (" << cuda::mma_family_name(v.family) << "): c " << hex(v.c) << " hardware " << hex(v.hardware)
        << " model " << hex(v.model) << "\n    a";
    for (int i = 0; i < k; ++i) out << " " << hex(v.a[i]).substr(8 - mma::operand_bits(r.operand) / 4);
    out << "\n    b";
    for (int i = 0; i < k; ++i) out << " " << hex(v.b[i]).substr(8 - mma::operand_bits(r.operand) / 4);
    out << "\n";
  }
}
#endif

void run(const MmaCheckCliOptions& o) {
  if (o.count + o.targeted == 0)
    throw ValidationError(ErrorCode::bad_argument, "kvsim mma-check needs --count or --targeted above 0");
  std::vector<mma::Operand> types;
  for (mma::Operand op : mma::kAllOperands)
    if (o.type == "all" || o.type == mma::operand_name(op)) types.push_back(op);
  // Every dump file is writable before the device runs anything.
  for (mma::Operand op : types)
    if (!o.dump.empty() && !std::ofstream(dump_file(o.dump, op), std::ios::binary))
      throw ValidationError(ErrorCode::bad_argument, "--dump: cannot write " + dump_file(o.dump, op));
#if KVSIM_HAVE_CUDA
  bool all_equal = true;
  nlohmann::ordered_json runs = nlohmann::ordered_json::array();
  for (mma::Operand op : types) {
    cuda::MmaCheckOptions options;
    options.operand = op;
    options.random_count = static_cast<uint64_t>(o.count);
    options.targeted_count = static_cast<uint64_t>(o.targeted);
    options.seed = static_cast<uint64_t>(o.seed);
    options.alternatives_every = static_cast<int>(o.alternatives_every);
    if (!o.dump.empty()) options.dump_path = dump_file(o.dump, op);
    const cuda::MmaCheckReport report = cuda::run_mma_check(options);
    all_equal = all_equal && report.total_differences() == 0 && report.host_differences == 0;
    if (o.json) runs.push_back(report_json(report));
    else print_report(std::cout, report, o.seed, o.alternatives_every);
  }
  if (o.json) {
    nlohmann::ordered_json j;
    j["kvsim_version"] = kVersion;
    j["seed"] = o.seed;
    j["runs"] = runs;
    j["ok"] = all_equal;
    std::cout << j.dump(2) << "\n";
  }
  if (!all_equal) throw ExitStatus{kExitCheckFailed};
#else
  (void)types;
  throw BackendUnavailable("kvsim mma-check runs the tensor cores' instruction: CUDA backend not compiled in this build "
                           "(configure with -DKVSIM_CUDA=ON where nvcc is available)");
#endif
}

}  // namespace

void register_mma_check(CLI::App& app) {
  auto opts = std::make_shared<MmaCheckCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "mma-check", "Run the tensor cores' mma.sync and core's model of it on the same inner products, bit for bit");
  cmd->add_option("--type", opts->type, "Input type: bf16, fp16, e4m3, e5m2 or all (default all)")
      ->check(CLI::IsMember({"all", "bf16", "fp16", "e4m3", "e5m2"}));
  add_int_option(*cmd, "--count", opts->count, "Random inner products per type", 0, INT64_MAX / 2);
  add_int_option(*cmd, "--targeted", opts->targeted, "Targeted inner products per type", 0,
                 INT64_MAX / 2);
  add_int_option(*cmd, "--seed", opts->seed, "Seed of the generated inputs", 0, INT64_MAX);
  add_int_option(*cmd, "--alternatives-every", opts->alternatives_every,
                 "Run each alternative rule on every Nth tile of 128 products", 1, 1 << 20);
  cmd->add_option("--dump", opts->dump, "Write differing and sample vectors to DUMP.<type>.bin (for analysis)");
  cmd->add_flag("--json", opts->json, "Print one JSON object: runs (per type: families, alternatives), ok");
  cmd->callback([opts] { run(*opts); });
}

}  // namespace kvsim::cli
