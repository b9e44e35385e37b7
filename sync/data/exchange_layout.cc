#include "sync/data/exchange_layout.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "base/log.h"
#include "comm/topology/regions.h"

namespace gradex::sync {

comm::HostTopology region_topology(const std::vector<int>& region_of_rank) {
  std::vector<std::string> labels;
  labels.reserve(region_of_rank.size());
  for (int region : region_of_rank)
    labels.push_back("region " + std::to_string(region));
  return comm::host_topology(labels, static_cast<int>(region_of_rank.size()));
}

double nearest_region_rtt_ms(const std::vector<std::vector<double>>& host_rtt_ms,
                             const comm::HostTopology& hosts,
                             const std::vector<int>& region_of_rank) {
  double nearest = std::numeric_limits<double>::infinity();
  const size_t H = static_cast<size_t>(hosts.host_count());
  if (host_rtt_ms.size() != H) return nearest;
  auto region_of_host = [&](size_t h) {
    return region_of_rank[static_cast<size_t>(hosts.hosts[h][0])];
  };
  for (size_t a = 0; a < H; ++a)
    for (size_t b = a + 1; b < H; ++b)
      if (region_of_host(a) != region_of_host(b))
        nearest = std::min(nearest, std::max(host_rtt_ms[a][b], host_rtt_ms[b][a]));
  return nearest;
}

namespace {

// Every region holds as many ranks as every other. The hierarchical collectives run one
// cross-group collective per local index, and a group smaller than the largest runs the missing
// indices' collectives on its own ranks one after another: with a region of one host beside one of
// two (hosts in regions 0, 0, 1, 2 at 20-150 ms), DGC steps ran at 0.65x the flat exchange's rate.
bool groups_even(const comm::HostTopology& groups) {
  for (const auto& g : groups.hosts)
    if (g.size() != groups.hosts[0].size()) return false;
  return true;
}

std::string describe(const std::vector<int>& region_of_rank) {
  std::string s;
  for (int r : region_of_rank)
    s += (s.empty() ? "" : " ") + std::to_string(r);
  return s;
}

}  // namespace

ExchangeLayout exchange_layout(comm::Communicator& comm, const config::Config& config,
                               const EngineOptions& options) {
  ExchangeLayout layout;
  if (options.collectives.hierarchical == EngineOptions::Hierarchical::kOff) {
    layout.description = "flat (GRADEX_HIERARCHICAL=0)";
    return layout;
  }
  const int P = comm.size();
  comm::HostTopology groups = comm::host_topology(comm.rank_hosts(), P);
  const int host_count = groups.host_count();
  layout.description = std::to_string(host_count) + " host(s) as groups";
  const std::string& tier = config.get_string("GRADEX_HIERARCHY_TIER");
  const std::string& declared = config.get_string("GRADEX_REGION");
  // Whether regions are looked for: the same on every rank (the tier is agreed, the host count
  // is from the identities every rank published; a partial declaration fails in
  // discover_regions on every rank).
  const bool look = tier == "region" || (tier == "auto" && (host_count >= 3 || !declared.empty()));
  if (look && P > 1) {
    const comm::RegionMap map = comm::discover_regions(comm, declared);
    for (size_t h = 1; h < map.host_rtt_ms.size(); ++h)
      layout.rank0_round_trips_s.emplace_back(groups.hosts[h][0], map.host_rtt_ms[0][h] / 1e3);
    comm::HostTopology by_region = region_topology(map.region_of_rank);
    // A region is a union of hosts, so fewer regions than hosts means some region holds two hosts
    // or more: reducing inside regions then saves WAN bytes (one host each is the host layout).
    const int regions = by_region.host_count();
    const bool pays = regions >= 2 && regions < host_count;
    const double nearest = nearest_region_rtt_ms(map.host_rtt_ms, groups, map.region_of_rank);
    const bool wan = map.declared || nearest >= kWanRttMs;
    if (pays && (tier == "region" || (wan && groups_even(by_region)))) {
      char rtt[64] = "";
      if (!map.declared) std::snprintf(rtt, sizeof rtt, ", nearest %.1f ms apart", nearest);
      layout.description = std::string("regions (") + (map.declared ? "declared" : "measured") +
                           rtt + "): rank -> region " + describe(map.region_of_rank);
      groups = std::move(by_region);
    } else if (pays && wan) {
      // A warning when the user declared the regions (they are not used), else information.
      const std::string message = "GRADEX_HIERARCHY_TIER=auto: the regions (rank -> region " +
                                  describe(map.region_of_rank) +
                                  ") hold unequal numbers of ranks; the hosts are the tier "
                                  "(GRADEX_HIERARCHY_TIER=region uses the regions all the same)";
      if (map.declared)
        GX_LOG(kWarn) << message;
      else
        GX_LOG(kInfo) << message;
    } else if (tier == "region") {
      GX_LOG(kWarn) << "GRADEX_HIERARCHY_TIER=region: the job's hosts form " << regions
                    << " region(s) with no region of two hosts or more (rank -> region "
                    << describe(map.region_of_rank) << "): the hosts are the tier";
    }
  }
  if (options.collectives.hierarchical == EngineOptions::Hierarchical::kOn ||
      comm::hierarchy_pays(groups)) {
    layout.groups = std::make_unique<comm::HostTopology>(std::move(groups));
    layout.description = "hierarchical over " + layout.description;
  } else {
    layout.description = "flat (" + layout.description + ": nothing to reduce inside a group)";
  }
  return layout;
}

}  // namespace gradex::sync
