// Block quantization (format and contracts in quant.h). Compiled with -ffp-contract=off: the
// dequantization q * scale must round the same way in quantize() (where the residual is formed)
// and in dequantize() on every rank, so no fused multiply-adds.
#include "compress/quant/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/half.h"

namespace gradex::compress::quant {
namespace {

size_t scale_bytes(ScaleType t) {
  return t == ScaleType::kFloat32 ? 4 : 2;
}

size_t code_bytes(int bits, size_t n) {
  return bits == 8 ? n : (n + 1) / 2;
}

// The scale actually used for a block whose largest finite magnitude is amax: representable in the
// chosen scale type (fp16: rounded to nearest, clamped to the largest finite half).
float block_scale(const QuantOptions& o, float amax) {
  float s = amax / static_cast<float>(max_code(o.bits));
  if (o.scale == ScaleType::kFloat16) {
    return half_to_float(float_to_half(std::min(s, 65504.0f)));
  }
  return s;
}

void put_scale(const QuantOptions& o, float s, uint8_t* out) {
  if (o.scale == ScaleType::kFloat32) {
    std::memcpy(out, &s, 4);
  } else {
    uint16_t h = float_to_half(s);
    std::memcpy(out, &h, 2);
  }
}

float get_scale(const QuantOptions& o, const uint8_t* in) {
  if (o.scale == ScaleType::kFloat32) {
    float s;
    std::memcpy(&s, in, 4);
    return s;
  }
  uint16_t h;
  std::memcpy(&h, in, 2);
  return half_to_float(h);
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Decoded code i of a block (8-bit: signed bytes; 4-bit: offset nibbles).
inline int code_at(int bits, const uint8_t* codes, size_t i) {
  if (bits == 8) return static_cast<int8_t>(codes[i]);
  uint8_t byte = codes[i / 2];
  return static_cast<int>((i % 2) ? (byte >> 4) : (byte & 0x0f)) - 8;
}

template <typename Sink>
void decode_blocks(const QuantOptions& o, const uint8_t* in, size_t count, Sink&& sink) {
  const size_t sb = scale_bytes(o.scale);
  for (size_t begin = 0; begin < count; begin += o.block) {
    const size_t n = std::min(o.block, count - begin);
    const float s = get_scale(o, in);
    const uint8_t* codes = in + sb;
    for (size_t i = 0; i < n; ++i)
      sink(begin + i, static_cast<float>(code_at(o.bits, codes, i)) * s);
    in += sb + code_bytes(o.bits, n);
  }
}

}  // namespace

int max_code(int bits) {
  return bits == 8 ? 127 : 7;
}

void validate(const QuantOptions& o) {
  if (o.bits != 8 && o.bits != 4)
    throw InvalidArgument("quantization bits must be 4 or 8, got " + std::to_string(o.bits));
  if (o.block < 2 || o.block > 65536 || o.block % 2 != 0)
    throw InvalidArgument("quantization block must be an even number in [2, 65536], got " +
                          std::to_string(o.block));
}

size_t encoded_size(const QuantOptions& o, size_t count) {
  const size_t full = count / o.block, tail = count % o.block;
  const size_t per_block = scale_bytes(o.scale) + code_bytes(o.bits, o.block);
  return full * per_block + (tail ? scale_bytes(o.scale) + code_bytes(o.bits, tail) : 0);
}

float uniform(uint64_t seed, uint64_t counter) {
  uint64_t h = splitmix64(splitmix64(seed) ^ counter);
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

size_t quantize(const QuantOptions& o, const float* delta, float* residual, size_t count,
                uint64_t counter, uint8_t* out) {
  const size_t sb = scale_bytes(o.scale);
  const int qmax = max_code(o.bits);
  size_t nonfinite = 0;
  std::vector<float> v(std::min(o.block, count));  // one block of residual + delta
  for (size_t begin = 0; begin < count; begin += o.block) {
    const size_t n = std::min(o.block, count - begin);
    float amax = 0.0f;
    for (size_t i = 0; i < n; ++i) {
      float x = residual ? residual[begin + i] + delta[begin + i] : delta[begin + i];
      if (!std::isfinite(x)) {
        ++nonfinite;
        x = std::numeric_limits<float>::quiet_NaN();
      } else {
        amax = std::max(amax, std::fabs(x));
      }
      v[i] = x;
    }
    const float s = block_scale(o, amax);
    put_scale(o, s, out);
    uint8_t* codes = out + sb;
    std::memset(codes, 0, code_bytes(o.bits, n));
    for (size_t i = 0; i < n; ++i) {
      const float x = v[i];
      int q = 0;
      float e = 0.0f;  // the new residual
      if (std::isnan(x)) {
        q = 0;  // non-finite: dropped, residual reset
      } else if (s > 0.0f) {
        float t = x / s;
        float r = o.rounding == Rounding::kNearest
                      ? std::nearbyint(t)
                      : std::floor(t + uniform(o.seed, counter + begin + i));
        r = std::min(std::max(r, static_cast<float>(-qmax)), static_cast<float>(qmax));
        q = static_cast<int>(r);
        const float deq = static_cast<float>(q) * s;
        e = x - deq;
        if (deq + e != x) {  // the difference rounded: send nothing, keep all of x
          q = 0;
          e = x;
        }
      } else {
        e = x;  // all-zero (or underflowed) block: nothing to send
      }
      if (residual) residual[begin + i] = e;
      if (o.bits == 8) {
        codes[i] = static_cast<uint8_t>(static_cast<int8_t>(q));
      } else {
        codes[i / 2] |= static_cast<uint8_t>((q + 8) << ((i % 2) * 4));
      }
    }
    out += sb + code_bytes(o.bits, n);
  }
  return nonfinite;
}

void dequantize(const QuantOptions& o, const uint8_t* in, size_t count, float* out) {
  decode_blocks(o, in, count, [out](size_t i, float x) { out[i] = x; });
}

void dequantize_add(const QuantOptions& o, const uint8_t* in, size_t count, float* acc) {
  decode_blocks(o, in, count, [acc](size_t i, float x) { acc[i] += x; });
}

}  // namespace gradex::compress::quant
