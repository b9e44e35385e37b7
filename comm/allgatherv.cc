// allgatherv: every rank sends its payload size to every other rank, then its payload (skipped
// when empty). Direct exchange: each rank waits on every other rank itself, so a failure names the
// rank at fault; the payloads of a step are all in flight at once. Every received length is
// checked (the size message and each payload): a disagreement, e.g. ranks that are not in the same
// collective, fails with a MismatchError naming both ranks instead of misreading bytes.
#include "comm/allgatherv_prologue.h"
#include "comm/collectives.h"

namespace gradex::comm {

void allgatherv(Communicator& comm, const void* data, size_t bytes, std::vector<Bytes>& result) {
  const int P = comm.size();
  const int r = comm.rank();
  thread_local std::vector<uint64_t> sizes;
  uint64_t tag = 0;
  if (!detail::allgatherv_prologue(comm, "allgatherv", "allgatherv sizes", data, bytes, result,
                                   sizes, &tag))
    return;

  std::vector<RequestPtr> requests(2 * static_cast<size_t>(P));
  for (int q = 0; q < P; ++q) {
    if (q == r) continue;
    const size_t i = 2 * static_cast<size_t>(q);
    Bytes& slot = result[static_cast<size_t>(q)];
    slot.resize(sizes[static_cast<size_t>(q)]);
    if (!slot.empty()) requests[i] = comm.irecv(q, tag + 1, slot.data(), slot.size());
    if (bytes > 0) requests[i + 1] = comm.isend(q, tag + 1, data, bytes);
  }
  comm.wait_all(requests, "allgatherv");
  for (int q = 0; q < P; ++q) {
    const size_t i = 2 * static_cast<size_t>(q);
    if (q == r || !requests[i]) continue;
    const size_t got = comm.recv_length(*requests[i]);
    if (got != sizes[static_cast<size_t>(q)])
      detail::throw_length_mismatch("allgatherv", comm, "payload", q, got,
                                    sizes[static_cast<size_t>(q)]);
  }
}

std::vector<Bytes> allgatherv(Communicator& comm, const void* data, size_t bytes) {
  std::vector<Bytes> result;
  allgatherv(comm, data, bytes, result);
  return result;
}

}  // namespace gradex::comm
