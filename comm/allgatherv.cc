// allgatherv: every rank sends its payload size to every other rank, then its payload (skipped
// when empty). Direct exchange: each rank waits on every other rank itself, so a failure names the
// rank at fault; the payloads of a step are all in flight at once.
#include <cstring>

#include "base/check.h"
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
  {
    std::vector<RequestPtr> requests;
    for (int q = 0; q < P; ++q) {
      if (q == r) continue;
      requests.push_back(comm.irecv(q, tag, &sizes[static_cast<size_t>(q)], sizeof(uint64_t)));
      requests.push_back(comm.isend(q, tag, &my_size, sizeof(uint64_t)));
    }
    comm.wait_all(requests, "allgatherv sizes");
  }

  std::vector<RequestPtr> requests;
  for (int q = 0; q < P; ++q) {
    if (q == r) continue;
    Bytes& slot = result[static_cast<size_t>(q)];
    slot.resize(sizes[static_cast<size_t>(q)]);
    if (!slot.empty()) requests.push_back(comm.irecv(q, tag + 1, slot.data(), slot.size()));
    if (bytes > 0) requests.push_back(comm.isend(q, tag + 1, data, bytes));
  }
  comm.wait_all(requests, "allgatherv");
  return result;
}

}  // namespace gradex::comm
