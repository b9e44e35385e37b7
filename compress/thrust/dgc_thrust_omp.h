// The Thrust DGC step and casts built for the CPU on Thrust's OpenMP backend: the same algorithm
// source as the CUDA kernels (thrust/dgc_algo.h), callable on host memory. Exists so that the GPU
// algorithm is tested against the CPU kernels on machines without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include "compress/thrust/dgc_params.h"

namespace gradex::compress::thrust_dgc {

// One DGC step over host arrays: g (n), u (n, or null when momentum is 0), v (n) are updated;
// out_idx and out_val must hold p.cap elements. Scratch is allocated internally.
StepResult omp_step(const StepParams& p, const float* g, float* u, float* v, uint32_t* out_idx,
                    float* out_val);

// out[i] = to16(in[i] * scale) with the counts of compress::half::to_half.
CastCounts omp_to_half(const float* in, uint16_t* out, size_t n, DType type, float scale);

}  // namespace gradex::compress::thrust_dgc
