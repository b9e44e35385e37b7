#include "sync/pipeline.h"

#include <algorithm>
#include <chrono>
#include <exception>

#include "base/thread_pool.h"
#include "sync/dense_exchange.h"

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

namespace {

// Greedy packing in round order by the fusion rule the dense exchange applies to one call's items
// (sync/dense_exchange.h): a bucket takes the next job while its wire bytes stay within the limit;
// a job larger than the limit travels alone.
void add_buckets(std::vector<Job>& jobs, route::Path path, size_t elem, size_t fusion_bytes,
                 std::deque<Unit>& units) {
  const size_t limit = fusion_limit(fusion_bytes, elem);
  Unit* open = nullptr;
  size_t bytes = 0;
  for (Job& j : jobs) {
    if (route::unit_path(j.path) != path || j.rider) continue;
    const size_t b = j.tensor->numel * elem;
    if (open == nullptr || bytes + b > limit) {
      open = &units.emplace_back();
      open->path = path;
      bytes = 0;
    }
    open->jobs.push_back(&j);
    bytes += b;
  }
}

// Marks the riders (see plan()); returns whether there are any.
bool choose_riders(std::vector<Job>& jobs, const PlanOptions& options) {
  using route::Path;
  if (options.rider_bytes == 0) return false;
  if (std::none_of(jobs.begin(), jobs.end(), [](const Job& j) { return j.path == Path::kSparse; }))
    return false;
  uint64_t bytes = 0;
  bool any = false;
  for (Job& j : jobs) {
    const bool dense = j.path == Path::kDense || j.path == Path::kDenseFp32;
    if (!dense || j.id.kind != WorkKind::kGradient || j.absent || !j.tensor->int8_residual.empty())
      continue;
    const DType wire = j.path == Path::kDense ? options.dense_wire : DType::kFloat32;
    const uint64_t b = j.tensor->numel * dtype_size(wire);
    if (bytes + b > options.rider_bytes) break;  // round order: a prefix rides
    bytes += b;
    j.rider = true;
    j.rider_wire = wire;
    any = true;
  }
  return any;
}

}  // namespace

std::deque<Unit> plan(std::vector<Job>& jobs, const PlanOptions& options) {
  std::deque<Unit> units;
  using route::Path;
  const bool riders = choose_riders(jobs, options);
  add_buckets(jobs, Path::kDense, dtype_size(options.dense_wire), options.fusion_bytes, units);
  // Dense jobs a policy keeps in fp32 on a 16-bit wire (GRADEX_POLICY=auto): buckets of their own.
  add_buckets(jobs, Path::kDenseFp32, 4, options.fusion_bytes, units);
  // The quantized route (sync/int8_exchange.h): buckets of their own per code width, counted at
  // one byte per element (4-bit buckets thus hold twice their wire bytes' worth).
  add_buckets(jobs, Path::kInt8, 1, options.fusion_bytes, units);
  add_buckets(jobs, Path::kInt4, 1, options.fusion_bytes, units);
  add_buckets(jobs, Path::kFirstAverage, 4, options.fusion_bytes, units);
  const uint64_t group = options.sparse_group_elements;
  Unit* open = nullptr;
  uint64_t elements = 0;
  for (Job& j : jobs) {
    if (j.path != Path::kSparse) continue;
    const uint64_t n = j.tensor->numel;
    if (open == nullptr || elements >= group || n >= group) {
      open = &units.emplace_back();
      open->path = Path::kSparse;
      open->finish_on_pool = true;  // decoding may overlap the next unit's transfer
      elements = 0;
    }
    open->jobs.push_back(&j);
    elements += n;
  }
  if (riders) {
    Unit& first = *std::find_if(units.begin(), units.end(),
                                [](const Unit& u) { return u.path == Path::kSparse; });
    for (Job& j : jobs)
      if (j.rider) first.jobs.push_back(&j);
  }
  return units;
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
