// The hierarchical exchange's layout: which ranks reduce together over their fast links before the
// slow tier (comm/hierarchical.h takes it as a HostTopology whose "hosts" are these groups).
//   GRADEX_HIERARCHICAL=0          none: the flat exchange over all ranks.
//   GRADEX_HIERARCHY_TIER=host     the machines (GRADEX_HOST_ID): shared memory inside, network
//                                  across.
//   GRADEX_HIERARCHY_TIER=region   regions (comm/topology/regions.h): hosts whose round trips
//                                  cluster, or as GRADEX_REGION declares; a LAN inside, the WAN
//                                  across, so one payload per region and lane crosses the WAN.
//   auto                           regions when declared, or when measured on a job of 3 hosts or
//                                  more, at least kWanRttMs apart, some region holding 2 hosts or
//                                  more (otherwise there is nothing to reduce inside a region), and
//                                  every region as many ranks as the others (an uneven layout runs
//                                  a small region's missing lanes one after another); else hosts.
// Either layout is used when it pays (comm::hierarchy_pays: two groups or more, one with two ranks
// or more) or GRADEX_HIERARCHICAL=1. Collective: every rank of `comm` calls it at the same point
// (the engine, right after the start-up agreement), and every rank gets the same layout.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/config.h"
#include "comm/communicator.h"
#include "comm/topology/host_topology.h"
#include "sync/engine/options.h"

namespace gradex::sync {

// Regions whose nearest hosts are closer than this are not a WAN apart (racks, zones of one
// cloud region): auto keeps hosts as the tier there.
constexpr double kWanRttMs = 5.0;

struct ExchangeLayout {
  std::unique_ptr<comm::HostTopology> groups;  // null: the flat exchange
  std::string description;                     // for the log (Engine::layout_description)
  // Where the regions were measured: rank 0's round trip (seconds) to the lowest rank of each
  // other host, the same on every rank (the link probe chooses its peers from it). Else empty.
  std::vector<std::pair<int, double>> rank0_round_trips_s;
};

ExchangeLayout exchange_layout(comm::Communicator& comm, const config::Config& config,
                               const EngineOptions& options);

// The topology whose groups are `region_of_rank`'s regions (ranks ascending inside each).
comm::HostTopology region_topology(const std::vector<int>& region_of_rank);

// The smallest round trip between hosts of different regions, in ms (infinity for one region).
double nearest_region_rtt_ms(const std::vector<std::vector<double>>& host_rtt_ms,
                             const comm::HostTopology& hosts,
                             const std::vector<int>& region_of_rank);

}  // namespace gradex::sync
