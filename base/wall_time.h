// Elapsed wall time on the steady clock, for measurements that feed timeouts, statistics and the
// cost model (which must not jump with the system clock).
#pragma once

#include <chrono>

namespace gradex {

// Seconds from `start` to now.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace gradex
