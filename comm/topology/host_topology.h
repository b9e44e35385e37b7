// Which ranks share a host, in the form the hierarchical collectives use (comm/hierarchical.h).
#pragma once

#include <string>
#include <vector>

namespace gradex::comm {

// Hosts are ordered by their lowest rank; a host's ranks ascend. Built from the host identities
// every rank published (Communicator::rank_hosts()), so it is the same on every rank.
struct HostTopology {
  std::vector<std::vector<int>> hosts;  // hosts[h][i]: the rank of local index i on host h
  std::vector<int> host_of;             // rank -> h
  std::vector<int> local_index;         // rank -> i

  int host_count() const { return static_cast<int>(hosts.size()); }
  int world_size() const { return static_cast<int>(host_of.size()); }
  // The largest number of ranks on one host.
  int max_local() const;
  // Ranks in host order (host 0's ranks, then host 1's, ...): the order of every ring of the
  // hierarchical exchange.
  std::vector<int> ranks_by_host() const;
};

// `rank_hosts[r]` is rank r's host identity; an empty vector means one host per rank of `world`.
HostTopology host_topology(const std::vector<std::string>& rank_hosts, int world);

// GRADEX_HIERARCHICAL's auto rule: at least two hosts and some host holds at least two ranks (one
// host alone, or one rank per host, has nothing to gain).
bool hierarchy_pays(const HostTopology& topology);

}  // namespace gradex::comm
