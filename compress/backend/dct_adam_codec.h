// The Adam codec in DeMo's transform domain (the default for Adam-family optimizers;
// docs/adam_codec.md has the measurements that chose it): per tensor and rank, with decay b
// (GRADEX_ADAM_DECAY), the rank's gradient g and C the chunked DCT (compress/dct/chunked_dct.h,
// blocks of at most GRADEX_ADAM_DCT_CHUNK rows x columns of the tensor's [rows, cols] view):
//   m <- b*m + C(g);  sent <- top-k(m);  m <- m - sent        (m: coefficients)
// Every rank sums the ranks' sent coefficients in rank order (bit-identical on every rank) and
// hands C^-1(average) to the user's optimizer as the gradient. A kept coefficient reaches every
// element of its block, so every element receives a little of the average each step instead of
// rare bursts of error feedback, which is what Adam's per-element normalisation needs.
//
// It is the AdamCodec (adam_codec.h) run on C(g) instead of g: the selection, the wire payload
// (indices name coefficients), the sum and return_to_residual are the same code. The state's
// residual holds coefficients; DgcOptions::residual_dct_chunk records that in checkpoints, so a
// state is never restored into the element-domain codec or another chunk size (StateError).
// Dense steps send C^-1(b*m + C(g)) = b*C^-1(m) + g and empty m.
//
// Backends: the transform runs on the host. Host-accessible backends (CPU, Thrust on OpenMP)
// transform their memory in place of a copy; other backends (CUDA) copy the tensor to host
// staging memory and back, waiting for their own copies.
#pragma once

#include <vector>

#include "compress/backend/adam_codec.h"
#include "compress/dct/chunked_dct.h"

namespace gradex::compress::backend {

class DctAdamCodec : public AdamCodec {
 public:
  // `rows`: the tensor's output rows (0: unknown, a 1-D view); options.residual_dct_chunk is the
  // chunk (InvalidArgument when 0 or above dct::ChunkedDct::kMaxChunk).
  DctAdamCodec(Backend& backend, std::string key, size_t numel, uint64_t rows,
               const DgcOptions& options, const WireOptions& wire, float decay);

  const dct::ChunkedDct& transform() const { return dct_; }

  void encode_step(float* grad, float grad_scale, Stream& stream,
                   std::vector<uint8_t>& out) override;
  void dense_step(float* grad, float grad_scale, Stream& stream) override;
  // out (numel floats, all zeros) = C^-1(scale * sum of the payloads' coefficients).
  void sum_payloads(const std::vector<wire::PayloadSpan>& payloads, float scale, float* out,
                    Stream& stream) override;

 private:
  // dst (backend memory) = C(src) or C^-1(src) for src in backend memory.
  void apply(const float* src, float* dst, bool inverse, Stream& stream);

  dct::ChunkedDct dct_;
  BufferPtr coefficients_;        // backend memory, numel floats
  BufferPtr host_in_, host_out_;  // staging for backends that are not host-accessible
  EventPtr copied_;
};

}  // namespace gradex::compress::backend
