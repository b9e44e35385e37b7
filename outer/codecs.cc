#include "outer/codecs.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "base/check.h"
#include "base/error.h"
#include "compress/dgc/select.h"

namespace gradex::outer {

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

TopkCodec::TopkCodec(double density, uint64_t numel, uint64_t key,
                     const compress::WireOptions& wire)
    : key_(key), wire_(wire), residual_(numel, 0.0f) {
  if (!(density > 0.0 && density <= 1.0))
    throw ConfigError("GRADEX_OUTER_DENSITY=" + std::to_string(density) + " must be in (0, 1]");
  if (numel > std::numeric_limits<uint32_t>::max())
    throw ConfigError("DiLoCo top-k: a fragment of " + std::to_string(numel) +
                      " elements exceeds the sparse format's 2^32 - 1 (use more fragments)");
  const double k = std::ceil(density * static_cast<double>(numel));
  k_ = numel == 0 ? 0 : static_cast<size_t>(std::min<double>(std::max(k, 1.0), numel));
}

uint64_t TopkCodec::encode(const float* delta, std::vector<uint8_t>& out) {
  uint64_t nonfinite = 0;
  const size_t n = residual_.size();
  for (size_t i = 0; i < n; ++i) {
    const float v = residual_[i] + delta[i];
    const bool finite = std::isfinite(v);
    nonfinite += !finite;
    residual_[i] = finite ? v : 0.0f;
  }
  compress::dgc::exact_top_k(residual_.data(), n, k_, indices_, scratch_);
  values_.resize(indices_.size());
  for (size_t j = 0; j < indices_.size(); ++j) {
    values_[j] = residual_[indices_[j]];
    residual_[indices_[j]] = 0.0f;
  }
  compress::wire::SparseRef ref{n, indices_.data(), values_.data(), indices_.size(),
                                DType::kFloat32};
  compress::wire::encode(ref, key_, wire_, out);
  return nonfinite;
}

void TopkCodec::decode_add(const uint8_t* in, size_t size, float* acc) {
  compress::wire::decode(in, size, decoded_);
  if (decoded_.header.key != key_)
    throw MismatchError("DiLoCo top-k: a payload of fragment " +
                        std::to_string(decoded_.header.key) +
                        " arrived in the exchange of fragment " + std::to_string(key_));
  if (decoded_.header.numel != residual_.size())
    throw MismatchError("DiLoCo top-k: a payload of " + std::to_string(decoded_.header.numel) +
                        " elements for a fragment of " + std::to_string(residual_.size()));
  const auto& idx = decoded_.indices;
  const auto& val = decoded_.values;
  for (size_t j = 0; j < idx.size(); ++j)
    acc[idx[j]] += val[j];
}

}  // namespace gradex::outer
