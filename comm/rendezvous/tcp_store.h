// A small TCP key-value store for standalone bootstrap (no framework). Rank 0 runs a
// TcpStoreServer in a background thread; every rank (rank 0 included) talks to it through a
// TcpStore client. Wire format: tcp_store_protocol.h.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/rendezvous/socket.h"
#include "comm/rendezvous/store.h"
#include "comm/rendezvous/store_seal.h"

namespace gradex::comm {

// Serves the store on host:port from a background thread that multiplexes every client with
// poll(). Blocking requests (get, wait) are parked on the server until their key appears or their
// own timeout passes, so the server never blocks on one client. The destructor stops the thread
// and joins it; the thread never outlives its server object.
class TcpStoreServer {
 public:
  // `host` must be an address of this machine; port 0 picks a free port. Throws ConfigError when
  // the port is in use ("MASTER_PORT P is already in use on this host"). With a `job_secret`,
  // only clients that prove knowledge of it are served (tcp_store_core.h); without one, a
  // non-loopback address is warned about once per process.
  TcpStoreServer(const std::string& host, uint16_t port, const std::string& job_secret = "");
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  uint16_t port() const { return port_; }
  // Clients refused so far for failing authentication.
  uint64_t refused_clients() const;

 private:
  struct State;
  void run();

  uint16_t port_ = 0;
  Fd listen_fd_;
  Fd wake_read_, wake_write_;  // a pipe: writing one byte asks the thread to stop
  std::unique_ptr<State> state_;
  std::thread thread_;
};

// A client connection to a TcpStoreServer. Thread-safe: requests are serialized on the connection.
class TcpStore : public Store {
 public:
  // Connects (retrying until `connect_timeout`) and checks that the peer is a gradex store.
  // With a `job_secret` the client and the store prove knowledge of it to each other first, and
  // every request and reply after that is sealed (store_seal.h);
  // ConfigError "... refused this client: authentication failed: ..." or "the gradex store at
  // HOST:PORT did not prove knowledge of the job secret" when either side lacks it.
  // `server`, when given, is kept alive as long as this client (rank 0 serves and uses the store).
  TcpStore(std::string host, uint16_t port, Millis connect_timeout,
           std::unique_ptr<TcpStoreServer> server = nullptr, const std::string& job_secret = "");
  ~TcpStore() override;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Millis timeout) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;

 private:
  struct Reply;
  // Sends one request frame and reads its reply; `timeout` bounds the server-side wait and the
  // reply may take `grace` on top of it (network, a busy server). On a sealed connection the
  // request is sealed (unless `plain_request`: the proof that opens the connection) and the reply
  // opened.
  Reply round_trip(const Bytes& frame, Millis timeout, const char* operation, Millis grace,
                   bool plain_request = false);
  // The hello (and, with a secret, the mutual challenge-response) after connecting.
  void handshake(const std::string& job_secret, Millis grace);

  std::string host_;
  uint16_t port_;
  std::mutex mutex_;
  Fd fd_;
  std::unique_ptr<TcpStoreServer> server_;  // destroyed after the connection is closed
  std::unique_ptr<StoreChannel> channel_;   // with a job secret: the connection's seal
};

}  // namespace gradex::comm
