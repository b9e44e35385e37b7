// The calling thread's CPU clock, for measurements that must not depend on other programs' load:
// on a shared machine wall time includes the time this thread waited for a core, CPU time does not.
#pragma once

#include <time.h>

namespace gradex {

// Seconds of CPU this thread has used (CLOCK_THREAD_CPUTIME_ID); differences of two calls on the
// same thread time the work between them.
inline double thread_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

}  // namespace gradex
