// Casts shared by the engine's stages (engine_stages.cc) and the dense exchange.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "base/dtype.h"
#include "compress/half/cast.h"
#include "sync/negotiation/negotiator.h"

namespace gradex::sync::detail {

// 16-bit tensors travel through fp32 scratch buffers; compress/'s casts are vectorized and saturate
// (a finite value never becomes inf on the way back).
inline void to_float(const void* data, DType t, uint64_t n, float* out) {
  if (t == DType::kFloat32)
    std::memcpy(out, data, n * 4);
  else
    compress::half::from_half(static_cast<const uint16_t*>(data), out, n, t, 1.0f);
}

inline void from_float(const float* in, uint64_t n, DType t, void* data) {
  if (t == DType::kFloat32)
    std::memcpy(data, in, n * 4);
  else
    compress::half::to_half(in, static_cast<uint16_t*>(data), n, t, 1.0f);
}

}  // namespace gradex::sync::detail
