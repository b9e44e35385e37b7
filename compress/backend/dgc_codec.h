// One tensor's DGC codec on a backend: its state (u and v in backend memory, compress/dgc's
// step), the selection staged to host memory, the payload encoded for the wire (compress/wire),
// the tensor's key id in every payload, and the sum of every rank's payloads into the average.
// The engine (sync/) holds one per DGC tensor and calls it from its pipeline stages; it frames
// the payloads of a unit with compress/wire/message.h.
//
// Numerics: every rank adds the same payloads in rank order into zeros, so the averages are
// bit-identical on every rank and every backend (scatter_add and wire::add_range share the
// expression out + scale * value). On the CPU backend the step also clears the gradient in the
// pass that reads it (the buffer then receives the sum: no separate zero-fill) and the sum adds
// the payloads' values in their wire type straight into the buffer, in pieces on the pool.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compress/backend/backend.h"
#include "compress/backend/staging.h"
#include "compress/options.h"
#include "compress/wire/codec.h"
#include "compress/wire/message.h"

namespace gradex::compress::backend {

// Stable 64-bit id of a tensor key (FNV-1a), carried in payload headers so that a receiver can
// verify that a payload belongs to the tensor it decodes.
uint64_t tensor_key_id(const std::string& key);

class DgcCodec {
 public:
  // `options.sparsity` is the tensor's own (its policy's); `backend` outlives the codec.
  DgcCodec(Backend& backend, std::string key, size_t numel, const DgcOptions& options,
           const WireOptions& wire);
  virtual ~DgcCodec() = default;
  DgcCodec(const DgcCodec&) = delete;
  DgcCodec& operator=(const DgcCodec&) = delete;

  DgcState& state() { return *state_; }
  const std::string& key() const { return key_; }
  uint64_t key_id() const { return key_id_; }

  // A sparse step over `grad` (backend memory, times grad_scale): the DGC step, its selection
  // staged and encoded, appended to `out`; `grad` is left all zeros (it receives sum_payloads).
  // (AdamCodec, compress/backend/adam_codec.h, adds a decay of v before both steps;
  // DctAdamCodec runs them on the gradient's chunked DCT.)
  virtual void encode_step(float* grad, float grad_scale, Stream& stream,
                           std::vector<uint8_t>& out);
  // An empty selection (no element, the state untouched), appended to `out`: the payload of a rank
  // that contributes nothing to this step's sum (sync's absent submissions).
  void encode_empty(std::vector<uint8_t>& out);
  // A dense step: `grad` becomes what this rank sends densely (v after the update); v is emptied,
  // u kept. Queued on `stream`.
  virtual void dense_step(float* grad, float grad_scale, Stream& stream);
  // out (numel floats, all zeros) += scale * payloads[r] for r in rank order. Every payload is
  // validated (wire::decode's checks, this tensor's key and size); CorruptPayload names the key and
  // the lowest rank whose payload is bad. (DctAdamCodec, dct_adam_codec.h, sums coefficients and
  // writes their inverse transform.)
  virtual void sum_payloads(const std::vector<wire::PayloadSpan>& payloads, float scale, float* out,
                            Stream& stream);

  // v[i] += value for every element of `dropped` (host memory), queued on `stream`: the mass a
  // host-level re-selection (host_reselect.h) did not keep returns to this rank's residual.
  void return_to_residual(const wire::DecodedPayload& dropped, Stream& stream);

  // Bytes copied between the backend and host memory so far (0 on host backends).
  size_t staged_bytes() const { return stager_.bytes_staged() + applier_.bytes_staged(); }

 protected:
  Backend& backend() { return backend_; }

 private:
  void sum_on_host(const std::vector<wire::PayloadSpan>& payloads, float scale, float* out);

  Backend& backend_;
  std::string key_;
  uint64_t key_id_;
  WireOptions wire_;
  DgcStatePtr state_;
  SelectionStager stager_;
  PayloadApplier applier_;
  BufferPtr dense_out_;  // a dense step's output, allocated by the first one
  wire::DecodedPayload decoded_;
};

}  // namespace gradex::compress::backend
