#include "comm/rendezvous/socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <sstream>
#include <thread>

#include "base/error.h"

namespace gradex::comm {
namespace {

struct AddrInfoDeleter {
  void operator()(addrinfo* ai) const { freeaddrinfo(ai); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

// Resolves host:port. Returns nullptr and sets *error on failure (the caller may retry: DNS can be
// briefly unavailable while a cluster starts).
AddrInfoPtr resolve(const std::string& host, uint16_t port, bool passive, std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* result = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &result);
  if (rc != 0) {
    *error = std::string("cannot resolve '") + host + "': " + gai_strerror(rc);
    return nullptr;
  }
  return AddrInfoPtr(result);
}

// One non-blocking connect attempt bounded by `deadline`. Returns a connected blocking-mode Fd,
// or an invalid one with *err set to the errno of the failure.
Fd try_connect(const addrinfo* ai, Clock::time_point deadline, int* err) {
  Fd fd(socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
  if (!fd.valid()) {
    *err = errno;
    return Fd();
  }
  if (connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      *err = errno;
      return Fd();
    }
    pollfd p{fd.get(), POLLOUT, 0};
    int rc;
    do {
      rc = poll(&p, 1, poll_timeout_ms(deadline));
    } while (rc < 0 && errno == EINTR);
    if (rc == 0) {
      *err = ETIMEDOUT;
      return Fd();
    }
    int so_error = 0;
    socklen_t len = sizeof(so_error);
    getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_error, &len);
    if (so_error != 0) {
      *err = so_error;
      return Fd();
    }
  }
  int flags = fcntl(fd.get(), F_GETFL);
  fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  int one = 1;
  setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

}  // namespace

std::string host_port(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

std::string format_seconds(double seconds) {
  std::ostringstream os;
  os << seconds << " s";
  return os.str();
}

int poll_timeout_ms(Clock::time_point deadline) {
  auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > 1000000 ? 1000000 : static_cast<int>(left);
}

void set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
    throw TransportError(std::string("fcntl(O_NONBLOCK) failed: ") + std::strerror(errno));
}

Fd listen_tcp(const std::string& host, uint16_t port, uint16_t* bound_port) {
  std::string error;
  AddrInfoPtr ai = resolve(host, port, true, &error);
  if (!ai) throw ConfigError("MASTER_ADDR: " + error);
  int last_errno = 0;
  for (const addrinfo* a = ai.get(); a != nullptr; a = a->ai_next) {
    Fd fd(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd.valid()) {
      last_errno = errno;
      continue;
    }
    // SO_REUSEADDR lets a restarted job reuse a port in TIME_WAIT; Linux still refuses a port
    // that another socket is listening on, which is the case we must report.
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || listen(fd.get(), 1024) != 0) {
      last_errno = errno;
      continue;
    }
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len);
    uint16_t p = local.ss_family == AF_INET6
                     ? ntohs(reinterpret_cast<sockaddr_in6*>(&local)->sin6_port)
                     : ntohs(reinterpret_cast<sockaddr_in*>(&local)->sin_port);
    if (bound_port) *bound_port = p;
    return fd;
  }
  if (last_errno == EADDRINUSE)
    throw ConfigError("MASTER_PORT " + std::to_string(port) +
                      " is already in use on this host (rank 0 serves the gradex store there; "
                      "choose another MASTER_PORT)");
  if (last_errno == EADDRNOTAVAIL)
    throw ConfigError("MASTER_ADDR=" + host +
                      " is not an address of this host, but rank 0 serves the gradex store "
                      "there (run rank 0 on the MASTER_ADDR host)");
  throw TransportError("cannot listen on " + host_port(host, port) + ": " +
                       std::strerror(last_errno));
}

Fd connect_tcp_with_retry(const std::string& host, uint16_t port, Clock::time_point deadline,
                          double timeout_s) {
  std::string last_error = "no attempt made";
  auto backoff = std::chrono::milliseconds(10);
  while (true) {
    std::string resolve_error;
    AddrInfoPtr ai = resolve(host, port, false, &resolve_error);
    if (!ai) {
      last_error = resolve_error;
    } else {
      for (const addrinfo* a = ai.get(); a != nullptr; a = a->ai_next) {
        int err = 0;
        Fd fd = try_connect(a, deadline, &err);
        if (fd.valid()) return fd;
        last_error = std::strerror(err);
      }
    }
    auto now = Clock::now();
    if (now >= deadline) break;
    // Retrying covers the usual race where rank 0 has not started listening yet.
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
  throw TimeoutError("bootstrap", -1,
                     "could not connect to the gradex store at " + host_port(host, port) +
                         " within " + format_seconds(timeout_s) + ": " + last_error +
                         " (check MASTER_ADDR/MASTER_PORT and that rank 0 is running)");
}

namespace {

// What send_all and recv_all share: wait (up to the deadline) until fd is ready for `events`, then
// move bytes with io(p, left) (a non-blocking ::send or ::recv), until all have moved. Interrupted
// or not-ready calls poll again; any other failure is a TransportError "<verb> <what> failed".
template <typename Pointer, typename Io>
bool transfer_all(int fd, short events, Pointer p, size_t bytes, Clock::time_point deadline,
                  const char* verb, const std::string& what, Io io) {
  while (bytes > 0) {
    pollfd pfd{fd, events, 0};
    int rc = poll(&pfd, 1, poll_timeout_ms(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) return false;
    ssize_t n = io(p, bytes);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      throw TransportError(verb + (" " + what) + " failed: " + std::strerror(errno));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

bool send_all(int fd, const void* data, size_t bytes, Clock::time_point deadline,
              const std::string& what) {
  return transfer_all(fd, POLLOUT, static_cast<const char*>(data), bytes, deadline, "sending to",
                      what, [fd](const char* p, size_t left) {
                        return ::send(fd, p, left, MSG_NOSIGNAL | MSG_DONTWAIT);
                      });
}

bool recv_all(int fd, void* data, size_t bytes, Clock::time_point deadline,
              const std::string& what) {
  return transfer_all(fd, POLLIN, static_cast<char*>(data), bytes, deadline, "receiving from", what,
                      [fd, &what](char* p, size_t left) {
                        ssize_t n = ::recv(fd, p, left, MSG_DONTWAIT);
                        if (n == 0) throw TransportError(what + " closed the connection");
                        return n;
                      });
}

}  // namespace gradex::comm
