// The store server: one thread, poll() over the listening socket, a wake-up pipe and every client;
// the request handling itself is StoreServerCore (tcp_store_core.h).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "base/error.h"
#include "base/log.h"
#include "comm/rendezvous/tcp_store.h"
#include "comm/rendezvous/tcp_store_core.h"

namespace gradex::comm {
namespace {

std::string address_text(const sockaddr_storage& a) {
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    return host_port(text, ntohs(in->sin_port));
  }
  if (a.ss_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    return host_port(text, ntohs(in6->sin6_port));
  }
  return "an unknown address";
}

bool is_loopback(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(&a)->sin_addr.s_addr) >> 24) == 127;
  if (a.ss_family == AF_INET6) {
    const in6_addr& v6 = reinterpret_cast<const sockaddr_in6*>(&a)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&v6)) return v6.s6_addr[12] == 127;
  }
  return false;
}

}  // namespace

struct TcpStoreServer::State : StoreServerCore {
  using StoreServerCore::StoreServerCore;
};

TcpStoreServer::TcpStoreServer(const std::string& host, uint16_t port,
                               const std::string& job_secret)
    : state_(std::make_unique<State>(job_secret)) {
  listen_fd_ = listen_tcp(host, port, &port_);
  set_nonblocking(listen_fd_.get());
  sockaddr_storage local{};
  socklen_t len = sizeof(local);
  getsockname(listen_fd_.get(), reinterpret_cast<sockaddr*>(&local), &len);
  if (job_secret.empty() && !is_loopback(local)) {
    static std::once_flag warned;
    std::call_once(warned, [&] {
      GX_LOG(kWarn) << "the gradex store listens on " << address_text(local)
                    << " without a job secret: anyone who reaches this port can join or disturb "
                       "the job (set GRADEX_JOB_SECRET_FILE on every rank; see docs/security.md)";
    });
  }
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
    throw TransportError(std::string("pipe2 failed: ") + std::strerror(errno));
  wake_read_.reset(fds[0]);
  wake_write_.reset(fds[1]);
  thread_ = std::thread([this] { run(); });
}

TcpStoreServer::~TcpStoreServer() {
  char byte = 1;
  ssize_t n;
  do {
    n = ::write(wake_write_.get(), &byte, 1);
  } while (n < 0 && errno == EINTR);
  if (thread_.joinable()) thread_.join();
}

uint64_t TcpStoreServer::refused_clients() const {
  return state_->refused();
}

void TcpStoreServer::run() {
  State& s = *state_;
  std::vector<pollfd> pfds;
  while (true) {
    // Sleep until the next parked deadline at most, so timeouts are answered on time.
    Clock::time_point wake = s.next_deadline(Clock::now() + std::chrono::seconds(1));
    auto& clients = s.clients();
    pfds.clear();
    pfds.push_back({wake_read_.get(), POLLIN, 0});
    pfds.push_back({listen_fd_.get(), POLLIN, 0});
    for (auto& c : clients) {
      short events = c->closing ? 0 : POLLIN;
      if (c->out.size() > c->out_sent) events |= POLLOUT;
      pfds.push_back({c->fd.get(), events, 0});
    }
    int rc = poll(pfds.data(), pfds.size(), poll_timeout_ms(wake));
    if (rc < 0 && errno != EINTR) {
      GX_LOG(kError) << "gradex store: poll failed: " << std::strerror(errno);
      return;
    }
    if (pfds[0].revents) return;  // stop requested

    // pfds[i + 2] belongs to the clients present before accept; new clients come after them.
    const size_t polled = pfds.size() - 2;
    if (pfds[1].revents & POLLIN) {
      while (true) {
        sockaddr_storage peer{};
        socklen_t len = sizeof(peer);
        int fd = accept4(listen_fd_.get(), reinterpret_cast<sockaddr*>(&peer), &len,
                         SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) break;
        s.add_client(Fd(fd), address_text(peer), Clock::now());
      }
    }

    for (size_t i = 0; i < polled; ++i) {
      StoreClient& c = *clients[i];
      short rev = pfds[i + 2].revents;
      if (rev & (POLLIN | POLLHUP | POLLERR)) {
        uint8_t buf[65536];
        ssize_t n = ::recv(c.fd.get(), buf, sizeof(buf), 0);
        if (n > 0) {
          s.receive(c, buf, static_cast<size_t>(n));
        } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
          s.disconnected(c);  // peer gone: forget it (its parked request dies with it)
          continue;
        }
      }
      if ((rev & POLLOUT) || c.out.size() > c.out_sent) {
        ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_sent, c.out.size() - c.out_sent,
                           MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) c.out_sent += static_cast<size_t>(n);
        if (n < 0 && errno != EAGAIN && errno != EINTR) c.fd.reset();
      }
      if (c.fd.valid() && c.out_sent == c.out.size()) {
        c.out.clear();
        c.out_sent = 0;
        if (c.closing)
          c.fd.reset();
        else
          s.flushed(c);
      }
    }
    s.tick(Clock::now());
    s.remove_closed();
  }
}

}  // namespace gradex::comm
