#include "sync/policy/transport_cpu.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <vector>

#include "base/cpu_time.h"
#include "base/log.h"
#include "comm/rendezvous/socket.h"

namespace gradex::sync::cost {
namespace {

using Clock = std::chrono::steady_clock;

struct Pair {
  comm::Fd writer, reader;
  const char* via = "none";
};

Pair tcp_loopback() {
  Pair p;
  try {
    uint16_t port = 0;
    comm::Fd listener = comm::listen_tcp("127.0.0.1", 0, &port);
    p.writer = comm::connect_tcp_with_retry("127.0.0.1", port,
                                            Clock::now() + std::chrono::milliseconds(500), 0.5);
    p.reader.reset(::accept(listener.get(), nullptr, nullptr));
    if (!p.reader.valid()) return {};
    const int one = 1;
    ::setsockopt(p.writer.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    p.via = "tcp loopback";
  } catch (const std::exception&) {
    return {};
  }
  return p;
}

Pair unix_pair() {
  Pair p;
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return p;
  p.writer.reset(fds[0]);
  p.reader.reset(fds[1]);
  p.via = "unix socket pair";
  return p;
}

// Streams `bytes` from writer to reader in one thread; false when the connection stalls or fails.
bool stream(const Pair& p, size_t bytes, size_t chunk, std::vector<uint8_t>& out,
            const std::vector<uint8_t>& in) {
  size_t sent = 0, received = 0;
  int stalls = 0;
  while (received < bytes) {
    bool moved = false;
    if (sent < bytes) {
      const ssize_t n = ::send(p.writer.get(), in.data(), std::min(chunk, bytes - sent),
                               MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
        moved = true;
      } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        return false;
      }
    }
    const ssize_t n = ::recv(p.reader.get(), out.data(), chunk, MSG_DONTWAIT);
    if (n > 0) {
      received += static_cast<size_t>(n);
      moved = true;
    } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      return false;
    }
    if (moved) {
      stalls = 0;
      continue;
    }
    pollfd fd{p.reader.get(), POLLIN, 0};
    if (::poll(&fd, 1, 100) == 0 && ++stalls > 10) return false;  // ~1 s without progress
  }
  return true;
}

}  // namespace

TransportSample measure_transport(size_t bytes, size_t chunk, int repeats) {
  TransportSample best;
  if (bytes == 0 || chunk == 0 || repeats < 1) return best;
  Pair p = tcp_loopback();
  if (!p.writer.valid()) p = unix_pair();
  if (!p.writer.valid()) return best;
  std::vector<uint8_t> in(chunk, 0x5a), out(chunk);
  if (!stream(p, chunk, chunk, out, in)) return best;  // warms the connection and its buffers
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    const double c0 = thread_cpu_seconds();
    if (!stream(p, bytes, chunk, out, in)) {
      GX_LOG(kDebug) << "transport CPU measurement over " << p.via << " stalled";
      return {};
    }
    const double cpu = thread_cpu_seconds() - c0;
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    if (best.bytes == 0 || cpu < best.seconds) best = {bytes, cpu, best.wall_seconds, p.via};
    if (best.wall_seconds == 0 || wall < best.wall_seconds) best.wall_seconds = wall;
  }
  return best;
}

}  // namespace gradex::sync::cost
