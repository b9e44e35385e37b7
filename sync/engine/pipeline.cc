#include "sync/engine/pipeline.h"

#include <algorithm>
#include <chrono>
#include <exception>

#include "base/thread_pool.h"
#include "sync/route/route.h"

namespace gradex::sync::pipeline {

uint64_t Unit::elements() const {
  uint64_t n = 0;
  for (const Job* j : jobs)
    n += j->tensor->numel;
  return n;
}

std::string Unit::keys() const {
  std::string s;
  for (size_t i = 0; i < jobs.size() && i < 8; ++i)
    s += (s.empty() ? "'" : ", '") + jobs[i]->id.key + "'";
  if (jobs.size() > 8) s += ", ...";
  return s;
}

std::deque<Unit> plan(std::vector<Job>& jobs, const PlanOptions& options) {
  return route::pack(jobs, options);
}

int lookahead_for(int threads) {
  return 1 + std::max(threads, 0) / 8;
}

void run(std::deque<Unit>& units, const Stages& stages, ThreadPool& pool, int lookahead) {
  const size_t n = units.size();
  // A pool without workers would run a "background" prepare at once, on this thread: no overlap
  // to win, so units are simply prepared in order.
  const size_t ahead = pool.threads() > 1 ? static_cast<size_t>(std::max(lookahead, 0)) : 0;
  size_t launched = 0;  // units [0, launched) have their prepare stage handed out
  // The failure of the earliest unit is the cause: later ones (e.g. a peer that stopped answering
  // after it failed on the same unit) are consequences.
  std::exception_ptr error;
  size_t error_unit = n;
  auto fail = [&](size_t unit, std::exception_ptr e) {
    if (unit < error_unit) {
      error = std::move(e);
      error_unit = unit;
    }
  };
  // Finish stages that ended on the pool with an exception stop the walk before the next
  // transfer: this rank would only go on to wait for peers that stopped on the same unit.
  auto harvest = [&](size_t upto) {
    for (size_t j = 0; j < upto; ++j) {
      std::future<void>& f = units[j].finished;
      if (!f.valid() || f.wait_for(std::chrono::seconds(0)) != std::future_status::ready) continue;
      try {
        f.get();
      } catch (...) {
        fail(j, std::current_exception());
      }
    }
  };
  for (size_t i = 0; i < n && error_unit == n; ++i) {
    Unit& u = units[i];
    try {
      const bool here = launched <= i;  // not handed to the pool: it runs on this thread
      if (here) launched = i + 1;
      for (; launched < std::min(n, i + 1 + ahead); ++launched) {
        Unit& next = units[launched];
        next.prepared = pool.submit([&next, &stages] {
          if (!next.prepare_claimed.exchange(true)) stages.prepare(next);
        });
      }
      // A prepare no worker has started yet runs here: waiting for a queue would only idle.
      if (here || !u.prepare_claimed.exchange(true))
        stages.prepare(u);
      else
        u.prepared.get();  // rethrows the stage's exception
      harvest(i);
      if (error_unit < n) break;
      stages.transfer(u);
      // Decode on the pool only when the next unit is ready to go on the wire: otherwise this
      // thread would wait for it anyway, and decoding here saves the hand-off.
      const bool next_ready =
          i + 1 < n && units[i + 1].prepared.valid() &&
          units[i + 1].prepared.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
      if (u.finish_on_pool && next_ready) {
        u.finished = pool.submit([&u, &stages] {
          if (!u.finish_claimed.exchange(true)) stages.finish(u);
        });
      } else {
        u.finish_claimed = true;
        stages.finish(u);
      }
    } catch (...) {
      fail(i, std::current_exception());
    }
  }
  // Drain: no task may outlive this call (they reference the units and the stages). A prepare
  // that has not started is cancelled by claiming it (its unit was never transferred); a finish
  // that has not started runs here (its unit's transfer has completed, so its result is valid).
  for (size_t j = 0; j < n; ++j) {
    Unit& u = units[j];
    if (u.prepared.valid()) {
      u.prepare_claimed = true;
      u.prepared.wait();  // an exception of a unit past the failure point does not matter
    }
    if (!u.finished.valid()) continue;
    try {
      if (!u.finish_claimed.exchange(true)) stages.finish(u);
      u.finished.get();
    } catch (...) {
      if (u.finished.valid()) u.finished.wait();
      fail(j, std::current_exception());
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace gradex::sync::pipeline
