// The relay of gradex-delayline: reads every host's TUN device, moves each IPv4 packet along its
// path (link.h) and writes it to the destination host's TUN device when it arrives there; drops it
// when a queue is full, at random with the configured loss probability, or while its source or
// destination host is blackholed. Single-threaded: epoll over the TUN descriptors, the control
// input and a timerfd armed at the next event of a heap of (time, packet, hop).
#pragma once

#include <cstdint>
#include <queue>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "link.h"
#include "tun.h"

namespace gradex::delayline {

struct RelayOptions {
  std::vector<std::string> netns;  // host i's network namespace (/run/netns/<name>)
  std::string dev = "wan0";        // the TUN device created in each
  std::vector<uint32_t> addrs;     // host i's IPv4 address, host byte order
  TopologySpec topology;
  double loss = 0;    // probability of dropping a packet at ingress, in [0, 1]
  uint64_t seed = 1;  // of the loss draws
};

struct RelayCounters {
  uint64_t read_packets = 0, read_bytes = 0, delivered_packets = 0, delivered_bytes = 0;
  // Packets and IP bytes that a pipe between two regions accepted (both directions, every region
  // pair): what crossed the WAN, counted once per packet however many hosts share the pipe. A
  // packet dropped later at its receiver's downlink still counts (it used the WAN).
  uint64_t wan_packets = 0, wan_bytes = 0;
  uint64_t queue_drops = 0, loss_drops = 0, blackhole_drops = 0, unroutable = 0, write_errors = 0;
};

class Relay {
 public:
  // Opens the TUN devices (see open_tun_in_netns: call before starting any thread).
  explicit Relay(RelayOptions options);
  // Serves until "quit" or end of input on `control_in`, answering each command with one line on
  // `control_out`:
  //   stats              "stats read_packets=N read_bytes=N ... wan_bytes=N in_flight=N"
  //   loss P             set the loss probability (0..1)        -> "ok"
  //   blackhole H        drop every packet from or to host H    -> "ok"
  //   restore H          stop doing so                          -> "ok"
  //   quit                                                      -> "ok", then return
  // A bad command gets "error <reason>" and changes nothing.
  void run(int control_in, int control_out);
  const RelayCounters& counters() const { return counters_; }
  std::string stats_line() const;

 private:
  struct Packet {
    std::vector<uint8_t> bytes;
    int src = 0, dst = 0;
  };
  struct Event {
    int64_t time_ns;
    uint64_t seq;  // FIFO among equal times
    uint32_t slot;
    uint32_t hop;  // the hop the packet enters now; == path size: deliver
    bool operator>(const Event& o) const {
      return time_ns != o.time_ns ? time_ns > o.time_ns : seq > o.seq;
    }
  };

  void read_host(int host);
  void ingress(int src, const uint8_t* data, size_t size, int64_t now_ns);
  void advance(uint32_t slot, uint32_t hop, int64_t at_ns);
  void release_due(int64_t now_ns);
  void arm_timer();
  std::string command(const std::string& line, bool* quit);
  void free_slot(uint32_t slot);

  RelayOptions options_;
  Topology topology_;
  std::vector<Fd> tuns_;
  std::unordered_map<uint32_t, int> host_of_addr_;
  std::vector<bool> blackholed_;
  std::vector<Packet> slots_;
  std::vector<uint32_t> free_slots_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  uint64_t seq_ = 0;
  size_t in_flight_ = 0;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> uniform_{0.0, 1.0};
  RelayCounters counters_;
  Fd timer_;
  int64_t armed_ns_ = -1;
  std::vector<uint8_t> scratch_;
};

}  // namespace gradex::delayline
