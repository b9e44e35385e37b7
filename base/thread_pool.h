// gradex's one persistent worker pool. Threads are created in the constructor only; nothing
// after start-up creates a thread. Two ways to use it:
//   - parallel_for(n, fn): runs fn(0..n-1) on the calling thread and the workers and returns when
//     all have run. The caller takes part (it claims indices like any worker), so a parallel_for
//     called from inside a pool task cannot deadlock: in the worst case the caller runs every
//     index itself. The first exception (lowest index) is rethrown on the caller after all
//     indices have finished.
//   - parallel_for_heaviest_first(weights, fn): the same over tasks of unequal size, the heaviest
//     claimed first (a unit's tensors: the large ones start at once, the small ones fill in).
//   - submit(task): runs task on a worker; the future carries its exception, if any.
// Either kind may run inside the other's tasks (a tensor's own data-parallel split inside a
// unit's spread): a nested parallel_for gets helpers as workers run out of outer work.
// The destructor runs every task already submitted, then joins the workers.
//
// shared_pool() is the process-wide pool the compression kernels and casts use. It is sized once,
// at first use, from GRADEX_THREADS (0: the hardware's threads, at most 8); a forked child gets a
// fresh pool of its own (the parent's workers do not exist in the child).
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <mutex>
#include <numeric>
#include <thread>
#include <type_traits>
#include <vector>

namespace gradex {

class ThreadPool {
 public:
  // `threads`: total parallelism including the caller of parallel_for, so threads - 1 workers
  // are started (threads <= 1: none, everything runs on the caller).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Parallelism a parallel_for can reach: workers + the caller.
  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // fn is called as fn(int index); it is referenced, never copied (no allocation per call).
  template <typename Fn>
  void parallel_for(int n, Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    run_batch(
        n, [](void* f, int i) { (*static_cast<F*>(f))(i); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }
  // fn(i) for i in [0, weight.size()), claimed in order of decreasing weight (ties: lower index
  // first). Every task runs even when another throws; then the exception of the lowest index i
  // (not the first one claimed) is rethrown, so the error reported does not depend on the pool's
  // size or on timing.
  template <typename Fn>
  void parallel_for_heaviest_first(const std::vector<uint64_t>& weight, Fn&& fn) {
    const int n = static_cast<int>(weight.size());
    std::vector<int> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return weight[a] > weight[b]; });
    std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
    parallel_for(n, [&](int position) {
      const int i = order[static_cast<size_t>(position)];
      try {
        fn(i);
      } catch (...) {
        errors[static_cast<size_t>(i)] = std::current_exception();
      }
    });
    for (std::exception_ptr& e : errors)
      if (e) std::rethrow_exception(e);
  }
  std::future<void> submit(std::function<void()> task);

 private:
  struct Batch;
  using Trampoline = void (*)(void* fn, int index);
  void run_batch(int n, Trampoline call, void* fn);
  void worker_loop();
  static void run_indices(Batch& batch);

  std::mutex mutex_;
  std::condition_variable work_cv_;  // workers wait for batches or tasks
  std::condition_variable done_cv_;  // parallel_for callers wait for their helpers
  // parallel_for calls that still want helpers. A vector with reserved room: posting and
  // withdrawing a batch allocates nothing (it grows only past its high-water mark).
  std::vector<Batch*> batches_;
  std::deque<std::packaged_task<void()>> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

// Threads GRADEX_THREADS asks for, resolved: 0 becomes the hardware's threads clamped to [1, 8].
int configured_threads();
// The process-wide pool (see above).
ThreadPool& shared_pool();
// Sizes the shared pool before its first use (an engine whose GRADEX_THREADS came through the API
// calls this; 0: automatic). Returns false when the pool already exists with another size (it is
// not rebuilt: that would create threads after start-up).
bool configure_shared_pool(int threads);

}  // namespace gradex
