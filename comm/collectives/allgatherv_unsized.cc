// allgatherv_unsized: the allgatherv without a size round, on communicators that learn a message's
// length on arrival (Communicator::receives_any_length). Every payload travels at once:
//   direct: every rank sends its payload to every other (tag), receiving P-1 payloads of any
//           length: one message latency, P-1 payloads into every rank at once;
//   ring:   at step s rank r forwards to r+1 the payload of rank r-s (its own at step 0) and
//           receives from r-1 that of rank r-1-s (tags tag + s): P-1 message latencies, one
//           payload on each link at a time.
// Each received payload's length is bounded by options' maximum (a longer one is a MismatchError
// naming the rank; nothing is allocated beyond the maximum).
#include <string>

#include "base/error.h"
#include "comm/collectives.h"
#include "comm/collectives/allgatherv_prologue.h"

namespace gradex::comm {

void allgatherv_unsized(Communicator& comm, const void* data, size_t bytes,
                        std::vector<Bytes>& result, bool ring, size_t max_bytes,
                        const char* operation) {
  if (comm.size() > 1 && !comm.receives_any_length())
    throw InternalError(std::string(operation) +
                        ": this communicator cannot receive payloads of unknown length");
  uint64_t tag = 0;
  if (!detail::take_own_slot(comm, data, bytes, result, &tag)) return;
  const int P = comm.size();
  const int r = comm.rank();
  if (!ring) {
    std::vector<RequestPtr> requests;
    requests.reserve(2 * static_cast<size_t>(P - 1));
    for (int j = 1; j < P; ++j) {  // staggered: at step j every rank sends to r + j
      const int from = (r - j + P) % P, to = (r + j) % P;
      requests.push_back(
          comm.irecv_any_length(from, tag, result[static_cast<size_t>(from)], max_bytes));
      requests.push_back(comm.isend(to, tag, data, bytes));
    }
    comm.wait_all(requests, operation);
    return;
  }
  const int right = (r + 1) % P, left = (r - 1 + P) % P;
  for (int s = 0; s + 1 < P; ++s) {
    const int outgoing = (r - s + P) % P, incoming = (r - 1 - s + P) % P;
    const Bytes& payload = result[static_cast<size_t>(outgoing)];
    std::vector<RequestPtr> requests(2);
    requests[0] = comm.irecv_any_length(left, tag + static_cast<uint64_t>(s),
                                        result[static_cast<size_t>(incoming)], max_bytes);
    requests[1] = comm.isend(right, tag + static_cast<uint64_t>(s), payload.data(), payload.size());
    comm.wait_all(requests, operation);
  }
}

}  // namespace gradex::comm
