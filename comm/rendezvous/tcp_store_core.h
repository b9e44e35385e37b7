// The TCP store server's request handling, without sockets: clients are byte streams in and out.
// tcp_store_server.cc moves bytes between sockets and this core; the fuzzer drives it directly.
//
// Authentication (when the store has a job secret; comm/rendezvous/auth.h): a client's first frame
// must be a hello carrying a 32-byte nonce and an ephemeral X25519 key; the server answers with its
// own nonce, key and a proof (HMAC of both nonces and keys), the client answers with its proof, and
// only then are set/get/wait/add accepted, every frame from then on sealed in both directions
// (store_seal.h).
// Anything else (no nonce, a wrong proof, another request first, an oversized frame, silence for 30
// s) is refused with an error reply naming the authentication failure, logged with the client's
// address, and the connection is closed. Without a secret any client is served, as before.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/rendezvous/auth.h"
#include "comm/rendezvous/socket.h"
#include "comm/rendezvous/store_seal.h"
#include "comm/rendezvous/tcp_store_protocol.h"

namespace gradex::comm {

// A request parked until its keys exist or its deadline passes (get and wait).
struct StoreParked {
  store_wire::Type type;
  std::vector<std::string> keys;
  Clock::time_point deadline;
};

struct StoreClient {
  enum class Auth { kAwaitHello, kAwaitProof, kAuthenticated };
  Fd fd;             // the socket (unused by the fuzzer)
  std::string peer;  // "host:port" for messages
  Bytes in;          // bytes received, not yet parsed into frames
  Bytes out;         // bytes to send
  size_t out_sent = 0;
  std::optional<StoreParked> parked;  // clients are synchronous: at most one request in flight
  bool closing = false;               // refused or malformed: drop once `out` is flushed
  Auth auth = Auth::kAuthenticated;
  Clock::time_point accepted;
  auth::Nonce client_nonce{};
  auth::Nonce server_nonce{};
  seal::PublicKey client_key{};
  std::unique_ptr<seal::EphemeralKey> server_key;  // until the keys are derived
  std::unique_ptr<StoreChannel> channel;           // after authentication: every frame sealed
};

class StoreServerCore {
 public:
  // Unauthenticated frames larger than this are refused (a stranger cannot make us buffer 64 MiB).
  static constexpr uint32_t kMaxUnauthenticatedFrame = 4096;
  // A client that has not authenticated within this long is dropped.
  static constexpr Millis kAuthWindow{30000};

  explicit StoreServerCore(std::string job_secret) : secret_(std::move(job_secret)) {}

  StoreClient& add_client(Fd fd, std::string peer, Clock::time_point now);
  // Appends received bytes and handles every complete frame.
  void receive(StoreClient& c, const uint8_t* data, size_t size);
  // After c.out was flushed: handles a frame queued behind a parked one.
  void flushed(StoreClient& c);
  // The connection closed (or failed): logs an interrupted authentication.
  void disconnected(StoreClient& c);
  // Answers parked requests whose keys exist or whose deadline passed; drops clients that did not
  // authenticate in time.
  void tick(Clock::time_point now);
  // Removes clients whose fd is invalid (after disconnected()).
  void remove_closed();
  // The earliest parked deadline, or `limit` when earlier.
  Clock::time_point next_deadline(Clock::time_point limit) const;

  std::vector<std::unique_ptr<StoreClient>>& clients() { return clients_; }
  // Clients refused for failing authentication (tests read it from another thread).
  uint64_t refused() const { return refused_.load(); }

 private:
  void parse(StoreClient& c);
  void handle(StoreClient& c, store_wire::Type type, store_wire::Reader r);
  void handle_hello(StoreClient& c, store_wire::Reader& r);
  void handle_auth(StoreClient& c, store_wire::Reader& r);
  void refuse(StoreClient& c, const std::string& reason);
  bool try_answer(StoreClient& c, Clock::time_point now);
  void answer_parked(Clock::time_point now);
  void push(StoreClient& c, const Bytes& frame);

  std::string secret_;
  std::map<std::string, Bytes> data_;
  std::vector<std::unique_ptr<StoreClient>> clients_;
  std::atomic<uint64_t> refused_{0};
};

}  // namespace gradex::comm
