// Element types gradex moves. Shared by comm/ (reductions), compress/ (casts, payloads) and the C
// API.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gradex {

// Values are part of the wire format and the C API: never renumber.
enum class DType : uint8_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

inline size_t dtype_size(DType t) {
  return t == DType::kFloat32 ? 4 : 2;
}
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "fp32";
    case DType::kFloat16:
      return "fp16";
    case DType::kBFloat16:
      return "bf16";
  }
  return "invalid";
}
inline bool dtype_valid(uint8_t raw) {
  return raw <= static_cast<uint8_t>(DType::kBFloat16);
}

}  // namespace gradex
