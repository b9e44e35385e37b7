#include "sync/nonfinite.h"

#include <cstring>

#include "compress/half/cast.h"

namespace gradex::sync {
namespace {

// A value is non-finite when its exponent bits are all ones; testing bits keeps the loop
// branch-free and identical for the three types.
template <typename Bits>
uint64_t scan_bits(Bits* v, uint64_t n, Bits exponent, bool zero) {
  uint64_t count = 0;
  for (uint64_t i = 0; i < n; ++i)
    count += (v[i] & exponent) == exponent;
  if (count > 0 && zero)
    for (uint64_t i = 0; i < n; ++i)
      if ((v[i] & exponent) == exponent) v[i] = 0;
  return count;
}

}  // namespace

uint64_t scan_nonfinite(void* data, DType dtype, uint64_t n, bool zero) {
  switch (dtype) {
    case DType::kFloat32:
      // The common case (counting only) is split over the worker pool for large gradients.
      if (!zero) return compress::half::count_nonfinite(static_cast<const float*>(data), n);
      return scan_bits(static_cast<uint32_t*>(data), n, uint32_t{0x7f800000u}, zero);
    case DType::kFloat16:
      return scan_bits(static_cast<uint16_t*>(data), n, uint16_t{0x7c00u}, zero);
    case DType::kBFloat16:
      return scan_bits(static_cast<uint16_t*>(data), n, uint16_t{0x7f80u}, zero);
  }
  return 0;
}

}  // namespace gradex::sync
