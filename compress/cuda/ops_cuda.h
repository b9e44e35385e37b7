// CUDA launchers of the device backend's element-wise operations and the dense DGC step (built
// into gradex_compress_cuda with the DGC step of dgc_cuda.h). A plain host header: all pointers are
// device pointers, and every call is queued on `stream` and returns without waiting, except
// count_nonfinite, which returns a count (it waits for its own work on the stream only).
#pragma once

#include <cstddef>
#include <cstdint>

#include "compress/cuda/dgc_cuda.h"

namespace gradex::compress::cuda {

// The dense DGC step of thrust_dgc::StepAlgo::run_dense (u may be null when momentum is 0).
// Waits for the stream only when clipping needs the gradient's norm.
void dgc_step_dense(const thrust_dgc::StepParams& p, const float* g, float* u, float* v,
                    float* dense_out, cudaStream_t stream);

// out[i] = from16(in[i]) * scale (or out[i] += that when add).
void from_half(const uint16_t* in, float* out, size_t n, bool bf16, float scale, bool add,
               cudaStream_t stream);

// NaN or Inf elements of x.
size_t count_nonfinite(const float* x, size_t n, cudaStream_t stream);

// Sum of squares in double (a reduction: waits for its result on the stream).
double sum_squares(const float* x, size_t n, cudaStream_t stream);

// x[i] <- 0 where x[i] is NaN or Inf.
void zero_nonfinite(float* x, size_t n, cudaStream_t stream);

// thrust_dgc::apply_momentum (sync/momentum.h's step) in place; u may be null when m is 0.
void apply_momentum(float* g, float* u, size_t n, float m, bool nesterov, float grad_scale,
                    cudaStream_t stream);

// out[idx[j]] += scale * val[j]; idx strictly increasing (one thread per element, no conflicts).
void scatter_add(const uint32_t* idx, const float* val, size_t count, float* out, float scale,
                 cudaStream_t stream);

}  // namespace gradex::compress::cuda
