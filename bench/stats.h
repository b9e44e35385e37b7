// Small statistics and clocks shared by the benchmark commands.
#pragma once

#include <vector>

namespace gradex::bench {

// Median (mean of the two middle values for an even count), mean, minimum and maximum of a
// non-empty sample; InvalidArgument for an empty one.
double median(std::vector<double> values);
double mean(const std::vector<double>& values);
double minimum(const std::vector<double>& values);
double maximum(const std::vector<double>& values);

// Monotonic wall-clock seconds, and CPU seconds consumed by this process (all its threads,
// including any progress threads of the transport).
double wall_seconds();
double process_cpu_seconds();

}  // namespace gradex::bench
