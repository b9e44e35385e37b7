// The per-tensor work of the engine's pipeline stages (sync/engine/pipeline.h): prepare (a
// gradient's clipping, momentum and DGC step on its backend, sync/data/backend_path.h; LocalSGD
// deltas) and finish (every rank's payload summed, casts back into the caller's buffer, LocalSGD
// anchors). The unit's route (sync/route/route.h) runs them over its jobs and frames what they
// select; these run on the worker pool or on the progress thread and touch only their own job's
// tensor.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "base/check.h"
#include "base/error.h"
#include "base/thread_pool.h"
#include "base/wall_time.h"
#include "sync/data/backend_path.h"
#include "sync/engine/engine.h"
#include "sync/engine/engine_executor.h"
#include "sync/engine/engine_internal.h"
#include "sync/engine/pipeline.h"
#include "sync/route/route.h"
#include "sync/timeline/recorder.h"
#include "sync/timeline/unit_args.h"

namespace gradex::sync {
namespace {

using Clock = std::chrono::steady_clock;
using detail::from_float;
using detail::to_float;
using pipeline::Job;
using pipeline::Unit;

}  // namespace

void Engine::Executor::prepare(Job& job, std::vector<uint8_t>& payload_out) {
  TensorState& t = *job.tensor;
  const route::JobRole role = route::role_of(job);
  if (role.first_average) {
    // Full values in fp32, which also establishes an identical anchor everywhere.
    job.values = job.data;
    job.values_dtype = t.dtype;
    return;
  }
  if (job.id.kind == WorkKind::kAverage) {
    // Later averages send (parameters - anchor): small deltas lose far less in 16 bits. A value
    // equal to its anchor sends 0 even when it is infinite (an attention mask's -inf buffer), where
    // the subtraction would give NaN; for finite values x - x is +0 anyway.
    job.delta.resize(t.numel);
    to_float(job.data, t.dtype, t.numel, job.delta.data());
    for (uint64_t i = 0; i < t.numel; ++i)
      job.delta[i] = job.delta[i] == t.anchor[i] ? 0.0f : job.delta[i] - t.anchor[i];
    job.values = job.delta.data();
    job.values_dtype = DType::kFloat32;
    return;
  }
  if (job.absent)
    path_->prepare_absent(t, job.data, job.step, role.selects, payload_out);
  else
    path_->prepare(t, job.data, job.clip, job.step, role.selects, payload_out);
  job.values = path_->values(t, job.data);
  job.values_dtype = DType::kFloat32;
  if (job.rider) job.saturated = path_->encode_rider(t, job.data, job.rider_wire, payload_out);
}

void Engine::Executor::prepare_named(Job& job, std::vector<uint8_t>& payload_out) {
  try {
    if (before_prepare_) before_prepare_(job);
    prepare(job, payload_out);
  } catch (const Error& e) {
    throw Error(e.code(), "prepare of " + work_name(job.id) + ": " + e.what());
  } catch (const std::exception& e) {
    throw InternalError("prepare of " + work_name(job.id) + ": " + e.what());
  }
}

namespace {

// Elements a job's prepare stage computes on (0: it only points at the caller's buffer): the
// weights by which a unit's jobs are spread over the pool.
uint64_t prepare_work(const Job& job, const EngineOptions& options) {
  const route::JobRole role = route::role_of(job);
  if (role.first_average) return 0;
  const bool dense_gradient =
      job.id.kind == WorkKind::kGradient && role.summed_in_place && !role.dense_step && !job.absent;
  if (dense_gradient && !job.rider && options.momentum <= 0 && options.clip_norm <= 0) return 0;
  return job.tensor->numel;
}

// The same for the finish stage: a sparse sum, parameters and anchors, a 16-bit tensor's cast back
// (a dense fp32 gradient's average is already in place).
uint64_t finish_work(const Job& job) {
  const bool in_place = job.id.kind == WorkKind::kGradient && route::role_of(job).summed_in_place &&
                        job.tensor->dtype == DType::kFloat32 && !job.rider;
  return in_place ? 0 : job.tensor->numel;
}

// The jobs of a unit whose stages may run beside other tensors' (host backends; LocalSGD's
// parameter averages are host code whatever holds the tensor), in unit order, with their work.
struct HostJobs {
  std::vector<size_t> index;     // into unit.jobs
  std::vector<uint64_t> weight;  // elements
  uint64_t total = 0;
  bool contains(size_t j) const { return std::binary_search(index.begin(), index.end(), j); }
};

template <typename Work>
HostJobs host_jobs(const Unit& unit, const BackendPath& path, Work&& work) {
  HostJobs h;
  for (size_t j = 0; j < unit.jobs.size(); ++j) {
    const Job& job = *unit.jobs[j];
    if (job.id.kind == WorkKind::kGradient && !path.concurrent_stages(*job.tensor)) continue;
    h.index.push_back(j);
    h.weight.push_back(work(job));
    h.total += h.weight.back();
  }
  return h;
}

// fn(j) for every job j of `unit`: device jobs here, in order (their stage's stream is fed by one
// thread), then the host jobs over the pool, heaviest first. Each tensor's stage touches only its
// own state, so the order changes no result; the error of the lowest failing host job is rethrown
// after every one has run.
template <typename Fn>
void spread_jobs(ThreadPool& pool, Unit& unit, const HostJobs& host, Fn&& fn) {
  for (size_t j = 0; j < unit.jobs.size(); ++j)
    if (!host.contains(j)) fn(j);
  pool.parallel_for_heaviest_first(host.weight,
                                   [&](int i) { fn(host.index[static_cast<size_t>(i)]); });
}

}  // namespace

void Engine::Executor::prepare_unit(Unit& unit) {
  auto t0 = Clock::now();
  ThreadPool& pool = shared_pool();
  // Each tensor's work is independent (its own momentum, residual and selection; a large tensor is
  // also split inside its DGC step, compress/dgc/parallel.h), so it may be spread over the pool;
  // the route frames the payloads in job order, so its message depends on neither.
  const HostJobs host =
      host_jobs(unit, *path_, [this](const Job& job) { return prepare_work(job, options_); });
  route::JobWork work;
  work.prepare = [&](size_t j, std::vector<uint8_t>& out) { prepare_named(*unit.jobs[j], out); };
  if (pipeline::spread_prepare(pool.threads(), host.index.size(), host.total))
    work.spread = [&](const std::function<void(size_t)>& fn) { spread_jobs(pool, unit, host, fn); };
  route::select(unit, hierarchy()).pack(unit, work);
  unit.counters.prepare_seconds += seconds_since(t0);
  if (engine_.trace_) {
    unit.timeline_args = timeline::unit_args(unit).members();
    engine_.trace_->span(engine_.trace_row(), "encode", t0, Clock::now(),
                         timeline::Args::from_members(unit.timeline_args));
  }
}

void Engine::Executor::finish(Job& job, const std::vector<compress::wire::PayloadSpan>& payloads) {
  TensorState& t = *job.tensor;
  if (job.rider) {
    job.nonfinite_result = path_->finish_rider(t, job.data, payloads, job.rider_wire);
    return;
  }
  const route::JobRole role = route::role_of(job);
  if (job.id.kind == WorkKind::kGradient) {
    path_->finish(t, job.data, payloads, role.selects);
    return;
  }
  if (role.first_average) {
    t.anchor.resize(t.numel);
    to_float(job.data, t.dtype, t.numel, t.anchor.data());
  } else if (job.id.kind == WorkKind::kAverage) {
    for (uint64_t k = 0; k < t.numel; ++k)
      job.delta[k] += t.anchor[k];
    from_float(job.delta.data(), t.numel, t.dtype, job.data);
    to_float(job.data, t.dtype, t.numel, t.anchor.data());
  }
}

void Engine::Executor::finish_unit(Unit& unit) {
  auto t0 = Clock::now();
  // Unpacking reads the layout and the world size only (no collective: any thread).
  route::Context ctx{*engine_.comm_, *path_,  sparse_gather_, link_,
                     options_,       config_, hierarchy(),    engine_.world_size_};
  const route::Payloads payloads = route::select(unit, hierarchy()).unpack(unit, ctx);
  // Every tensor's finish is its own (its sum, its cast back): spread like the prepare stage.
  ThreadPool& pool = shared_pool();
  const HostJobs host = host_jobs(unit, *path_, finish_work);
  static const std::vector<compress::wire::PayloadSpan> kNone;
  auto finish_job = [&](size_t j) {
    finish(*unit.jobs[j], payloads.empty() ? kNone : payloads[j]);
  };
  if (pipeline::spread_prepare(pool.threads(), host.index.size(), host.total))
    spread_jobs(pool, unit, host, finish_job);
  else
    for (size_t j = 0; j < unit.jobs.size(); ++j)
      finish_job(j);
  for (const Job* job : unit.jobs) {
    if (job->saturated == 0) continue;
    unit.counters.saturated += job->saturated;
    if (unit.counters.first_saturated.empty()) unit.counters.first_saturated = job->tensor->key;
  }
  unit.counters.finish_seconds += seconds_since(t0);
  if (engine_.trace_)
    engine_.trace_->span(engine_.trace_row(), "decode", t0, Clock::now(),
                         timeline::Args::from_members(unit.timeline_args));
  complete_unit(unit);
}

}  // namespace gradex::sync
