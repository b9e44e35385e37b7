#include "comm/reduce.h"

#include <cstdint>

#include "compress/half/cast.h"

namespace gradex::comm {

void sum_into(void* acc, const void* incoming, size_t count, DType dtype) {
  if (dtype == DType::kFloat32) {
    auto* a = static_cast<float*>(acc);
    const auto* b = static_cast<const float*>(incoming);
    for (size_t i = 0; i < count; ++i)
      a[i] = b[i] + a[i];
    return;
  }
  // 16-bit sums live with the other 16-bit conversions (compress/half: widen, add, round once).
  compress::half::sum_into(static_cast<uint16_t*>(acc), static_cast<const uint16_t*>(incoming),
                           count, dtype);
}

}  // namespace gradex::comm
