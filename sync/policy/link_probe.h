// The link model's measurement and the cost model's agreement, over the public comm::Communicator
// API: the start-up probe of the link per tier (sync/policy/link_model.h), and the agreement on
// rank 0's numbers.
#pragma once

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "sync/policy/cost_model.h"
#include "sync/policy/link_model.h"

namespace gradex::sync::cost {

struct ProbeOptions {
  // Message sizes of the ping-pongs (two or more distinct sizes separate alpha from beta).
  std::vector<size_t> sizes{8, 64u << 10, 256u << 10};
  int repeats = 7;  // timed round trips per size, after one untimed one
  // On a long path every timed round trip, stream and burst costs a WAN round trip or more of the
  // start-up (the probe took 4.8 s at 50 ms and about three times that at 150 ms), and the
  // fastest of a few is as good as of many when each lasts a round trip: where rank 0's first two
  // round trips (the untimed one and the first timed) take at least long_path_round_trip_s each,
  // each size gets long_path_repeats timed round trips, only the first size and the largest are
  // timed (alpha from the first, the window-limited fit and the transport's CPU from the largest;
  // beta at line rate comes from the stream), and each stream and burst gets one timed after the
  // untimed one. Rank 0 decides; its peers follow the flags its messages carry.
  double long_path_round_trip_s = 0.01;
  int long_path_repeats = 2;
  // Beta at line rate: after each tier's round trips, the tier's peer streams one message of what
  // the round trips' fit moves in stream_max_seconds (at least the largest round trip's size, at
  // most stream_bytes_max) to rank 0, twice after one untimed stream; beta is the fastest
  // stream's (seconds - 2 alpha) / bytes where that is below the fit's. On a long path the round
  // trips (at most 256 KiB) wait on TCP's window, not the line: at 1 Gbit/s and 25 ms one way
  // they read 75-90 ns per byte where the line moves 8. 0 bytes: no stream.
  size_t stream_bytes_max = 16u << 20;
  double stream_max_seconds = 0.1;
  // On a short path (no long-path economy) the stream moves what the round trips' fit moves in
  // this instead: there the fit is not window-limited and TCP reaches the line within a round trip
  // or two, so 30 ms of the line measures it (at 1 Gbit/s, 3.75 MB a stream; the three streams of
  // 0.1 s each were 0.29-0.37 s of a 0.75-0.87 s probe on a 1 Gbit/s LAN, most of the first step
  // that the start left unhidden).
  double short_path_stream_seconds = 0.03;
  // The incast bursts: for each size, ascending, every rank on another host than rank 0 sends
  // that many bytes to rank 0 at once (at most burst_total_max_bytes in all, and at most what the
  // other-host fit moves in burst_max_seconds, so that a slow link spends a bounded start-up on
  // it), the first size twice after one untimed burst, the larger ones twice without one of their
  // own (the first size's opened every sender's window), once each on a long path. A size that
  // those caps bring down to a smaller one's is not measured again. Empty: none measured.
  std::vector<size_t> burst_bytes_per_sender;
  size_t burst_total_max_bytes = 16u << 20;
  double burst_max_seconds = 0.5;
  // The bursts are timed only when rank 0's other-host fit has a latency of at least this (0:
  // always). Every rank learns rank 0's decision with the burst count.
  double burst_min_alpha_s = 0;
  // Round trips (seconds) from rank 0 to the lowest rank of each other host, measured already and
  // the same on every rank (the regions' discovery, comm/topology/regions.h): when it holds every
  // such rank, the probe chooses the peers it measures from it instead of pinging them again, and
  // a peer whose round trip is at least long_path_round_trip_s gets no ping-pong at all (its
  // latency is half that round trip; beta and the transport's CPU come from its streams).
  std::vector<std::pair<int, double>> rank0_round_trips_s;
};

// Which class of link connects ranks whose host identities (comm::host_identity()) are `hosts`:
// kOtherHost as soon as two ranks differ (a flat ring then crosses hosts), else kSameHost.
PeerClass collective_class(const std::vector<std::string>& hosts);

struct ProbeResult {
  std::vector<std::string> hosts;  // every rank's host identity, by rank
  // By tier: the rank measured (-1: no such tier), rank 0's fit (unmeasured tiers keep defaults).
  // kHost: the lowest rank on rank 0's host. The other hosts' lowest ranks are timed by one
  // round trip each; where their round trips split at a gap of comm::kRegionGapRatio or more
  // (and at least comm::kRegionMinFarRoundTripMs above it), kRegion is the farthest below the
  // gap and kAcross the farthest above; without a gap the
  // farthest is kAcross on a latency-bound link (alpha >= LinkModel::kLatencyBoundS), else
  // kRegion. A flat collective waits on its slowest link: the farthest host's tier is `flat`.
  std::array<int, kTiers> peers{-1, -1, -1};
  std::array<LinkParams, kTiers> link;
  Tier flat = Tier::kHost;
  // Rank 0's CPU over the flat tier's largest timed round trips (its thread's CPU clock: the
  // transport's copies, protocol and progress work, not the time spent asleep waiting for the
  // link), the upper quartile of the round trips (the kernel defers network work it is not
  // charged for on a loaded host, so the dearer round trips are the closer to the whole cost):
  // `transport_bytes` sent and received (each byte counted once) in `transport_cpu_s`. Where the
  // flat tier's peer was a known long path (no round trips), over its timed stream instead: bytes
  // received only, which read 2.1-3.0 ns a byte at 25-75 ms one way where the round trips read
  // 1.3-1.6. 0 bytes: nothing measured (one rank).
  uint64_t transport_bytes = 0;
  double transport_cpu_s = 0;
  // Rank 0's incast bursts (ProbeOptions::burst_bytes_per_sender), ascending by size, none when
  // not measured.
  std::vector<IncastBurst> bursts;
  // This rank's seconds in each part (rank 0 logs its own), for the start-up's log: across a WAN
  // each is a chain of round trips.
  struct Parts {
    double peers_s = 0;   // the hosts' names and the choice of the peers measured
    double pings_s = 0;   // the ping-pongs
    double stream_s = 0;  // the streams at line rate
    double bursts_s = 0;  // the incast bursts
    double agree_s = 0;   // the broadcast of rank 0's numbers
  } parts;

  // The cost model's class (CostModel::set_link): kSameHost the host tier, kOtherHost the flat
  // tier (the one flat collectives cross). Unmeasured: defaults with measured = false.
  LinkParams class_link(PeerClass c) const;
  // The agreed link model of these numbers for `world` ranks and the port queue.
  LinkModel model(int world, double port_queue_s) const;
};

// Collective. Every rank passes its own host identity: the one its communicator published at
// connection (Communicator::rank_hosts, then no message gathers the hosts) on every rank, or on
// none; rank 0 runs timed ping-pongs with one peer
// of each tier (ProbeResult::peers) at every size, fits alpha and beta per tier (LinkFit), times
// a stream for beta at line rate (ProbeOptions::stream_bytes_max) and its own CPU over the
// largest messages; the other ranks only answer or wait.
// Then, if asked and some rank is on another host, rank 0 times the incast bursts. Every rank
// returns rank 0's result.
ProbeResult probe_links(comm::Communicator& comm, const std::string& host,
                        const ProbeOptions& options = {});

// Collective: every rank returns rank 0's snapshot (`local` is used on rank 0 only), so that
// decisions taken from it agree although each rank measures its own times.
Snapshot agree_snapshot(comm::Communicator& comm, const Snapshot& local);

}  // namespace gradex::sync::cost
