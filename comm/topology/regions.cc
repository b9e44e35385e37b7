#include "comm/topology/regions.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <limits>
#include <numeric>

#include "base/error.h"
#include "comm/collectives.h"
#include "comm/topology/host_topology.h"

namespace gradex::comm {
namespace {

using Clock = std::chrono::steady_clock;

int find(std::vector<int>& parent, int x) {
  while (parent[static_cast<size_t>(x)] != x)
    x = parent[static_cast<size_t>(x)] =
        parent[static_cast<size_t>(parent[static_cast<size_t>(x)])];
  return x;
}

// Numbers groups in the order of their first member: labels[i] -> 0, 1, ...
std::vector<int> renumber(const std::vector<int>& labels) {
  std::vector<int> out(labels.size());
  std::vector<std::pair<int, int>> seen;  // (label, number)
  for (size_t i = 0; i < labels.size(); ++i) {
    auto it = std::find_if(seen.begin(), seen.end(), [&](auto& s) { return s.first == labels[i]; });
    if (it == seen.end()) {
      seen.emplace_back(labels[i], static_cast<int>(seen.size()));
      it = seen.end() - 1;
    }
    out[i] = it->second;
  }
  return out;
}

// A ping's byte: another ping of the pair follows (kMorePings), this is its last (kLastPing), or
// this is its last and the higher host times the pair from its pong to this ping's arrival
// (kLastPingTimedThere; a long path's).
constexpr uint8_t kMorePings = 1, kLastPing = 0, kLastPingTimedThere = 2;

// This host leader's round trips (ms) to the other hosts' leaders. The pairs meet in the rounds of
// a round-robin tournament (the circle method), each leader with at most one partner a round; the
// lower host times up to `repeats` ping-pongs, each end waiting in wait_all (asleep on the worker's
// events, so a busy host's scheduler wakes it when a message arrives; spinning processes on
// oversubscribed cores measured their scheduling, 10-25 ms on loopback). The fastest after the
// first (connection and cache warm-up) is kept; the host that did not time the pair leaves its
// entry 0 (regions_from_rtts takes the larger direction). A pair whose first round trip took
// `long_path_ms` or more is timed once more only, and by the higher host: the lower answers its
// pong with a last ping at once, and the higher times from its pong to that ping, a clean round
// trip (the first one may hold the partner's late arrival), without a pong of its own: a round
// takes 1.5 round trips there, not 2 (across regions each round trip costs the start-up tens of
// ms or more, and a WAN's jitter is small beside a gap of kRegionGapRatio). The lower host
// decides; each ping says whether another follows and who times it.
std::vector<double> time_leaders(Communicator& comm, uint64_t tag, const std::vector<int>& leaders,
                                 size_t me, int repeats, double long_path_ms) {
  const size_t H = leaders.size();
  const size_t slots = H + H % 2;  // an odd count plays against a bye
  std::vector<double> rtt(H, 0.0);
  for (size_t round = 0; round + 1 < slots; ++round) {
    // Circle method: slot 0 stays, the others rotate; slot i meets slot slots - 1 - i.
    auto host_at = [&](size_t slot) {
      return slot == 0 ? 0 : 1 + (slot - 1 + round) % (slots - 1);
    };
    size_t partner = slots;
    for (size_t i = 0; i < slots; ++i) {
      if (host_at(i) == me) partner = host_at(slots - 1 - i);
    }
    if (partner >= H) continue;  // the bye
    const int peer = leaders[partner];
    double best = std::numeric_limits<double>::infinity();
    int count = repeats;  // the lower host may shorten it; the higher follows the pings' bytes
    Clock::time_point pong_sent;  // the higher host's last pong
    for (int rep = 0; rep < count; ++rep) {
      const uint64_t ping = tag + 2 * static_cast<uint64_t>(rep), pong = ping + 1;
      std::vector<RequestPtr> requests;
      if (me < partner) {
        const uint8_t out = rep + 1 < count ? kMorePings : kLastPing;
        uint8_t in = 0;
        const auto t0 = Clock::now();
        requests.push_back(comm.irecv(peer, pong, &in, 1));
        requests.push_back(comm.isend(peer, ping, &out, 1));
        comm.wait_all(requests, "regions");
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        if (rep > 0) best = std::min(best, ms);
        if (rep == 0 && ms >= long_path_ms && count > 1) {
          // The last ping, timed there: sent now, as the pong has just arrived.
          const uint8_t last = kLastPingTimedThere;
          requests.clear();
          requests.push_back(comm.isend(peer, ping + 2, &last, 1));
          comm.wait_all(requests, "regions");
          break;
        }
      } else {
        uint8_t in = kLastPing;
        const uint8_t out = 1;
        requests.push_back(comm.irecv(peer, ping, &in, 1));
        comm.wait_all(requests, "regions");
        if (in == kLastPingTimedThere && rep > 0) {
          rtt[partner] =
              std::chrono::duration<double, std::milli>(Clock::now() - pong_sent).count();
          break;
        }
        if (in != kMorePings) count = rep + 1;  // this ping was the pair's last
        requests.clear();
        requests.push_back(comm.isend(peer, pong, &out, 1));
        comm.wait_all(requests, "regions");
        pong_sent = Clock::now();
      }
    }
    if (me < partner && best < std::numeric_limits<double>::infinity()) rtt[partner] = best;
  }
  return rtt;
}

}  // namespace

std::vector<int> regions_from_rtts(const std::vector<std::vector<double>>& rtt_ms) {
  const size_t n = rtt_ms.size();
  auto d = [&](size_t a, size_t b) { return std::max(rtt_ms[a][b], rtt_ms[b][a]); };
  std::vector<double> all;
  for (size_t a = 0; a < n; ++a)
    for (size_t b = a + 1; b < n; ++b)
      all.push_back(d(a, b));
  std::sort(all.begin(), all.end());
  double cut = -1, widest = 0;
  for (size_t i = 1; i < all.size(); ++i) {
    const double lo = std::max(all[i - 1], 1e-6);  // a 0 ms round trip: a LAN's, not a division
    const double ratio = all[i] / lo;
    if (region_gap(lo, all[i]) && ratio > widest) {
      widest = ratio;
      cut = all[i - 1];
    }
  }
  std::vector<int> parent(n);
  std::iota(parent.begin(), parent.end(), 0);
  for (size_t a = 0; a < n; ++a)
    for (size_t b = a + 1; b < n; ++b)
      if (cut < 0 || d(a, b) <= cut)
        parent[static_cast<size_t>(find(parent, static_cast<int>(b)))] =
            find(parent, static_cast<int>(a));
  std::vector<int> root(n);
  for (size_t a = 0; a < n; ++a)
    root[a] = find(parent, static_cast<int>(a));
  return renumber(root);
}

RegionMap discover_regions(Communicator& comm, const std::string& declared_region, int repeats,
                           double long_path_ms) {
  const int P = comm.size();
  RegionMap map;
  // Who declared a region: every rank learns every rank's name, so a partial declaration fails
  // everywhere with the same message.
  const std::vector<Bytes> names = allgatherv(comm, declared_region.data(), declared_region.size());
  int with = -1, without = -1;
  for (int r = 0; r < P; ++r)
    (names[static_cast<size_t>(r)].empty() ? without : with) = r;
  if (with >= 0 && without >= 0) {
    const Bytes& n = names[static_cast<size_t>(with)];
    throw MismatchError("regions: rank " + std::to_string(with) + " declared region '" +
                        std::string(n.begin(), n.end()) + "' and rank " + std::to_string(without) +
                        " none: declare a region on every rank or on none");
  }
  if (with >= 0) {
    std::vector<int> labels(static_cast<size_t>(P));
    for (int r = 0; r < P; ++r)
      for (int q = 0; q <= r; ++q)
        if (names[static_cast<size_t>(q)] == names[static_cast<size_t>(r)]) {
          labels[static_cast<size_t>(r)] = q;
          break;
        }
    map.region_of_rank = renumber(labels);
    map.declared = true;
    return map;
  }
  const HostTopology topo = host_topology(comm.rank_hosts(), P);
  const size_t H = static_cast<size_t>(topo.host_count());
  std::vector<int> leaders(H);
  for (size_t h = 0; h < H; ++h)
    leaders[h] = topo.hosts[h][0];
  const size_t me = static_cast<size_t>(topo.host_of[static_cast<size_t>(comm.rank())]);
  const bool leader = leaders[me] == comm.rank();
  const uint64_t tag = comm.next_collective_tag();
  std::vector<double> row;
  if (leader && H > 1)
    row = time_leaders(comm, tag, leaders, me, std::max(repeats, 2), long_path_ms);
  const std::vector<Bytes> rows = allgatherv(comm, row.data(), row.size() * sizeof(double));
  map.host_rtt_ms.assign(H, std::vector<double>(H, 0.0));
  if (H > 1) {
    for (size_t h = 0; h < H; ++h) {
      const Bytes& b = rows[static_cast<size_t>(leaders[h])];
      if (b.size() != H * sizeof(double))
        throw CorruptPayload("regions: rank " + std::to_string(leaders[h]) + " sent " +
                             std::to_string(b.size()) + " bytes of round trips, expected " +
                             std::to_string(H * sizeof(double)));
      std::memcpy(map.host_rtt_ms[h].data(), b.data(), b.size());
    }
    for (size_t a = 0; a < H; ++a)  // each pair was timed from one end
      for (size_t b = a + 1; b < H; ++b)
        map.host_rtt_ms[a][b] = map.host_rtt_ms[b][a] =
            std::max(map.host_rtt_ms[a][b], map.host_rtt_ms[b][a]);
  }
  const std::vector<int> host_region = regions_from_rtts(map.host_rtt_ms);
  map.region_of_rank.resize(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r)
    map.region_of_rank[static_cast<size_t>(r)] =
        host_region[static_cast<size_t>(topo.host_of[static_cast<size_t>(r)])];
  map.region_of_rank = renumber(map.region_of_rank);
  return map;
}

}  // namespace gradex::comm
