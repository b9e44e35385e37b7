// broadcast (root sends to every rank directly) and barrier (dissemination: ceil(log2 P) rounds).
#include "base/check.h"
#include "base/error.h"
#include "comm/collectives.h"

namespace gradex::comm {

void broadcast(Communicator& comm, void* data, size_t bytes, int root) {
  const int P = comm.size();
  if (root < 0 || root >= P)
    throw InvalidArgument("broadcast root " + std::to_string(root) +
                          " is not a rank of a world of " + std::to_string(P));
  if (P == 1 || bytes == 0) return;
  GX_CHECK(data != nullptr);
  const uint64_t tag = comm.next_collective_tag();
  std::vector<RequestPtr> requests;
  if (comm.rank() == root) {
    for (int q = 0; q < P; ++q)
      if (q != root) requests.push_back(comm.isend(q, tag, data, bytes));
    comm.wait_all(requests, "broadcast");
    return;
  }
  requests.push_back(comm.irecv(root, tag, data, bytes));
  comm.wait_all(requests, "broadcast");
  size_t got = comm.recv_length(*requests[0]);
  if (got != bytes)
    throw MismatchError("broadcast: root rank " + std::to_string(root) + " sent " +
                        std::to_string(got) + " bytes, this rank expected " +
                        std::to_string(bytes));
}

void barrier(Communicator& comm) {
  const int P = comm.size();
  if (P == 1) return;
  const int r = comm.rank();
  const uint64_t tag = comm.next_collective_tag();
  uint8_t out = 0;
  uint64_t round = 0;
  for (int distance = 1; distance < P; distance *= 2, ++round) {
    // Round k: tell rank r + 2^k, hear from rank r - 2^k. After ceil(log2 P) rounds every rank
    // has (transitively) heard from every other.
    uint8_t in = 0;
    std::vector<RequestPtr> requests;
    requests.push_back(comm.irecv((r - distance + P) % P, tag + round, &in, 1));
    requests.push_back(comm.isend((r + distance) % P, tag + round, &out, 1));
    comm.wait_all(requests, "barrier");
  }
}

}  // namespace gradex::comm
