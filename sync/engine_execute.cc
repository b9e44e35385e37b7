// What the engine does with a round's gradients, around the negotiation: inspect() fills in what
// this rank announces (exchange counter, non-finite flag); execute() runs the round's ready work as
// a pipeline of units (sync/pipeline.h): each gradient is routed (dense, DGC sparse, DGC dense
// step, LocalSGD average), the round is cut into units (dense buckets first, then DGC tensors in
// key order), and every unit is prepared, transferred and finished on its own; its handles
// complete as soon as its results are written. The stages themselves are in engine_stages.cc; the
// transfer and the completion are here. LocalSGD's local step (no exchange) is here too. The data
// work is the tensor's backend's (sync/backend_path.h).
#include <algorithm>
#include <chrono>
#include <limits>

#include "base/check.h"
#include "base/log.h"
#include "base/thread_pool.h"
#include "base/wall_time.h"
#include "comm/collectives.h"
#include "comm/hierarchical.h"
#include "compress/dgc/schedule.h"
#include "sync/backend_path.h"
#include "sync/dense_exchange.h"
#include "sync/engine.h"
#include "sync/engine_internal.h"
#include "sync/pipeline.h"

namespace gradex::sync {
namespace {

using Clock = std::chrono::steady_clock;
using detail::work_name;
using pipeline::Job;
using pipeline::Route;
using pipeline::Unit;

}  // namespace

void Engine::inspect(std::vector<Announcement>& announce) {
  struct Item {
    Announcement* a;
    void* data;
    TensorState* tensor;
    bool absent;
  };
  std::vector<Item> items;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Announcement& a : announce) {
      if (a.id.kind != WorkKind::kGradient) continue;
      auto f = in_flight_.find(a.id);
      if (f == in_flight_.end()) continue;  // failed meanwhile (the announcement still goes out)
      const Handle& h = handles_[f->second];
      items.push_back({&a, h.data, &tensors_.at(a.id.key), h.absent});
    }
  }
  const bool zero = options_.nonfinite == NonFinitePolicy::kZero;
  uint64_t total = 0;
  const std::string* first_bad = nullptr;  // named by the one-time warning (sync/stats_report.h)
  for (Item& it : items) {
    // The counter is written only by this thread (execute), so it is read without the lock.
    it.a->step = it.tensor->step;
    if (it.absent) continue;  // contributes zeros: never non-finite, its data never read
    const uint64_t bad = path_->scan_nonfinite(*it.tensor, it.data, zero);
    total += bad;
    if (bad > 0 && first_bad == nullptr) first_bad = &it.tensor->key;
    it.a->nonfinite = bad > 0 && !zero;
  }
  if (total > 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.nonfinite += total;
    if (stats_.first_nonfinite_tensor.empty()) stats_.first_nonfinite_tensor = *first_bad;
  }
}

void Engine::local_step(TensorState& t, void* data, Handle& handle) {
  // This rank's momentum continues: the same u its synchronous steps used (DGC's own u for DGC
  // tensors, which no sparse exchange touches any more). Non-finite: the rank's own optimizer
  // (or GradScaler) sees it; momentum stays untouched.
  const bool zero = options_.nonfinite == NonFinitePolicy::kZero;
  const uint64_t bad = path_->local_step(t, data, handle.clip_scale, zero);
  stats_.nonfinite += bad;
  if (bad > 0 && !zero && options_.nonfinite == NonFinitePolicy::kError) {
    handle.code = ErrorCode::kInvalidArgument;
    handle.message = work_name(handle.id) +
                     " holds NaN/Inf values in a LocalSGD local step (GRADEX_NONFINITE=error)";
  }
}

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
      job.absent = handle.absent;
      if (w.id.kind == WorkKind::kGradient) {
        // A membership's first exchange of a tensor meets a newcomer's counters as a matter of
        // course (reconfigure(): it starts at 0); later differences point at a checkpoint mix-up.
        const bool first_of_membership = exchanged_in_membership_.insert(w.id.key).second;
        if (w.steps_differed && first_of_membership && connects_ > 1) {
          GX_LOG(kInfo) << "tensor '" << w.id.key << "': a member of the new membership has "
                        << "another exchange counter (a newcomer); all continue at " << w.step;
        } else if (w.steps_differed) {
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

  // GRADEX_POLICY=auto: an agreed re-plan when due (collective), and policy switches at agreed
  // epoch boundaries, before anything is routed.
  if (planner_) planner_->before_routes(*comm_, jobs, *path_, mutex_);

  // Routes, from agreed data only (policy, agreed counter, anchor presence), so that every rank
  // cuts the same units. The counters advance here: only this thread reads them (inspect).
  for (Job& job : jobs) {
    TensorState& t = *job.tensor;
    if (job.id.kind == WorkKind::kAverage) {
      job.route = t.anchor.empty() ? Route::kFirstAverage : Route::kDense;
      continue;
    }
    const bool sparse_step =
        t.policy.kind == ExchangeKind::kSparse && path_->sparse_step(t, job.step);
    if (sparse_step) {
      job.route = Route::kSparse;
    } else {
      job.route = Route::kDense;
      job.dgc_dense_step = t.policy.kind == ExchangeKind::kSparse;
      job.full_precision = t.policy.kind == ExchangeKind::kDense && t.policy.full_precision;
      job.int8 = t.policy.kind == ExchangeKind::kDense && t.policy.int8 &&
                 job.id.kind == WorkKind::kGradient;
    }
    ++t.step;
  }

  // Skipped gradients need no transfer: they complete before any unit travels.
  if (!skipped.empty()) {
    for (auto& [job, w] : skipped) {
      ++job.tensor->step;  // the exchange happened (skipped identically everywhere)
      const bool propagate = options_.nonfinite == NonFinitePolicy::kPropagate;
      // Only gradients carry the non-finite flag.
      GX_CHECK(job.id.kind == WorkKind::kGradient);
      path_->skip(*job.tensor, job.data, propagate);
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
  plan_options.sparse_group_elements = latency_bound_group(jobs)
                                           ? std::numeric_limits<uint64_t>::max()
                                           : options_.sparse_group_bytes / 4;
  std::deque<Unit> units = pipeline::plan(jobs, plan_options);
  GX_LOG(kDebug) << "round: " << jobs.size() << " tensor(s) in " << units.size() << " unit(s)";
  pipeline::Stages stages;
  stages.prepare = [this](Unit& u) { prepare_unit(u); };
  stages.transfer = [this](Unit& u) { transfer(u); };
  stages.finish = [this](Unit& u) { finish_unit(u); };
  ThreadPool& pool = shared_pool();
  pipeline::run(units, stages, pool, pipeline::lookahead_for(pool.threads()));
}

bool Engine::latency_bound_group(const std::vector<Job>& jobs) const {
  // A group size the user wrote is honoured; the agreed model exists from the first sparse unit
  // on (every rank got it in that unit's collective), so every rank plans the same units.
  const GatherModel* model = sparse_gather_.model();
  if (model == nullptr || !model->latency_bound() ||
      config_.source_of("GRADEX_SPARSE_GROUP_MB") != config::Source::kDefault)
    return false;
  // The round's DGC payloads at their policies' sparsities, at kPayloadBytesPerValue (an fp32
  // value and its index: the most the wire format spends on one).
  constexpr uint64_t kPayloadBytesPerValue = 8;
  uint64_t payload = 0;
  for (const Job& j : jobs)
    if (j.route == Route::kSparse)
      payload += compress::dgc::target_count(j.tensor->numel, j.tensor->policy.sparsity) *
                 kPayloadBytesPerValue;
  return payload <= model->fused_payload_bytes();
}

void Engine::transfer(Unit& unit) {
  if (before_transfer_) before_transfer_(unit);
  // The link probe is not the unit's: it runs before the unit's bytes are counted.
  if (unit.route == Route::kSparse) sparse_gather_.agree(*comm_);
  const bool dense_auto = options_.dense_collective == EngineOptions::DenseCollective::kAuto;
  if (unit.route != Route::kSparse && !unit.jobs.front()->int8 && dense_auto && world_size_ > 2 &&
      hierarchy() == nullptr)
    sparse_gather_.agree_model(*comm_);
  const uint64_t sent_before = comm_->bytes_sent();
  const uint64_t received_before = comm_->bytes_received();
  if (unit.route == Route::kSparse) {
    auto t0 = Clock::now();
    try {
      if (const comm::HostTopology* hosts = hierarchy())
        transfer_sparse_hierarchical(unit, *hosts);
      else
        sparse_gather_.gather(*comm_, unit.message, unit.received);
    } catch (const Error& e) {
      throw Error(e.code(), "sparse exchange of [" + unit.keys() + "]: " + e.what());
    }
    unit.counters.transfer_seconds += seconds_since(t0);
  } else if (unit.jobs.front()->int8) {
    transfer_int8(unit);
  } else {
    std::vector<DenseItem> items;
    items.reserve(unit.jobs.size());
    for (Job* job : unit.jobs)
      items.push_back(
          {job->values, job->values_dtype, job->tensor->numel, false, &job->tensor->key});
    DenseExchangeOptions options{options_.fusion_bytes, options_.half_on_wire, options_.half_type,
                                 options_.nonfinite,    hierarchy(),           {}};
    if (options_.dense_collective == EngineOptions::DenseCollective::kDirect) {
      options.direct_for = [](uint64_t) { return true; };
    } else if (const GatherModel* model = sparse_gather_.model(); dense_auto && model) {
      options.direct_for = [model](uint64_t bytes) { return model->dense_direct_for(bytes); };
    }
    // LocalSGD's first average sends full fp32 values (it establishes the anchor everywhere).
    if (unit.route == Route::kFirstAverage) options.half_on_wire = false;
    if (unit.jobs.front()->full_precision) options.half_on_wire = false;  // auto policy's fp32
    DenseCounters dc;
    // A tensor leaving the 8-bit route takes its residuals along (error feedback stays exact).
    for (Job* job : unit.jobs)
      if (job->id.kind == WorkKind::kGradient && !job->tensor->int8_residual.empty())
        path_->int8_fold(*job->tensor, static_cast<float*>(job->values), world_size_);
    // Gradients are cast on their tensors' backends; parameter averages on the CPU backend.
    std::vector<TensorState*> tensor(unit.jobs.size(), nullptr);
    for (size_t i = 0; i < unit.jobs.size(); ++i)
      if (unit.jobs[i]->id.kind == WorkKind::kGradient) tensor[i] = unit.jobs[i]->tensor;
    path_->dense_average(*comm_, items, tensor, options, dc);
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

const comm::HostTopology* Engine::hierarchy() {
  if (hierarchy_comm_ != comm_.get()) {
    hierarchy_comm_ = comm_.get();
    hierarchy_.reset();
    if (options_.hierarchical != EngineOptions::Hierarchical::kOff && comm_ != nullptr) {
      // Every rank sees the hosts every rank published (Communicator::rank_hosts), so the choice
      // and the layout are the same everywhere.
      auto t = std::make_unique<comm::HostTopology>(
          comm::host_topology(comm_->rank_hosts(), comm_->size()));
      if (options_.hierarchical == EngineOptions::Hierarchical::kOn || comm::hierarchy_pays(*t))
        hierarchy_ = std::move(t);
    }
  }
  return hierarchy_.get();
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
  if (planner_) planner_->observe_unit(unit, options_.half_on_wire);  // measured times
  stats_.bytes_sent += c.wire_bytes;
  stats_.bytes_received += c.received_bytes;
  stats_.saturated += c.saturated;
  if (stats_.first_saturated_tensor.empty()) stats_.first_saturated_tensor = c.first_saturated;
  stats_.compress_seconds += c.prepare_seconds;
  stats_.communicate_seconds += c.transfer_seconds;
  stats_.decode_seconds += c.finish_seconds;
  stats_.staged_bytes = path_->staged_bytes();
  cv_.notify_all();
}

}  // namespace gradex::sync
