#include "sync/momentum.h"

#include <cmath>

#include "compress/dgc/kernels.h"

namespace gradex::sync {

void apply_momentum(float* __restrict g, float* __restrict u, uint64_t n, const MomentumParams& p) {
  const float m = p.momentum, s = p.grad_scale;
  if (m == 0.0f) {
    scale_values(g, n, s);
    return;
  }
  // The same operation order as DGC's update kernel (compress/dgc/kernels.cc), so a tensor that
  // moves between the two paths sees identical arithmetic.
  if (p.nesterov) {
    for (uint64_t i = 0; i < n; ++i) {
      const float gi = g[i] * s;
      const float ui = m * u[i] + gi;
      u[i] = ui;
      g[i] = gi + m * ui;
    }
  } else {
    for (uint64_t i = 0; i < n; ++i) {
      const float ui = m * u[i] + g[i] * s;
      u[i] = ui;
      g[i] = ui;
    }
  }
}

void scale_values(float* g, uint64_t n, float s) {
  if (s == 1.0f) return;
  for (uint64_t i = 0; i < n; ++i)
    g[i] *= s;
}

float clip_scale_for_norm(double clip_norm, int world_size, double norm) {
  const double limit = clip_norm / std::sqrt(static_cast<double>(world_size));
  if (!(norm > limit) || !std::isfinite(norm)) return 1.0f;
  return static_cast<float>(limit / norm);
}

double l2_norm(const float* g, uint64_t n) {
  return std::sqrt(compress::dgc::sum_squares(g, 0, n));
}

}  // namespace gradex::sync
