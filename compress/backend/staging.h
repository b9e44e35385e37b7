// The only traffic between a device backend and host memory on the engine's path (Debian's UCX has
// no CUDA transports, so whatever crosses the wire passes through host memory):
//   SelectionStager  a DGC step's selection (indices + values) to host, for wire::encode;
//   PayloadApplier   received payloads, decoded and validated on the host, back to the backend,
//                    where scatter_add sums them into the output in call (rank) order.
// Dense 16-bit buckets use Backend::copy into an allocate_staging() buffer directly. On
// host-accessible backends nothing is copied and bytes_staged() stays 0.
#pragma once

#include <cstddef>

#include "compress/backend/backend.h"
#include "compress/wire/codec.h"

namespace gradex::compress::backend {

class SelectionStager {
 public:
  explicit SelectionStager(Backend& backend);
  // After `info = state.step(...)` on `stream`: the selection in host memory, valid until the next
  // call or the next step of `state`. Waits for its own copy only (an event on `stream`).
  wire::SparseRef stage(DgcState& state, const DgcStepInfo& info, Stream& stream);
  // Bytes copied from the device to host so far.
  size_t bytes_staged() const { return bytes_; }

 private:
  Backend& backend_;
  BufferPtr host_;
  EventPtr done_;
  size_t bytes_ = 0;
};

class PayloadApplier {
 public:
  explicit PayloadApplier(Backend& backend);
  // out (backend memory, numel floats) += scale * payload, queued on `stream`. numel must equal
  // the payload's element count (InvalidArgument otherwise, as wire::accumulate). Use one stream
  // per applier: its staging buffers are reused once the previous apply's copy has completed.
  void apply(const wire::DecodedPayload& payload, float* out, size_t numel, float scale,
             Stream& stream);
  size_t bytes_staged() const { return bytes_; }

 private:
  Backend& backend_;
  BufferPtr host_, device_;
  EventPtr copied_;
  size_t bytes_ = 0;
};

}  // namespace gradex::compress::backend
