#include "comm/collectives/reduce.h"

#include <cstdint>

#include "base/half_sum.h"

namespace gradex::comm {

void sum_into(void* acc, const void* incoming, size_t count, DType dtype) {
  if (dtype == DType::kFloat32) {
    auto* a = static_cast<float*>(acc);
    const auto* b = static_cast<const float*>(incoming);
    for (size_t i = 0; i < count; ++i)
      a[i] = b[i] + a[i];
    return;
  }
  // 16-bit sums live with the scalar 16-bit conversions (base/half_sum.h: widen, add, round once).
  half_sum_into(static_cast<uint16_t*>(acc), static_cast<const uint16_t*>(incoming), count, dtype);
}

}  // namespace gradex::comm
