#include "compress/backend/adam_codec.h"

#include <cmath>
#include <string>

#include "base/error.h"

namespace gradex::compress::backend {
namespace {

const DgcOptions& checked(const std::string& key, const DgcOptions& options, float decay) {
  if (options.momentum != 0.0f)
    throw InvalidArgument("tensor '" + key +
                          "': the Adam codec keeps no momentum of its own (got " +
                          std::to_string(options.momentum) + "); the optimizer owns its moments");
  if (!(decay >= 0.0f && decay <= 1.0f))
    throw InvalidArgument("tensor '" + key + "': the Adam codec's decay must lie in [0, 1], got " +
                          std::to_string(decay));
  return options;
}

}  // namespace

AdamCodec::AdamCodec(Backend& backend, std::string key, size_t numel, const DgcOptions& options,
                     const WireOptions& wire, float decay)
    : DgcCodec(backend, key, numel, checked(key, options, decay), wire), decay_(decay) {}

void AdamCodec::decay_buffer(Stream& stream) {
  if (decay_ == 1.0f) return;
  // The residual is the state's own memory (DgcState::residual's contract); m = 0 makes
  // apply_momentum the in-place scale g <- s*g on every backend.
  float* m = const_cast<float*>(state().residual());
  backend().apply_momentum(m, nullptr, state().numel(), 0.0f, false, decay_, stream);
}

void AdamCodec::encode_step(float* grad, float grad_scale, Stream& stream,
                            std::vector<uint8_t>& out) {
  decay_buffer(stream);
  DgcCodec::encode_step(grad, grad_scale, stream, out);
}

void AdamCodec::dense_step(float* grad, float grad_scale, Stream& stream) {
  decay_buffer(stream);
  DgcCodec::dense_step(grad, grad_scale, stream);
}

}  // namespace gradex::compress::backend
