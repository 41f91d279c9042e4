// libFuzzer target: the codec text parsers of `kvsim codec` (numbers.hpp's
// parse_fp32 for values, parse_int with 0x-hex for codes) followed by every
// codec of core. A value that parses encodes to a code in range for every
// format; decoding that code and encoding again gives the same code (codes
// are fixed points, NaN codes stay NaN); a code that parses decodes, and
// every format's decode of it re-encodes to a code of equal value.
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kvsim/core/codecs.hpp"
#include "kvsim/validation/errors.hpp"
#include "numbers.hpp"

using namespace kvsim;
using namespace kvsim::cli;
using namespace kvsim::codec;

namespace {

bool same_value(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

void check_value(float x) {
  const uint8_t e4 = f32_to_e4m3(x, Saturation::finite), e5 = f32_to_e5m2(x, Saturation::finite);
  const uint8_t e4n = f32_to_e4m3(x, Saturation::none), e5n = f32_to_e5m2(x, Saturation::none);
  const uint8_t e2 = f32_to_e2m1(x);
  if (e2 > 0xF) std::abort();
  if (f32_to_e4m3(e4m3_to_f32(e4), Saturation::finite) != e4) std::abort();
  if (f32_to_e5m2(e5m2_to_f32(e5), Saturation::finite) != e5) std::abort();
  if (!same_value(e4m3_to_f32(f32_to_e4m3(e4m3_to_f32(e4n), Saturation::none)), e4m3_to_f32(e4n))) std::abort();
  if (!same_value(e5m2_to_f32(f32_to_e5m2(e5m2_to_f32(e5n), Saturation::none)), e5m2_to_f32(e5n))) std::abort();
  if (f32_to_e2m1(e2m1_to_f32(e2)) != e2) std::abort();
  const uint16_t b = f32_to_bf16(x), h = f32_to_f16(x);
  if (!same_value(bf16_to_f32(f32_to_bf16(bf16_to_f32(b))), bf16_to_f32(b))) std::abort();
  if (!same_value(f16_to_f32(f32_to_f16(f16_to_f32(h))), f16_to_f32(h))) std::abort();
  const int8_t i = f32_to_int8(x);
  if (f32_to_int8(int8_to_f32(i)) != i) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const bool as_code = in.ConsumeBool();
  const std::string text = in.ConsumeRemainingBytesAsString();
  try {
    if (!as_code) {
      check_value(parse_fp32("value 1", text));
    } else {
      const int64_t code = parse_int("value 1", text, -128, 0xFFFF, IntSyntax::decimal_or_hex);
      const uint32_t u = static_cast<uint32_t>(code);
      for (float v : {e4m3_to_f32(static_cast<uint8_t>(u)), e5m2_to_f32(static_cast<uint8_t>(u)),
                      e2m1_to_f32(static_cast<uint8_t>(u & 0xF)), bf16_to_f32(static_cast<uint16_t>(u)),
                      f16_to_f32(static_cast<uint16_t>(u)), int8_to_f32(static_cast<int8_t>(static_cast<uint8_t>(u)))})
        check_value(v);
    }
  } catch (const ValidationError& e) {
    if (e.code() != ErrorCode::bad_argument) std::abort();
  }
  return 0;
}
