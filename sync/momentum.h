// gradex-owned momentum outside DGC's sparse steps. With GRADEX_MOMENTUM = m > 0 gradex applies
// momentum to every gradient it handles (the optimizer runs with momentum 0), so that dense-policy
// tensors, DGC's dense warm-up steps and LocalSGD's local phase all train like SGD with momentum:
//   u <- m*u + s*g;  g <- u            (Nesterov: g <- s*g + m*u, with the new u)
// where s is the step's clipping factor. Averaging is linear, so sending u and averaging gives
// exactly the momentum of the averaged gradient (up to fp32 rounding) on every rank.
#pragma once

#include <cstdint>

namespace gradex::sync {

struct MomentumParams {
  float momentum = 0;  // m in [0, 1); 0: g <- s*g only (u is not touched and may be null)
  bool nesterov = false;
  float grad_scale = 1.0f;  // s: clipping factor
};

// Applies one step in place to n fp32 values of g, updating u (n floats). Computed in fp32, so a
// caller that sends 16-bit values casts only the result.
void apply_momentum(float* g, float* u, uint64_t n, const MomentumParams& p);

// Scales n values by s (no-op for s == 1).
void scale_values(float* g, uint64_t n, float s);

// Norm clipping (GRADEX_CLIP_NORM, as the DGC paper's local clipping): the factor that brings a
// gradient of L2 norm `norm` down to clip_norm / sqrt(world_size); 1 when it is already within,
// and when the norm is not finite (then the non-finite gradient is skipped everywhere instead).
float clip_scale_for_norm(double clip_norm, int world_size, double norm);

// L2 norm of n fp32 values (double accumulation).
double l2_norm(const float* g, uint64_t n);

}  // namespace gradex::sync
