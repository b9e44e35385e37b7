// The Thrust-on-OpenMP backend: the CUDA backend's algorithms (dgc_algo.h, ops_algo.h) compiled for
// Thrust's OpenMP system over host memory. It exists so that CI runs the GPU code paths, operation
// by operation, against the CPU backend on machines without a GPU.
#pragma once

#include "compress/backend/backend.h"

namespace gradex::compress::backend {

BackendPtr make_thrust_omp_backend();

}  // namespace gradex::compress::backend
