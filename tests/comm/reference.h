// Deterministic inputs and the reference sum for the ring allreduce, reproducing the documented
// summation order (docs/collectives.md) so results can be compared bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "base/dtype.h"
#include "base/half.h"

namespace gradex::test {

// Input of `rank` as raw elements of `dtype` (stored in uint32 for fp32, uint16 otherwise),
// varied in sign and magnitude so that the summation order shows in the low bits.
inline std::vector<uint8_t> make_input(int rank, size_t count, DType dtype, uint32_t seed) {
  std::vector<uint8_t> out(count * dtype_size(dtype));
  uint64_t x = 0x9e3779b97f4a7c15ull * (static_cast<uint64_t>(rank) + 1) + seed;
  for (size_t i = 0; i < count; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    float v = static_cast<float>(static_cast<int64_t>(x % 2000001) - 1000000) * 1e-3f;
    if (x & 0x100000) v *= 1e-3f;  // mix magnitudes
    if (dtype == DType::kFloat32) {
      std::memcpy(out.data() + 4 * i, &v, 4);
    } else {
      uint16_t h = dtype == DType::kFloat16 ? float_to_half(v * 1e-2f) : float_to_bf16(v);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// The ring's result: segment k (the first count % P segments one element longer) is summed
// starting at rank k, then k+1, ..., k-1 (mod P): acc = x_{k+j} + acc, rounded to `dtype` after
// every addition for fp16/bf16.
inline std::vector<uint8_t> reference_sum(const std::vector<std::vector<uint8_t>>& inputs,
                                          size_t count, DType dtype) {
  const size_t P = inputs.size();
  const size_t es = dtype_size(dtype);
  std::vector<uint8_t> out(count * es);
  size_t begin = 0;
  for (size_t k = 0; k < P; ++k) {
    size_t len = count / P + (k < count % P ? 1 : 0);
    for (size_t i = begin; i < begin + len; ++i) {
      if (dtype == DType::kFloat32) {
        float acc;
        std::memcpy(&acc, inputs[k].data() + 4 * i, 4);
        for (size_t j = 1; j < P; ++j) {
          float v;
          std::memcpy(&v, inputs[(k + j) % P].data() + 4 * i, 4);
          acc = v + acc;
        }
        std::memcpy(out.data() + 4 * i, &acc, 4);
      } else {
        auto to_f = dtype == DType::kFloat16 ? half_to_float : bf16_to_float;
        auto from_f = dtype == DType::kFloat16 ? float_to_half : float_to_bf16;
        uint16_t acc;
        std::memcpy(&acc, inputs[k].data() + 2 * i, 2);
        for (size_t j = 1; j < P; ++j) {
          uint16_t v;
          std::memcpy(&v, inputs[(k + j) % P].data() + 2 * i, 2);
          acc = from_f(to_f(v) + to_f(acc));
        }
        std::memcpy(out.data() + 2 * i, &acc, 2);
      }
    }
    begin += len;
  }
  return out;
}

}  // namespace gradex::test
