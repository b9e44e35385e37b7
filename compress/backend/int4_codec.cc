// The dense 4-bit codec (contracts in int4_codec.h) over compress/quant's block format. encode()
// and the decodes are this format's 4-bit / fp32-scale / nearest case written as straight loops the
// compiler vectorizes, as int8_codec.cc does for 8 bits (compress/quant's general code rounds
// through nearbyint, packs nibble by nibble and decodes through a per-element callback); the bytes
// are the same as quant::quantize's. A block holding a non-finite value takes quant's own path.
// Codes are computed into a byte per element first and packed two per byte in a second loop, so
// that neither loop carries the nibble arithmetic's dependence between neighbours. Compiled with
// -O3 -ffp-contract=off: q * scale must round the same way here and in every rank's decode.
#include "compress/backend/int4_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/error.h"
#include "compress/backend/block_rounding.h"
#include "compress/quant/quant.h"

namespace gradex::compress::backend::int4 {
namespace {

const quant::QuantOptions& options() {
  static const quant::QuantOptions o = block::nearest_fp32(4, kInt4Block);
  return o;
}

// Bytes of one block of n elements: the scale and ceil(n / 2) code bytes.
GX_ALWAYS_INLINE size_t block_bytes(size_t n) {
  return 4 + (n + 1) / 2;
}

}  // namespace

size_t encoded_size(size_t count) {
  return quant::encoded_size(options(), count);
}

double bytes_per_element() {
  return static_cast<double>(4 + kInt4Block / 2) / static_cast<double>(kInt4Block);
}

namespace {

GX_ALWAYS_INLINE size_t encode_blocks(const float* values, float* residual, size_t count,
                                      uint8_t* out) {
  size_t nonfinite = 0;
  float v[kInt4Block];
  for (size_t begin = 0; begin < count; begin += kInt4Block) {
    const size_t n = std::min(kInt4Block, count - begin);
    const float* g = values + begin;
    float* r = residual ? residual + begin : nullptr;
    const int32_t top = block::gather(g, r, n, v);
    if (top >= block::kNonFinite) {  // NaN/Inf: quant's path sends them as 0, resets the residual
      nonfinite += quant::quantize(options(), g, r, n, 0, out);
      out += block_bytes(n);
      continue;
    }
    const float s = block::scale_of(top, 7.0f);
    std::memcpy(out, &s, 4);
    int8_t q[kInt4Block];  // packed below as q + 8, two to a byte
    if (s > 0.0f) {
      float scratch[kInt4Block];  // the new residual, when there is no residual to write it to
      block::round(v, n, s, 7.0f, q, r ? r : scratch);
    } else {  // an all-zero (or underflowed) block: nothing to send
      std::memset(q, 0, n);
      if (r) std::memcpy(r, v, n * 4);
    }
    uint8_t* packed = out + 4;
    const size_t pairs = n / 2;
    for (size_t j = 0; j < pairs; ++j)
      packed[j] = static_cast<uint8_t>((q[2 * j] + 8) | ((q[2 * j + 1] + 8) << 4));
    if (n % 2) packed[pairs] = static_cast<uint8_t>(q[n - 1] + 8);  // the high nibble stays 0
    out += block_bytes(n);
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
    throw CorruptPayload(what + ": a 4-bit encoding of " + std::to_string(count) + " elements is " +
                         std::to_string(want) + " bytes, got " + std::to_string(size));
  for (size_t begin = 0, at = 0; begin < count; begin += kInt4Block) {
    const size_t n = std::min(kInt4Block, count - begin);
    block::checked_scale(in + at, begin, what);
    const uint8_t* codes = in + at + 4;
    // A used nibble 0 would decode to -8, outside the symmetric range. Checked branch-free over
    // the block first; the element is looked for only when one is there.
    const size_t pairs = n / 2;
    uint8_t zero = 0;
    for (size_t j = 0; j < pairs; ++j)
      zero |= static_cast<uint8_t>(((codes[j] & 0x0f) == 0) | ((codes[j] & 0xf0) == 0));
    if (n % 2) zero |= static_cast<uint8_t>((codes[pairs] & 0x0f) == 0);
    if (zero) {
      for (size_t i = 0; i < n; ++i) {
        const int nibble = (codes[i / 2] >> ((i % 2) * 4)) & 0x0f;
        if (nibble == 0)
          throw CorruptPayload(what + ": element " + std::to_string(begin + i) +
                               " has code -8 (nibble 0; codes are in [-7, 7])");
      }
    }
    if (n % 2 && (codes[pairs] & 0xf0) != 0)
      throw CorruptPayload(what + ": the unused high nibble after element " +
                           std::to_string(begin + n - 1) + " (the last) is " +
                           std::to_string(codes[pairs] >> 4) + " (0 expected)");
    at += block_bytes(n);
  }
}

namespace {

// The block walk both decodes share: each block's scale, then out[i] (+)= (nibble - 8) * scale.
template <bool Add>
GX_ALWAYS_INLINE void decode_blocks(const uint8_t* in, size_t count, float* out) {
  for (size_t begin = 0; begin < count; begin += kInt4Block) {
    const size_t n = std::min(kInt4Block, count - begin);
    float s;
    std::memcpy(&s, in, 4);
    const uint8_t* codes = in + 4;
    // Unpacked into a byte per element first, so that the multiply loop is contiguous.
    int8_t q[kInt4Block];
    const size_t pairs = n / 2;
    for (size_t j = 0; j < pairs; ++j) {
      q[2 * j] = static_cast<int8_t>((codes[j] & 0x0f) - 8);
      q[2 * j + 1] = static_cast<int8_t>((codes[j] >> 4) - 8);
    }
    if (n % 2) q[n - 1] = static_cast<int8_t>((codes[pairs] & 0x0f) - 8);
    block::scale_codes<Add>(q, n, s, out + begin);
    in += block_bytes(n);
  }
}

}  // namespace

void decode_add(const uint8_t* in, size_t count, float* acc) {
  with_vector_isa([&]() GX_VECTOR_BODY { decode_blocks<true>(in, count, acc); });
}

void decode(const uint8_t* in, size_t count, float* out) {
  with_vector_isa([&]() GX_VECTOR_BODY { decode_blocks<false>(in, count, out); });
}

}  // namespace gradex::compress::backend::int4
