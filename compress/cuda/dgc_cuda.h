// CUDA launchers of the DGC step and the 16-bit casts (built as gradex_compress_cuda when nvcc is
// present, for sm_80 and sm_90). A plain host header: no CUDA or Thrust types beyond the opaque
// stream handle. All pointers are device pointers; calls are ordered on `stream` and return after
// the host has read back the counts it needs (the selection loop synchronizes the stream).
#pragma once

#include <cstddef>
#include <cstdint>

#include "compress/thrust/dgc_params.h"

struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;  // the same declaration as cuda_runtime_api.h

namespace gradex::compress::cuda {

// Device scratch the step needs (sample and candidate buffers), in bytes.
size_t dgc_workspace_bytes(const thrust_dgc::StepParams& p);

// One DGC step with thrust_dgc::make_step_params(options, n, step): updates u (null when momentum
// is 0) and v, writes the selection to out_idx / out_val (p.cap elements each). Throws
// InvalidArgument when the workspace is too small, InternalError on a CUDA error.
thrust_dgc::StepResult dgc_step(const thrust_dgc::StepParams& p, const float* g, float* u, float* v,
                                uint32_t* out_idx, float* out_val, void* workspace,
                                size_t workspace_bytes, cudaStream_t stream);

// out[i] = to16(in[i] * scale), with saturation and non-finite counts (synchronizes the stream).
thrust_dgc::CastCounts to_half(const float* in, uint16_t* out, size_t n, DType type, float scale,
                               cudaStream_t stream);

}  // namespace gradex::compress::cuda
