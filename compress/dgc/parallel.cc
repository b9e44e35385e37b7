#include "compress/dgc/parallel.h"

#include <algorithm>
#include <thread>

namespace gradex::compress::dgc {

int pick_threads(size_t n, int requested, size_t min_elements) {
  if (n < min_elements || n < 2 * 64) return 1;
  int t = requested;
  if (t <= 0) t = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 8);
  size_t max_useful = std::max<size_t>(1, n / 65536);
  return static_cast<int>(std::min<size_t>(t, max_useful));
}

size_t split_min_elements(int threads, uint64_t unit_elements) {
  const uint64_t share = unit_elements / (2 * static_cast<uint64_t>(std::max(threads, 1)));
  return static_cast<size_t>(std::max<uint64_t>(kMinSplitElements, share));
}

void chunk_bounds(size_t n, int threads, int c, size_t* begin, size_t* end) {
  size_t per = (n + threads - 1) / threads;
  per = (per + 63) / 64 * 64;
  *begin = std::min(n, per * c);
  *end = std::min(n, per * (c + 1));
}

}  // namespace gradex::compress::dgc
