// LocalSGD schedule (post-local SGD): `warmup_steps` fully synchronous steps, then gradients stay
// local and parameters are averaged every `period` steps. Steps are counted by gradex_end_step().
//
// Combination with DGC: during the synchronous warm-up, gradients follow the normal policy (dense,
// fp16 or DGC per tensor); in the local phase no gradient is exchanged, so DGC's residual is left
// untouched.
//
// Momentum: whoever owns momentum owns it in every phase. With GRADEX_MOMENTUM = m > 0 (optimizer
// at momentum 0) the engine applies this rank's momentum to each local-phase gradient in place
// (g <- u = m*u + g, Nesterov g + m*u), continuing the u of the synchronous phase (DGC's u for DGC
// tensors), so local steps train like SGD with momentum. With GRADEX_MOMENTUM = 0 local gradients
// are left exactly as they are and the optimizer's own momentum applies.
#pragma once

#include <cstdint>

namespace gradex::sync {

class LocalSgdSchedule {
 public:
  LocalSgdSchedule(int64_t period, int64_t warmup_steps) : period_(period), warmup_(warmup_steps) {}

  bool enabled() const { return period_ > 0; }
  // Whether gradients submitted in step `completed_steps` (0-based) are exchanged.
  bool exchanges_gradients(uint64_t completed_steps) const {
    return !enabled() || completed_steps < static_cast<uint64_t>(warmup_);
  }
  // Whether parameters are averaged after the step that brings the count to `completed_steps`.
  bool average_after(uint64_t completed_steps) const {
    if (!enabled() || completed_steps <= static_cast<uint64_t>(warmup_)) return false;
    return (completed_steps - static_cast<uint64_t>(warmup_)) % static_cast<uint64_t>(period_) == 0;
  }

 private:
  int64_t period_;
  int64_t warmup_;
};

}  // namespace gradex::sync
