// What the engine tells the user about its counters as training runs, called once per completed
// step (Engine::end_step), so every plugin gets it:
//  - GRADEX_STATS_EVERY = N > 0: every N steps rank 0 writes one line with the last N steps'
//    compression ratio, MB sent, exchange milliseconds and saturated / non-finite counts;
//  - the first time values saturate in a 16-bit cast or a NaN/Inf is seen, a one-time warning
//    (per engine) naming the tensor and what to do about it.
#pragma once

#include <cstdint>
#include <string>

#include "base/config.h"
#include "sync/engine/stats.h"

namespace gradex::sync {

class StatsReporter {
 public:
  // `total`: the engine's cumulative counters after the step; `rank`: this rank.
  void after_step(const config::Config& config, int rank, const Stats& total);

  // The periodic line for a window of `steps` steps (exposed for tests).
  static std::string window_line(const Stats& window, uint64_t first_step, uint64_t last_step);

 private:
  Stats at_last_report_;
  bool warned_saturated_ = false;
  bool warned_nonfinite_ = false;
};

}  // namespace gradex::sync
