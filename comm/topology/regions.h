// Regions: groups of hosts whose mutual round trips cluster together (the hosts of one cloud region
// are a LAN apart, regions a WAN apart). Discovered from measured round trips between hosts, or
// declared per rank; every rank gets the same answer. This is what a region-hierarchical exchange
// takes as its upper tier (reduce inside a region over its fast links, across regions over the
// slow ones).
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.h"

namespace gradex::comm {

// Two round trips belong to different tiers when the larger is at least this many times the
// smaller (a LAN's 0.1-1 ms against a WAN's 20-300 ms; jitter inside a tier stays well below it).
constexpr double kRegionGapRatio = 4.0;
// ... and the larger is at least this many ms: below it both ends are a LAN's (or one host's
// loopback), whatever their ratio; a loaded host's loopback round trips of 20-200 us differ 4x
// from one sample to the next, and a tier split on that is noise (a phantom region tier).
constexpr double kRegionMinFarRoundTripMs = 2.0;

// A round trip of at least this many ms is a long path's, where each round trip of the start-up
// costs that much: a pair of hosts whose first round trip takes it is timed once more only
// (discover_regions), and so is the stripes' round trip (ucx_stripes.cc).
constexpr double kLongPathRoundTripMs = 20.0;

// Whether round trips of `below_ms` (> 0) and `above_ms` (>= below_ms) lie in different tiers: the
// rule of both regions_from_rtts and the link probe's choice of a region peer.
inline bool region_gap(double below_ms, double above_ms) {
  return above_ms / below_ms >= kRegionGapRatio && above_ms >= kRegionMinFarRoundTripMs;
}

// The regions of `n` hosts from their round trips in ms (`rtt_ms[a][b]`, symmetric in meaning;
// the larger of [a][b] and [b][a] is used, the diagonal ignored). The round trips are sorted and
// cut at the largest ratio between consecutive values if that ratio is at least kRegionGapRatio
// (and the value above the cut at least kRegionMinFarRoundTripMs);
// hosts joined by a chain of round trips below the cut share a region. No such gap: one region.
// Regions are numbered in the order of their first host (host 0 is in region 0).
std::vector<int> regions_from_rtts(const std::vector<std::vector<double>>& rtt_ms);

struct RegionMap {
  std::vector<int> region_of_rank;  // rank -> region, numbered in the order of its lowest rank
  // Round trips in ms between hosts (HostTopology order, symmetric); empty when declared.
  std::vector<std::vector<double>> host_rtt_ms;
  bool declared = false;  // from `declared_region`, not measured
};

// Collective. With `declared_region` non-empty on every rank, ranks that declared the same name
// share a region (MismatchError naming a rank when some ranks declared one and others did not).
// Otherwise the lowest rank of every host (Communicator::rank_hosts) times `repeats` round trips
// with every other host's lowest rank (pairs in the rounds of a tournament: H - 1 rounds of
// `repeats` round trips; on a pair whose first took `long_path_ms` or more, one more, timed by the
// other end without a reply: 1.5 round trips a round; the fastest after the first kept), the rows
// are gathered, and regions_from_rtts groups the hosts; a host's ranks share its region.
RegionMap discover_regions(Communicator& comm, const std::string& declared_region, int repeats = 4,
                           double long_path_ms = kLongPathRoundTripMs);

}  // namespace gradex::comm
