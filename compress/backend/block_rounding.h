// What the dense block codecs (int8_codec.cc, int4_codec.cc) share, inline so that each loop still
// vectorizes in its caller (and is compiled with its caller's ISA, base/vector_dispatch.h): a
// block's input with its error feedback added, the block's largest magnitude, and nearest rounding
// to symmetric integer codes with exact error feedback, all in compress/quant's arithmetic
// (quant.h: the bytes must equal quant::quantize's). Include only from files compiled with
// -ffp-contract=off (compress/CMakeLists.txt), where q * scale rounds the same way as in every
// rank's decode.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "base/error.h"
#include "base/vector_dispatch.h"
#include "compress/quant/quant.h"

namespace gradex::compress::backend::block {

// compress/quant's options for the codecs' format: `bits`, `block` elements, fp32 scales, nearest
// rounding (validated).
inline quant::QuantOptions nearest_fp32(int bits, size_t block) {
  quant::QuantOptions q;
  q.bits = bits;
  q.block = block;
  q.scale = quant::ScaleType::kFloat32;
  q.rounding = quant::Rounding::kNearest;
  quant::validate(q);
  return q;
}

// The scale at `in` of the block starting at element `begin`, refused (CorruptPayload naming
// `what`) unless finite and non-negative.
inline float checked_scale(const uint8_t* in, size_t begin, const std::string& what) {
  float scale;
  std::memcpy(&scale, in, 4);
  if (!std::isfinite(scale) || scale < 0.0f)
    throw CorruptPayload(what + ": block at element " + std::to_string(begin) + " has scale " +
                         std::to_string(scale) + " (a finite non-negative value expected)");
  return scale;
}

// v[i] = r[i] + g[i] (g[i] when r is null) for i < n; returns the bit pattern of the largest
// magnitude among them, computed on the integers so that the reduction vectorizes (|x| orders as
// its bits do; a NaN or Inf has the largest, at or above kNonFinite).
GX_ALWAYS_INLINE int32_t gather(const float* g, const float* r, size_t n, float* v) {
  if (r) {
    for (size_t i = 0; i < n; ++i)
      v[i] = r[i] + g[i];
  } else {
    std::memcpy(v, g, n * 4);
  }
  int32_t top = 0;
  for (size_t i = 0; i < n; ++i) {
    int32_t bits;
    std::memcpy(&bits, &v[i], 4);
    bits &= 0x7fffffff;
    top = bits > top ? bits : top;
  }
  return top;
}
constexpr int32_t kNonFinite = 0x7f800000;

// The block's scale, quant's block_scale for fp32 scales: amax / max_code, amax the magnitude
// whose bits `top` holds (finite).
GX_ALWAYS_INLINE float scale_of(int32_t top, float max_code) {
  float amax;
  std::memcpy(&amax, &top, 4);
  return amax / max_code;
}

// Codes for v[0, n) at scale s > 0: q[i] = nearest(v[i] / s) clamped to [-max_code, max_code], and
// e[i] = v[i] - q[i] * s, exact; an element whose difference would round is sent as 0 and kept
// whole (quant.h). v, q and e must not overlap (e may be the caller's residual itself). quant's
// rounding, nearbyint(x / s) under the default mode (ties to even), equals (t + 1.5 * 2^23) - 1.5 *
// 2^23 for |t| < 2^22, and is never -0, so q * s matches quant's float(int(q)) * s, sign of zero
// included.
GX_ALWAYS_INLINE void round(const float* __restrict v, size_t n, float s, float max_code,
                            int8_t* __restrict q, float* __restrict e) {
  constexpr float kRound = 12582912.0f;
  for (size_t i = 0; i < n; ++i) {
    const float x = v[i];
    float c = (x / s + kRound) - kRound;
    c = std::min(std::max(c, -max_code), max_code);
    const float deq = c * s;
    const float d = x - deq;
    const bool exact = deq + d == x;
    q[i] = static_cast<int8_t>(static_cast<int>(exact ? c : 0.0f));
    e[i] = exact ? d : x;
  }
}

// out[i] = q[i] * s (Add: out[i] += q[i] * s) for i < n: one fp32 multiply per element, as
// quant::dequantize rounds it.
template <bool Add>
GX_ALWAYS_INLINE void scale_codes(const int8_t* q, size_t n, float s, float* out) {
  for (size_t i = 0; i < n; ++i) {
    if constexpr (Add)
      out[i] += static_cast<float>(q[i]) * s;
    else
      out[i] = static_cast<float>(q[i]) * s;
  }
}

}  // namespace gradex::compress::backend::block
