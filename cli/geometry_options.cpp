#include "geometry_options.hpp"

#include <optional>

#include "numbers.hpp"

namespace kvsim::cli {
namespace {

// A CLI11 validator that accepts exactly what a core parse_* function accepts,
// so the flag spellings never drift from core.
template <typename Parse>
CLI::Validator core_name_validator(Parse parse, std::string choices) {
  return CLI::Validator(
      [parse, choices](std::string& value) -> std::string {
        if (parse(value)) return {};
        return "'" + value + "' is not one of " + choices;
      },
      choices);
}

// A flag naming a core value (a layout, a dtype, an engine), checked by core's parser of it.
template <typename Parse>
CLI::Option* add_name_option(CLI::App& cmd, const std::string& flag, std::string& value, const std::string& help,
                             Parse parse, const std::string& choices) {
  return cmd.add_option(flag, value, help)->check(core_name_validator(parse, choices));
}

}  // namespace

void add_geometry_options(CLI::App& cmd, GeometryOptions& opts) {
  const std::string group = "Geometry";
  add_name_option(cmd, "--layout", opts.layout, "Element order inside a block", parse_layout, "nhd|hnd|split-x")
      ->capture_default_str()
      ->group(group);
  add_name_option(cmd, "--placement", opts.placement,
                  "Layer placement: in_block (TensorRT-LLM) or per_layer (FlashInfer/vLLM)", parse_placement,
                  "in_block|per_layer")
      ->capture_default_str()
      ->group(group);
  // Numbers go through numbers.hpp (decimal only); their ranges are core's
  // validate_geometry, which names the field and the rule.
  add_int_option(cmd, "--layers", opts.layers, "Layers L")->group(group);
  add_int_option(cmd, "--kv-factor", opts.kv_factor, "2 = separate K and V, 1 = one latent tensor (MLA)")->group(group);
  add_int_option(cmd, "--kv-heads", opts.kv_heads, "KV heads H")->group(group);
  add_int_option(cmd, "--head-dim", opts.head_dim, "Head dimension D")->group(group);
  add_int_option(cmd, "--page-size", opts.page_size, "Tokens per block P (1..1024)")->group(group);
  add_name_option(cmd, "--dtype", opts.dtype, "Cache dtype", parse_dtype, "fp32|fp16|bf16|fp8_e4m3|fp8_e5m2|int8|nvfp4")
      ->capture_default_str()
      ->group(group);
  add_int_option(cmd, "--blocks", opts.blocks, "Primary pool blocks")->group(group);
  add_int_option(cmd, "--secondary-blocks", opts.secondary_blocks, "Secondary (offload) pool blocks")->group(group);
  add_name_option(cmd, "--engine", opts.engine,
                  "An engine's own KV tensors (docs/index-arithmetic.md, Engine tensor presets): sets --layout "
                  "(flashinfer keeps NHD or HND) and --placement",
                  parse_engine, engine_choices())
      ->group(group);
}

std::optional<Engine> engine_option(const GeometryOptions& opts) {
  if (opts.engine.empty()) return std::nullopt;
  return parse_engine(opts.engine).value();  // the validator accepted it
}

PoolGeometry make_geometry(const GeometryOptions& opts) {
  // The validators above already accepted these names; value() cannot fail.
  const PoolGeometry g{.layers = opts.layers,
                       .kv_factor = opts.kv_factor,
                       .kv_heads = opts.kv_heads,
                       .tokens_per_block = opts.page_size,
                       .head_dim = opts.head_dim,
                       .dtype = parse_dtype(opts.dtype).value(),
                       .layout = parse_layout(opts.layout).value(),
                       .placement = parse_placement(opts.placement).value(),
                       .primary_blocks = opts.blocks,
                       .secondary_blocks = opts.secondary_blocks};
  validate_geometry(g);
  return g;
}

Json geometry_json(const PoolGeometry& g) {
  return Json{{"layers", g.layers},         {"kv_factor", g.kv_factor},
              {"kv_heads", g.kv_heads},     {"tokens_per_block", g.tokens_per_block},
              {"head_dim", g.head_dim},     {"dtype", std::string(dtype_name(g.dtype))},
              {"layout", std::string(layout_name(g.layout))}, {"placement", std::string(placement_name(g.placement))},
              {"primary_blocks", g.primary_blocks}, {"secondary_blocks", g.secondary_blocks}};
}

Json inner_strides_json(const InnerStrides& s) {
  return Json{{"head", s.head}, {"token", s.token}, {"dim_outer", s.dim_outer}, {"dim_inner", s.dim_inner}, {"x", s.x}};
}

Json strides_json(const PoolStrides& s, int32_t kv_factor) {
  const Json inner{{"k", inner_strides_json(s.inner[0])},
                   {"v", kv_factor == 2 ? inner_strides_json(s.inner[1]) : Json(nullptr)}};
  return Json{{"block", s.block}, {"layer", s.layer}, {"kv", s.kv}, {"inner", inner}};
}

Json axes_json(const std::vector<Axis>& axes) {
  Json list = Json::array();
  for (const Axis& a : axes) list.push_back(Json{{"name", a.name}, {"extent", a.extent}, {"stride", a.stride}});
  return list;
}

Json engine_json(const EngineLayout& l) {
  Json tensors = Json::array();
  for (const EngineTensor& t : l.tensors) {
    Json axes = Json::array();
    for (const EngineTensorAxis& a : t.axes) axes.push_back(Json{{"name", a.name}, {"extent", a.extent}, {"stride", a.stride}});
    tensors.push_back(Json{{"name", t.name},
                           {"per_layer", t.per_layer},
                           {"holds", t.kv < 0 ? "K and V" : t.kv == 0 ? "K" : "V"},
                           {"elements", t.elements()},
                           {"axes", axes}});
  }
  Json j;
  j["name"] = std::string(engine_name(l.engine));
  j["tensors"] = tensors;
  j["allocation_elements"] = l.allocation_elements;
  j["allocation_strides"] = strides_json(l.strides, l.geometry.kv_factor);
  return j;
}

}  // namespace kvsim::cli
