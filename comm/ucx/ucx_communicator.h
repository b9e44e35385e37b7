// The UCX Communicator: one ucp context + worker, an endpoint to every rank (itself included) with
// peer error handling, tagged messages whose 64-bit UCX tag is
//   bit 63: control flag | bits 62..24: user tag | bits 23..0: source rank
// so a receive matches exactly one peer. Control messages (liveness probes, abort notices) travel
// in the control half of the tag space and are handled inside progress().
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/error.h"
#include "comm/communicator.h"
#include "comm/rendezvous/socket.h"
#include "comm/seal/frame_pool.h"
#include "comm/seal/seal.h"
#include "comm/ucx/ucx_handles.h"

namespace gradex::comm::ucx {

constexpr int kRankBits = 24;
constexpr uint64_t kRankMask = (uint64_t{1} << kRankBits) - 1;
constexpr uint64_t kControlBit = uint64_t{1} << 63;
constexpr uint64_t kUserTagLimit = uint64_t{1} << 39;

class UcxCommunicator;

// An in-flight isend / irecv. Destroying one that has not completed cancels it and waits (bounded)
// until UCX no longer touches its buffer.
class UcxRequest : public Request {
 public:
  ~UcxRequest() override;
  int peer() const override { return peer_; }

 private:
  friend class UcxCommunicator;
  UcxRequest(UcxCommunicator* owner, int peer, bool is_recv)
      : owner_(owner), peer_(peer), is_recv_(is_recv) {}

  UcxCommunicator* owner_;
  int peer_;
  bool is_recv_;
  void* handle_ = nullptr;  // UCX request while in flight, nullptr once completed and freed
  ucs_status_t status_ = UCS_INPROGRESS;
  ucp_tag_recv_info_t info_{};
  size_t posted_bytes_ = 0;  // a receive's buffer size
  // irecv_any_length: until the probe finds the message, no UCX receive exists (handle_ null).
  bool probing_ = false;
  uint64_t probe_tag_ = 0;
  Bytes* any_length_out_ = nullptr;
  size_t any_length_max_ = 0;
  // Sealed messages (ucx_seal.cc): a send's frame, or the frame a receive lands in until it is
  // opened into the caller's buffer (user_data_; for irecv_any_length, any_length_out_).
  bool sealed_ = false;
  seal::FramePool::Buffer frame_;  // from the communicator's pool; returned when done with
  size_t frame_bytes_ = 0;
  void* user_data_ = nullptr;
  uint64_t user_tag_ = 0;
  bool queued_ = false;        // a sealed receive not yet opened: in its (peer, tag) open queue
  size_t payload_length_ = 0;  // a sealed receive's payload, once opened
  std::string seal_failure_;   // why the frame was refused ("" when it opened)
};

constexpr uint32_t kControlMagic = 0x43584747;  // "GGXC"
enum ControlKind : uint32_t { kControlPing = 1, kControlPong = 2, kControlAbort = 3 };

// Wire format of a control message (host byte order: both ends are the same build): a 20-byte
// header, then `text_length` bytes of text (abort notices only; at most kAbortMessageMax). Only
// header + text travel; the control receive has room for the longest.
struct ControlMessage {
  uint32_t magic;
  uint32_t kind;    // ControlKind
  int32_t subject;  // probe: sequence number; abort: the rank blamed (the sender: its own error)
  int32_t code;     // abort: ErrorCode of the failure
  uint32_t text_length;  // abort: bytes of `text` (the failure's message, possibly cut)
  char text[kAbortMessageMax];
};
constexpr size_t kControlHeaderBytes = offsetof(ControlMessage, text);

// An abort notice can overtake data its sender had already sent: a rank that finished a collective
// and then aborted (a process group shut down after its last collective) leaves its peers with the
// same collective's last messages from other, live ranks still to come. A wait with requests
// pending keeps them running for this long after the notice, and as long again after each
// completion, up to kAbortGraceMax: what can still complete does, what cannot fails with the
// notice's error. Waits with nothing pending fail at once.
constexpr Millis kAbortGrace{250};
constexpr Millis kAbortGraceMax{2000};

class UcxCommunicator : public Communicator {
 public:
  UcxCommunicator(std::shared_ptr<Store> store, int rank, int world_size,
                  const CommOptions& options);
  ~UcxCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const CommOptions& options() const override { return options_; }

  RequestPtr isend(int peer, uint64_t tag, const void* data, size_t bytes) override;
  RequestPtr irecv(int peer, uint64_t tag, void* data, size_t bytes) override;
  bool receives_any_length() const override { return true; }
  RequestPtr irecv_any_length(int peer, uint64_t tag, Bytes& out, size_t max_bytes) override;
  bool progress() override;
  bool test(Request& request, const char* operation) override;
  void wait_all(std::vector<RequestPtr>& requests, const char* operation) override;
  size_t recv_length(const Request& request) const override;
  uint64_t next_collective_tag() override;
  bool wait_for_next_collective(int wake_fd, Millis max_wait) override;
  std::vector<int> unresponsive_peers() override;
  void abort(ErrorCode code, const std::string& message) override;
  void interrupt(ErrorCode code, const std::string& message) override;
  uint64_t bytes_sent() const override { return bytes_sent_; }
  std::vector<std::string> rank_hosts() const override { return rank_hosts_; }
  int connections_per_peer() const override { return stripes_; }
  uint64_t bytes_received() const override { return bytes_received_; }

 private:
  friend class UcxRequest;
  struct PeerSlot {
    UcxCommunicator* self;
    int rank;
    ucs_status_t error = UCS_OK;  // set by the endpoint error callback
  };
  struct ControlSend {
    ControlMessage message;
    void* handle;
    std::vector<uint8_t> frame;  // the sealed form that travels, when the peer's keys exist
  };
  // One peer's sealed connection (comm/seal/seal.h): both directions, and the receives of each user
  // tag in the order they were posted, which is the order UCX matches that tag's messages (and so
  // the order their frames must be opened in).
  struct PeerSeal {
    PeerSeal(seal::Cipher cipher, const seal::DirectionKeys& keys, int peer)
        : sealer(cipher, keys.send), opener(cipher, keys.receive, peer) {}
    seal::Sealer sealer;
    seal::Opener opener;
    std::unordered_map<uint64_t, std::deque<UcxRequest*>> open_queue;
    std::vector<uint8_t> last_frame;  // test-only (Tamper::kReplay): the previous frame sent
  };

  // --- bootstrap and teardown (ucx_communicator.cc) ---
  // Whether any endpoint of this rank will be shared memory (GRADEX_SHM=1 or the hierarchical
  // exchange, with a peer on this host), from every rank's published host (collective through the
  // store: every rank publishes and reads, whatever its options).
  bool may_use_shared_memory(Store& store);
  bool shared_memory_between(const std::vector<std::string>& hosts,
                             const std::string& my_host) const;
  // Whether the hierarchical exchange keeps same-host traffic on shared memory, for ranks on
  // `hosts` (CommOptions::hierarchical_shm; auto: several hosts of which one holds two ranks).
  bool hierarchical_shm_for(const std::vector<std::string>& hosts) const;
  void connect_endpoints(Store& store);
  void exchange_hello();
  // --- striping (ucx_stripes.cc) ---
  // Decides the connections per peer (CommOptions::stripes; auto: rank 0 times the round trip to
  // its peers on other hosts and tells every rank), opens the extra endpoints and starts one
  // message both ways on each. Collective, after exchange_hello. It does not wait for them: across
  // a WAN an endpoint's wire-up takes several round trips, which the collectives after it (the
  // start-up agreement, the regions, the link probe) overlap; progress() settles them.
  void connect_stripes();
  // From progress(): once every extra connection's message has arrived and left, paces the
  // connections that appeared since the wire-up's scan (CommOptions::tcp_pacing). A failed one
  // fails its peer through the endpoint's error handler, as any message to it would.
  void settle_stripe_hello();
  // The agreed count for auto (collective; 1 when no two ranks are on different hosts).
  int agree_auto_stripes();
  // The endpoint a message to `peer` with user tag `tag` travels on (its lane's connection).
  ucp_ep_h endpoint_for(int peer, uint64_t tag) const;
  // Starts closing `peer`'s extra connections (force: no flush); close requests go to `closing`.
  void close_stripes(int peer, bool force, std::vector<void*>* closing);
  void close_endpoints();
  void goodbye_barrier();
  // Bounded teardown: flushes control messages, cancels the control receive, closes endpoints.
  void shutdown();
  static void on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t status);

  // --- sealing (ucx_seal.cc) ---
  // The peer's sealed connection, nullptr when messages to it travel in clear (no sealing, the
  // handshake not done yet, or this rank itself).
  PeerSeal* seal_for(int peer) const {
    return peer < static_cast<int>(seals_.size()) ? seals_[static_cast<size_t>(peer)].get()
                                                  : nullptr;
  }
  // Derives every connection's keys from the hello round (ucx_hello.cc) and starts sealing.
  void install_seals(const std::vector<seal::Handshake>& handshakes,
                     const std::vector<std::unique_ptr<seal::EphemeralKey>>& keys,
                     const std::vector<bool>& peer_has_aes);
  // A send's frame: the message sealed for `peer` (and, in tests, tampered with).
  void seal_send(UcxRequest& request, PeerSeal& s, uint64_t tag, const void* data, size_t bytes);
  void apply_tamper(PeerSeal& s, seal::FramePool::Buffer& frame, size_t& frame_bytes, uint64_t tag,
                    const void* data, size_t bytes);
  // Returns a request's frame buffer to the pool (after its send completed or its frame was
  // opened).
  void recycle_frame(UcxRequest& request) { frame_pool_.release(std::move(request.frame_)); }
  // A sealed receive: completes, in its (peer, tag) queue's order, once its frame arrived and was
  // opened (or refused: seal_failure_).
  bool poll_sealed_receive(UcxRequest& request);
  void open_frame(UcxRequest& request);
  void unqueue(UcxRequest& request);
  // Throws (after failing the communicator and telling the peers) for a refused frame.
  [[noreturn]] void fail_sealed(const UcxRequest& request, const char* operation,
                                const std::vector<UcxRequest*>& pending);
  // A received control message of `length` bytes, sealed or not: the plain message and its length,
  // or false (refused or ignored).
  bool open_control(size_t length, int source, ControlMessage* out, size_t* out_length);

  // --- requests (ucx_requests.cc) ---
  // Polls a request once; true when it is no longer in flight (a sealed receive: opened).
  bool poll_request(UcxRequest& request);
  // Polls a request's UCX status once; true when UCX no longer holds it.
  bool poll_transport(UcxRequest& request);
  // An irecv_any_length request's probe: once its message has arrived, sizes the caller's buffer
  // and starts the UCX receive of that message. False while nothing has arrived.
  bool take_probed_message(UcxRequest& request);
  // Cancels every in-flight request, force-closing endpoints whose sends cannot be cancelled,
  // and progresses until UCX has let go of all of them (bounded).
  void abandon(const std::vector<UcxRequest*>& requests);
  // Throws (after abandoning `pending`) the error that makes progress impossible: a failed
  // endpoint, an abort notice from another rank, or an earlier failure of this communicator.
  void throw_if_failed(const char* operation, const std::vector<UcxRequest*>& pending);
  // A peer that failed (its own error, or a third rank's) closes its endpoints at once; the abort
  // notice naming the root cause may be just behind: progress up to 100 ms for it to arrive.
  void await_abort_notice();
  // Records the first failure, tells the other ranks (abort notice) when `notify_peers`, abandons
  // `pending` and throws TimeoutError (code kTimeout) or PeerError.
  [[noreturn]] void fail(ErrorCode code, const std::string& operation, int peer,
                         const std::string& detail, const std::vector<UcxRequest*>& pending,
                         bool notify_peers);
  // Makes this the communicator's failure unless one was recorded first: logged once, and told to
  // the peers (abort notice) when `notify_peers`.
  void record_failure(ErrorCode code, int peer, const std::string& what, bool notify_peers);
  void check_usable(const char* operation, int peer) const;
  // MismatchError for a receive whose message was longer than its buffer.
  [[noreturn]] void throw_truncated(const UcxRequest& request, const char* operation) const;
  // Between polls of wait_all: spins a little, then sleeps until a worker event or (at most)
  // `deadline`.
  void idle(int* idle_rounds, Clock::time_point deadline);

  // --- sleeping until the next collective (ucx_wait.cc) ---
  // The sequence number the next next_collective_tag() call will return (bits 16.. of the tag).
  uint64_t following_collective_seq() const;
  // True when a message of user tag range [tag, tag + 2^16) from any peer waits unreceived.
  bool collective_message_waiting(uint64_t tag);
  // Blocks until a worker event, `extra_fd` (-1: none) is readable, or `timeout`; returns at once
  // when the worker has events pending (progress them). False, without sleeping, when the worker
  // offers no event fd (or arming it fails): the caller must poll instead.
  bool sleep_on_events(int extra_fd, Millis timeout);
  // The worker's event fd (-1 when UCX offers none): idle() and wait_for_next_collective() block
  // on it.
  int event_fd_ = -1;

  // --- control messages (ucx_control.cc) ---
  void post_control_recv();
  void handle_control(const ControlMessage& m, size_t length, int source);
  void send_control(int peer, uint32_t kind, int32_t subject, int32_t code,
                    const std::string& text = "");
  // Sends an abort notice (blamed rank, code, text) to every other rank, once per communicator.
  void notify_abort(int32_t blamed, ErrorCode code, const std::string& text);
  void reap_control_sends(bool all, Clock::time_point deadline);
  // On a timeout: pings every peer and returns the ranks that did not answer within a grace
  // period (a stopped or dead process cannot answer; a rank that is itself waiting can).
  std::vector<int> probe_unresponsive();
  // At most every 100 ms: marks a shared-memory peer whose process no longer exists as failed
  // (UCX reports nothing for it), so the next check fails with a PeerError naming it.
  void check_shared_memory_peers();

  int rank_;
  int size_;
  CommOptions options_;
  // Declaration order is destruction order in reverse: endpoints close before the worker dies.
  Config config_;
  bool context_rndv_eager_ = false;  // RNDV_THRESH=inf: no endpoint of this rank is shared memory
  std::unique_ptr<Context> context_;
  std::vector<std::unique_ptr<PeerSlot>> peers_;  // stable addresses for the error callback
  // Buffers UCX may touch until the worker is destroyed, so declared before it. A control message
  // lands here in its sealed form (or plain, before the keys exist).
  std::array<uint8_t, sizeof(ControlMessage) + seal::kOverheadBytes> control_in_{};
  ucp_tag_recv_info_t control_info_{};
  std::list<ControlSend> control_sends_;      // in flight; stable addresses
  std::list<ControlSend> abandoned_control_;  // released to UCX unfinished at teardown
  std::unique_ptr<Worker> worker_;
  std::vector<Endpoint> endpoints_;
  // Per peer, its connections beyond endpoints_[peer] (lanes l with l % count != 0 use entry
  // l % count - 1); empty for peers with one connection. Their errors report to the same PeerSlot.
  std::vector<std::vector<Endpoint>> stripe_endpoints_;
  std::vector<Bytes> peer_addresses_;  // every peer's worker address, for the extra endpoints
  int stripes_ = 1;                    // connections to each peer on another host (agreed)
  int paced_flows_ = 0;                // connections paced at wire-up (CommOptions::tcp_pacing)
  // may_use_shared_memory took the launcher's word that no other rank is on this host.
  bool alone_by_launcher_ = false;
  // connect_stripes' messages in flight (empty once settled), their buffers, and the TCP sockets
  // that existed when the wire-up paced its flows.
  std::vector<RequestPtr> stripe_hello_;
  std::vector<uint8_t> stripe_hello_in_;
  uint8_t stripe_hello_out_ = 1;
  std::set<uint64_t> sockets_paced_;
  Clock::time_point stripes_started_;
  // Until then, progress() paces the sockets new since the start that the wire-up's pass missed
  // (UCX's TCP transport accepts or opens a peer's connection after its hello; seen unpaced in 2 of
  // 40 runs of TcpPacing.ACommunicatorPacesItsConnections), every kLatePacingEvery.
  bool late_pacing_ = false;  // within that window: no clock read on progress() after it
  Clock::time_point late_pacing_until_{}, late_pacing_next_{};
  static constexpr std::chrono::milliseconds kLatePacingFor{3000}, kLatePacingEvery{20};
  void pace_late_sockets();
  // Peers reached through shared memory (no UCX failure handling: force-closing does not complete
  // their requests, so abandon() releases those at once).
  std::vector<bool> shared_memory_peer_;
  // Every rank's host identity and process identity (comm/topology/host_identity.h), as published.
  std::vector<std::string> rank_hosts_;
  std::vector<std::string> rank_processes_;
  Clock::time_point next_process_check_{};
  int peer_process_gone_ = -1;  // the shared-memory peer check_shared_memory_peers found gone

  // Per peer, its sealed connection (empty without sealing; null for this rank).
  std::vector<std::unique_ptr<PeerSeal>> seals_;
  seal::FramePool frame_pool_;
  bool sealing_ = false;  // CommOptions::seal resolved (check_seal_setting)
  seal::Tamper tamper_;   // test-only
  uint64_t frames_sealed_ = 0;

  uint64_t collective_seq_ = 0;
  uint64_t bytes_sent_ = 0;
  uint64_t bytes_received_ = 0;

  // Control plane.
  void* control_recv_ = nullptr;
  int32_t probe_seq_ = 0;
  std::vector<int32_t> pong_seq_;  // last probe sequence each peer answered

  // Failure state: once set, the communicator refuses new work (message streams are out of step).
  ErrorCode failure_code_ = ErrorCode::kOk;
  int failure_peer_ = -1;
  std::string failure_what_;
  int abort_from_ = -1;  // rank whose abort notice arrived (first one)
  int abort_blamed_ = -1;
  ErrorCode abort_code_ = ErrorCode::kOk;
  std::string abort_text_;          // the notice's message ("" from an older notice without one)
  Clock::time_point abort_seen_{};  // when the notice arrived
  Clock::time_point abort_grace_until_{};  // pending requests may complete until then (kAbortGrace)
  bool notified_peers_ = false;            // this rank's abort notice went out (at most once)
  // From the goodbye barrier on: a peer that completed the barrier may close its endpoints
  // before this rank has, which tcp reports here as an endpoint error. Such errors are logged at
  // debug level; a barrier that fails for them says so itself ("closing without every rank").
  bool leaving_ = false;
  bool closing_ = false;

  // interrupt() from another thread: set once, acted on by the owning thread (take_interrupt).
  std::atomic<bool> interrupted_{false};
  std::mutex interrupt_mutex_;  // interrupt_code_ and interrupt_text_
  ErrorCode interrupt_code_ = ErrorCode::kOk;
  std::string interrupt_text_;
  // Owning thread: turns a pending interrupt() into this communicator's failure (abort notice
  // sent), abandons `pending` and throws Error(code, ...) naming `operation`.
  void take_interrupt(const char* operation, const std::vector<UcxRequest*>& pending);
};

}  // namespace gradex::comm::ucx
