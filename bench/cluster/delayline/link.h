// The network model of gradex-delayline: FIFO serializers ("pipes") chained into one path per
// directed host pair, and the topology that builds those paths from per-region settings.
//
// A pipe is one direction of a link: a drop-tail queue in bytes in front of a transmitter of a
// fixed rate. Because it is FIFO with a fixed rate, a packet's departure is known when it arrives
// (behind whatever is still queued), so a pipe needs no packet storage: only the time its
// transmitter becomes free. The relay feeds each pipe its arrivals in time order (its event heap),
// which keeps the model exact and work-conserving when several sources share one pipe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace gradex::delayline {

struct LinkSpec {
  double rate_bps = 0;   // > 0
  int64_t delay_ns = 0;  // one-way propagation delay after the transmitter, >= 0
};

class Pipe {
 public:
  Pipe(double rate_bps, int64_t queue_bytes) : rate_bps_(rate_bps), queue_bytes_(queue_bytes) {}
  // A packet of `bytes` arrives at `now_ns` (never earlier than the previous arrival): returns when
  // its last bit leaves the transmitter, or -1 when the bytes still queued plus this packet exceed
  // the queue (drop-tail). A packet that finds the transmitter idle is always accepted.
  int64_t admit(int64_t now_ns, size_t bytes);
  double rate_bps() const { return rate_bps_; }

 private:
  double rate_bps_;
  int64_t queue_bytes_;
  int64_t busy_until_ns_ = 0;
};

// One step of a path: serialize through `pipe`, then wait `delay_ns` before the next step.
// `inter_region`: the pipe between two regions (what the relay counts as WAN traffic).
struct Hop {
  Pipe* pipe;
  int64_t delay_ns;
  bool inter_region = false;
};

// Hosts in regions. Every host has an uplink and a downlink at the intra-region rate (its NIC,
// full duplex). Inside a region a packet crosses its sender's uplink, the intra-region delay and
// its receiver's downlink; between regions it crosses its sender's uplink, the pipe from its region
// to the other (shared by every host pair that crosses it; the inter-region rate, then the
// inter-region delay) and its receiver's downlink. One region: every host pair is a NIC-to-NIC path
// with the intra-region delay. As many regions as hosts: a pipe of its own for every directed pair.
struct TopologySpec {
  std::vector<int> region_of;  // region of each host: 0 .. R-1, every region used
  LinkSpec intra;
  LinkSpec inter;  // unused with one region
  // Region pairs whose pipes differ from `inter` (both directions of {a, b}, a < b): e.g. three
  // regions 20, 75 and 150 ms apart.
  std::map<std::pair<int, int>, LinkSpec> inter_pairs;
  double queue_ms = 10;  // each pipe's queue, in ms at its own rate (at least 4 packets of mtu)
  int64_t mtu = 65000;
};

class Topology {
 public:
  explicit Topology(const TopologySpec& spec);
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;
  int hosts() const { return static_cast<int>(spec_.region_of.size()); }
  const std::vector<Hop>& path(int src, int dst) const { return paths_[src * hosts() + dst]; }

 private:
  Pipe* make_pipe(double rate_bps);

  TopologySpec spec_;
  std::vector<std::unique_ptr<Pipe>> pipes_;
  std::vector<std::vector<Hop>> paths_;  // src * hosts + dst
};

// "1gbit", "100mbit", "500kbit", "2500000bit" (tc's spelling) -> bits per second; throws
// std::invalid_argument naming the text otherwise.
double parse_rate(const std::string& text);
// "25ms", "0.25ms", "100us", "1s" -> nanoseconds; throws std::invalid_argument otherwise.
int64_t parse_time(const std::string& text);
// "RATE,DELAY" (e.g. "1gbit,25ms") -> LinkSpec.
LinkSpec parse_link(const std::string& text);
// "A-B:RATE,DELAY;C-D:RATE,DELAY" -> {{min, max}: LinkSpec}; throws std::invalid_argument.
std::map<std::pair<int, int>, LinkSpec> parse_inter_pairs(const std::string& text);

}  // namespace gradex::delayline
