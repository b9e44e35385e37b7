// The tensors of the engine tests that mix dtypes: a tensor's spec, its values as bytes of its
// dtype, and a digest that compares results bit for bit across runs and thread counts.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "base/half.h"
#include "gradex/gradex.h"

namespace gradex::test {

struct Spec {
  const char* key;
  uint64_t n;
  gradex_dtype_t dtype;
};

// FNV-1a over bytes.
struct Digest {
  uint64_t h = 1469598103934665603ull;
  void add(const void* data, size_t bytes) {
    const auto* p = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < bytes; ++i)
      h = (h ^ p[i]) * 1099511628211ull;
  }
};

inline size_t elem_size(gradex_dtype_t t) {
  return t == GRADEX_FLOAT32 ? 4 : 2;
}

// `f` as the bytes of a tensor of `dtype` (fp32 as is; fp16/bf16 rounded to nearest).
inline std::vector<uint8_t> dtype_bytes(const std::vector<float>& f, gradex_dtype_t dtype) {
  std::vector<uint8_t> out(f.size() * elem_size(dtype));
  for (size_t i = 0; i < f.size(); ++i) {
    if (dtype == GRADEX_FLOAT32) {
      std::memcpy(out.data() + 4 * i, &f[i], 4);
    } else {
      const uint16_t h =
          dtype == GRADEX_FLOAT16 ? gradex::float_to_half(f[i]) : gradex::float_to_bf16(f[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

}  // namespace gradex::test
