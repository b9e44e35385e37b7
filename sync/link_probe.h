// The cost model's collective parts, over the public comm::Communicator API:
// the start-up probe of the link per peer class, and the agreement on rank 0's numbers.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "sync/cost_model.h"

namespace gradex::sync::cost {

// One incast burst: `bytes` arrived at rank 0 from every other-host rank at once, and the fastest
// of its timed bursts took `seconds`, `extra_s` longer than the other-host fit predicts for the
// same bytes from one sender (a start message's latency, then the data's; never below 0). A port
// that overflowed and waited for a retransmission shows here as that wait; a path that absorbed
// the burst as about 0.
struct IncastBurst {
  uint64_t bytes = 0;
  double extra_s = 0;
  double seconds = 0;  // 0: not known (a model built without the probe)
};

struct ProbeOptions {
  // Message sizes of the ping-pongs (two or more distinct sizes separate alpha from beta).
  std::vector<size_t> sizes{8, 64u << 10, 256u << 10};
  int repeats = 7;  // timed round trips per size, after one untimed one
  // The incast bursts: for each size, ascending, every rank on another host than rank 0 sends
  // that many bytes to rank 0 at once (at most burst_total_max_bytes in all, and at most what the
  // other-host fit moves in burst_max_seconds, so that a slow link spends a bounded start-up on
  // it), twice after one untimed burst. A size that those caps bring down to a smaller one's is
  // not measured again. Empty: none measured.
  std::vector<size_t> burst_bytes_per_sender;
  size_t burst_total_max_bytes = 16u << 20;
  double burst_max_seconds = 0.5;
  // The bursts are timed only when rank 0's other-host fit has a latency of at least this (0:
  // always). Every rank learns rank 0's decision with the burst count.
  double burst_min_alpha_s = 0;
};

// Which class of link connects ranks whose host identities (comm::host_identity()) are `hosts`:
// kOtherHost as soon as two ranks differ (a flat ring then crosses hosts), else kSameHost.
PeerClass collective_class(const std::vector<std::string>& hosts);

struct ProbeResult {
  std::vector<std::string> hosts;  // every rank's host identity, by rank
  // The rank each class was measured with (-1: no such rank), by class: the lowest rank on rank
  // 0's host, and of the lowest rank on each other host the one farthest from rank 0.
  std::array<int, kPeerClasses> peers{-1, -1};
  std::array<LinkParams, kPeerClasses> link;  // rank 0's fit; unmeasured classes keep defaults
  // Rank 0's CPU over the largest size's timed round trips (its thread's CPU clock: the
  // transport's copies, protocol and progress work, not the time spent asleep waiting for the
  // link), the upper quartile of the round trips (the kernel defers network work it is not
  // charged for on a loaded host, so the dearer round trips are the closer to the whole cost):
  // `transport_bytes` sent and received (each byte counted once) in `transport_cpu_s`. 0 bytes:
  // nothing measured (one rank).
  uint64_t transport_bytes = 0;
  double transport_cpu_s = 0;
  // Rank 0's incast bursts (ProbeOptions::burst_bytes_per_sender), ascending by size, none when
  // not measured.
  std::vector<IncastBurst> bursts;
};

// Collective. Every rank passes its own host identity; rank 0 runs timed ping-pongs with one peer
// of each class (ProbeResult::peers: on another host, the farthest host, found by a round trip to
// each, since a flat collective waits on its slowest link) at every size and fits alpha and beta
// per class (LinkFit) and times its own CPU over the largest messages; the other ranks only answer
// or wait.
// Then, if asked and some rank is on another host, rank 0 times the incast bursts. Every rank
// returns rank 0's result.
ProbeResult probe_links(comm::Communicator& comm, const std::string& host,
                        const ProbeOptions& options = {});

// Collective: every rank returns rank 0's snapshot (`local` is used on rank 0 only), so that
// decisions taken from it agree although each rank measures its own times.
Snapshot agree_snapshot(comm::Communicator& comm, const Snapshot& local);

}  // namespace gradex::sync::cost
