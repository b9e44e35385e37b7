#include "base/thread_pool.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "base/config.h"

namespace gradex {

// One parallel_for call. Lives on the caller's stack: the caller does not return before every
// helper that started has finished, and it removes the helpers that never started from the queue.
struct ThreadPool::Batch {
  Trampoline call = nullptr;
  void* fn = nullptr;
  int n = 0;
  std::atomic<int> next{0};
  // Guarded by the pool's mutex: helpers still wanted (the batch is in batches_ while > 0), and
  // helpers running it now. The caller returns once it has withdrawn the batch and running is 0.
  int wanted = 0;
  int running = 0;
  std::mutex error_mutex;
  std::exception_ptr error;
  int error_index = -1;
};

ThreadPool::ThreadPool(int threads) {
  const int workers = std::max(0, threads - 1);
  batches_.reserve(64);
  workers_.reserve(static_cast<size_t>(workers));
  for (int i = 0; i < workers; ++i)
    workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (auto& w : workers_)
    w.join();
}

void ThreadPool::run_indices(Batch& batch) {
  for (int i = batch.next.fetch_add(1); i < batch.n; i = batch.next.fetch_add(1)) {
    try {
      batch.call(batch.fn, i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(batch.error_mutex);
      if (!batch.error || i < batch.error_index) {
        batch.error = std::current_exception();
        batch.error_index = i;
      }
    }
  }
}

void ThreadPool::worker_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [this] { return stopping_ || !batches_.empty() || !tasks_.empty(); });
    if (!batches_.empty()) {  // data-parallel work first: a caller is waiting on it
      Batch* batch = batches_.front();
      if (--batch->wanted == 0) batches_.erase(batches_.begin());
      ++batch->running;
      lock.unlock();
      run_indices(*batch);
      lock.lock();
      // The caller may return as soon as running reaches 0: touch the batch no more after this.
      if (--batch->running == 0) done_cv_.notify_all();
      continue;
    }
    if (tasks_.empty()) return;  // stopping, and every submitted task has run
    std::packaged_task<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task();  // a packaged_task stores its exception in the future
    lock.lock();
  }
}

void ThreadPool::run_batch(int n, Trampoline call, void* fn) {
  if (n <= 0) return;
  Batch batch;
  batch.call = call;
  batch.fn = fn;
  batch.n = n;
  const int helpers = std::min(n - 1, static_cast<int>(workers_.size()));
  if (helpers > 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    batch.wanted = helpers;
    batches_.push_back(&batch);
  }
  if (helpers == 1)
    work_cv_.notify_one();
  else if (helpers > 1)
    work_cv_.notify_all();
  run_indices(batch);
  if (helpers > 0) {
    std::unique_lock<std::mutex> lock(mutex_);
    // Every index is claimed: helpers that have not started would find nothing; withdraw them.
    if (batch.wanted > 0) {
      batches_.erase(std::find(batches_.begin(), batches_.end(), &batch));
      batch.wanted = 0;
    }
    done_cv_.wait(lock, [&] { return batch.running == 0; });
  }
  if (batch.error) std::rethrow_exception(batch.error);
}

std::future<void> ThreadPool::submit(std::function<void()> task) {
  std::packaged_task<void()> packaged(std::move(task));
  std::future<void> future = packaged.get_future();
  if (workers_.empty()) {  // no workers: run it here, the future still carries the outcome
    packaged();
    return future;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(std::move(packaged));
  }
  work_cv_.notify_one();
  return future;
}

namespace {
int resolve(int64_t requested) {
  if (requested > 0) return static_cast<int>(requested);
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 8);
}

// The shared pool's state. The pool belongs to the process that created it. A forked child (test
// harnesses, Python multiprocessing) inherits the object but not its workers, so it builds its
// own; the parent's copy is left untouched in the child (its mutex may have been held at fork
// time). Pools are never destroyed: workers must outlive every static that tasks may use.
std::mutex g_mutex;
ThreadPool* g_pool = nullptr;
pid_t g_owner = 0;
int g_requested = -1;  // from configure_shared_pool; -1: GRADEX_THREADS from the environment
}  // namespace

int configured_threads() {
  // Only GRADEX_THREADS is read, strictly (an invalid value is a ConfigError naming it); other
  // variables are the engine's business.
  config::Config config;
  if (const char* text = std::getenv("GRADEX_THREADS"))
    config.set("GRADEX_THREADS", text, config::Source::kEnvironment);
  return resolve(config.get_int("GRADEX_THREADS"));
}

ThreadPool& shared_pool() {
  std::lock_guard<std::mutex> lock(g_mutex);
  const pid_t self = getpid();
  if (g_pool == nullptr || g_owner != self) {
    g_pool = new ThreadPool(g_requested >= 0 ? resolve(g_requested) : configured_threads());
    g_owner = self;
  }
  return *g_pool;
}

bool configure_shared_pool(int threads) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_pool != nullptr && g_owner == getpid()) return g_pool->threads() == resolve(threads);
  g_requested = std::max(0, threads);
  return true;
}

}  // namespace gradex
