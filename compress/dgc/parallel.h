// Data-parallel helper for the CPU kernels: splits [0, n) into `threads` contiguous, ordered chunks
// (aligned to 64 elements) and runs fn(chunk, begin, end) on each, on the calling thread and the
// process's shared worker pool (base/thread_pool.h; no thread is created per call). The first
// exception (lowest chunk) is rethrown on the caller after every chunk has finished.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/thread_pool.h"

namespace gradex::compress::dgc {

// Threads to use for n elements: 1 below min_elements, else `requested` (0: hardware, at most 8),
// at most one per 64Ki elements.
int pick_threads(size_t n, int requested, size_t min_elements);

// Tensors from this many elements up are split across threads (DgcOptions::parallel_min_elements)
// when a unit of about `unit_elements` is spread tensor by tensor over a pool of `threads`
// (sync's prepare stage): a tensor holding more than a 1/(2*threads) share of the unit would
// otherwise finish last on one thread while the others idle. Never below kMinSplitElements, where
// the hand-off costs about as much as it saves.
constexpr size_t kMinSplitElements = size_t{1} << 17;
size_t split_min_elements(int threads, uint64_t unit_elements);

// Bounds of chunk c of `threads` over [0, n), as parallel_chunks computes them.
void chunk_bounds(size_t n, int threads, int c, size_t* begin, size_t* end);

// fn(int chunk, size_t begin, size_t end). A template so that callers' lambdas are referenced,
// never wrapped in a std::function (no allocation per call).
template <typename Fn>
void parallel_chunks(size_t n, int threads, Fn&& fn) {
  if (threads <= 1) {
    fn(0, size_t{0}, n);
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
