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
  return backend::step_info_of(step, dgc::sparsity_at(options, step), r.count, r);
}

}  // namespace gradex::compress::thrust_dgc
