#include "comm/reduce.h"

#include <cstdint>
#include <cstring>

#include "base/half.h"

namespace gradex::comm {
namespace {

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void sum_16(uint16_t* acc, const uint16_t* in, size_t count) {
  for (size_t i = 0; i < count; ++i)
    acc[i] = FromFloat(ToFloat(in[i]) + ToFloat(acc[i]));
}

}  // namespace

void sum_into(void* acc, const void* incoming, size_t count, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: {
      auto* a = static_cast<float*>(acc);
      const auto* b = static_cast<const float*>(incoming);
      for (size_t i = 0; i < count; ++i)
        a[i] = b[i] + a[i];
      return;
    }
    case DType::kFloat16:
      sum_16<half_to_float, float_to_half>(static_cast<uint16_t*>(acc),
                                           static_cast<const uint16_t*>(incoming), count);
      return;
    case DType::kBFloat16:
      sum_16<bf16_to_float, float_to_bf16>(static_cast<uint16_t*>(acc),
                                           static_cast<const uint16_t*>(incoming), count);
      return;
  }
}

}  // namespace gradex::comm
