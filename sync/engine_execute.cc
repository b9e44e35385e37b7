// Engine::execute: one round's ready work as a pipeline of units (sync/pipeline.h). Each gradient
// is routed (dense, DGC sparse, DGC dense step, LocalSGD average), the round is cut into units
// (dense buckets first, then DGC tensors in key order), and every unit is prepared, transferred
// and finished on its own; its handles complete as soon as its results are written. The stages
// themselves are in engine_stages.cc; the transfer and the completion are here.
#include <algorithm>
#include <chrono>
#include <limits>

#include "base/check.h"
#include "base/log.h"
#include "base/thread_pool.h"
#include "comm/collectives.h"
#include "sync/dense_exchange.h"
#include "sync/device_path.h"
#include "sync/engine.h"
#include "sync/engine_internal.h"
#include "sync/pipeline.h"
#include "sync/sparse_exchange.h"

namespace gradex::sync {
namespace {

using Clock = std::chrono::steady_clock;
using detail::work_name;
using pipeline::Job;
using pipeline::Route;
using pipeline::Unit;

// The prepare stage of this many units beyond the one on the wire runs ahead on the pool. The DGC
// kernel is itself parallel (it spreads over idle workers), so one unit ahead keeps the pool busy;
// more would only contend for the same cores and delay the finish stages queued behind them.
constexpr int kLookahead = 1;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks)
    s += (s.empty() ? "" : ", ") + std::to_string(r);
  return "[" + s + "]";
}

void fill_nan(void* data, DType dtype, uint64_t n) {
  if (dtype == DType::kFloat32) {
    std::fill_n(static_cast<float*>(data), n, std::numeric_limits<float>::quiet_NaN());
  } else {
    // A quiet NaN in either 16-bit format.
    const uint16_t nan = dtype == DType::kFloat16 ? 0x7e00u : 0x7fc0u;
    std::fill_n(static_cast<uint16_t*>(data), n, nan);
  }
}

}  // namespace

void Engine::execute(const std::vector<ReadyWork>& ready) {
  std::vector<Job> jobs;
  jobs.reserve(ready.size());
  // Gradients that some rank found non-finite: excluded from the exchange on every rank, their
  // state untouched everywhere; the policy decides what every rank's caller gets.
  std::vector<std::pair<Job, const ReadyWork*>> skipped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const ReadyWork& w : ready) {
      auto f = in_flight_.find(w.id);
      GX_CHECK(f != in_flight_.end());  // ready means this rank announced it
      const Handle& handle = handles_[f->second];
      Job job;
      job.id = w.id;
      job.tensor = &tensors_.at(w.id.key);
      job.data = handle.data;
      job.clip = handle.clip_scale;
      if (w.id.kind == WorkKind::kGradient) {
        if (w.steps_differed) {
          GX_LOG(kWarn) << "tensor '" << w.id.key << "': ranks announced different exchange "
                        << "counters (restored from different checkpoints?); all continue at "
                        << w.step;
        }
        job.tensor->step = w.step;
        job.step = w.step;
      }
      if (w.nonfinite_ranks.empty())
        jobs.push_back(std::move(job));
      else
        skipped.push_back({std::move(job), &w});
    }
  }

  // Routes, from agreed data only (policy, agreed counter, anchor presence), so that every rank
  // cuts the same units. The counters advance here: only this thread reads them (inspect).
  for (Job& job : jobs) {
    TensorState& t = *job.tensor;
    if (job.id.kind == WorkKind::kAverage) {
      job.route = t.anchor.empty() ? Route::kFirstAverage : Route::kDense;
      continue;
    }
    // [device path] a device tensor's DGC state decides from the same counter.
    const bool sparse_step =
        t.policy.kind == ExchangeKind::kSparse &&
        (t.device ? device_->sparse_step(t, job.step)
                  : sparse_is_cheaper(t.codec->density_at(job.step), world_size_));
    if (sparse_step) {
      job.route = Route::kSparse;
    } else {
      job.route = Route::kDense;
      job.dgc_dense_step = t.policy.kind == ExchangeKind::kSparse;
    }
    ++t.step;
  }

  // Skipped gradients need no transfer: they complete before any unit travels.
  if (!skipped.empty()) {
    for (auto& [job, w] : skipped) {
      ++job.tensor->step;  // the exchange happened (skipped identically everywhere)
      const bool propagate = options_.nonfinite == NonFinitePolicy::kPropagate;
      if (job.tensor->device && job.id.kind == WorkKind::kGradient)
        device_->skip(*job.tensor, job.data, propagate);  // [device path] on its backend
      else if (propagate)
        fill_nan(job.data, job.tensor->dtype, job.tensor->numel);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [job, w] : skipped) {
      ++job.tensor->exchanges;
      ++stats_.tensors;
      if (options_.nonfinite == NonFinitePolicy::kError)
        complete(job.id, ErrorCode::kInvalidArgument,
                 work_name(job.id) + " holds NaN/Inf values on ranks " +
                     rank_list(w->nonfinite_ranks) +
                     " (GRADEX_NONFINITE=error); no rank changed its state for it");
      else
        complete(job.id, ErrorCode::kOk, "");
    }
    cv_.notify_all();
  }
  if (jobs.empty()) return;

  pipeline::PlanOptions plan_options;
  plan_options.fusion_bytes = options_.fusion_bytes;
  plan_options.dense_wire = options_.half_on_wire ? options_.half_type : DType::kFloat32;
  plan_options.sparse_group_elements = options_.sparse_group_bytes / 4;
  std::deque<Unit> units = pipeline::plan(jobs, plan_options);
  GX_LOG(kDebug) << "round: " << jobs.size() << " tensor(s) in " << units.size() << " unit(s)";
  pipeline::Stages stages;
  stages.prepare = [this](Unit& u) { prepare_unit(u); };
  stages.transfer = [this](Unit& u) { transfer(u); };
  stages.finish = [this](Unit& u) { finish_unit(u); };
  pipeline::run(units, stages, shared_pool(), kLookahead);
}

void Engine::transfer(Unit& unit) {
  if (before_transfer_) before_transfer_(unit);
  const uint64_t sent_before = comm_->bytes_sent();
  const uint64_t received_before = comm_->bytes_received();
  if (unit.route == Route::kSparse) {
    auto t0 = Clock::now();
    const bool ring = options_.sparse_ring_for(world_size_);
    try {
      unit.received = ring ? comm::ring_allgatherv(*comm_, unit.message.data(), unit.message.size())
                           : comm::allgatherv(*comm_, unit.message.data(), unit.message.size());
    } catch (const Error& e) {
      throw Error(e.code(), "sparse exchange of [" + unit.keys() + "]: " + e.what());
    }
    unit.counters.transfer_seconds += seconds_since(t0);
  } else {
    std::vector<DenseItem> items;
    items.reserve(unit.jobs.size());
    for (Job* job : unit.jobs)
      items.push_back(
          {job->values, job->values_dtype, job->tensor->numel, false, &job->tensor->key});
    DenseExchangeOptions options{options_.fusion_bytes, options_.half_on_wire, options_.half_type,
                                 options_.nonfinite};
    // LocalSGD's first average sends full fp32 values (it establishes the anchor everywhere).
    if (unit.route == Route::kFirstAverage) options.half_on_wire = false;
    DenseCounters dc;
    // [device path] a unit holding a device gradient: the same bucket, device items cast and
    // staged on their backends, host items on the CPU backend.
    std::vector<TensorState*> device(unit.jobs.size(), nullptr);
    bool any_device = false;
    for (size_t i = 0; i < unit.jobs.size(); ++i) {
      const Job& job = *unit.jobs[i];
      if (job.tensor->device && job.id.kind == WorkKind::kGradient) {
        device[i] = job.tensor;
        any_device = true;
      }
    }
    if (any_device)
      device_->dense_average(*comm_, items, device, options, dc);
    else
      dense_average(*comm_, items, options, dc);
    for (size_t i = 0; i < items.size(); ++i)
      unit.jobs[i]->nonfinite_result = items[i].nonfinite_result;
    unit.counters.saturated += dc.saturated;
    if (dc.first_saturated != nullptr) unit.counters.first_saturated = *dc.first_saturated;
    unit.counters.prepare_seconds += dc.cast_seconds;
    unit.counters.transfer_seconds += dc.communicate_seconds;
  }
  unit.counters.wire_bytes += comm_->bytes_sent() - sent_before;
  unit.counters.received_bytes += comm_->bytes_received() - received_before;
}

void Engine::complete_unit(Unit& unit) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Job* job : unit.jobs) {
    TensorState& t = *job->tensor;
    ++t.exchanges;
    ++stats_.tensors;
    stats_.dense_bytes += ring_allreduce_bytes(t.numel * 4, world_size_);
    if (job->id.kind == WorkKind::kAverage) ++stats_.parameter_averages;
    if (job->route == Route::kSparse) ++stats_.sparse_exchanges;
    if (job->dgc_dense_step) ++stats_.dense_fallbacks;
    if (job->nonfinite_result && options_.nonfinite == NonFinitePolicy::kError)
      complete(job->id, ErrorCode::kInvalidArgument,
               work_name(job->id) +
                   " has NaN/Inf values in its average (a rank submitted "
                   "non-finite values and GRADEX_NONFINITE=error)");
    else
      complete(job->id, ErrorCode::kOk, "");
  }
  const pipeline::UnitCounters& c = unit.counters;
  stats_.bytes_sent += c.wire_bytes;
  stats_.bytes_received += c.received_bytes;
  stats_.saturated += c.saturated;
  if (stats_.first_saturated_tensor.empty()) stats_.first_saturated_tensor = c.first_saturated;
  stats_.compress_seconds += c.prepare_seconds;
  stats_.communicate_seconds += c.transfer_seconds;
  stats_.decode_seconds += c.finish_seconds;
  stats_.staged_bytes = device_->staged_bytes();  // [device path]
  cv_.notify_all();
}

}  // namespace gradex::sync
