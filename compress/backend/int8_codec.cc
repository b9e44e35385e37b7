// The dense 8-bit codec (contracts in int8_codec.h) over compress/quant's block format.
#include "compress/backend/int8_codec.h"

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
  if (count == 0) return 0;
  return quant::quantize(options(), values, residual, count, 0, out);
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

void decode_add(const uint8_t* in, size_t count, float* acc) {
  if (count) quant::dequantize_add(options(), in, count, acc);
}

void decode(const uint8_t* in, size_t count, float* out) {
  if (count) quant::dequantize(options(), in, count, out);
}

}  // namespace gradex::compress::backend::int8
