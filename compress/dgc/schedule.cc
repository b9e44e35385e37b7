#include "compress/dgc/schedule.h"

#include <algorithm>
#include <cmath>

namespace gradex::compress::dgc {

double sparsity_at(const DgcOptions& o, uint64_t step) {
  if (!o.schedule.empty()) return step < o.schedule.size() ? o.schedule[step] : o.sparsity;
  if (o.warmup_steps <= 0 || step >= static_cast<uint64_t>(o.warmup_steps)) return o.sparsity;
  // The paper's exponential ramp: density divides by 4 per stage (0.996 is its rounding of
  // 1 - 4^-4). Stages never exceed the target, so a low target simply ends the ramp early.
  static constexpr double kRamp[4] = {0.75, 0.9375, 0.984375, 0.996};
  uint64_t stage = step * 4 / static_cast<uint64_t>(o.warmup_steps);
  return std::min(kRamp[stage], o.sparsity);
}

size_t target_count(size_t numel, double sparsity) {
  if (numel == 0) return 0;
  double k = std::round((1.0 - sparsity) * static_cast<double>(numel));
  return std::clamp<size_t>(static_cast<size_t>(k), 1, numel);
}

CountBounds count_bounds(const DgcOptions& o, size_t numel, double sparsity) {
  CountBounds b;
  b.k = target_count(numel, sparsity);
  b.low = std::max<size_t>(1, static_cast<size_t>(std::ceil(o.accept_low * b.k)));
  b.high = std::min(numel, static_cast<size_t>(std::floor(o.accept_high * b.k)));
  b.high = std::max(b.high, b.k);
  b.cap = o.max_selected > 0 ? std::min(o.max_selected, numel) : b.high;
  b.high = std::min(b.high, b.cap);
  b.k = std::min(b.k, b.cap);
  b.low = std::min(b.low, b.k);
  return b;
}

}  // namespace gradex::compress::dgc
