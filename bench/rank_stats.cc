#include "bench/rank_stats.h"

#include <chrono>
#include <cstring>
#include <thread>

#include "base/error.h"
#include "comm/collectives.h"

namespace gradex::bench {

std::vector<std::vector<double>> gather_per_rank(comm::Communicator& comm,
                                                 const std::vector<double>& mine) {
  std::vector<comm::Bytes> all = comm::allgatherv(comm, mine.data(), mine.size() * sizeof(double));
  std::vector<std::vector<double>> out;
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].size() != mine.size() * sizeof(double)) {
      throw MismatchError("rank " + std::to_string(r) + " reported " +
                          std::to_string(all[r].size() / sizeof(double)) +
                          " measurements, this rank " + std::to_string(mine.size()));
    }
    std::vector<double> values(mine.size());
    if (!values.empty()) std::memcpy(values.data(), all[r].data(), all[r].size());
    out.push_back(std::move(values));
  }
  return out;
}

std::vector<double> max_over_ranks(comm::Communicator& comm, const std::vector<double>& mine) {
  std::vector<double> out = mine;
  for (const auto& values : gather_per_rank(comm, mine)) {
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = std::max(out[i], values[i]);
  }
  return out;
}

std::vector<double> mean_over_ranks(comm::Communicator& comm, const std::vector<double>& mine) {
  std::vector<double> out(mine.size(), 0.0);
  auto all = gather_per_rank(comm, mine);
  for (const auto& values : all) {
    for (size_t i = 0; i < out.size(); ++i)
      out[i] += values[i] / static_cast<double>(all.size());
  }
  return out;
}

void idle_wait(comm::Communicator& comm, comm::Request& request, const char* operation) {
  auto start = std::chrono::steady_clock::now();
  while (true) {
    comm.progress();
    if (comm.test(request, operation)) return;
    if (std::chrono::steady_clock::now() - start > comm.options().timeout) {
      throw TimeoutError(operation, request.peer(), "no message while idle-waiting");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
}

}  // namespace gradex::bench
