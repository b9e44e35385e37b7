// The dense 4-bit gradient codec: the 4-bit rung of the dense quantized route
// (sync/data/int8_exchange.h), at about half of the 8-bit codec's (int8_codec.h) bytes.
// compress/quant's block format at 4 bits, nearest rounding, fp32 scales, with error feedback, plus
// the validation every received piece passes before it is summed.
//
// Format of `count` elements: ceil(count / kInt4Block) blocks, each [fp32 scale, little-endian]
// [two codes per byte: element 2i in the low nibble, 2i+1 in the high one, each stored as q + 8 for
// q in [-7, 7]; an odd tail leaves its last high nibble 0] (compress/quant/quant.h). A block of 128
// elements is 4 + 64 = 68 bytes: 0.53 bytes per element, about an eighth of fp32 and 52% of the
// 8-bit codec. The nibble 0 (q = -8) is never written: codes are symmetric, scale = amax / 7.
//
// Rounding: nearest (round half to even), for the same reason as the 8-bit codec: with error
// feedback every step's rounding error is carried into the next, so stochastic rounding's
// unbiasedness buys nothing and only adds variance; nearest is also reproducible with no seed. At
// 4 bits a step is amax / 7 of its block, so far more of each value waits in the residual.
//
// Exactness: encode() leaves residual' = (residual + values) - dequant(codes), exactly
// (compress/quant's contract: an element whose difference would round is sent as 0 and kept
// whole), so dequant(sent) + residual' == residual + values bit for bit. With fp32 scales of
// amax / 7 and nearest rounding a non-zero code decodes to within a factor of two of its element
// (a zero code's difference is the element itself), so the difference is exact (Sterbenz's lemma)
// and the fallback holds the contract rather than being taken in practice.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gradex::compress::backend::int4 {

constexpr size_t kInt4Block = 128;

// Bytes of the encoding of `count` elements.
size_t encoded_size(size_t count);
// Wire bytes per element of a large tensor (for cost models): (4 + block / 2) / block.
double bytes_per_element();

// Encodes residual[i] + values[i] into `out` (encoded_size(count) bytes) and leaves the new
// residual (above). `residual` may be null (no error feedback). Returns the non-finite values met
// (sent as 0, residual reset to 0). The bytes are quant::quantize's at bits 4, block kInt4Block,
// fp32 scales, nearest rounding.
size_t encode(const float* values, float* residual, size_t count, uint8_t* out);

// Checks an encoding of `count` elements of `size` bytes: the length, every scale finite and
// non-negative, no nibble 0 (q = -8) in a used position, and the unused high nibble of an odd tail
// zero. Throws CorruptPayload naming `what` and what was wrong.
void validate(const uint8_t* in, size_t size, size_t count, const std::string& what);

// acc[i] += decoded value i (one fp32 addition per element), out[i] = decoded value i. A decoded
// value is float(q) * scale, one fp32 multiply, rounded as quant::dequantize rounds it.
void decode_add(const uint8_t* in, size_t count, float* acc);
void decode(const uint8_t* in, size_t count, float* out);

}  // namespace gradex::compress::backend::int4
