// Block-wise 8-bit and 4-bit quantization with per-block scales, error feedback, and a byte format
// that a reduce-scatter can decode and sum in fp32 (DiLoCo's pseudo-gradients; see
// outer/). No UCX, no state beyond what the caller passes in.
//
// Format of `count` elements: ceil(count / block) blocks back to back; block b holds
//   [scale: fp32 or fp16, little-endian][codes: one byte per element (8-bit) or two per byte
//   (4-bit, element 2i in the low nibble, 2i+1 in the high one; an odd tail leaves the high
//   nibble 0)].
// 8-bit codes are two's complement in [-127, 127]; 4-bit codes are stored as q + 8 for q in
// [-7, 7]. A value decodes to float(q) * scale. Because every block is self-contained and `block`
// is even, the encoding of elements [a, b) with a a multiple of `block` is the byte range
// [encoded_size(a), encoded_size(b)) of the whole encoding: payloads can be cut into chunks at
// block boundaries and decoded chunk by chunk.
//
// Error feedback: quantize() encodes v = residual + delta (one fp32 addition per element) and
// leaves residual = v - dequantized(v). The subtraction is exact by construction: an element whose
// difference would round is sent as code 0 instead (its whole value stays in the residual), so
// dequantized + residual == residual_old + delta holds bit for bit for every finite v. Non-finite
// v are sent as 0, their residual is reset to 0, and they are counted.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gradex::compress::quant {

enum class Rounding {
  kNearest,     // round half to even: deterministic
  kStochastic,  // floor(v / scale + u), u from a counter-based generator: unbiased, reproducible
};
enum class ScaleType { kFloat32, kFloat16 };

struct QuantOptions {
  int bits = 8;       // 4 or 8
  size_t block = 64;  // elements per block: even, in [2, 65536]
  ScaleType scale = ScaleType::kFloat32;
  Rounding rounding = Rounding::kNearest;
  uint64_t seed = 0;  // stochastic rounding: the stream; element i draws u(seed, counter + i)
};

// InvalidArgument naming the field when an option is out of range.
void validate(const QuantOptions& options);

// Bytes of the encoding of `count` elements.
size_t encoded_size(const QuantOptions& options, size_t count);
// Largest code magnitude: 127 or 7.
int max_code(int bits);

// Quantizes residual[i] + delta[i] (residual may be null: no error feedback, treated as zeros)
// into `out` (encoded_size(count) bytes) and updates residual as described above. `counter` is
// the index of element 0 in the stochastic rounding stream (callers give every element of every
// round a distinct counter so that draws never repeat). Returns the number of non-finite values.
size_t quantize(const QuantOptions& options, const float* delta, float* residual, size_t count,
                uint64_t counter, uint8_t* out);

// out[i] = decoded value i, for i < count.
void dequantize(const QuantOptions& options, const uint8_t* in, size_t count, float* out);
// acc[i] += decoded value i (one fp32 addition per element).
void dequantize_add(const QuantOptions& options, const uint8_t* in, size_t count, float* acc);

// The uniform [0, 1) draw of stochastic rounding for (seed, counter): 24 random bits.
float uniform(uint64_t seed, uint64_t counter);

}  // namespace gradex::compress::quant
