#include "sync/nonfinite.h"

#include "compress/half/cast.h"

namespace gradex::sync {

// compress/half's scans: bit tests, split over the worker pool for large gradients.
uint64_t scan_nonfinite(void* data, DType dtype, uint64_t n, bool zero) {
  namespace half = compress::half;
  if (dtype == DType::kFloat32) {
    auto* v = static_cast<float*>(data);
    return zero ? half::zero_nonfinite(v, n) : half::count_nonfinite(v, n);
  }
  auto* v = static_cast<uint16_t*>(data);
  return zero ? half::zero_nonfinite(v, n, dtype) : half::count_nonfinite(v, n, dtype);
}

}  // namespace gradex::sync
