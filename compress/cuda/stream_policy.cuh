// What the Thrust algorithms (compress/thrust/*_algo.h) need from a CUDA stream: an execution
// policy that queues work on it without synchronizing (par_nosync), and load(), which reads one
// value back and so synchronizes the stream. Errors become InternalError naming the call.
#pragma once

#include <cuda_runtime.h>
#include <thrust/system/cuda/execution_policy.h>

#include <string>

#include "base/error.h"

namespace gradex::compress::cuda {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw InternalError(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

struct StreamPolicy {
  cudaStream_t stream;
  auto policy() const { return thrust::cuda::par_nosync.on(stream); }
  template <typename T>
  T load(const T* p) const {
    T value;
    check(cudaMemcpyAsync(&value, p, sizeof(T), cudaMemcpyDeviceToHost, stream), "load");
    check(cudaStreamSynchronize(stream), "load");
    return value;
  }
};

}  // namespace gradex::compress::cuda
