#include "compress/cuda/dgc_cuda.h"

#include <cuda_runtime.h>
#include <thrust/system/cuda/execution_policy.h>

#include <string>

#include "base/error.h"
#include "compress/cuda/stream_policy.cuh"
#include "compress/thrust/dgc_algo.h"

namespace gradex::compress::cuda {
namespace {

size_t align256(size_t bytes) {
  return (bytes + 255) / 256 * 256;
}

}  // namespace

size_t dgc_workspace_bytes(const thrust_dgc::StepParams& p) {
  return align256(p.sample_m * sizeof(float)) + align256(p.cand_cap * sizeof(uint32_t)) +
         align256(p.cand_cap * sizeof(float));
}

thrust_dgc::StepResult dgc_step(const thrust_dgc::StepParams& p, const float* g, float* u, float* v,
                                uint32_t* out_idx, float* out_val, void* workspace,
                                size_t workspace_bytes, cudaStream_t stream) {
  if (workspace_bytes < dgc_workspace_bytes(p))
    throw InvalidArgument("cuda::dgc_step: workspace of " + std::to_string(workspace_bytes) +
                          " bytes, needs " + std::to_string(dgc_workspace_bytes(p)));
  char* w = static_cast<char*>(workspace);
  float* sample = reinterpret_cast<float*>(w);
  w += align256(p.sample_m * sizeof(float));
  uint32_t* cand = reinterpret_cast<uint32_t*>(w);
  w += align256(p.cand_cap * sizeof(uint32_t));
  float* mag = reinterpret_cast<float*>(w);
  StreamPolicy backend{stream};
  thrust_dgc::StepAlgo<StreamPolicy> algo(backend, p, u, v, sample, cand, mag, out_idx);
  thrust_dgc::StepResult r = algo.run(g, out_val);
  check(cudaStreamSynchronize(stream), "dgc_step");
  return r;
}

thrust_dgc::CastCounts to_half(const float* in, uint16_t* out, size_t n, DType type, float scale,
                               cudaStream_t stream) {
  if (type == DType::kFloat32) throw InvalidArgument("cuda::to_half: type must be 16-bit");
  StreamPolicy backend{stream};
  thrust_dgc::CastCounts c =
      thrust_dgc::cast_to_half(backend, in, out, n, scale, type == DType::kBFloat16);
  check(cudaStreamSynchronize(stream), "to_half");
  return c;
}

}  // namespace gradex::compress::cuda
