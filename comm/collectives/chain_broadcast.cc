// chain_broadcast: the root's bytes travel down a chain root -> root+1 -> ... -> root-1 in
// options().ring_chunk_bytes pieces, each rank forwarding a piece as soon as it has arrived, so
// every rank (the root included) sends the buffer once: (P-2) piece times plus one transfer time,
// where the direct broadcast (broadcast_barrier.cc) sends it P-1 times from the root's uplink.
//
// Tags: tag + tag_lane(k) for piece k (consecutive pieces take different lanes, hence connections
// when the communicator stripes; pieces k and k + kTagLanes share a tag and match in the order
// sent). Every received piece's length is checked.
#include <algorithm>
#include <string>

#include "base/check.h"
#include "base/error.h"
#include "comm/collectives/exact.h"

namespace gradex::comm {

void chain_broadcast(Communicator& comm, void* data, size_t bytes, int root,
                     const char* operation) {
  const int P = comm.size();
  if (root < 0 || root >= P)
    throw InvalidArgument(std::string(operation) + ": root " + std::to_string(root) +
                          " is not a rank of a world of " + std::to_string(P));
  if (P == 1 || bytes == 0) return;
  GX_CHECK(data != nullptr);
  const uint64_t tag = comm.next_collective_tag();
  const int r = comm.rank();
  const int position = (r - root + P) % P;  // 0: the root; P-1: the end of the chain
  const int previous = (r - 1 + P) % P;
  const int next = (r + 1) % P;
  const bool forwards = position + 1 < P;
  const size_t piece = std::max<size_t>(1, comm.options().ring_chunk_bytes);
  const size_t pieces = (bytes + piece - 1) / piece;
  auto* base = static_cast<uint8_t*>(data);
  auto length_of = [&](size_t k) { return std::min(piece, bytes - k * piece); };

  std::vector<RequestPtr> sends;
  sends.reserve(forwards ? pieces : 0);
  if (position == 0) {
    for (size_t k = 0; k < pieces; ++k)
      sends.push_back(comm.isend(next, tag + tag_lane(k), base + k * piece, length_of(k)));
    comm.wait_all(sends, operation);
    return;
  }
  // Every receive is posted up front, so pieces land in place whatever the sender's pace.
  std::vector<RequestPtr> receives;
  receives.reserve(pieces);
  for (size_t k = 0; k < pieces; ++k)
    receives.push_back(comm.irecv(previous, tag + tag_lane(k), base + k * piece, length_of(k)));
  std::vector<RequestPtr> one(1);
  for (size_t k = 0; k < pieces; ++k) {
    one[0] = std::move(receives[k]);
    comm.wait_all(one, operation);
    const size_t got = comm.recv_length(*one[0]);
    if (got != length_of(k))
      throw MismatchError(std::string(operation) + ": piece " + std::to_string(k) + " from rank " +
                          std::to_string(previous) + " has " + std::to_string(got) +
                          " bytes, this rank expected " + std::to_string(length_of(k)));
    one[0].reset();
    if (forwards)
      sends.push_back(comm.isend(next, tag + tag_lane(k), base + k * piece, length_of(k)));
  }
  comm.wait_all(sends, operation);
}

}  // namespace gradex::comm
