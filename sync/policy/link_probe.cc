#include "sync/policy/link_probe.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <functional>
#include <set>

#include "base/cpu_time.h"
#include "base/error.h"
#include "comm/collectives.h"
#include "comm/topology/regions.h"
#include "sync/data/byte_io.h"

namespace gradex::sync::cost {
namespace {

using Clock = std::chrono::steady_clock;

// A sender refuses a start message asking for more (corrupt or hostile): ProbeOptions' default
// total, all of it from one sender.
constexpr uint64_t kBurstMaxPerSender = uint64_t{16} << 20;
// Nor does any rank take part in more bursts than this.
constexpr uint64_t kBurstMaxCount = 8;

// Sub-tags of the probe's collective tag: one per (class, size, repeat, direction).
uint64_t sub_tag(int cls, size_t size_index, int repeat, int direction) {
  return static_cast<uint64_t>(((cls * 64 + static_cast<int>(size_index)) * 256 + repeat) * 2 +
                               direction);
}

std::vector<uint8_t> broadcast_bytes(comm::Communicator& comm, std::vector<uint8_t> bytes) {
  uint64_t size = bytes.size();
  comm::broadcast(comm, &size, sizeof size, 0);
  bytes.resize(size);
  comm::broadcast(comm, bytes.data(), bytes.size(), 0);
  return bytes;
}

// A start message's top bit: the burst it starts is the last one (rank 0 decides how many).
constexpr uint64_t kLastBurst = uint64_t{1} << 63;
// A ping's first byte: 1 when another round trip of the same size follows, 0 for the last; the
// first size's last ping says 2 on a long path: the sizes between the first and the largest are
// skipped there (ProbeOptions::long_path_round_trip_s).
constexpr uint8_t kMorePings = 1, kLastPing = 0, kLastPingLongPath = 2;

// What rank 0 measured of a burst: the fastest timed one, its bytes per sender and rank 0's thread
// CPU over it (the transport's receive work). Zero on the other ranks.
struct BurstTiming {
  double seconds = 0;
  uint64_t each = 0;
  double cpu_s = 0;
};

// Rank 0's part of the incast burst: the fastest of `timed` bursts, after `untimed` ones, from
// every rank in `senders` at once, each started by a message from rank 0 that carries its bytes per
// sender (`each_for(rep, seconds of the rep before)`, rank 0's numbers) and whether it is the last.
// The senders' part: answer each start with that many bytes until the last. Other ranks do nothing.
BurstTiming time_burst(comm::Communicator& comm, const std::vector<int>& senders,
                       const std::function<uint64_t(int, double)>& each_for, int untimed,
                       int timed) {
  const uint64_t tag = comm.next_collective_tag();
  const int me = comm.rank();
  const bool sends = std::find(senders.begin(), senders.end(), me) != senders.end();
  BurstTiming best;
  if (me != 0 && !sends) return best;
  uint64_t start = 0;
  std::vector<uint8_t> data;
  double previous_s = 0;
  // The senders stop at the start marked last; kBurstMaxCount bounds a peer that never marks one.
  const int reps = me == 0 ? untimed + timed : static_cast<int>(kBurstMaxCount) + 1;
  for (int rep = 0; rep < reps; ++rep) {
    const uint64_t t = tag + static_cast<uint64_t>(rep) * 2;
    std::vector<comm::RequestPtr> reqs;
    if (me != 0) {
      reqs.push_back(comm.irecv(0, t, &start, sizeof start));
      comm.wait_all(reqs, "link probe burst");
      const bool last = (start & kLastBurst) != 0;
      start &= ~kLastBurst;
      if (start > kBurstMaxPerSender)
        throw CorruptPayload("link probe burst: rank 0 asked for " + std::to_string(start) +
                             " bytes");
      data.resize(std::max<uint64_t>(1, start), 0x3c);
      reqs.clear();
      reqs.push_back(comm.isend(0, t + 1, data.data(), start));
      comm.wait_all(reqs, "link probe burst");
      if (last) break;
      if (rep == static_cast<int>(kBurstMaxCount))
        throw CorruptPayload("link probe burst: rank 0 marked none of " +
                             std::to_string(kBurstMaxCount + 1) + " bursts the last");
      continue;
    }
    const uint64_t each = std::min(each_for(rep, previous_s), kBurstMaxPerSender);
    start = rep + 1 == reps ? (each | kLastBurst) : each;
    data.resize(std::max<uint64_t>(1, each * senders.size()), 0x3c);
    for (size_t i = 0; i < senders.size(); ++i)
      reqs.push_back(comm.irecv(senders[i], t + 1, data.data() + i * each, each));
    const auto t0 = Clock::now();
    const double cpu0 = thread_cpu_seconds();
    for (int q : senders)
      reqs.push_back(comm.isend(q, t, &start, sizeof start));
    comm.wait_all(reqs, "link probe burst");
    previous_s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (rep >= untimed && (rep == untimed || previous_s < best.seconds))
      best = {previous_s, each, thread_cpu_seconds() - cpu0};
  }
  return best;
}

// The same size for every rep.
std::function<uint64_t(int, double)> each_of(uint64_t each) {
  return [each](int, double) { return each; };
}

// Rank 0's round trip to rank `q` in `known` (ProbeOptions::rank0_round_trips_s, the same on every
// rank), 0 when it is not there.
double known_round_trip_s(const std::vector<std::pair<int, double>>& known, int q) {
  for (const auto& [rank, seconds] : known)
    if (rank == q && seconds > 0) return seconds;
  return 0;
}

// On a known long path, the share of the first stream's time per byte that sizes the next streams
// (probe_links).
constexpr double kSlowStartShare = 4;

// Round trips rank 0 times with each candidate of farthest_other_host_peer, after an untimed one.
constexpr int kFarthestPings = 2;

// Rank 0's round trip to each of `peers` at once (8 bytes each way), in seconds: each the time to
// its answer's arrival, as rank 0 sees it while it drives progress (at most the communicator's
// timeout; then wait_all reports whoever did not answer).
std::vector<double> round_trips(comm::Communicator& comm, const std::vector<int>& peers,
                                uint64_t tag) {
  const char* what = "link probe: round trip to each host";
  std::vector<uint64_t> in(peers.size()), out(peers.size());
  std::vector<comm::RequestPtr> recvs, sends;
  const auto t0 = Clock::now();
  for (size_t i = 0; i < peers.size(); ++i) {
    recvs.push_back(comm.irecv(peers[i], tag + 1, &in[i], sizeof in[i]));
    sends.push_back(comm.isend(peers[i], tag, &out[i], sizeof out[i]));
  }
  std::vector<double> took(peers.size(), -1);
  size_t left = peers.size();
  const auto deadline = t0 + comm.options().timeout;
  while (left > 0 && Clock::now() < deadline) {
    comm.progress();
    for (size_t i = 0; i < peers.size(); ++i) {
      if (took[i] >= 0 || !comm.test(*recvs[i], what)) continue;
      took[i] = std::chrono::duration<double>(Clock::now() - t0).count();
      --left;
    }
  }
  comm.wait_all(recvs, what);
  comm.wait_all(sends, what);
  for (double& s : took)
    if (s < 0) s = std::chrono::duration<double>(Clock::now() - t0).count();
  return took;
}

// The choice of other_host_peers from rank 0's round trips to `candidates` (seconds, by index).
std::array<int32_t, 2> choose_other_host_peers(const std::vector<int>& candidates,
                                               const std::vector<double>& fastest) {
  // Ascending by round trip; among equal ones the higher rank first, so that the last is the
  // lowest rank of the slowest.
  std::vector<size_t> order(candidates.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return fastest[x] < fastest[y] || (fastest[x] == fastest[y] && x > y);
  });
  std::array<int32_t, 2> chosen{-1, candidates[order.back()]};
  double widest = comm::kRegionGapRatio;
  for (size_t i = 0; i + 1 < order.size(); ++i) {
    const double below = std::max(fastest[order[i]], 1e-9), above = fastest[order[i + 1]];
    const double ratio = above / below;
    if (comm::region_gap(below * 1e3, above * 1e3) && ratio >= widest) {
      widest = ratio;
      chosen[0] = candidates[order[i]];
    }
  }
  return chosen;
}

// The other-host peers rank 0 probes: {near, far}, each -1 when absent. Of the lowest rank on each
// host other than rank 0's, rank 0 times the fastest round trip (8 bytes; every host pinged at
// once); far is the one with the longest (ties: the lowest rank): a flat collective waits on its
// slowest link, and the lowest-ranked other-host peer may share rank 0's region while the other
// hosts are an ocean away. Where the sorted round trips split at a ratio of comm::kRegionGapRatio
// or more (the largest such split) with the round trip above it at least
// comm::kRegionMinFarRoundTripMs, near is the farthest below it: rank 0's region. Collective
// over every rank (the candidates answer rank 0's pings, then every rank takes rank 0's choice
// from a broadcast); a single candidate is far, chosen without a message, and so are all of them
// when `known` (ProbeOptions::rank0_round_trips_s, the same on every rank) holds each one's round
// trip: every rank takes the same choice from it.
std::array<int32_t, 2> other_host_peers(comm::Communicator& comm,
                                        const std::vector<std::string>& hosts,
                                        const std::vector<std::pair<int, double>>& known) {
  std::vector<int> candidates;
  std::set<std::string> seen{hosts[0]};
  for (size_t r = 1; r < hosts.size(); ++r)
    if (seen.insert(hosts[r]).second) candidates.push_back(static_cast<int>(r));
  if (candidates.size() < 2) return {-1, candidates.empty() ? -1 : candidates.front()};
  std::vector<double> known_s;
  for (int c : candidates)
    if (const double s = known_round_trip_s(known, c); s > 0) known_s.push_back(s);
  if (known_s.size() == candidates.size()) return choose_other_host_peers(candidates, known_s);
  const uint64_t tag = comm.next_collective_tag();
  const int me = comm.rank();
  uint64_t ping = 0;
  std::array<int32_t, 2> chosen{-1, candidates.front()};
  if (me == 0) {
    std::vector<double> fastest;
    for (int rep = 0; rep <= kFarthestPings; ++rep) {
      const std::vector<double> took =
          round_trips(comm, candidates, tag + static_cast<uint64_t>(rep) * 2);
      if (rep == 1) fastest = took;
      for (size_t i = 0; rep > 1 && i < took.size(); ++i)
        fastest[i] = std::min(fastest[i], took[i]);
    }
    chosen = choose_other_host_peers(candidates, fastest);
  } else if (std::find(candidates.begin(), candidates.end(), me) != candidates.end()) {
    for (int rep = 0; rep <= kFarthestPings; ++rep) {
      const uint64_t t = tag + static_cast<uint64_t>(rep) * 2;
      std::vector<comm::RequestPtr> reqs;
      reqs.push_back(comm.irecv(0, t, &ping, sizeof ping));
      comm.wait_all(reqs, "link probe: round trip to each host");
      reqs.clear();
      reqs.push_back(comm.isend(0, t + 1, &ping, sizeof ping));
      comm.wait_all(reqs, "link probe: round trip to each host");
    }
  }
  comm::broadcast(comm, chosen.data(), sizeof chosen, 0);
  for (int32_t c : chosen)
    if (c != -1 && std::find(candidates.begin(), candidates.end(), c) == candidates.end())
      throw CorruptPayload("link probe: rank 0 chose rank " + std::to_string(c) +
                           ", which is not the lowest rank of another host");
  if (chosen[1] == -1 || chosen[0] == chosen[1])
    throw CorruptPayload("link probe: rank 0 chose no farthest host");
  return chosen;
}

}  // namespace

PeerClass collective_class(const std::vector<std::string>& hosts) {
  for (const std::string& h : hosts)
    if (h != hosts.front()) return PeerClass::kOtherHost;
  return PeerClass::kSameHost;
}

LinkParams ProbeResult::class_link(PeerClass c) const {
  const Tier t = c == PeerClass::kSameHost ? Tier::kHost : flat;
  if (c == PeerClass::kOtherHost && flat == Tier::kHost) return LinkParams{};
  return link[static_cast<size_t>(t)];
}

LinkModel ProbeResult::model(int world, double port_queue_s) const {
  LinkModel m;
  m.tiers = link;
  for (size_t t = 0; t < kTiers; ++t)
    m.present[t] = peers[t] >= 0;
  m.present[static_cast<size_t>(flat)] = world > 1;
  m.flat = flat;
  m.world_size = world;
  m.port_queue_s = port_queue_s;
  m.bursts = bursts;
  return m;
}

ProbeResult probe_links(comm::Communicator& comm, const std::string& host,
                        const ProbeOptions& options) {
  if (options.repeats < 1 || options.repeats > 255 || options.sizes.empty() ||
      options.sizes.size() > 64)
    throw InvalidArgument("link probe: 1-255 repeats and 1-64 sizes");
  ProbeResult result;
  const int world = comm.size();
  const int me = comm.rank();
  auto part_from = Clock::now();
  auto part_done = [&part_from](double& part) {
    const auto now = Clock::now();
    part += std::chrono::duration<double>(now - part_from).count();
    part_from = now;
  };
  // The hosts the communicator learnt at its connection (each rank's published identity, the same
  // list on every rank) where they hold this rank's `host`: a UCX communicator's, for the host
  // identity it published. Else one allgather (across a WAN, a round trip of the probe).
  result.hosts = comm.rank_hosts();
  if (result.hosts.size() != static_cast<size_t>(world) ||
      result.hosts[static_cast<size_t>(me)] != host) {
    result.hosts.clear();
    for (const comm::Bytes& b : comm::allgatherv(comm, host.data(), host.size()))
      result.hosts.emplace_back(b.begin(), b.end());
  }
  // The rank rank 0 measures in each slot (-1: none): the lowest rank on its own host, the
  // farthest host of its region (only where the other hosts' round trips show a gap), the
  // farthest host. Every rank knows them (the hosts, rank 0's broadcast choice).
  constexpr int kSlots = 3;
  std::array<int, kSlots> peer{-1, -1, -1};
  for (int r = 1; r < world && peer[0] < 0; ++r)
    if (result.hosts[static_cast<size_t>(r)] == result.hosts[0]) peer[0] = r;
  const std::array<int32_t, 2> others =
      other_host_peers(comm, result.hosts, options.rank0_round_trips_s);
  part_done(result.parts.peers_s);
  peer[1] = others[0];
  peer[2] = others[1];
  int flat_slot = 0;
  for (int c = 0; c < kSlots; ++c)
    if (peer[static_cast<size_t>(c)] >= 0) flat_slot = c;
  const uint64_t tag = comm.next_collective_tag();
  size_t largest = 0;
  for (size_t s : options.sizes)
    largest = std::max(largest, s);
  std::vector<uint8_t> send(largest, 0x5a), recv(largest);
  std::array<LinkParams, kSlots> fitted;
  uint64_t transport_bytes = 0;
  double transport_cpu_s = 0;
  std::vector<double> transport_cpu;  // rank 0: the flat slot's largest round trips' CPU
  // Rank 0's: a long path's economy (ProbeOptions::long_path_round_trip_s), from its first
  // untimed round trip; the peers follow the pings' flags and the bursts' last marks.
  bool long_path = false;
  double first_round_trip = 0;
  // The transport's CPU over the flat slot's timed stream, where no round trip measured it.
  double stream_cpu_s = 0;
  uint64_t stream_cpu_bytes = 0;
  for (int c = 0; c < kSlots; ++c) {
    const int q = peer[static_cast<size_t>(c)];
    if (q < 0) continue;
    // A path the regions' discovery timed already as long (the same number on every rank): its
    // round trip is the latency, the stream the rest (below), and no ping-pong runs. At 25 ms one
    // way the ping-pongs were 0.60 s of a 1.6 s probe, 2.0 s of 4.5 at 75 ms: each 256 KiB round
    // trip waits out TCP's slow start both ways, for numbers the stream gives again.
    const double known_s = known_round_trip_s(options.rank0_round_trips_s, q);
    const bool known_long =
        known_s > 0 && known_s >= options.long_path_round_trip_s && options.stream_bytes_max > 0;
    if (known_long) long_path = true;
    LinkFit fit;
    if (!known_long && (me == 0 || me == q)) {
      const int other = me == 0 ? q : 0;
      bool skip_middle = false;  // as the first size's last ping said
      for (size_t si = 0; si < options.sizes.size(); ++si) {
        const size_t bytes = options.sizes[si];
        if (skip_middle && bytes != largest) continue;
        double fastest = 0;
        // The peer answers until a ping says it is the last; rank 0 may shorten its own count
        // after the first round trip (a long path), never lengthen it.
        int repeats = options.repeats;
        for (int rep = 0; rep <= repeats; ++rep) {
          std::vector<comm::RequestPtr> reqs;
          const auto t0 = Clock::now();
          const double cpu0 = thread_cpu_seconds();
          if (me == 0) {
            send[0] = rep < repeats ? kMorePings : kLastPing;
            // Known long after the first size's second round trip: its last ping says so.
            if (rep == repeats && si == 0 && long_path) {
              send[0] = kLastPingLongPath;
              skip_middle = true;
            }
            reqs.push_back(comm.isend(other, tag + sub_tag(c, si, rep, 0), send.data(), bytes));
            reqs.push_back(comm.irecv(other, tag + sub_tag(c, si, rep, 1), recv.data(), bytes));
          } else {
            reqs.push_back(comm.irecv(other, tag + sub_tag(c, si, rep, 0), recv.data(), bytes));
            comm.wait_all(reqs, "link probe");
            if (comm.recv_length(*reqs[0]) < 1)
              throw CorruptPayload("link probe: an empty ping from rank 0");
            if (recv[0] != kMorePings) repeats = rep;  // this round trip is the last
            if (recv[0] == kLastPingLongPath) skip_middle = true;
            reqs.clear();
            reqs.push_back(comm.isend(other, tag + sub_tag(c, si, rep, 1), send.data(), bytes));
          }
          comm.wait_all(reqs, "link probe");
          const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
          // The first two round trips of the first size, both long: one slow round trip (a loaded
          // host, a sanitizer's build) does not cut the samples of a short path.
          if (me == 0 && si == 0 && rep == 0) first_round_trip = seconds;
          if (me == 0 && si == 0 && rep == 1 &&
              std::min(first_round_trip, seconds) >= options.long_path_round_trip_s)
            long_path = true;
          // The ping just sent said whether another follows: one promised is sent.
          if (me == 0 && long_path)
            repeats = std::min(repeats, std::max(rep + (rep < repeats ? 1 : 0),
                                                 std::max(1, options.long_path_repeats)));
          // Rep 0 warms the path (connection, buffers) and is not counted. Each size counts
          // with its fastest round trip: on a long path the first round trips of a large
          // message wait for TCP's congestion window to open (slow start); the fastest is the
          // one the window limited least. A round trip is two messages of `bytes` each.
          if (me == 0 && rep > 0 && (rep == 1 || seconds < fastest)) fastest = seconds;
          if (me == 0 && rep > 0 && bytes == largest && c == flat_slot)
            transport_cpu.push_back(thread_cpu_seconds() - cpu0);
        }
        if (me == 0) fit.add(2.0, 2.0 * bytes, fastest);
      }
    }
    LinkParams p = known_long ? LinkParams{known_s / 2, 0, true} : fit.params(LinkParams{});
    // Beta at line rate: one stream from the peer (ProbeOptions::stream_bytes_max). Every rank
    // takes part in the stream's collective tag; rank 0 sizes it and tells the peer: from the
    // round trips' fit, or on a known long path from an untimed stream of the largest ping size
    // (which a window limits as it limited that ping): the timed one is sized by a quarter of its
    // time per byte (kSlowStartShare) and follows an untimed one of twice that size, which opens
    // the window. At 1 Gbit/s and 25 ms one way the first stream's time per byte is 380 ns (the
    // line's 8): sized by it alone the streams stayed at 256 KiB and read 0.10-0.18 Gbit/s; after
    // an untimed stream of the timed one's size, 0.36; as here, 0.72 (the round trips' fit: 0.88).
    const uint64_t stream_cap = std::min<uint64_t>(options.stream_bytes_max, kBurstMaxPerSender);
    auto stream_for = [&](double beta_s_per_byte, double seconds) {
      double n = static_cast<double>(options.stream_bytes_max);
      if (beta_s_per_byte > 0) n = std::min(n, seconds / beta_s_per_byte);
      return std::min<uint64_t>(std::max<uint64_t>(static_cast<uint64_t>(n), largest), stream_cap);
    };
    // Rank 0 knows its economy from this slot's first round trip (a peer learns the size from the
    // stream's start message, whatever it is).
    const uint64_t stream =
        me == 0 && options.stream_bytes_max > 0
            ? stream_for(p.beta_s_per_byte,
                         long_path ? options.stream_max_seconds : options.short_path_stream_seconds)
            : 0;
    part_done(result.parts.pings_s);
    BurstTiming took;
    if (options.stream_bytes_max > 0 && known_long) {
      const double alpha_s = p.alpha_s;
      took = time_burst(
          comm, {q},
          [&, sized = uint64_t{0}](int rep, double first_s) mutable -> uint64_t {
            if (rep == 0) return std::min<uint64_t>(largest, stream_cap);
            if (rep == 1) {
              const double data_s = first_s - 2 * alpha_s;
              sized = stream_for(
                  data_s > 0 ? data_s / static_cast<double>(largest) / kSlowStartShare : 0,
                  options.stream_max_seconds);
            }
            return rep == 1 ? std::min<uint64_t>(2 * sized, stream_cap) : sized;
          },
          2, 1);
    } else if (options.stream_bytes_max > 0) {
      took = time_burst(comm, {q}, each_of(stream), 1, long_path ? 1 : 2);
    }
    if (me == 0 && took.each > 0) {
      const double data_s = took.seconds - 2 * p.alpha_s;
      const double beta = data_s / static_cast<double>(took.each);
      if (data_s > 0 && (known_long || beta < p.beta_s_per_byte)) p.beta_s_per_byte = beta;
      // A stream no slower than the known round trip (a jittery one): its whole time, a bound.
      if (known_long && data_s <= 0)
        p.beta_s_per_byte = took.seconds / static_cast<double>(took.each);
      if (known_long && c == flat_slot) {
        stream_cpu_s = took.cpu_s;
        stream_cpu_bytes = took.each;
      }
    }
    fitted[static_cast<size_t>(c)] = p;
    part_done(result.parts.stream_s);
  }
  if (!transport_cpu.empty()) {
    // The upper quartile of the round trips: a loaded host defers part of its network work (the
    // receive path's softirqs) to ksoftirqd, where no rank's clock sees it, so the dearer round
    // trips are the closer to the whole cost; a quartile rather than the dearest, so that one
    // round trip that a burst of load hit does not set the number (it read 0.28-1.01 ns per byte
    // between runs as the dearest of three).
    std::sort(transport_cpu.begin(), transport_cpu.end());
    transport_cpu_s = transport_cpu[(transport_cpu.size() - 1) * 3 / 4];
    transport_bytes = 2 * largest;
  } else if (stream_cpu_bytes > 0) {
    transport_cpu_s = stream_cpu_s;
    transport_bytes = stream_cpu_bytes;
  }
  // The incast bursts: the rule every rank derives from the hosts alone, so that all call them or
  // none.
  std::vector<IncastBurst> bursts;
  if (!options.burst_bytes_per_sender.empty() && peer[2] >= 0) {
    std::vector<int> senders;
    for (int r = 1; r < world; ++r)
      if (result.hosts[static_cast<size_t>(r)] != result.hosts[0]) senders.push_back(r);
    // Rank 0 sizes each (the flat tier's numbers bound the time) and tells the senders in each
    // start message; the other ranks take part in as many bursts as rank 0 times.
    const LinkParams fit = fitted[2];
    std::vector<uint64_t> sizes;  // per sender, ascending and distinct (rank 0's)
    const bool wanted_here = fit.alpha_s >= options.burst_min_alpha_s;
    for (size_t wanted : options.burst_bytes_per_sender) {
      if (!wanted_here) break;
      double each =
          static_cast<double>(std::min(wanted, options.burst_total_max_bytes / senders.size()));
      if (fit.beta_s_per_byte > 0)
        each = std::min(each, options.burst_max_seconds / fit.beta_s_per_byte /
                                  static_cast<double>(senders.size()));
      const auto bytes = std::min<uint64_t>(static_cast<uint64_t>(each), kBurstMaxPerSender);
      if (bytes > 0 && (sizes.empty() || bytes > sizes.back())) sizes.push_back(bytes);
    }
    uint64_t count = sizes.size();
    comm::broadcast(comm, &count, sizeof count, 0);
    if (count > kBurstMaxCount)
      throw CorruptPayload("link probe: rank 0 asked for " + std::to_string(count) + " bursts");
    for (uint64_t i = 0; i < count; ++i) {
      const uint64_t each = me == 0 ? sizes[i] : 0;  // the senders learn it from rank 0
      // The first size's untimed burst has opened every sender's window: the next sizes are
      // timed without one of their own (on a 1 Gbit/s LAN the untimed 4 MiB burst from each of
      // three hosts was 0.1 s of the start), and once on a long path (each burst there is 3-4
      // round trips).
      const double fastest =
          time_burst(comm, senders, each_of(each), i > 0 ? 0 : 1, long_path ? 1 : 2).seconds;
      if (me == 0) {
        const uint64_t total = each * senders.size();
        bursts.push_back({total,
                          std::max(0.0, fastest - fit.seconds(2.0, static_cast<double>(total))),
                          fastest});
      }
    }
  }
  part_done(result.parts.bursts_s);
  // Rank 0 labels the slots with tiers: the far slot is across regions where a gap split the
  // hosts or its latency is a WAN's, else inside the region.
  std::array<int32_t, kTiers> tier_peer{-1, -1, -1};
  tier_peer[static_cast<size_t>(Tier::kHost)] = peer[0];
  tier_peer[static_cast<size_t>(Tier::kRegion)] = peer[1];
  if (peer[2] >= 0) {
    const bool across = peer[1] >= 0 || fitted[2].alpha_s >= LinkModel::kLatencyBoundS;
    tier_peer[static_cast<size_t>(across ? Tier::kAcross : Tier::kRegion)] = peer[2];
  }
  ByteWriter w;
  for (size_t t = 0; t < kTiers; ++t) {
    const int32_t q = tier_peer[t];
    const int slot = q < 0 ? -1 : q == peer[0] ? 0 : q == peer[1] ? 1 : 2;
    const LinkParams p = slot < 0 ? LinkParams{} : fitted[static_cast<size_t>(slot)];
    w.put<int32_t>(q);
    w.put<double>(p.alpha_s);
    w.put<double>(p.beta_s_per_byte);
    w.put<uint8_t>(p.measured ? 1 : 0);
  }
  w.put<uint64_t>(transport_bytes);
  w.put<double>(transport_cpu_s);
  w.put<uint64_t>(bursts.size());
  for (const IncastBurst& b : bursts) {
    w.put<uint64_t>(b.bytes);
    w.put<double>(b.extra_s);
    w.put<double>(b.seconds);
  }
  const std::vector<uint8_t> agreed = broadcast_bytes(comm, std::move(w.bytes()));
  part_done(result.parts.agree_s);
  ByteReader r(agreed.data(), agreed.size(), "link probe result");
  for (size_t t = 0; t < kTiers; ++t) {
    const auto q = r.get<int32_t>();
    if (q < -1 || q >= world || q == 0)
      throw CorruptPayload("link probe result: peer " + std::to_string(q));
    result.peers[t] = q;
    LinkParams& p = result.link[t];
    p.alpha_s = r.get<double>();
    p.beta_s_per_byte = r.get<double>();
    p.measured = r.get<uint8_t>() != 0;
    if (q >= 0) result.flat = static_cast<Tier>(t);
  }
  result.transport_bytes = r.get<uint64_t>();
  result.transport_cpu_s = r.get<double>();
  const auto count = r.get<uint64_t>();
  if (count > kBurstMaxCount)
    throw CorruptPayload("link probe result: " + std::to_string(count) + " bursts");
  for (uint64_t i = 0; i < count; ++i) {
    IncastBurst b;
    b.bytes = r.get<uint64_t>();
    b.extra_s = r.get<double>();
    b.seconds = r.get<double>();
    result.bursts.push_back(b);
  }
  r.expect_end();
  return result;
}

Snapshot agree_snapshot(comm::Communicator& comm, const Snapshot& local) {
  std::vector<uint8_t> bytes;
  if (comm.rank() == 0) bytes = local.encode();
  bytes = broadcast_bytes(comm, std::move(bytes));
  return Snapshot::decode(bytes.data(), bytes.size());
}

}  // namespace gradex::sync::cost
