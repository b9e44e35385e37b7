#include "sync/outer/codecs.h"

#include <cstring>

#include "base/check.h"

namespace gradex::sync::outer {

void Fp32Codec::encode(const float* values, size_t count, size_t, uint8_t* out) {
  if (count) std::memcpy(out, values, 4 * count);
}

void Fp32Codec::decode_add(const uint8_t* in, size_t count, float* acc) const {
  for (size_t i = 0; i < count; ++i) {
    float x;
    std::memcpy(&x, in + 4 * i, 4);
    acc[i] += x;
  }
}

void Fp32Codec::decode(const uint8_t* in, size_t count, float* out) const {
  if (count) std::memcpy(out, in, 4 * count);
}

QuantCodec::QuantCodec(const compress::quant::QuantOptions& options, bool error_feedback,
                       size_t residual_begin, size_t residual_count, uint64_t stride)
    : options_(options),
      error_feedback_(error_feedback),
      residual_begin_(residual_begin),
      residual_(error_feedback ? residual_count : 0, 0.0f),
      stride_(stride) {
  compress::quant::validate(options_);
}

size_t QuantCodec::encoded_size(size_t count) const {
  return compress::quant::encoded_size(options_, count);
}

void QuantCodec::encode(const float* values, size_t count, size_t offset, uint8_t* out) {
  float* residual = nullptr;
  if (error_feedback_ && count > 0) {
    GX_CHECK(offset >= residual_begin_ && offset + count <= residual_begin_ + residual_.size());
    residual = residual_.data() + (offset - residual_begin_);
  }
  nonfinite_ +=
      compress::quant::quantize(options_, values, residual, count, round_ * stride_ + offset, out);
}

void QuantCodec::decode_add(const uint8_t* in, size_t count, float* acc) const {
  compress::quant::dequantize_add(options_, in, count, acc);
}

void QuantCodec::decode(const uint8_t* in, size_t count, float* out) const {
  compress::quant::dequantize(options_, in, count, out);
}

}  // namespace gradex::sync::outer
