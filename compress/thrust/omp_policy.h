// The policy StepAlgo and the ops algorithms take on the host: Thrust's OpenMP system, reading
// memory directly (the CUDA policy reads device memory through its own loads).
#pragma once

#include <thrust/system/omp/execution_policy.h>

namespace gradex::compress::thrust_dgc {

struct OmpPolicy {
  auto policy() const { return thrust::omp::par; }
  template <typename T>
  T load(const T* p) const {
    return *p;
  }
};

}  // namespace gradex::compress::thrust_dgc
