// allgatherv: every rank sends its payload size to every other rank, then its payload (skipped
// when empty). Direct exchange: each rank waits on every other rank itself, so a failure names the
// rank at fault; the payloads of a step are all in flight at once. Every received length is
// checked (the size message and each payload): a disagreement, e.g. ranks that are not in the same
// collective, fails with a MismatchError naming both ranks instead of misreading bytes.
#include <cstring>

#include "base/check.h"
#include "base/error.h"
#include "comm/collectives.h"

namespace gradex::comm {

std::vector<Bytes> allgatherv(Communicator& comm, const void* data, size_t bytes) {
  const int P = comm.size();
  const int r = comm.rank();
  GX_CHECK(data != nullptr || bytes == 0);
  std::vector<Bytes> result(static_cast<size_t>(P));
  if (bytes > 0) {
    const auto* p = static_cast<const uint8_t*>(data);
    result[static_cast<size_t>(r)].assign(p, p + bytes);
  }
  if (P == 1) return result;
  const uint64_t tag = comm.next_collective_tag();

  // Sizes as little-endian-independent uint64 values (all ranks run the same build).
  std::vector<uint64_t> sizes(static_cast<size_t>(P), 0);
  uint64_t my_size = bytes;
  auto check = [&](const char* what, int q, size_t received, size_t expected) {
    if (received == expected) return;
    throw MismatchError("allgatherv: rank " + std::to_string(r) + " received " +
                        std::to_string(received) + " bytes of " + what + " from rank " +
                        std::to_string(q) + ", expected " + std::to_string(expected) + ": ranks " +
                        std::to_string(q) + " and " + std::to_string(r) +
                        " are not in the same collective");
  };
  {
    // Requests at 2q (receive from q) and 2q + 1 (send to q).
    std::vector<RequestPtr> requests(2 * static_cast<size_t>(P));
    for (int q = 0; q < P; ++q) {
      if (q == r) continue;
      const size_t i = 2 * static_cast<size_t>(q);
      requests[i] = comm.irecv(q, tag, &sizes[static_cast<size_t>(q)], sizeof(uint64_t));
      requests[i + 1] = comm.isend(q, tag, &my_size, sizeof(uint64_t));
    }
    comm.wait_all(requests, "allgatherv sizes");
    for (int q = 0; q < P; ++q)
      if (q != r)
        check("size", q, comm.recv_length(*requests[2 * static_cast<size_t>(q)]), sizeof(uint64_t));
  }

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
    if (q != r && requests[i])
      check("payload", q, comm.recv_length(*requests[i]), sizes[static_cast<size_t>(q)]);
  }
  return result;
}

}  // namespace gradex::comm
