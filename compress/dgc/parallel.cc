#include "compress/dgc/parallel.h"

#include <algorithm>
#include <thread>

#include "base/thread_pool.h"

namespace gradex::compress::dgc {

int pick_threads(size_t n, int requested, size_t min_elements) {
  if (n < min_elements || n < 2 * 64) return 1;
  int t = requested;
  if (t <= 0) t = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 8);
  size_t max_useful = std::max<size_t>(1, n / 65536);
  return static_cast<int>(std::min<size_t>(t, max_useful));
}

void chunk_bounds(size_t n, int threads, int c, size_t* begin, size_t* end) {
  size_t per = (n + threads - 1) / threads;
  per = (per + 63) / 64 * 64;
  *begin = std::min(n, per * c);
  *end = std::min(n, per * (c + 1));
}

void parallel_chunks(size_t n, int threads, const std::function<void(int, size_t, size_t)>& fn) {
  if (threads <= 1) {
    fn(0, 0, n);
    return;
  }
  // Chunks are fixed by (n, threads) alone, never by which thread runs them: results that
  // depend on the chunking (per-chunk candidate lists) are the same whatever the pool's size.
  shared_pool().parallel_for(threads, [&](int c) {
    size_t b, e;
    chunk_bounds(n, threads, c, &b, &e);
    fn(c, b, e);
  });
}

}  // namespace gradex::compress::dgc
