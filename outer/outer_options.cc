#include "outer/outer_options.h"

#include <string>

#include "base/error.h"

namespace gradex::outer {

OuterOptions outer_options_from_config(const config::Config& c) {
  OuterOptions o;
  o.period = c.get_int("GRADEX_OUTER_PERIOD");
  o.lr = c.get_float("GRADEX_OUTER_LR");
  o.momentum = c.get_float("GRADEX_OUTER_MOMENTUM");
  o.nesterov = c.get_bool("GRADEX_OUTER_NESTEROV");
  o.fragments = c.get_int("GRADEX_OUTER_FRAGMENTS");
  o.delay = c.get_int("GRADEX_OUTER_DELAY");
  o.mixing = c.get_float("GRADEX_OUTER_MIXING");
  const std::string bits = c.get_string("GRADEX_OUTER_BITS");
  o.topk = bits == "topk";
  o.bits = o.topk ? 0 : std::stoi(bits);
  o.density = c.get_float("GRADEX_OUTER_DENSITY");
  o.wire = compress::wire_options_from_config(c);
  o.quant.bits = o.bits == 32 || o.topk ? 8 : o.bits;
  o.quant.block = static_cast<size_t>(c.get_int("GRADEX_OUTER_BLOCK"));
  o.quant.scale = c.get_string("GRADEX_OUTER_SCALE") == "fp16"
                      ? compress::quant::ScaleType::kFloat16
                      : compress::quant::ScaleType::kFloat32;
  o.quant.rounding = c.get_string("GRADEX_OUTER_ROUNDING") == "stochastic"
                         ? compress::quant::Rounding::kStochastic
                         : compress::quant::Rounding::kNearest;
  o.quant.seed = static_cast<uint64_t>(c.get_int("GRADEX_OUTER_SEED"));
  if (o.delay >= o.period)
    throw ConfigError("GRADEX_OUTER_DELAY=" + std::to_string(o.delay) +
                      " must be below GRADEX_OUTER_PERIOD=" + std::to_string(o.period) +
                      " (a fragment's exchange must merge before its next one starts)");
  if (o.quant.block % 2 != 0)
    throw ConfigError("GRADEX_OUTER_BLOCK=" + std::to_string(o.quant.block) +
                      " must be even (4-bit codes are packed two per byte)");
  return o;
}

}  // namespace gradex::outer
