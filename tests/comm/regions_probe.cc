// gradex-regions-probe: one rank of a job (launcher variables as torchrun sets them, GRADEX_*
// settings from the environment) that connects, discovers the regions from measured round trips
// (comm/topology/regions.h) and prints them on rank 0:
//   stripes <connections per peer>
//   regions: <region of rank 0> <region of rank 1> ...
//   rtt_ms: <host a> <host b> <round trip>     (one line per pair of hosts)
// The emulated WAN's end-to-end test (tests/bench/wan_test.py) runs it across regions.
#include <cstdio>
#include <exception>

#include "base/config.h"
#include "comm/communicator.h"
#include "comm/rendezvous/launch.h"
#include "comm/topology/regions.h"

int main() {
  using namespace gradex::comm;
  try {
    const LaunchInfo info = require_launch_info_from_environment();
    const CommOptions options = comm_options_from_config(gradex::config::Config::from_environment());
    auto comm = create_ucx_communicator(connect_tcp_store(info, options), info.rank,
                                        info.world_size, options);
    const RegionMap map = discover_regions(*comm, "");
    if (info.rank == 0) {
      std::printf("stripes %d\nregions:", comm->connections_per_peer());
      for (int r : map.region_of_rank)
        std::printf(" %d", r);
      std::printf("\n");
      for (size_t a = 0; a < map.host_rtt_ms.size(); ++a)
        for (size_t b = a + 1; b < map.host_rtt_ms.size(); ++b)
          std::printf("rtt_ms: %zu %zu %.3f\n", a, b, map.host_rtt_ms[a][b]);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gradex-regions-probe: %s\n", e.what());
    return 1;
  }
}
