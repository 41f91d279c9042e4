// `kvsim codec`: core's bit-exact number codecs (contract §4) one value at a time.
//   encode --format F VALUE...   one hex code per value
//   decode --format F CODE...    one value per code (%.9g round-trips fp32;
//                                 nan, inf, -inf, -0 spelled out)
//   nvfp4 --global-scale G V1..V16   the E4M3 scale byte and 8 packed bytes
// With no values on the command line they are read one per line from stdin.
// Values parse with strtof syntax (nan, inf, hex floats), codes as decimal or
// 0x-hex, both through numbers.hpp. A value starting with '-'
// followed by a letter (-inf, -nan) looks like a flag to CLI11: put `--`
// before the values.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "kvsim/validation.hpp"
#include "numbers.hpp"

namespace kvsim::cli {
namespace {

enum class Format { e4m3, e4m3_nosat, e5m2, e5m2_nosat, e2m1, bf16, fp16, int8 };

struct FormatInfo {
  const char* name;
  Format format;
  int hex_digits;     // printed width of a code
  uint32_t max_code;  // largest code
};

constexpr FormatInfo kFormats[] = {
    {"e4m3", Format::e4m3, 2, 0xFF},       {"e4m3-nosat", Format::e4m3_nosat, 2, 0xFF},
    {"e5m2", Format::e5m2, 2, 0xFF},       {"e5m2-nosat", Format::e5m2_nosat, 2, 0xFF},
    {"e2m1", Format::e2m1, 1, 0xF},        {"bf16", Format::bf16, 4, 0xFFFF},
    {"fp16", Format::fp16, 4, 0xFFFF},     {"int8", Format::int8, 2, 0xFF},
};

const FormatInfo& format_info(const std::string& name) {
  for (const FormatInfo& f : kFormats)
    if (name == f.name) return f;
  fail(ErrorCode::bad_argument, "unknown format '" + name + "'");  // CLI11's IsMember rejects it first
}

std::vector<std::string> format_names() {
  std::vector<std::string> names;
  for (const FormatInfo& f : kFormats) names.emplace_back(f.name);
  return names;
}

std::string trim(const std::string& s) {
  const auto first = s.find_first_not_of(" \t\r");
  if (first == std::string::npos) return {};
  const auto last = s.find_last_not_of(" \t\r");
  return s.substr(first, last - first + 1);
}

// One input and the name its errors use: "value 2" (command line) or
// "stdin line 7".
struct Input {
  std::string label;
  std::string text;
};

// The command-line values, or one per non-blank stdin line when none were
// given (blanks around a line are ignored; a NUL byte inside one is an error
// of the number parser, never a silent cut).
std::vector<Input> inputs_or_stdin(const std::vector<std::string>& args) {
  std::vector<Input> inputs;
  if (!args.empty()) {
    for (size_t i = 0; i < args.size(); ++i) inputs.push_back({"value " + std::to_string(i + 1), args[i]});
    return inputs;
  }
  std::string line;
  for (int64_t n = 1; std::getline(std::cin, line); ++n) {
    const std::string t = trim(line);
    if (!t.empty()) inputs.push_back({"stdin line " + std::to_string(n), t});
  }
  return inputs;
}

std::string hex(uint32_t code, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*x", digits, code);
  return buf;
}

// A code: 0x-hex or decimal, in [0, max_code]; int8 also takes -128..-1.
uint32_t parse_code(const Input& in, const FormatInfo& f) {
  const int64_t lo = f.format == Format::int8 ? -128 : 0;
  return static_cast<uint32_t>(parse_int(in.label, in.text, lo, f.max_code, IntSyntax::decimal_or_hex)) & f.max_code;
}

// Round-trippable fp32 text: 9 significant digits, special values spelled out.
std::string format_value(float v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0.0f) return std::signbit(v) ? "-0" : "0";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}

uint32_t encode(float v, Format f) {
  using namespace codec;
  switch (f) {
    case Format::e4m3: return f32_to_e4m3(v, Saturation::finite);
    case Format::e4m3_nosat: return f32_to_e4m3(v, Saturation::none);
    case Format::e5m2: return f32_to_e5m2(v, Saturation::finite);
    case Format::e5m2_nosat: return f32_to_e5m2(v, Saturation::none);
    case Format::e2m1: return f32_to_e2m1(v);
    case Format::bf16: return f32_to_bf16(v);
    case Format::fp16: return f32_to_f16(v);
    case Format::int8: return static_cast<uint8_t>(f32_to_int8(v));
  }
  return 0;
}

float decode(uint32_t code, Format f) {
  using namespace codec;
  switch (f) {
    case Format::e4m3:
    case Format::e4m3_nosat: return e4m3_to_f32(static_cast<uint8_t>(code));
    case Format::e5m2:
    case Format::e5m2_nosat: return e5m2_to_f32(static_cast<uint8_t>(code));
    case Format::e2m1: return e2m1_to_f32(static_cast<uint8_t>(code));
    case Format::bf16: return bf16_to_f32(static_cast<uint16_t>(code));
    case Format::fp16: return f16_to_f32(static_cast<uint16_t>(code));
    case Format::int8: return int8_to_f32(static_cast<int8_t>(static_cast<uint8_t>(code)));
  }
  return 0.0f;
}

struct CodecOptions {
  std::string format;
  std::string global_scale;
  std::vector<std::string> values;
};

void add_values(CLI::App* cmd, CodecOptions& o, const char* what) {
  cmd->add_option("values", o.values, std::string(what) + " (none: read one per line from stdin)");
  cmd->footer("Values that start with '-' and a letter (-inf, -nan) look like flags: put -- before the values.");
}

}  // namespace

void register_codec(CLI::App& app) {
  CLI::App* codec_cmd = app.add_subcommand("codec", "Bit-exact codecs: encode, decode, nvfp4 block quantization");
  codec_cmd->require_subcommand(1);

  auto enc = std::make_shared<CodecOptions>();
  CLI::App* encode_cmd = codec_cmd->add_subcommand("encode", "fp32 values -> codes (one hex code per line)");
  encode_cmd->add_option("--format", enc->format, "Target format")->required()->check(CLI::IsMember(format_names()));
  add_values(encode_cmd, *enc, "fp32 values (strtof syntax)");
  encode_cmd->callback([enc]() {
    const FormatInfo& f = format_info(enc->format);
    // Every input is parsed before anything is printed: a failing command prints nothing on stdout.
    std::string out;
    for (const Input& in : inputs_or_stdin(enc->values))
      out += hex(encode(parse_fp32(in.label, in.text), f.format), f.hex_digits) + '\n';
    std::cout << out;
  });

  auto dec = std::make_shared<CodecOptions>();
  CLI::App* decode_cmd = codec_cmd->add_subcommand("decode", "codes -> fp32 values (%.9g, nan, inf, -inf, -0)");
  decode_cmd->add_option("--format", dec->format, "Source format")->required()->check(CLI::IsMember(format_names()));
  add_values(decode_cmd, *dec, "codes (0x-hex or decimal)");
  decode_cmd->callback([dec]() {
    const FormatInfo& f = format_info(dec->format);
    std::string out;
    for (const Input& in : inputs_or_stdin(dec->values)) out += format_value(decode(parse_code(in, f), f.format)) + '\n';
    std::cout << out;
  });

  auto fp4 = std::make_shared<CodecOptions>();
  CLI::App* nvfp4_cmd = codec_cmd->add_subcommand(
      "nvfp4", "Quantize 16 values to one nvfp4 block: scale byte, then 8 packed bytes (element 2i low nibble)");
  nvfp4_cmd->add_option("--global-scale", fp4->global_scale, "Global decode scale g (finite, > 0; strtof syntax)")
      ->required();
  add_values(nvfp4_cmd, *fp4, "exactly 16 fp32 values");
  nvfp4_cmd->callback([fp4]() {
    const float g = parse_fp32("--global-scale", fp4->global_scale);
    if (!std::isfinite(g) || !(g > 0.0f))
      fail(ErrorCode::bad_global_scale,
           "global scale " + format_value(g) + ": rule: the nvfp4 global scale must be finite and > 0");
    const std::vector<Input> inputs = inputs_or_stdin(fp4->values);
    if (inputs.size() != static_cast<size_t>(codec::kNvfp4BlockElems))
      fail(ErrorCode::shape_mismatch, "got " + std::to_string(inputs.size()) + " values: rule: one nvfp4 block is " +
                                          std::to_string(codec::kNvfp4BlockElems) + " values");
    float x[codec::kNvfp4BlockElems];
    for (int i = 0; i < codec::kNvfp4BlockElems; ++i) x[i] = parse_fp32(inputs[i].label, inputs[i].text);
    uint8_t packed[codec::kNvfp4BlockElems / 2];
    const uint8_t scale = codec::nvfp4_quantize16(x, g, packed);
    std::cout << "scale " << hex(scale, 2) << '\n' << "packed";
    for (uint8_t b : packed) std::cout << ' ' << hex(b, 2);
    std::cout << '\n' << "decoded";
    for (int i = 0; i < codec::kNvfp4BlockElems; ++i)
      std::cout << ' ' << format_value(codec::nvfp4_decode(codec::nibble_at(packed, i), scale, g));
    std::cout << '\n';
    std::cout.flush();
  });
}

}  // namespace kvsim::cli
