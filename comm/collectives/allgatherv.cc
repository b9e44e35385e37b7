// allgatherv: every rank sends its payload size to every other rank, then its payload (skipped
// when empty). Direct exchange: each rank waits on every other rank itself, so a failure names the
// rank at fault; the payloads of a step are all in flight at once. Every received length is
// checked (the size message and each payload): a disagreement, e.g. ranks that are not in the same
// collective, fails with a MismatchError naming both ranks instead of misreading bytes.
#include "comm/collectives.h"
#include "comm/collectives/allgatherv_prologue.h"

namespace gradex::comm {

namespace detail {

void direct_payloads(Communicator& comm, const char* operation, uint64_t tag, const void* data,
                     const std::vector<uint64_t>& travel, std::vector<Bytes>& result) {
  const int P = comm.size();
  const int r = comm.rank();
  const uint64_t mine = travel[static_cast<size_t>(r)];
  // Requests at 2q (receive from q) and 2q + 1 (send to q).
  std::vector<RequestPtr> requests(2 * static_cast<size_t>(P));
  for (int q = 0; q < P; ++q) {
    if (q == r) continue;
    const size_t i = 2 * static_cast<size_t>(q);
    const uint64_t want = travel[static_cast<size_t>(q)];
    if (want > 0) requests[i] = comm.irecv(q, tag, result[static_cast<size_t>(q)].data(), want);
    if (mine > 0) requests[i + 1] = comm.isend(q, tag, data, mine);
  }
  comm.wait_all(requests, operation);
  for (int q = 0; q < P; ++q) {
    const size_t i = 2 * static_cast<size_t>(q);
    if (q == r || !requests[i]) continue;
    const size_t got = comm.recv_length(*requests[i]);
    if (got != travel[static_cast<size_t>(q)])
      throw_length_mismatch(operation, comm, "payload", q, got, travel[static_cast<size_t>(q)]);
  }
}

}  // namespace detail

void allgatherv(Communicator& comm, const void* data, size_t bytes, std::vector<Bytes>& result) {
  detail::two_round_allgatherv(comm, "allgatherv", "allgatherv sizes", data, bytes, result,
                               detail::direct_payloads);
}

std::vector<Bytes> allgatherv(Communicator& comm, const void* data, size_t bytes) {
  std::vector<Bytes> result;
  allgatherv(comm, data, bytes, result);
  return result;
}

}  // namespace gradex::comm
