// The backend report of one Thrust DGC step, shared by the backends that run it (thrust-omp and
// CUDA): which step ran at which target sparsity, and what the selection found.
#pragma once

#include <cstdint>

#include "compress/backend/backend.h"
#include "compress/dgc/schedule.h"
#include "compress/thrust/dgc_params.h"

namespace gradex::compress::thrust_dgc {

inline backend::DgcStepInfo step_info(const StepResult& r, const DgcOptions& options,
                                      uint64_t step) {
  backend::DgcStepInfo info;
  info.step = step;
  info.sparsity = dgc::sparsity_at(options, step);
  info.count = r.count;
  info.threshold = r.threshold;
  info.rounds = r.rounds;
  info.exact = r.exact;
  info.saturated = r.saturated;
  return info;
}

}  // namespace gradex::compress::thrust_dgc
