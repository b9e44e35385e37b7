// The store server: one thread, poll() over the listening socket, a wake-up pipe and every client.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <optional>

#include "base/error.h"
#include "base/log.h"
#include "comm/tcp_store.h"
#include "comm/tcp_store_protocol.h"

namespace gradex::comm {

using namespace store_wire;

namespace {

// A request parked until its keys exist or its deadline passes (get and wait).
struct Parked {
  Type type;
  std::vector<std::string> keys;
  Clock::time_point deadline;
};

struct Client {
  Fd fd;
  Bytes in;   // bytes received, not yet parsed into frames
  Bytes out;  // bytes to send
  size_t out_sent = 0;
  std::optional<Parked> parked;  // clients are synchronous: at most one request in flight
  bool closing = false;          // protocol violation: drop once `out` is flushed
};

Bytes reply(Type type, const Bytes& payload = {}) {
  return make_frame(type, payload);
}

Bytes text_reply(Type type, const std::string& text) {
  return reply(type, Bytes(text.begin(), text.end()));
}

}  // namespace

struct TcpStoreServer::State {
  std::map<std::string, Bytes> data;
  std::vector<std::unique_ptr<Client>> clients;

  // Answers a parked request if it can be answered now (keys present, or deadline passed).
  bool try_answer(Client& c, Clock::time_point now) {
    const Parked& p = *c.parked;
    const std::string* missing = nullptr;
    for (const auto& k : p.keys) {
      if (!data.count(k)) {
        missing = &k;
        break;
      }
    }
    if (missing == nullptr) {
      Bytes frame = p.type == Type::kGet ? reply(Type::kOk, data[p.keys[0]]) : reply(Type::kOk);
      c.out.insert(c.out.end(), frame.begin(), frame.end());
    } else if (now >= p.deadline) {
      Bytes frame = text_reply(Type::kTimeout, *missing);
      c.out.insert(c.out.end(), frame.begin(), frame.end());
    } else {
      return false;
    }
    c.parked.reset();
    return true;
  }

  void answer_parked(Clock::time_point now) {
    for (auto& c : clients)
      if (c->parked) try_answer(*c, now);
  }

  // Handles one complete request frame from `c`.
  void handle(Client& c, Type type, Reader r) {
    Bytes out;
    switch (type) {
      case Type::kHello:
        out = reply(Type::kOk);
        break;
      case Type::kSet: {
        std::string key = r.str();
        data[key] = r.bytes();
        out = reply(Type::kOk);
        answer_parked(Clock::now());
        break;
      }
      case Type::kGet:
      case Type::kWait: {
        Parked p;
        p.type = type;
        // Clamped to a week: a hostile or buggy client cannot overflow the deadline.
        p.deadline = Clock::now() + std::chrono::milliseconds(
                                        std::min<uint64_t>(r.u64(), 7ULL * 24 * 3600 * 1000));
        if (type == Type::kGet) {
          p.keys.push_back(r.str());
        } else {
          uint32_t n = r.u32();
          for (uint32_t i = 0; i < n; ++i)
            p.keys.push_back(r.str());
        }
        c.parked = std::move(p);
        try_answer(c, Clock::now());
        return;
      }
      case Type::kAdd: {
        int64_t delta = static_cast<int64_t>(r.u64());
        std::string key = r.str();
        Bytes& value = data[key];
        if (value.empty()) value.assign(8, 0);
        if (value.size() != 8) {
          out = text_reply(Type::kError, "key '" + key + "' holds a value, not a counter");
          break;
        }
        Reader vr(value.data(), 8);
        int64_t now_value = static_cast<int64_t>(vr.u64()) + delta;
        Writer w;
        w.u64(static_cast<uint64_t>(now_value));
        Bytes encoded = w.frame(Type::kOk);
        value.assign(encoded.begin() + kHeaderBytes, encoded.end());
        out = std::move(encoded);
        answer_parked(Clock::now());
        break;
      }
      default:
        out = text_reply(Type::kError,
                         "unknown request type " + std::to_string(static_cast<unsigned>(type)));
        c.closing = true;
    }
    c.out.insert(c.out.end(), out.begin(), out.end());
  }

  // Parses every complete frame in c.in. A malformed peer gets an error reply and is dropped.
  void parse(Client& c) {
    size_t at = 0;
    while (!c.closing && !c.parked && c.in.size() - at >= kHeaderBytes) {
      Header h = decode_header(c.in.data() + at);
      std::string bad = check_header(h);
      if (!bad.empty()) {
        GX_LOG(kWarn) << "gradex store: dropping a client: " << bad;
        Bytes frame = text_reply(Type::kError, "not a gradex store client: " + bad);
        c.out.insert(c.out.end(), frame.begin(), frame.end());
        c.closing = true;
        break;
      }
      if (c.in.size() - at < kHeaderBytes + h.length) break;
      try {
        handle(c, h.type, Reader(c.in.data() + at + kHeaderBytes, h.length));
      } catch (const Error& e) {
        GX_LOG(kWarn) << "gradex store: dropping a client: " << e.what();
        c.closing = true;
      }
      at += kHeaderBytes + h.length;
    }
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(at));
  }
};

TcpStoreServer::TcpStoreServer(const std::string& host, uint16_t port)
    : state_(std::make_unique<State>()) {
  listen_fd_ = listen_tcp(host, port, &port_);
  set_nonblocking(listen_fd_.get());
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

void TcpStoreServer::run() {
  State& s = *state_;
  std::vector<pollfd> pfds;
  while (true) {
    // Sleep until the next parked deadline at most, so timeouts are answered on time.
    Clock::time_point wake = Clock::now() + std::chrono::seconds(1);
    for (auto& c : s.clients)
      if (c->parked && c->parked->deadline < wake) wake = c->parked->deadline;

    pfds.clear();
    pfds.push_back({wake_read_.get(), POLLIN, 0});
    pfds.push_back({listen_fd_.get(), POLLIN, 0});
    for (auto& c : s.clients) {
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

    if (pfds[1].revents & POLLIN) {
      while (true) {
        int fd = accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) break;
        auto c = std::make_unique<Client>();
        c->fd.reset(fd);
        s.clients.push_back(std::move(c));
      }
    }

    // pfds[i + 2] belongs to the clients present before accept; new clients come after them.
    for (size_t i = 0; i + 2 < pfds.size(); ++i) {
      Client& c = *s.clients[i];
      short rev = pfds[i + 2].revents;
      if (rev & (POLLIN | POLLHUP | POLLERR)) {
        uint8_t buf[65536];
        ssize_t n = ::recv(c.fd.get(), buf, sizeof(buf), 0);
        if (n > 0) {
          c.in.insert(c.in.end(), buf, buf + n);
          s.parse(c);
        } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
          c.fd.reset();  // peer gone: forget it (its parked request dies with it)
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
        else if (!c.parked && !c.in.empty())
          s.parse(c);  // a frame queued behind a parked one
      }
    }
    s.answer_parked(Clock::now());
    for (size_t i = 0; i < s.clients.size();) {
      if (!s.clients[i]->fd.valid()) {
        s.clients.erase(s.clients.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }
}

}  // namespace gradex::comm
