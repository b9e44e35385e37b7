// The dense 8-bit codec (contracts in int8_codec.h) over compress/quant's block format. encode()
// and the decodes are this format's 8-bit / fp32-scale / nearest case written as straight loops the
// compiler vectorizes (compress/quant's general code rounds through nearbyint and decodes through a
// per-element callback: ~15 ns per element where these take ~1-2); the bytes are the same as
// quant::quantize's. A block holding a non-finite value takes quant's own path. Compiled with -O3
// -ffp-contract=off: q * scale must round the same way here and in every rank's decode.
#include "compress/backend/int8_codec.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "base/error.h"
#include "compress/quant/quant.h"

namespace gradex::compress::backend::int8 {
namespace {

const quant::QuantOptions& options() {
  static const quant::QuantOptions o = [] {
    quant::QuantOptions q;
    q.bits = 8;
    q.block = kInt8Block;
    q.scale = quant::ScaleType::kFloat32;
    q.rounding = quant::Rounding::kNearest;
    quant::validate(q);
    return q;
  }();
  return o;
}

}  // namespace

size_t encoded_size(size_t count) {
  return quant::encoded_size(options(), count);
}

double bytes_per_element() {
  return static_cast<double>(kInt8Block + 4) / static_cast<double>(kInt8Block);
}

size_t encode(const float* values, float* residual, size_t count, uint8_t* out) {
  size_t nonfinite = 0;
  float v[kInt8Block];
  for (size_t begin = 0; begin < count; begin += kInt8Block) {
    const size_t n = std::min(kInt8Block, count - begin);
    const float* g = values + begin;
    float* r = residual ? residual + begin : nullptr;
    if (r) {
      for (size_t i = 0; i < n; ++i)
        v[i] = r[i] + g[i];
    } else {
      std::memcpy(v, g, n * 4);
    }
    // The largest magnitude over the block's bit patterns (|x| orders as its bits do; NaN/Inf
    // have the largest), as integers so that the reduction vectorizes.
    int32_t top = 0;
    for (size_t i = 0; i < n; ++i) {
      int32_t bits;
      std::memcpy(&bits, &v[i], 4);
      bits &= 0x7fffffff;
      top = bits > top ? bits : top;
    }
    const bool bad = top >= 0x7f800000;
    float amax;
    std::memcpy(&amax, &top, 4);
    if (bad) {  // NaN/Inf: quant's path sends them as 0 and resets their residual
      nonfinite += quant::quantize(options(), g, r, n, 0, out);
      out += 4 + n;
      continue;
    }
    // quant's block_scale for fp32 scales, and its rounding: nearbyint(x / s) under the default
    // rounding mode (ties to even) equals (t + 1.5 * 2^23) - 1.5 * 2^23 for |t| < 2^22; here
    // |t| <= 127 (and a few ulps).
    const float s = amax / 127.0f;
    std::memcpy(out, &s, 4);
    int8_t* codes = reinterpret_cast<int8_t*>(out + 4);
    if (s > 0.0f) {
      // Hoisted so that each loop is branch-free and vectorizes.
      constexpr float kRound = 12582912.0f;
      float e[kInt8Block];
      for (size_t i = 0; i < n; ++i) {
        const float x = v[i];
        float q = (x / s + kRound) - kRound;
        q = std::min(std::max(q, -127.0f), 127.0f);
        const float deq = q * s;
        const float d = x - deq;
        const bool exact = deq + d == x;  // else send 0 and keep all of x (quant.h)
        codes[i] = static_cast<int8_t>(static_cast<int>(exact ? q : 0.0f));
        e[i] = exact ? d : x;
      }
      if (r) std::memcpy(r, e, n * 4);
    } else {  // an all-zero (or underflowed) block: nothing to send
      std::memset(codes, 0, n);
      if (r) std::memcpy(r, v, n * 4);
    }
    out += 4 + n;
  }
  return nonfinite;
}

void validate(const uint8_t* in, size_t size, size_t count, const std::string& what) {
  const size_t want = encoded_size(count);
  if (size != want)
    throw CorruptPayload(what + ": an 8-bit encoding of " + std::to_string(count) +
                         " elements is " + std::to_string(want) + " bytes, got " +
                         std::to_string(size));
  for (size_t begin = 0, at = 0; begin < count; begin += kInt8Block) {
    const size_t n = std::min(kInt8Block, count - begin);
    float scale;
    std::memcpy(&scale, in + at, 4);
    if (!std::isfinite(scale) || scale < 0.0f)
      throw CorruptPayload(what + ": block at element " + std::to_string(begin) + " has scale " +
                           std::to_string(scale) + " (a finite non-negative value expected)");
    const uint8_t* codes = in + at + 4;
    for (size_t i = 0; i < n; ++i)
      if (codes[i] == 0x80)
        throw CorruptPayload(what + ": element " + std::to_string(begin + i) +
                             " has code -128 (codes are in [-127, 127])");
    at += 4 + n;
  }
}

namespace {

// The block walk both decodes share: each block's scale, then out[i] (+)= code * scale.
template <bool Add>
void decode_blocks(const uint8_t* in, size_t count, float* out) {
  for (size_t begin = 0; begin < count; begin += kInt8Block) {
    const size_t n = std::min(kInt8Block, count - begin);
    float s;
    std::memcpy(&s, in, 4);
    const int8_t* codes = reinterpret_cast<const int8_t*>(in + 4);
    float* o = out + begin;
    for (size_t i = 0; i < n; ++i) {
      if constexpr (Add)
        o[i] += static_cast<float>(codes[i]) * s;
      else
        o[i] = static_cast<float>(codes[i]) * s;
    }
    in += 4 + n;
  }
}

}  // namespace

void decode_add(const uint8_t* in, size_t count, float* acc) {
  decode_blocks<true>(in, count, acc);
}

void decode(const uint8_t* in, size_t count, float* out) {
  decode_blocks<false>(in, count, out);
}

}  // namespace gradex::compress::backend::int8
