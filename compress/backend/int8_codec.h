// The dense 8-bit gradient codec (GRADEX_SPARSITY_OVERRIDES 'pattern:int8', the auto policy's
// '8-bit' rung): compress/quant's block format at 8 bits, nearest rounding, fp32 scales, with error
// feedback, plus the validation every received piece passes before it is summed. The engine's
// route (sync/data/int8_exchange.h) moves these encodings in a reduce-scatter + allgather.
//
// Format of `count` elements: ceil(count / kInt8Block) blocks, each [fp32 scale, little-endian]
// [one signed byte per element in [-127, 127]] (compress/quant/quant.h). A block of 128 elements
// is 132 bytes: 1.03 bytes per element, a quarter of fp32 and ~52% of 16-bit.
//
// Rounding: nearest (round half to even). With error feedback the rounding error of every step is
// carried into the next one, so stochastic rounding's unbiasedness buys nothing and only adds
// variance (measured in tests/compress/int8_codec_test.cc: the error-feedback quadratic ends
// closer to fp32 with nearest rounding); nearest is also reproducible with no seed at all.
//
// Exactness: encode() leaves residual' = (residual + values) - dequant(codes), exactly (compress/
// quant's contract: an element whose difference would round is sent as 0 and kept whole), so
// dequant(sent) + residual' == residual + values bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gradex::compress::backend::int8 {

constexpr size_t kInt8Block = 128;

// Bytes of the encoding of `count` elements.
size_t encoded_size(size_t count);
// Wire bytes per element of a large tensor (for cost models): (4 + block) / block.
double bytes_per_element();

// Encodes residual[i] + values[i] into `out` (encoded_size(count) bytes) and leaves the new
// residual (above). `residual` may be null (no error feedback). Returns the non-finite values met
// (sent as 0, residual reset to 0).
size_t encode(const float* values, float* residual, size_t count, uint8_t* out);

// Checks an encoding of `count` elements of `size` bytes: the length, every scale finite and
// non-negative, no code -128. Throws CorruptPayload naming `what` and what was wrong.
void validate(const uint8_t* in, size_t size, size_t count, const std::string& what);

// acc[i] += decoded value i (one fp32 addition per element), out[i] = decoded value i.
void decode_add(const uint8_t* in, size_t count, float* acc);
void decode(const uint8_t* in, size_t count, float* out);

}  // namespace gradex::compress::backend::int8
