#include "relay.h"

#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <sstream>
#include <stdexcept>

namespace gradex::delayline {

namespace {

constexpr size_t kMaxPacket = 65536;   // a TUN MTU is at most 65535
constexpr int kReadBatch = 64;         // packets read from one host before looking at the others
constexpr uint64_t kTimerTag = ~0ull;  // epoll tags: host index, kControlTag, kTimerTag
constexpr uint64_t kControlTag = ~0ull - 1;

int64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void write_line(int fd, const std::string& line) {
  const std::string text = line + "\n";
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw_errno("write to the control output");
    done += static_cast<size_t>(n);
  }
}

}  // namespace

Relay::Relay(RelayOptions options)
    : options_(std::move(options)),
      topology_(options_.topology),
      rng_(options_.seed),
      scratch_(kMaxPacket) {
  const size_t hosts = options_.netns.size();
  if (hosts != options_.addrs.size() || static_cast<int>(hosts) != topology_.hosts()) {
    throw std::invalid_argument(
        "namespaces, addresses and regions disagree on the number of hosts");
  }
  if (options_.loss < 0 || options_.loss > 1) throw std::invalid_argument("loss must be in [0, 1]");
  for (size_t h = 0; h < hosts; ++h) {
    tuns_.push_back(open_tun_in_netns(options_.netns[h], options_.dev));
    host_of_addr_[options_.addrs[h]] = static_cast<int>(h);
  }
  blackholed_.assign(hosts, false);
  timer_ = Fd(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  if (timer_.get() < 0) throw_errno("timerfd_create");
  // Release times are kept to the microsecond, not the default 50 us of timer slack.
  ::prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
}

void Relay::ingress(int src, const uint8_t* data, size_t size, int64_t now) {
  ++counters_.read_packets;
  counters_.read_bytes += size;
  if (size < 20 || (data[0] >> 4) != 4) {  // IPv4 only (the hosts' IPv6 is off)
    ++counters_.unroutable;
    return;
  }
  const uint32_t daddr = (uint32_t{data[16]} << 24) | (uint32_t{data[17]} << 16) |
                         (uint32_t{data[18]} << 8) | uint32_t{data[19]};
  const auto it = host_of_addr_.find(daddr);
  if (it == host_of_addr_.end() || it->second == src) {
    ++counters_.unroutable;
    return;
  }
  const int dst = it->second;
  if (blackholed_[src] || blackholed_[dst]) {
    ++counters_.blackhole_drops;
    return;
  }
  if (options_.loss > 0 && uniform_(rng_) < options_.loss) {
    ++counters_.loss_drops;
    return;
  }
  uint32_t slot;
  if (free_slots_.empty()) {
    slot = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
  } else {
    slot = free_slots_.back();
    free_slots_.pop_back();
  }
  Packet& p = slots_[slot];
  p.bytes.assign(data, data + size);
  p.src = src;
  p.dst = dst;
  ++in_flight_;
  advance(slot, 0, now);
}

void Relay::free_slot(uint32_t slot) {
  slots_[slot].bytes.clear();
  free_slots_.push_back(slot);
  --in_flight_;
}

void Relay::advance(uint32_t slot, uint32_t hop, int64_t at_ns) {
  Packet& p = slots_[slot];
  const auto& path = topology_.path(p.src, p.dst);
  if (hop == path.size()) {
    const ssize_t n = ::write(tuns_[p.dst].get(), p.bytes.data(), p.bytes.size());
    if (n == static_cast<ssize_t>(p.bytes.size())) {
      ++counters_.delivered_packets;
      counters_.delivered_bytes += p.bytes.size();
    } else {
      ++counters_.write_errors;  // the destination's stack refused it: a loss, as on a real NIC
    }
    free_slot(slot);
    return;
  }
  const int64_t departs = path[hop].pipe->admit(at_ns, p.bytes.size());
  if (departs < 0) {
    ++counters_.queue_drops;
    free_slot(slot);
    return;
  }
  if (path[hop].inter_region) {
    ++counters_.wan_packets;
    counters_.wan_bytes += p.bytes.size();
  }
  events_.push({departs + path[hop].delay_ns, seq_++, slot, hop + 1});
}

void Relay::release_due(int64_t now) {
  while (!events_.empty() && events_.top().time_ns <= now) {
    const Event e = events_.top();
    events_.pop();
    // The event's own time, not `now`: a late wake-up delays the write, never the model.
    advance(e.slot, e.hop, e.time_ns);
  }
}

void Relay::arm_timer() {
  const int64_t next = events_.empty() ? 0 : events_.top().time_ns;
  if (next == armed_ns_) return;
  itimerspec spec{};
  spec.it_value.tv_sec = next / 1000000000;
  spec.it_value.tv_nsec = next % 1000000000;
  if (::timerfd_settime(timer_.get(), TFD_TIMER_ABSTIME, &spec, nullptr) != 0) {
    throw_errno("timerfd_settime");
  }
  armed_ns_ = next;
}

void Relay::read_host(int host) {
  for (int i = 0; i < kReadBatch; ++i) {
    const ssize_t n = ::read(tuns_[host].get(), scratch_.data(), scratch_.size());
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) return;
      throw_errno("read the TUN device of host " + std::to_string(host));
    }
    ingress(host, scratch_.data(), static_cast<size_t>(n), now_ns());
  }
}

std::string Relay::stats_line() const {
  std::ostringstream out;
  const RelayCounters& c = counters_;
  out << "stats read_packets=" << c.read_packets << " read_bytes=" << c.read_bytes
      << " delivered_packets=" << c.delivered_packets << " delivered_bytes=" << c.delivered_bytes
      << " queue_drops=" << c.queue_drops << " loss_drops=" << c.loss_drops
      << " blackhole_drops=" << c.blackhole_drops << " unroutable=" << c.unroutable
      << " write_errors=" << c.write_errors << " wan_packets=" << c.wan_packets
      << " wan_bytes=" << c.wan_bytes << " in_flight=" << in_flight_;
  return out.str();
}

std::string Relay::command(const std::string& line, bool* quit) {
  std::istringstream in(line);
  std::string verb, extra;
  in >> verb;
  if (verb.empty()) return "error empty command";
  if (verb == "stats" || verb == "quit") {
    *quit = verb == "quit";
    return verb == "stats" ? stats_line() : "ok";
  }
  if (verb == "loss") {
    double p = -1;
    if (!(in >> p) || (in >> extra) || p < 0 || p > 1) return "error usage: loss P (0 <= P <= 1)";
    options_.loss = p;
    return "ok";
  }
  if (verb == "blackhole" || verb == "restore") {
    int host = -1;
    if (!(in >> host) || (in >> extra) || host < 0 || host >= static_cast<int>(tuns_.size())) {
      return "error usage: " + verb + " H (0 <= H < " + std::to_string(tuns_.size()) + ")";
    }
    blackholed_[host] = verb == "blackhole";
    return "ok";
  }
  return "error unknown command '" + verb + "' (stats, loss, blackhole, restore, quit)";
}

void Relay::run(int control_in, int control_out) {
  Fd epoll(::epoll_create1(EPOLL_CLOEXEC));
  if (epoll.get() < 0) throw_errno("epoll_create1");
  auto watch = [&](int fd, uint64_t tag) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = tag;
    if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, fd, &ev) != 0) throw_errno("epoll_ctl");
  };
  for (size_t h = 0; h < tuns_.size(); ++h)
    watch(tuns_[h].get(), h);
  watch(timer_.get(), kTimerTag);
  watch(control_in, kControlTag);
  std::string pending;
  bool quit = false;
  epoll_event ready[16];
  while (!quit) {
    release_due(now_ns());
    arm_timer();
    const int n = ::epoll_wait(epoll.get(), ready, 16, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno("epoll_wait");
    }
    for (int i = 0; i < n && !quit; ++i) {
      const uint64_t tag = ready[i].data.u64;
      if (tag == kTimerTag) {
        uint64_t expirations;
        while (::read(timer_.get(), &expirations, sizeof expirations) > 0) {
        }
        armed_ns_ = -1;
      } else if (tag == kControlTag) {
        char buffer[512];
        const ssize_t got = ::read(control_in, buffer, sizeof buffer);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {  // the owner closed its end or died: stop, and the TUN devices go with us
          quit = true;
          break;
        }
        pending.append(buffer, static_cast<size_t>(got));
        size_t eol;
        while (!quit && (eol = pending.find('\n')) != std::string::npos) {
          const std::string line = pending.substr(0, eol);
          pending.erase(0, eol + 1);
          write_line(control_out, command(line, &quit));
        }
      } else {
        read_host(static_cast<int>(tag));
      }
    }
  }
}

}  // namespace gradex::delayline
