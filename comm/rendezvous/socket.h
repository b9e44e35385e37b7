// Small blocking-with-deadline TCP helpers for the bootstrap store. IPv4 and IPv6 via getaddrinfo.
// Every call that can wait takes an absolute deadline, so nothing here can hang.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "base/fd.h"

namespace gradex::comm {

using Clock = std::chrono::steady_clock;

using gradex::Fd;  // base/fd.h

// "host:port" for messages (brackets around IPv6 literals).
std::string host_port(const std::string& host, uint16_t port);

// Listens on `host`:`port` (host must be an address of this machine; port 0 picks a free one).
// Throws ConfigError "MASTER_PORT P is already in use on this host" on EADDRINUSE, ConfigError when
// `host` is not a local address, TransportError otherwise.
Fd listen_tcp(const std::string& host, uint16_t port, uint16_t* bound_port);

// Connects to host:port, retrying refused/unreachable attempts until `deadline`. Throws
// TimeoutError "could not connect to the gradex store at HOST:PORT within T s: <errno text>".
Fd connect_tcp_with_retry(const std::string& host, uint16_t port, Clock::time_point deadline,
                          double timeout_s);

// Sends / receives exactly `bytes` bytes before `deadline`. Return false on timeout; throw
// TransportError when the connection fails or is closed by the peer (`what` names the peer).
bool send_all(int fd, const void* data, size_t bytes, Clock::time_point deadline,
              const std::string& what);
bool recv_all(int fd, void* data, size_t bytes, Clock::time_point deadline,
              const std::string& what);

void set_nonblocking(int fd);
// "2.5 s" for messages.
std::string format_seconds(double seconds);
// Milliseconds until `deadline` for poll(): 0 when past, capped to avoid int overflow.
int poll_timeout_ms(Clock::time_point deadline);

}  // namespace gradex::comm
