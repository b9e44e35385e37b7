// Bulk fp32 <-> fp16/bf16 casts for dense exchanges, with pre-division by the world size (as
// PyTorch's fp16 compression hook does) so that a sum over the ranks cannot overflow. Finite values
// beyond the 16-bit range saturate to the largest finite value and are counted; they never become
// inf. NaN and Inf inputs are counted and propagated (NaN stays NaN, Inf stays Inf): the policy is
// the engine's. Rounding is to nearest even, bit-identical to base/half.h for every non-NaN input.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"
#include "base/half.h"

namespace gradex::compress::half {

struct CastStats {
  size_t saturated = 0;  // finite values clamped to the 16-bit range
  size_t nonfinite = 0;  // NaN or Inf inputs (after scaling: a finite input times scale can't be)
};

// out[i] = to16(in[i] * scale). type must be kFloat16 or kBFloat16 (InvalidArgument otherwise).
CastStats to_half(const float* in, uint16_t* out, size_t n, DType type, float scale);
// The pre-divided cast of a gradient that is about to be summed over world_size ranks.
inline CastStats to_half_predivided(const float* in, uint16_t* out, size_t n, DType type,
                                    int world_size) {
  return to_half(in, out, n, type, 1.0f / static_cast<float>(world_size));
}
// out[i] = from16(in[i]) * scale (exact when scale is 1).
void from_half(const uint16_t* in, float* out, size_t n, DType type, float scale);
// out[i] += from16(in[i]) * scale.
void add_from_half(const uint16_t* in, float* out, size_t n, DType type, float scale);

// The ring's 16-bit sums are base/half_sum.h (comm/ uses them without depending on compress/).

// Number of NaN and Inf values in v[0, n).
size_t count_nonfinite(const float* v, size_t n);
// The same for n 16-bit values of `type` (fp16 or bf16; InvalidArgument otherwise).
size_t count_nonfinite(const uint16_t* v, size_t n, DType type);
// Replaces every NaN and Inf by +0 in place; returns how many there were.
size_t zero_nonfinite(float* v, size_t n);
size_t zero_nonfinite(uint16_t* v, size_t n, DType type);

// Large buffers (from 2^20 elements, in pieces of at least 2^19) are split over the shared worker
// pool (base/thread_pool.h); the casts are element-wise, so the results are bit-identical to a
// serial pass. Smaller pieces would cost more in hand-offs than they save.

// Largest finite value of a 16-bit type, as fp32.
constexpr float kHalfMax = 65504.0f;
constexpr float kBFloat16Max = 3.38953139e38f;

// Scalar saturating conversions (the bulk casts' semantics for one element).
inline uint16_t to_half_saturating(float x, bool* saturated) {
  uint32_t abs = float_bits(x) & 0x7fffffffu;
  *saturated = abs >= 0x477ff000u && abs < 0x7f800000u;  // finite but rounds past 65504
  return *saturated ? static_cast<uint16_t>(((float_bits(x) >> 16) & 0x8000u) | 0x7bffu)
                    : float_to_half(x);
}
inline uint16_t to_bf16_saturating(float x, bool* saturated) {
  uint32_t abs = float_bits(x) & 0x7fffffffu;
  *saturated = abs >= 0x7f7f8000u && abs < 0x7f800000u;  // finite but rounds to inf
  return *saturated ? static_cast<uint16_t>(((float_bits(x) >> 16) & 0x8000u) | 0x7f7fu)
                    : float_to_bf16(x);
}
// x rounded to the nearest value of `type` (saturating), returned as fp32.
inline float round_to(float x, DType type, bool* saturated) {
  *saturated = false;
  if (type == DType::kFloat16) return half_to_float(to_half_saturating(x, saturated));
  if (type == DType::kBFloat16) return bf16_to_float(to_bf16_saturating(x, saturated));
  return x;
}

}  // namespace gradex::compress::half
