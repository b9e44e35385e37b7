#include "comm/topology/host_topology.h"

#include <algorithm>
#include <map>

#include "base/check.h"

namespace gradex::comm {

int HostTopology::max_local() const {
  size_t m = 0;
  for (const auto& h : hosts)
    m = std::max(m, h.size());
  return static_cast<int>(m);
}

std::vector<int> HostTopology::ranks_by_host() const {
  std::vector<int> order;
  order.reserve(host_of.size());
  for (const auto& h : hosts)
    order.insert(order.end(), h.begin(), h.end());
  return order;
}

HostTopology host_topology(const std::vector<std::string>& rank_hosts, int world) {
  GX_CHECK(world >= 1);
  GX_CHECK(rank_hosts.empty() || static_cast<int>(rank_hosts.size()) == world);
  HostTopology t;
  t.host_of.assign(static_cast<size_t>(world), 0);
  t.local_index.assign(static_cast<size_t>(world), 0);
  std::map<std::string, int> index;  // host identity -> h, in order of first (lowest) rank
  for (int r = 0; r < world; ++r) {
    const std::string id =
        rank_hosts.empty() ? std::to_string(r) : rank_hosts[static_cast<size_t>(r)];
    auto it = index.find(id);
    if (it == index.end()) {
      it = index.emplace(id, t.host_count()).first;
      t.hosts.emplace_back();
    }
    const int h = it->second;
    t.host_of[static_cast<size_t>(r)] = h;
    t.local_index[static_cast<size_t>(r)] =
        static_cast<int>(t.hosts[static_cast<size_t>(h)].size());
    t.hosts[static_cast<size_t>(h)].push_back(r);
  }
  return t;
}

bool hierarchy_pays(const HostTopology& topology) {
  return topology.host_count() >= 2 && topology.max_local() >= 2;
}

}  // namespace gradex::comm
