// ring_allgather: equal-sized payloads gathered in place around the ring. At step s rank r sends
// slot r-s to r+1 and receives slot r-1-s from r-1 straight into `out` (tag + s), so each link
// carries one payload at a time and nothing is copied but the caller's own slot.
#include <cstring>
#include <string>

#include "base/check.h"
#include "base/error.h"
#include "comm/collectives/exact.h"

namespace gradex::comm {

void ring_allgather(Communicator& comm, const void* data, size_t bytes, void* out,
                    const char* operation) {
  const int P = comm.size();
  const int r = comm.rank();
  auto* slots = static_cast<uint8_t*>(out);
  auto slot = [&](int rank) { return slots + static_cast<size_t>(rank) * bytes; };
  if (bytes == 0) return;
  GX_CHECK(data != nullptr && out != nullptr);
  if (data != slot(r)) std::memmove(slot(r), data, bytes);
  if (P == 1) return;
  GX_CHECK_LT(static_cast<uint64_t>(P), uint64_t{1} << 16);
  const uint64_t tag = comm.next_collective_tag();
  const int right = (r + 1) % P, left = (r - 1 + P) % P;
  for (int s = 0; s + 1 < P; ++s) {
    const int outgoing = (r - s + P) % P, incoming = (r - 1 - s + P) % P;
    std::vector<RequestPtr> requests(2);
    requests[0] = comm.irecv(left, tag + static_cast<uint64_t>(s), slot(incoming), bytes);
    requests[1] = comm.isend(right, tag + static_cast<uint64_t>(s), slot(outgoing), bytes);
    comm.wait_all(requests, operation);
    const size_t got = comm.recv_length(*requests[0]);
    if (got != bytes)
      throw MismatchError(std::string(operation) + ": rank " + std::to_string(left) + " sent " +
                          std::to_string(got) + " bytes of rank " + std::to_string(incoming) +
                          "'s payload, this rank expected " + std::to_string(bytes));
  }
}

}  // namespace gradex::comm
