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
#include "compress/backend/block_rounding.h"
#include "compress/quant/quant.h"

namespace gradex::compress::backend::int8 {
namespace {

const quant::QuantOptions& options() {
  static const quant::QuantOptions o = block::nearest_fp32(8, kInt8Block);
  return o;
}

}  // namespace

size_t encoded_size(size_t count) {
  return quant::encoded_size(options(), count);
}

double bytes_per_element() {
  return static_cast<double>(kInt8Block + 4) / static_cast<double>(kInt8Block);
}

namespace {

GX_ALWAYS_INLINE size_t encode_blocks(const float* values, float* residual, size_t count,
                                      uint8_t* out) {
  size_t nonfinite = 0;
  float v[kInt8Block];
  for (size_t begin = 0; begin < count; begin += kInt8Block) {
    const size_t n = std::min(kInt8Block, count - begin);
    const float* g = values + begin;
    float* r = residual ? residual + begin : nullptr;
    const int32_t top = block::gather(g, r, n, v);
    if (top >= block::kNonFinite) {  // NaN/Inf: quant's path sends them as 0, resets the residual
      nonfinite += quant::quantize(options(), g, r, n, 0, out);
      out += 4 + n;
      continue;
    }
    const float s = block::scale_of(top, 127.0f);
    std::memcpy(out, &s, 4);
    int8_t* codes = reinterpret_cast<int8_t*>(out + 4);
    if (s > 0.0f) {
      float scratch[kInt8Block];  // the new residual, when there is no residual to write it to
      block::round(v, n, s, 127.0f, codes, r ? r : scratch);
    } else {  // an all-zero (or underflowed) block: nothing to send
      std::memset(codes, 0, n);
      if (r) std::memcpy(r, v, n * 4);
    }
    out += 4 + n;
  }
  return nonfinite;
}

}  // namespace

size_t encode(const float* values, float* residual, size_t count, uint8_t* out) {
  return with_vector_isa(
      [&]() GX_VECTOR_BODY { return encode_blocks(values, residual, count, out); });
}

void validate(const uint8_t* in, size_t size, size_t count, const std::string& what) {
  const size_t want = encoded_size(count);
  if (size != want)
    throw CorruptPayload(what + ": an 8-bit encoding of " + std::to_string(count) +
                         " elements is " + std::to_string(want) + " bytes, got " +
                         std::to_string(size));
  for (size_t begin = 0, at = 0; begin < count; begin += kInt8Block) {
    const size_t n = std::min(kInt8Block, count - begin);
    block::checked_scale(in + at, begin, what);
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
GX_ALWAYS_INLINE void decode_blocks(const uint8_t* in, size_t count, float* out) {
  for (size_t begin = 0; begin < count; begin += kInt8Block) {
    const size_t n = std::min(kInt8Block, count - begin);
    float s;
    std::memcpy(&s, in, 4);
    const int8_t* codes = reinterpret_cast<const int8_t*>(in + 4);
    block::scale_codes<Add>(codes, n, s, out + begin);
    in += 4 + n;
  }
}

}  // namespace

void decode_add(const uint8_t* in, size_t count, float* acc) {
  with_vector_isa([&]() GX_VECTOR_BODY { decode_blocks<true>(in, count, acc); });
}

void decode(const uint8_t* in, size_t count, float* out) {
  with_vector_isa([&]() GX_VECTOR_BODY { decode_blocks<false>(in, count, out); });
}

}  // namespace gradex::compress::backend::int8
