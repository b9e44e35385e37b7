// The sparse codec for optimizers that keep their own moments (Adam, AdamW, LAMB, Lion, ...):
// top-k of a local, decaying first-moment buffer with error feedback (DeMo's transmission without
// its DCT; docs/adam_codec.md has the measurements that chose it over DGC's plain error feedback).
//
// Per tensor and rank, with decay b (GRADEX_ADAM_DECAY) and the rank's gradient g:
//   m <- b*m + g;  sent <- top-k(m);  m <- m - sent        (a sparse step)
//   m <- b*m + g;  sent <- m;         m <- 0               (a dense step: early warm-up)
// and every rank receives the average of the sent vectors, which the user's optimizer takes as its
// gradient: gradex adds no momentum of its own to it (the optimizer keeps its moments; the buffer m
// only decides what is sent and when, and what is not sent yet fades by b per step instead of
// piling up as DGC's residual does). b = 1 is DGC's error-feedback top-k without momentum.
//
// It is a DgcCodec whose state has no momentum buffer (DgcOptions::momentum = 0): m is the DGC
// residual v, scaled by b in place (Backend::apply_momentum with m = 0, on every backend) just
// before DGC's update adds g to it. So the selection, the wire payload, the sum of every rank's
// payloads in rank order (bit-identical averages on every rank) and the checkpoint (DgcState's
// blob: m and the step counter) are DGC's own.
#pragma once

#include "compress/backend/dgc_codec.h"

namespace gradex::compress::backend {

class AdamCodec : public DgcCodec {
 public:
  // `options.momentum` must be 0 (InvalidArgument otherwise: the optimizer keeps the momentum);
  // `decay` in [0, 1].
  AdamCodec(Backend& backend, std::string key, size_t numel, const DgcOptions& options,
            const WireOptions& wire, float decay);

  float decay() const { return decay_; }

  void encode_step(float* grad, float grad_scale, Stream& stream,
                   std::vector<uint8_t>& out) override;
  void dense_step(float* grad, float grad_scale, Stream& stream) override;

 private:
  // m <- b*m on `stream` (nothing when b == 1).
  void decay_buffer(Stream& stream);

  float decay_;
};

}  // namespace gradex::compress::backend
