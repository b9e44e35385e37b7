// How the engine gathers a DGC unit's messages: one round trip while every payload is small, and
// above the inline maximum the direct exchange or the ring, whichever the link model
// (sync/policy/link_model.h) prices faster for the sizes at hand.
//
// Agreement. The choice must be the same on every rank, or ranks would run different collectives.
// It depends only on numbers every rank holds identically: the agreed link model (rank 0's probe,
// sync/policy/agreed_link.h), the shared options (GRADEX_ALLGATHER_INLINE_KB), the world size, and
// every rank's payload size, which every rank knows after the allgatherv's first round
// (comm/collectives.h: allgatherv_inline's ring_for) or from the previous gather.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "comm/collectives.h"
#include "sync/engine/options.h"
#include "sync/policy/link_model.h"

namespace gradex::sync {

class SparseGather {
 public:
  explicit SparseGather(EngineOptions::SparseCollective mode) : mode_(mode) {}

  // Whether gather() chooses by the link model (GRADEX_SPARSE_COLLECTIVE=auto): the caller agrees
  // it first (AgreedLink::agree, a route's plan step).
  bool needs_link() const { return mode_ == EngineOptions::SparseCollective::kAuto; }

  // Collective (the progress thread, every rank in the same unit order): every rank's `message`
  // into `received`, by rank. GRADEX_SPARSE_COLLECTIVE=ring: the two-round ring_allgatherv;
  // direct: comm::allgatherv_unsized's direct exchange where the communicator receives messages
  // of unknown length, else allgatherv_inline, the payloads above the inline maximum directly;
  // auto: allgatherv_inline with `link`'s inline maximum and gather_ring_for; on a latency-bound
  // link whose communicator receives messages of unknown length, every gather after the first is
  // comm::allgatherv_unsized (no size round), direct or around the ring as the model prices the
  // previous gather's sizes. `link`: the agreed model, required under auto with two ranks or more.
  comm::AllgathervPath gather(comm::Communicator& comm, const LinkModel* link,
                              const std::vector<uint8_t>& message,
                              std::vector<comm::Bytes>& received);

  // Whether the next gather skips its size round (what the planner prices): under auto on a
  // latency-bound link, or under direct, where the communicator receives any length.
  static bool unsized(EngineOptions::SparseCollective mode, bool receives_any_length) {
    return receives_any_length && mode != EngineOptions::SparseCollective::kRing;
  }

  // A new membership: the previous gather's sizes belong to the old one.
  void reset() { last_sizes_.clear(); }

 private:
  // Whether this gather skips the size round (comm::allgatherv_unsized), and then whether around
  // the ring: always directly under GRADEX_SPARSE_COLLECTIVE=direct; under auto on a latency-bound
  // link once a gather's sizes are known. nullopt: the sized collectives.
  std::optional<bool> unsized_ring(comm::Communicator& comm, const LinkModel* link) const;
  void remember_sizes(const std::vector<comm::Bytes>& received);

  EngineOptions::SparseCollective mode_;
  // Every rank's payload size in the last gather (identical on every rank: an allgatherv's
  // result), the prediction an unsized gather is chosen by.
  std::vector<uint64_t> last_sizes_;
};

}  // namespace gradex::sync
