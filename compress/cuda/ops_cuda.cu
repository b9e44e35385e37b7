#include "compress/cuda/ops_cuda.h"

#include <cuda_runtime.h>
#include <thrust/system/cuda/execution_policy.h>

#include <string>

#include "base/error.h"
#include "compress/cuda/stream_policy.cuh"
#include "compress/thrust/ops_algo.h"

namespace gradex::compress::cuda {
// Work is queued only: StreamPolicy's par_nosync lets Thrust return without synchronizing the
// stream; its load() is needed by the DGC step's template but never called by the dense step.

void dgc_step_dense(const thrust_dgc::StepParams& p, const float* g, float* u, float* v,
                    float* dense_out, cudaStream_t stream) {
  StreamPolicy q{stream};
  thrust_dgc::StepAlgo<StreamPolicy> algo(q, p, u, v, nullptr, nullptr, nullptr, nullptr);
  algo.run_dense(g, dense_out);
  check(cudaGetLastError(), "dgc_step_dense");
}

void from_half(const uint16_t* in, float* out, size_t n, bool bf16, float scale, bool add,
               cudaStream_t stream) {
  StreamPolicy q{stream};
  thrust_dgc::from_half(q, in, out, n, bf16, scale, add);
  check(cudaGetLastError(), "from_half");
}

size_t count_nonfinite(const float* x, size_t n, cudaStream_t stream) {
  StreamPolicy q{stream};
  return thrust_dgc::count_nonfinite(q, x, n);  // a reduction: Thrust waits for its result
}

double sum_squares(const float* x, size_t n, cudaStream_t stream) {
  StreamPolicy q{stream};
  return thrust_dgc::sum_squares(q, x, n);
}

void zero_nonfinite(float* x, size_t n, cudaStream_t stream) {
  StreamPolicy q{stream};
  thrust_dgc::zero_nonfinite(q, x, n);
  check(cudaGetLastError(), "zero_nonfinite");
}

void apply_momentum(float* g, float* u, size_t n, float m, bool nesterov, float grad_scale,
                    cudaStream_t stream) {
  StreamPolicy q{stream};
  thrust_dgc::apply_momentum(q, g, u, n, m, nesterov, grad_scale);
  check(cudaGetLastError(), "apply_momentum");
}

void scatter_add(const uint32_t* idx, const float* val, size_t count, float* out, float scale,
                 cudaStream_t stream) {
  StreamPolicy q{stream};
  thrust_dgc::scatter_add(q, idx, val, count, out, scale);
  check(cudaGetLastError(), "scatter_add");
}

}  // namespace gradex::compress::cuda
