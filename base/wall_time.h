// Elapsed wall time on the steady clock, for measurements that feed timeouts, statistics and the
// cost model (which must not jump with the system clock).
#pragma once

#include <chrono>

namespace gradex {

// Seconds from `start` to now.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Whole milliseconds from now to `deadline` (rounded down), 0 once it has passed: what is left of a
// timeout for a call that takes milliseconds.
inline std::chrono::milliseconds millis_until(std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return left.count() > 0 ? left : std::chrono::milliseconds(0);
}

}  // namespace gradex
