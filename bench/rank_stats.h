// Combining per-rank measurements, and waiting without stealing a core (comm-dependent helpers of
// the benchmark commands).
#pragma once

#include <vector>

#include "comm/communicator.h"

namespace gradex::bench {

// Every rank passes a vector of the same length; every rank gets all of them, indexed by rank.
std::vector<std::vector<double>> gather_per_rank(comm::Communicator& comm,
                                                 const std::vector<double>& mine);

// Per position: the maximum (a step takes as long as its slowest rank) / the mean over ranks.
std::vector<double> max_over_ranks(comm::Communicator& comm, const std::vector<double>& mine);
std::vector<double> mean_over_ranks(comm::Communicator& comm, const std::vector<double>& mine);

// Waits for one request while sleeping between progress calls, so that a rank with nothing to do
// does not compete for a core with the ranks being measured. Bounded by the communicator's timeout
// (TimeoutError naming `operation`).
void idle_wait(comm::Communicator& comm, comm::Request& request, const char* operation);

}  // namespace gradex::bench
