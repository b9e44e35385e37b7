// DiLoCo's settings (GRADEX_OUTER_*), read from the registry and cross-checked.
#pragma once

#include <cstdint>

#include "base/config.h"
#include "compress/options.h"
#include "compress/quant/quant.h"

namespace gradex::outer {

struct OuterOptions {
  int64_t period = 100;  // H
  double lr = 0.7;
  double momentum = 0.9;
  bool nesterov = true;
  int64_t fragments = 1;  // F
  int64_t delay = 0;      // steps between an exchange's start and its merge, < period
  double mixing = 0.0;    // a: theta_local = (1 - a) * theta_global + a * theta_local at a merge
  int bits = 4;           // 4, 8 or 32 (exact fp32); 0 with topk
  bool topk = false;      // GRADEX_OUTER_BITS=topk: DGC top-k of delta, allgathered
  double density = 0.01;  // topk: fraction of a fragment's elements sent per sync
  compress::WireOptions wire;           // topk: index coding, zstd (GRADEX_INDEX_CODING, ...)
  compress::quant::QuantOptions quant;  // bits 4/8: block, scale type, rounding, seed
};

// From GRADEX_OUTER_*; ConfigError naming the variable when values do not fit together (delay
// not below the period, an odd block).
OuterOptions outer_options_from_config(const config::Config& config);

}  // namespace gradex::outer
