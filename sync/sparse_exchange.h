// The sparse (DGC) path of the engine: each tensor's DGC state lives in a SparseCodec; all sparse
// tensors ready in one round are compressed, sent in one allgatherv (one message per rank holding
// one payload per tensor), then decoded and accumulated into averages on every rank.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/config.h"
#include "comm/communicator.h"
#include "compress/wire/codec.h"
#include "sync/byte_io.h"
#include "sync/options.h"

namespace gradex::sync {

// Stable 64-bit id of a tensor key (FNV-1a), carried in payload headers so a receiver can verify
// that a payload belongs to the tensor it decodes.
uint64_t tensor_key_id(const std::string& key);

class SparseCodec {
 public:
  SparseCodec(const std::string& key, uint64_t key_id, uint64_t numel, double sparsity,
              const config::Config& config, int world_size);
  ~SparseCodec();

  // Moves the schedule to `step` (the tensor's exchange counter that every rank agrees on).
  void set_step(uint64_t step);
  // Density (1 - sparsity) of the schedule at `step`.
  double density_at(uint64_t step) const;
  // A dense step: `grad` (in) becomes what this rank sends densely (the momentum-corrected,
  // accumulated update); the residual is cleared and the step counted, so nothing is lost or sent
  // twice. The momentum buffer is kept. `grad_scale` is the step's clipping factor.
  void dense_step(float* grad, float grad_scale = 1.0f);
  // A sparse step: compresses `grad` (times grad_scale) into an encoded payload appended to `out`.
  void compress(const float* grad, float grad_scale, std::vector<uint8_t>& out);
  // DGC's momentum buffer u (null when GRADEX_MOMENTUM is 0): read for diagnostics, written by
  // LocalSGD's local phase.
  float* momentum();
  // Decodes one rank's payload and adds value * scale into `sum`. CorruptPayload on bad input.
  void accumulate(const uint8_t* payload, size_t size, float scale, float* sum) const;

  // The exchange's own forms of the two above (sparse_average uses them; bit-identical results):
  // compress_and_clear is compress() that also leaves `grad` all zeros (it then receives the
  // sparse sum, so no separate zero-fill pass is needed) and keeps the payload in this codec
  // (also payload()), valid until its next call.
  const std::vector<uint8_t>& compress_and_clear(float* grad, float grad_scale);
  const std::vector<uint8_t>& payload() const;
  // Validates one rank's payload for this tensor (key, element count, everything wire::decode
  // checks) without widening its values; add it with compress::wire::add_range. The view points
  // into `payload` and `scratch`.
  compress::wire::PayloadView view(const uint8_t* payload, size_t size,
                                   compress::wire::DecodeScratch& scratch) const;

  void save(ByteWriter& w) const;
  void load(ByteReader& r);

  uint64_t numel() const;
  uint64_t steps_done() const;
  const float* residual() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct SparseItem {
  const std::string* key = nullptr;
  SparseCodec* codec = nullptr;
  float* values = nullptr;  // in: this rank's gradient (finite); out: the average over ranks
  float grad_scale = 1.0f;  // the step's clipping factor for this rank's gradient
};

struct SparseCounters {
  uint64_t wire_bytes = 0;
  uint64_t received_bytes = 0;
  double compress_seconds = 0;
  double communicate_seconds = 0;
  double decode_seconds = 0;
};

// Collective: identical item lists (keys, order) on every rank. Gradients must be finite: the
// engine keeps a gradient that is non-finite on any rank out of every rank's exchange (it would
// stay in the residual forever), deciding that from the flag carried in negotiation. `ring`: the
// payloads travel by comm::ring_allgatherv (no incast), else by the direct allgatherv; the
// results are bit-identical either way.
void sparse_average(comm::Communicator& comm, std::vector<SparseItem>& items,
                    SparseCounters& counters, bool ring = true);

// One tensor's part of a sparse exchange, for an engine that moves the messages itself (the
// pipeline, sync/pipeline.h): sum (numel floats, all zeros: compress_and_clear left it so)
// receives scale * payloads[r] for every rank r, added in rank order per element, which is
// bit-identical to sparse_average's sums however the work is split over the pool. Every payload
// is validated first; CorruptPayload names `key` and the rank whose payload is bad (the lowest).
void sum_payloads(const SparseCodec& codec, const std::string& key,
                  const std::vector<std::pair<const uint8_t*, size_t>>& payloads, float scale,
                  float* sum);

}  // namespace gradex::sync
