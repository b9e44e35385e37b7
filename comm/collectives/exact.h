// Collectives that move bytes unchanged, for the C API's exact collectives (capi/group.cc): every
// rank passes the same byte count (a received piece of another length is a MismatchError naming the
// sender); `operation` names the call in errors. Beside comm/collectives.h's broadcast (the root
// sends to every rank) and allgatherv (payloads of any size).
#pragma once

#include <cstddef>

#include "comm/communicator.h"

namespace gradex::comm {

// The broadcast contract as a pipelined chain root -> root+1 -> ... (chain_broadcast.cc): every
// rank sends the buffer once, in options().ring_chunk_bytes pieces forwarded as they arrive, so the
// root's uplink carries the bytes once instead of P-1 times.
void chain_broadcast(Communicator& comm, void* data, size_t bytes, int root,
                     const char* operation = "broadcast");

// Every rank's `bytes` bytes of `data`, in rank order, into `out` (P * bytes bytes; `data` may be
// out + rank * bytes), around the ring (ring_allgather.cc): (P-1) * bytes sent by every rank, one
// payload per link at a time.
void ring_allgather(Communicator& comm, const void* data, size_t bytes, void* out,
                    const char* operation = "allgather");

}  // namespace gradex::comm
