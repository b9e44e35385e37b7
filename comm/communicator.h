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

#include "base/error.h"
#include "comm/rendezvous/store.h"

namespace gradex::config {
class Config;
}

namespace gradex::comm {

struct CommOptions {
  Millis timeout{300000};  // GRADEX_TIMEOUT_S
  std::string iface;       // GRADEX_IFACE: UCX net devices ("" = UCX decides)
  // GRADEX_RING_CHUNK_KB; tests shrink it to reach multi-chunk paths.
  size_t ring_chunk_bytes = 256 << 10;
  // GRADEX_ALLGATHER_INLINE_KB: allgathervs of payloads up to this size take one round trip
  // (comm/collectives.h: allgatherv_inline). Equal on every rank.
  size_t allgather_inline_bytes = 4 << 10;
  // GRADEX_SHM: peers on the same host use shared memory (faster; a dead peer is then detected by
  // the liveness check within `timeout` rather than at once).
  bool shared_memory = false;
  // GRADEX_HOST_ID: replaces the derived host identity (comm/topology/host_identity.h); "" =
  // derived.
  std::string host_id;
  // GRADEX_HIERARCHICAL (auto / 1) with GRADEX_SHM not set to 0: when the job spans at least two
  // hosts and some host holds at least two ranks (auto; 1: whenever a peer shares the host), peers
  // on this rank's host use shared memory; their death is then detected by a process check
  // (comm/topology/host_identity.h, process_alive) within about 100 ms, as a PeerError.
  enum class HierarchicalShm { kOff, kAuto, kOn } hierarchical_shm = HierarchicalShm::kOff;
  // GRADEX_JOB_SECRET / GRADEX_JOB_SECRET_FILE, resolved ("" = none): when set, every peer proves
  // knowledge of it before any message is accepted (comm/rendezvous/auth.h, docs/security.md).
  std::string job_secret;
  // GRADEX_SEAL: whether every message to another rank is authenticated and encrypted with keys of
  // its connection (comm/seal/seal.h, docs/security.md). kAuto seals whenever there is a job
  // secret; kOn without a secret is a ConfigError naming both settings; kOff with a secret leaves
  // the data plane in clear (a warning, once). Equal on every rank (checked at connection).
  enum class Seal { kAuto, kOn, kOff } seal = Seal::kAuto;
  // Test-only (GRADEX_TEST_SEAL_TAMPER, comm/seal/seal.h: Tamper): "" or "KIND:N", which sealed
  // frame this rank alters before sending it, as an attacker on the path would.
  std::string seal_test_tamper;
  // Test-only: false makes the UCX communicator ignore the worker's event fd, so that tests reach
  // the polling fallback of workers without one.
  bool use_event_fd = true;
  // GRADEX_STRIPES: TCP connections to each peer (striping, see kTagLaneShift). 0 = auto: 1 unless
  // the job spans hosts; then rank 0 measures the round trip to its farthest peer at connection and
  // every peer on another host gets as many connections as the kernel's socket buffers need to
  // carry kStripeTargetBits at that round trip (comm/topology/tcp_limits.h: stripes_for_path), at
  // most kAutoStripesMax. N >= 1: N connections to every peer not reached through shared memory
  // (the same on every rank).
  int stripes = 0;
  // GRADEX_TCP_PACING: the connections this communicator makes to other hosts are paced by the
  // kernel (comm/topology/tcp_pacing.h). Local to a rank: pacing changes when bytes leave, never
  // which.
  bool tcp_pacing = true;
};

// Striping: bits 13..15 of a tag's low 16 bits are its lane. Messages to one peer whose tags differ
// in lane may travel over different connections (CommOptions::stripes, each connection its own TCP
// flow and window); messages with the same tag always take the same connection, so their order
// holds. A collective spreads a large transfer over the connections by giving its pieces
// consecutive lanes (tag + tag_lane(i) for piece i); tags that do not use lanes keep the same
// meaning (the lane only picks a connection).
constexpr int kTagLaneShift = 13;
constexpr uint64_t kTagLanes = 8;
constexpr uint64_t tag_lane(size_t piece) {
  return (static_cast<uint64_t>(piece) % kTagLanes) << kTagLaneShift;
}
// The most connections per peer: one per lane.
constexpr int kStripesMax = static_cast<int>(kTagLanes);

// Options from the GRADEX_* registry (GRADEX_TIMEOUT_S, GRADEX_IFACE, GRADEX_RING_CHUNK_KB,
// GRADEX_ALLGATHER_INLINE_KB, GRADEX_SHM, GRADEX_HOST_ID, GRADEX_HIERARCHICAL,
// GRADEX_JOB_SECRET[_FILE], GRADEX_STRIPES, GRADEX_SEAL, GRADEX_TEST_SEAL_TAMPER). ConfigError
// for an unusable secret (comm/rendezvous/auth.h) or GRADEX_SEAL=on without one.
CommOptions comm_options_from_config(const config::Config& config);

// Whether a communicator with `options` seals its messages (CommOptions::seal). ConfigError for
// GRADEX_SEAL=on without a job secret; warns once per process for GRADEX_SEAL=off with one.
bool check_seal_setting(const CommOptions& options);

// One line for gradex-config and the benchmarks' --print-config: whether the data plane is sealed
// under `config` and with which cipher ("sealed data plane: on (...): AES-256-GCM ...\n").
// ConfigError as comm_options_from_config.
std::string describe_seal_setting(const config::Config& config);

// An in-flight send or receive. Opaque; completed by Communicator::wait / test. Destroying one that
// has not completed cancels it (bounded in time), after which its buffer is no longer used; a
// request must not outlive its communicator.
class Request {
 public:
  virtual ~Request() = default;
  virtual int peer() const = 0;
};
using RequestPtr = std::unique_ptr<Request>;

// The longest abort message (Communicator::abort) that travels to the peers, in bytes.
constexpr size_t kAbortMessageMax = 1024;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const CommOptions& options() const = 0;

  // Non-blocking tagged messages. `data` must stay valid until the request completes. A receive
  // matches a send from `peer` with the same tag; its buffer must be at least as large as the
  // message (received length via Request completion -> recv_length). Tags are below 2^39;
  // messages from one peer with the same tag are matched in the order they were sent.
  virtual RequestPtr isend(int peer, uint64_t tag, const void* data, size_t bytes) = 0;
  virtual RequestPtr irecv(int peer, uint64_t tag, void* data, size_t bytes) = 0;

  // Whether irecv_any_length works on this communicator.
  virtual bool receives_any_length() const { return false; }
  // A receive of the next message from `peer` with `tag` whose length the caller does not know:
  // `out` is resized to the message's length when it arrives (a probe finds it) and filled; it
  // must stay valid until the request completes. recv_length gives the length. A message longer
  // than `max_bytes` is consumed whole and fails the wait with a MismatchError, as an irecv into
  // a short buffer does. Only where receives_any_length(); InternalError otherwise.
  virtual RequestPtr irecv_any_length(int peer, uint64_t tag, Bytes& out, size_t max_bytes) {
    (void)peer, (void)tag, (void)out, (void)max_bytes;
    throw InternalError("this communicator cannot receive a message of unknown length");
  }

  // Drives progress once; returns true if anything happened.
  virtual bool progress() = 0;
  // True when `request` has completed (successfully). Throws PeerError if it failed.
  virtual bool test(Request& request, const char* operation) = 0;
  // Progresses until every request completes; TimeoutError (operation, first incomplete peer) after
  // options().timeout without completion; PeerError when a peer fails. On error the remaining
  // requests are cancelled before the exception propagates, so buffers can be released.
  // Null entries are ignored. After a TimeoutError or PeerError the message streams between ranks
  // are out of step: the communicator is failed and every later call throws the same kind of
  // error. Other ranks learn about the failure (abort notice) and fail promptly too, naming the
  // same peer; a timeout names a rank that did not answer a liveness probe when there is one.
  virtual void wait_all(std::vector<RequestPtr>& requests, const char* operation) = 0;
  // A receive whose message is longer than its buffer fails with a MismatchError naming the
  // operation, the peer and the buffer's size (the communicator stays usable: nothing was lost from
  // the streams, but the caller's collective has failed).
  // Bytes actually received by a completed receive request.
  virtual size_t recv_length(const Request& request) const = 0;

  // A fresh tag for the next collective. Every rank calls collectives in the same order, so tags
  // agree; messages of successive collectives can never be confused. Tags are multiples of 2^16:
  // a collective may use tag + i for any i < 2^16 (e.g. one sub-tag per ring step).
  virtual uint64_t next_collective_tag() = 0;

  // Sleeps until this rank should join the next collective: true once a message of the next
  // collective (the tag the next call of next_collective_tag() will return, any sub-tag, from any
  // peer) has arrived, without consuming it; false when `wake_fd` is readable (a descriptor the
  // caller owns, e.g. an eventfd; -1: none; it is not read here) or `max_wait` has passed. This is
  // how a rank with nothing to do sleeps until another rank starts a collective. While it waits
  // the communicator keeps answering control messages (liveness probes), and a failed peer or an
  // abort notice ends the wait with PeerError / TimeoutError as in wait_all. The default, for a
  // communicator that cannot tell, returns true at once (the caller joins the collective).
  virtual bool wait_for_next_collective(int wake_fd, Millis max_wait) {
    (void)wake_fd;
    (void)max_wait;
    return true;
  }

  // The peers that do not answer a liveness probe within a grace period (a quarter of the
  // timeout, 0.2-2 s): stopped, hung, dead or cut off. Blocks for the grace period at most; throws
  // as wait_all when the communicator has failed. This is how a rank that waits for the others to
  // start the next collective (wait_for_next_collective), with nothing of its own in flight to
  // time out, tells a silent peer from a slow one. The default, for a communicator that cannot
  // tell, names none.
  virtual std::vector<int> unresponsive_peers() { return {}; }

  // Tells every peer that this rank failed on its own, with `code` and `message` (the first
  // kAbortMessageMax bytes of it travel): each peer's current or next call (wait_all, test,
  // wait_for_next_collective, even while it sleeps) then throws an Error of the same code whose
  // message names this rank and carries `message`, at once instead of after its timeout. This
  // communicator is failed afterwards (every later call throws). Nothing is sent when this
  // communicator's failure was already announced to the peers or came from a peer's notice (the
  // first failure is the one every rank reports). Never throws; bounded (the notices get at most
  // about 200 ms to leave). The default, for a communicator without peers to tell, does nothing.
  virtual void abort(ErrorCode code, const std::string& message) {
    (void)code;
    (void)message;
  }

  // The host identity (comm/topology/host_identity.h) of every rank, indexed by rank, as the ranks
  // published them at connection: equal on every rank. Empty when the communicator cannot tell
  // (every rank is then taken to be a host of its own).
  virtual std::vector<std::string> rank_hosts() const { return {}; }
  // Connections (TCP flows) to each peer on another host that lanes spread over (kTagLaneShift),
  // agreed by every rank at connection. 1 for a communicator that does not stripe.
  virtual int connections_per_peer() const { return 1; }
  // The one call another thread may make while this communicator is in use (Engine::abort, a
  // reconfiguration): the owning thread's current blocking call (wait_all, test,
  // wait_for_next_collective) or its next call fails as after abort(code, message) on that thread
  // (the peers get the notice) and throws Error(code, ...) carrying `message`, within about 10 ms
  // (the longest sleep between checks). Never throws. The default does nothing.
  virtual void interrupt(ErrorCode code, const std::string& message) {
    (void)code;
    (void)message;
  }

  // Bytes this communicator has sent / received since creation (for statistics): the payloads of
  // isend / irecv, excluding connection setup and internal control messages.
  virtual uint64_t bytes_sent() const = 0;
  virtual uint64_t bytes_received() const = 0;
};

// Creates the UCX communicator for `rank` of `world_size`, bootstrapping through `store` (all ranks
// must call this with the same store namespace). Blocks until every peer is connected or the
// timeout.
std::unique_ptr<Communicator> create_ucx_communicator(std::shared_ptr<Store> store, int rank,
                                                      int world_size, const CommOptions& options);

}  // namespace gradex::comm
