#include "compress/backend/dct_adam_codec.h"

#include <algorithm>
#include <string>

#include "base/error.h"

namespace gradex::compress::backend {
namespace {

const DgcOptions& checked(const std::string& key, const DgcOptions& options) {
  if (options.residual_dct_chunk == 0 || options.residual_dct_chunk > dct::ChunkedDct::kMaxChunk)
    throw InvalidArgument("tensor '" + key + "': the DCT Adam codec's chunk must lie in [1, " +
                          std::to_string(dct::ChunkedDct::kMaxChunk) + "], got " +
                          std::to_string(options.residual_dct_chunk));
  return options;
}

}  // namespace

DctAdamCodec::DctAdamCodec(Backend& backend, std::string key, size_t numel, uint64_t rows,
                           const DgcOptions& options, const WireOptions& wire, float decay)
    : AdamCodec(backend, key, numel, checked(key, options), wire, decay),
      dct_(numel, rows, options.residual_dct_chunk),
      coefficients_(backend.allocate(std::max<size_t>(numel, 1) * 4)) {
  if (!backend.host_accessible()) {
    host_in_ = backend.allocate_staging(std::max<size_t>(numel, 1) * 4);
    host_out_ = backend.allocate_staging(std::max<size_t>(numel, 1) * 4);
    copied_ = backend.create_event();
  }
}

void DctAdamCodec::apply(const float* src, float* dst, bool inverse, Stream& stream) {
  const size_t n = dct_.numel();
  if (n == 0) return;
  Backend& b = backend();
  if (b.host_accessible()) {  // host backends run queued work at the call
    if (inverse)
      dct_.inverse(src, dst);
    else
      dct_.forward(src, dst);
    return;
  }
  b.copy(host_in_->data(), src, n * 4, stream);
  copied_->record(stream);
  copied_->synchronize();
  if (inverse)
    dct_.inverse(host_in_->as<float>(), host_out_->as<float>());
  else
    dct_.forward(host_in_->as<float>(), host_out_->as<float>());
  b.copy(dst, host_out_->data(), n * 4, stream);
  copied_->record(stream);
  copied_->synchronize();  // host_out_ is reused by the next call
}

void DctAdamCodec::encode_step(float* grad, float grad_scale, Stream& stream,
                               std::vector<uint8_t>& out) {
  float* c = coefficients_->as<float>();
  apply(grad, c, false, stream);
  AdamCodec::encode_step(c, grad_scale, stream, out);   // leaves c all zeros
  backend().fill_zero(grad, dct_.numel() * 4, stream);  // receives sum_payloads
}

void DctAdamCodec::dense_step(float* grad, float grad_scale, Stream& stream) {
  float* c = coefficients_->as<float>();
  apply(grad, c, false, stream);
  AdamCodec::dense_step(c, grad_scale, stream);  // c = b*m + s*C(g); m emptied
  apply(c, grad, true, stream);
}

void DctAdamCodec::sum_payloads(const std::vector<wire::PayloadSpan>& payloads, float scale,
                                float* out, Stream& stream) {
  float* c = coefficients_->as<float>();
  backend().fill_zero(c, dct_.numel() * 4, stream);
  AdamCodec::sum_payloads(payloads, scale, c, stream);
  apply(c, out, true, stream);
}

}  // namespace gradex::compress::backend
