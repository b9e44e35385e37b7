#include "bench/stats.h"

#include <time.h>

#include <algorithm>
#include <numeric>

#include "base/error.h"

namespace gradex::bench {

namespace {

void require_values(const std::vector<double>& values, const char* what) {
  if (values.empty()) throw InvalidArgument(std::string(what) + " of an empty sample");
}

double seconds_of(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

double median(std::vector<double> values) {
  require_values(values, "median");
  size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  double upper = values[mid];
  if (values.size() % 2 == 1) return upper;
  double lower = *std::max_element(values.begin(), values.begin() + mid);
  return 0.5 * (lower + upper);
}

double mean(const std::vector<double>& values) {
  require_values(values, "mean");
  return std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
}

double minimum(const std::vector<double>& values) {
  require_values(values, "minimum");
  return *std::min_element(values.begin(), values.end());
}

double maximum(const std::vector<double>& values) {
  require_values(values, "maximum");
  return *std::max_element(values.begin(), values.end());
}

double wall_seconds() {
  return seconds_of(CLOCK_MONOTONIC);
}

double process_cpu_seconds() {
  return seconds_of(CLOCK_PROCESS_CPUTIME_ID);
}

}  // namespace gradex::bench
