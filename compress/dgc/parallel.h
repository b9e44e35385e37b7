// Data-parallel helper for the CPU kernels: splits [0, n) into `threads` contiguous, ordered chunks
// (aligned to 64 elements) and runs fn(chunk, begin, end) on each, on the calling thread and the
// process's shared worker pool (base/thread_pool.h; no thread is created per call). The first
// exception (lowest chunk) is rethrown on the caller after every chunk has finished.
#pragma once

#include <cstddef>
#include <functional>

namespace gradex::compress::dgc {

// Threads to use for n elements: 1 below min_elements, else `requested` (0: hardware, at most 8).
int pick_threads(size_t n, int requested, size_t min_elements);

void parallel_chunks(size_t n, int threads,
                     const std::function<void(int chunk, size_t begin, size_t end)>& fn);

// Bounds of chunk c of `threads` over [0, n), as parallel_chunks computes them.
void chunk_bounds(size_t n, int threads, int c, size_t* begin, size_t* end);

}  // namespace gradex::compress::dgc
