// What the routes do on the agreed link, for the planner (contract in route.h: link_paths): the
// routes' own rules, so that the planner prices what they send.
#include "sync/route/routes.h"

namespace gradex::sync::route {

uint64_t rider_bytes(const EngineOptions& options, const LinkModel* link,
                     const comm::HostTopology* hosts) {
  if (hosts != nullptr) return 0;
  using Collective = EngineOptions::DenseCollective;
  if (options.collectives.dense == Collective::kGather) return UINT64_MAX;
  if (options.collectives.dense != Collective::kAuto) return 0;
  return link != nullptr && link->latency_bound() ? link->rider_bytes() : 0;
}

LinkPaths link_paths(const LinkModel* link, const EngineOptions& options,
                     const comm::HostTopology* hosts, bool receives_any_length) {
  LinkPaths paths;
  // Across a hierarchy the planner prices flat collectives (the groups are not modelled yet), so
  // it keeps the flat ring's price for the dense buckets there.
  paths.dense_direct_max_bytes =
      hosts == nullptr ? dense_direct_max_bytes(options, link, hosts) : 0;
  paths.quantized_one_hop_max_bytes = quantized_one_hop_max_bytes(link, hosts);
  paths.rider_bytes = rider_bytes(options, link, hosts);
  // The flat gather skips its size round under GRADEX_SPARSE_COLLECTIVE=direct, and under auto on
  // a latency-bound link from a unit's second gather on (SparseGather::gather), as it does at
  // every step that is planned (the first is the probe's).
  using Sparse = EngineOptions::SparseCollective;
  const bool by_model =
      options.collectives.sparse == Sparse::kAuto && link != nullptr && link->latency_bound();
  paths.sparse_unsized = hosts == nullptr && receives_any_length &&
                         (options.collectives.sparse == Sparse::kDirect || by_model);
  return paths;
}

}  // namespace gradex::sync::route
