#include "sync/data/sparse_gather.h"

#include "base/check.h"

namespace gradex::sync {

std::optional<bool> SparseGather::unsized_ring(comm::Communicator& comm,
                                               const LinkModel* link) const {
  using Mode = EngineOptions::SparseCollective;
  if (comm.size() < 2 || !comm.receives_any_length()) return std::nullopt;
  if (mode_ == Mode::kDirect) return false;
  if (mode_ != Mode::kAuto) return std::nullopt;
  GX_CHECK(link != nullptr);
  // The direct exchange or the ring as the model prices the last gather's sizes (every rank holds
  // them all, so every rank runs the same collective); the first gather learns them.
  if (!link->latency_bound() || last_sizes_.size() != static_cast<size_t>(comm.size()))
    return std::nullopt;
  return link->gather_ring_for(last_sizes_);
}

comm::AllgathervPath SparseGather::gather(comm::Communicator& comm, const LinkModel* link,
                                          const std::vector<uint8_t>& message,
                                          std::vector<comm::Bytes>& received) {
  using Mode = EngineOptions::SparseCollective;
  if (mode_ == Mode::kRing) {
    comm::ring_allgatherv(comm, message.data(), message.size(), received);
    return comm.size() > 1 ? comm::AllgathervPath::kRing : comm::AllgathervPath::kLocal;
  }
  comm::AllgathervPath path;
  if (const std::optional<bool> ring = unsized_ring(comm, link)) {
    comm::allgatherv_unsized(comm, message.data(), message.size(), received, *ring,
                             comm::kUnsizedMaxBytes, "sparse allgatherv");
    path = *ring ? comm::AllgathervPath::kRingUnsized : comm::AllgathervPath::kDirectUnsized;
  } else {
    comm::AllgathervOptions options;
    options.inline_max_bytes = comm.options().allgather_inline_bytes;
    if (mode_ == Mode::kAuto && comm.size() > 1) {
      GX_CHECK(link != nullptr);
      options.inline_max_bytes = link->inline_max(options.inline_max_bytes);
      options.ring_for = [link](const std::vector<uint64_t>& following) {
        return link->gather_ring_for(following);
      };
    }
    path = comm::allgatherv_inline(comm, message.data(), message.size(), received, options,
                                   "sparse allgatherv");
  }
  remember_sizes(received);
  return path;
}

void SparseGather::remember_sizes(const std::vector<comm::Bytes>& received) {
  last_sizes_.resize(received.size());
  for (size_t q = 0; q < received.size(); ++q)
    last_sizes_[q] = received[q].size();
}

}  // namespace gradex::sync
