// The worker pool: every index runs exactly once, results do not depend on the pool's size,
// exceptions reach the caller (lowest index first), nested parallel_for cannot deadlock, submitted
// tasks run (and report their exceptions) before shutdown completes, and no thread is created
// per call.
#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <dirent.h>
#include <atomic>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

// Counts every heap allocation of the process while g_counting is set (any thread). The replacement
// operators pair malloc with free themselves; GCC, seeing both inlined, takes the pair for
// operator new with free (-Wmismatched-new-delete).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_allocations{0};
}  // namespace

void* operator new(std::size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}

namespace gradex {
namespace {

int thread_count() {  // threads of this process, from /proc
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d))
      n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

TEST(ThreadPool, EveryIndexRunsExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.threads(), std::max(threads, 1));
    for (int n : {0, 1, 2, 7, 64, 5000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_for(n, [&](int i) { hits[static_cast<size_t>(i)].fetch_add(1); });
      for (int i = 0; i < n; ++i)
        ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "threads " << threads << " n " << n;
    }
  }
}

TEST(ThreadPool, UsesSeveralThreads) {
  ThreadPool pool(4);
  std::mutex m;
  std::set<std::thread::id> seen;
  std::atomic<int> arrived{0};
  // Each index waits (bounded) until all four have started: only possible on four threads.
  pool.parallel_for(4, [&](int) {
    {
      std::lock_guard<std::mutex> lock(m);
      seen.insert(std::this_thread::get_id());
    }
    arrived.fetch_add(1);
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (arrived.load() < 4 && std::chrono::steady_clock::now() < until)
      std::this_thread::yield();
  });
  EXPECT_EQ(seen.size(), 4u);
}

TEST(ThreadPool, FirstExceptionByIndexReachesTheCallerAfterAllIndicesRan) {
  ThreadPool pool(4);
  std::atomic<int> ran{0};
  try {
    pool.parallel_for(100, [&](int i) {
      ran.fetch_add(1);
      if (i == 37 || i == 80) throw std::runtime_error("index " + std::to_string(i));
    });
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "index 37");
  }
  EXPECT_EQ(ran.load(), 100);
  // The pool is still usable afterwards.
  std::atomic<int> sum{0};
  pool.parallel_for(10, [&](int i) { sum.fetch_add(i); });
  EXPECT_EQ(sum.load(), 45);
}

TEST(ThreadPool, NestedParallelForFromEveryWorkerCompletes) {
  ThreadPool pool(3);
  std::atomic<long> total{0};
  pool.parallel_for(
      12, [&](int i) { pool.parallel_for(50, [&](int j) { total.fetch_add(i * 1000 + j); }); });
  long want = 0;
  for (int i = 0; i < 12; ++i)
    for (int j = 0; j < 50; ++j)
      want += i * 1000 + j;
  EXPECT_EQ(total.load(), want);
}

// A unit's tensors spread over the pool: claimed heaviest first (visible on a pool without workers,
// where the caller claims them one by one), every task once on a wide pool too, and the exception
// of the lowest index (not of the first one claimed) reported after every task ran, also when the
// tasks themselves split their work with a nested parallel_for.
TEST(ThreadPool, HeaviestFirstClaimsByWeightAndReportsTheLowestIndexError) {
  const std::vector<uint64_t> weight = {5, 100, 0, 100, 7, 1};
  ThreadPool serial(1);
  std::vector<int> order;
  serial.parallel_for_heaviest_first(weight, [&](int i) { order.push_back(i); });
  EXPECT_EQ(order, (std::vector<int>{1, 3, 4, 0, 5, 2}));

  for (int threads : {1, 2, 4, 7}) {
    ThreadPool pool(threads);
    std::vector<uint64_t> w(40);
    for (size_t i = 0; i < w.size(); ++i)
      w[i] = (i * 7919) % 13;
    std::vector<std::atomic<int>> runs(w.size());
    std::atomic<long> nested{0};
    try {
      pool.parallel_for_heaviest_first(w, [&](int i) {
        runs[static_cast<size_t>(i)].fetch_add(1);
        pool.parallel_for(9, [&](int j) { nested.fetch_add(j); });
        // Index 6 (weight 12) is claimed before index 2 (weight 4); 2 is the one reported.
        if (i == 2 || i == 6) throw std::runtime_error("task " + std::to_string(i));
      });
      FAIL() << "no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "task 2") << threads;
    }
    for (size_t i = 0; i < w.size(); ++i)
      ASSERT_EQ(runs[i].load(), 1) << threads << " " << i;
    EXPECT_EQ(nested.load(), 36L * static_cast<long>(w.size())) << threads;
  }
}

TEST(ThreadPool, ParallelForInsideSubmittedTasks) {
  ThreadPool pool(2);  // one worker: the submitted tasks occupy it, callers do the work
  std::vector<std::future<void>> futures;
  std::atomic<int> total{0};
  for (int t = 0; t < 4; ++t)
    futures.push_back(pool.submit([&] { pool.parallel_for(8, [&](int) { total.fetch_add(1); }); }));
  for (auto& f : futures)
    f.get();
  EXPECT_EQ(total.load(), 32);
}

TEST(ThreadPool, SubmittedExceptionTravelsInTheFuture) {
  ThreadPool pool(2);
  auto ok = pool.submit([] {});
  auto bad = pool.submit([] { throw std::invalid_argument("bad task"); });
  ok.get();
  EXPECT_THROW(bad.get(), std::invalid_argument);
  ThreadPool inline_pool(1);  // no workers: runs on the caller, same contract
  auto inline_bad = inline_pool.submit([] { throw std::invalid_argument("inline"); });
  EXPECT_THROW(inline_bad.get(), std::invalid_argument);
}

TEST(ThreadPool, ShutdownRunsEverySubmittedTask) {
  std::atomic<int> ran{0};
  {
    ThreadPool pool(3);
    for (int i = 0; i < 200; ++i)
      pool.submit([&] {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        ran.fetch_add(1);
      });
  }  // the destructor drains the queue, then joins
  EXPECT_EQ(ran.load(), 200);
}

TEST(ThreadPool, NoThreadIsCreatedPerCall) {
  ThreadPool pool(4);
  const int before = thread_count();
  std::atomic<int> sum{0};
  for (int k = 0; k < 200; ++k)
    pool.parallel_for(16, [&](int i) { sum.fetch_add(i); });
  EXPECT_EQ(sum.load(), 200 * 120);
  EXPECT_EQ(thread_count(), before);
}

TEST(ThreadPool, ParallelForAllocatesNothing) {
  ThreadPool pool(4);
  std::atomic<long> sum{0};
  auto body = [&](int i) { sum.fetch_add(i, std::memory_order_relaxed); };
  for (int k = 0; k < 10; ++k)  // warm-up
    pool.parallel_for(16, body);
  g_allocations = 0;
  g_counting = true;
  for (int k = 0; k < 500; ++k)
    pool.parallel_for(16, body);
  g_counting = false;
  EXPECT_EQ(g_allocations.load(), 0);
  EXPECT_EQ(sum.load(), 510 * 120);
}

TEST(ThreadPool, SharedPoolIsSizedOnceAndReused) {
  ThreadPool& a = shared_pool();
  ThreadPool& b = shared_pool();
  EXPECT_EQ(&a, &b);
  EXPECT_GE(a.threads(), 1);
  // Already built: another size is refused rather than rebuilt; its own size is accepted.
  EXPECT_TRUE(configure_shared_pool(a.threads()));
  EXPECT_FALSE(configure_shared_pool(a.threads() + 1));
}

}  // namespace
}  // namespace gradex
