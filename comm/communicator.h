// Point-to-point messaging between the ranks of one job. The UCX implementation (comm/ucx/) opens
// one context + worker per communicator, exchanges worker addresses through the Store, and connects
// an endpoint to every peer with peer error handling. All waiting honours the communicator's
// timeout: a dead peer yields PeerError, a silent one TimeoutError, each naming the operation and
// the peer rank. A Communicator is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/store.h"

namespace gradex::comm {

struct CommOptions {
  Millis timeout{300000};  // GRADEX_TIMEOUT_S
  std::string iface;       // GRADEX_IFACE: UCX net devices ("" = UCX decides)
  size_t ring_chunk_bytes =
      256 << 10;  // GRADEX_RING_CHUNK_KB; tests shrink it to reach multi-chunk paths
};

// An in-flight send or receive. Opaque; completed by Communicator::wait / test.
class Request {
 public:
  virtual ~Request() = default;
  virtual int peer() const = 0;
};
using RequestPtr = std::unique_ptr<Request>;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const CommOptions& options() const = 0;

  // Non-blocking tagged messages. `data` must stay valid until the request completes. A receive
  // matches a send from `peer` with the same tag; its buffer must be at least as large as the
  // message (received length via Request completion -> recv_length).
  virtual RequestPtr isend(int peer, uint64_t tag, const void* data, size_t bytes) = 0;
  virtual RequestPtr irecv(int peer, uint64_t tag, void* data, size_t bytes) = 0;

  // Drives progress once; returns true if anything happened.
  virtual bool progress() = 0;
  // True when `request` has completed (successfully). Throws PeerError if it failed.
  virtual bool test(Request& request, const char* operation) = 0;
  // Progresses until every request completes; TimeoutError (operation, first incomplete peer) after
  // options().timeout without completion; PeerError when a peer fails. On error the remaining
  // requests are cancelled before the exception propagates, so buffers can be released.
  virtual void wait_all(std::vector<RequestPtr>& requests, const char* operation) = 0;
  // Bytes actually received by a completed receive request.
  virtual size_t recv_length(const Request& request) const = 0;

  // A fresh tag for the next collective. Every rank calls collectives in the same order, so tags
  // agree; messages of successive collectives can never be confused.
  virtual uint64_t next_collective_tag() = 0;

  // Bytes this communicator has sent / received since creation (for statistics).
  virtual uint64_t bytes_sent() const = 0;
  virtual uint64_t bytes_received() const = 0;
};

// Creates the UCX communicator for `rank` of `world_size`, bootstrapping through `store` (all ranks
// must call this with the same store namespace). Blocks until every peer is connected or the
// timeout.
std::unique_ptr<Communicator> create_ucx_communicator(std::shared_ptr<Store> store, int rank,
                                                      int world_size, const CommOptions& options);

}  // namespace gradex::comm
