// Plain parameter and result structs of the Thrust DGC step, shared by the OpenMP build
// (thrust/dgc_thrust_omp.h) and the CUDA launchers (cuda/dgc_cuda.h). No Thrust or CUDA types.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"
#include "compress/options.h"

namespace gradex::compress::thrust_dgc {

struct StepParams {
  size_t n = 0;
  size_t k = 0, low = 0, high = 0, cap = 0;  // dgc::count_bounds
  size_t cand_cap = 0;                       // candidate buffer (>= high)
  float momentum = 0;                        // 0: no momentum buffer (u may be null)
  bool nesterov = false;
  double clip_limit = 0;  // clip_norm / sqrt(world_size); 0: off
  float grad_scale = 1;   // the caller's factor on g (applied after the clipping factor)
  size_t sample_m = 0, sample_stride = 1, sample_offset = 0, sample_rank = 1;  // dgc::plan_sample
  int max_rounds = 10;
  bool exact = false;
  DType value_dtype = DType::kFloat32;
};

struct StepResult {
  size_t count = 0;     // selected elements written to the outputs
  float threshold = 0;  // smallest selected |v|; +inf when none
  int rounds = 0;
  bool exact = false;
  size_t saturated = 0;
  float grad_scale = 1;
};

// Same parameters as DgcCompressor's step `step` with these options (strided sampling).
StepParams make_step_params(const DgcOptions& options, size_t n, uint64_t step);

struct CastCounts {
  size_t saturated = 0;
  size_t nonfinite = 0;
};

}  // namespace gradex::compress::thrust_dgc
