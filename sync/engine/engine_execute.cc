// What the engine does with a round's gradients, around the negotiation: inspect() fills in what
// this rank announces (exchange counter, non-finite flag); execute() runs the round's ready work as
// a pipeline of units (sync/engine/pipeline.h): each gradient is given a route
// (sync/route/route.h), the round is cut into units (dense buckets first, then DGC tensors in key
// order), and every unit is prepared, transferred and finished on its own; its handles complete as
// soon as its results are written. The prepare and finish stages are in engine_stages.cc; the
// transfer (the unit's route object, sync/route/) and the completion are here. LocalSGD's local
// step (no exchange) is here too. The data work is the tensor's backend's
// (sync/data/backend_path.h).
#include <algorithm>
#include <chrono>
#include <limits>

#include "base/check.h"
#include "base/log.h"
#include "base/thread_pool.h"
#include "base/wall_time.h"
#include "comm/collectives.h"
#include "comm/hierarchical.h"
#include "sync/data/backend_path.h"
#include "sync/engine/engine.h"
#include "sync/engine/engine_executor.h"
#include "sync/engine/pipeline.h"
#include "sync/negotiation/submission_timeline.h"
#include "sync/route/route.h"
#include "sync/timeline/recorder.h"
#include "sync/timeline/traced_communicator.h"

namespace gradex::sync {
namespace {

using pipeline::Job;
using pipeline::Unit;

}  // namespace

Engine::Executor::Executor(Engine& engine, const config::Config& config,
                           const EngineOptions& options, int world_size)
    : engine_(engine),
      config_(config),
      options_(options),
      path_(std::make_unique<BackendPath>(config, options, world_size)),
      sparse_gather_(options.collectives.sparse),
      link_(options.collectives.port_queue_s, options.collectives.port_queue_explicit) {}

void Engine::Executor::on_connect(ExchangeLayout layout) {
  ++connects_;
  exchanged_in_membership_.clear();
  hierarchy_ = std::move(layout.groups);
  layout_description_ = std::move(layout.description);
  sparse_gather_.reset();
  link_.reset(std::move(layout.rank0_round_trips_s));
}

void Engine::Executor::inspect(std::vector<Announcement>& announce) {
  struct Item {
    Announcement* a;
    void* data;
    TensorState* tensor;
    bool absent;
  };
  std::vector<Item> items;
  {
    std::lock_guard<std::mutex> lock(engine_.mutex_);
    for (Announcement& a : announce) {
      if (a.id.kind != WorkKind::kGradient) continue;
      auto f = engine_.table_.in_flight.find(a.id);
      if (f == engine_.table_.in_flight.end())
        continue;  // failed meanwhile (the announcement still goes out)
      const Handle& h = engine_.table_.handles[f->second];
      items.push_back({&a, h.data, &engine_.table_.tensors.at(a.id.key), h.absent});
    }
  }
  const bool zero = options_.nonfinite == NonFinitePolicy::kZero;
  uint64_t total = 0;
  const std::string* first_bad = nullptr;  // named by the one-time warning
                                           // (sync/engine/stats_report.h)
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
    std::lock_guard<std::mutex> lock(engine_.mutex_);
    engine_.steps_.stats.nonfinite += total;
    if (engine_.steps_.stats.first_nonfinite_tensor.empty())
      engine_.steps_.stats.first_nonfinite_tensor = *first_bad;
  }
}

void Engine::Executor::local_step(TensorState& t, void* data, Handle& handle) {
  // This rank's momentum continues: the same u its synchronous steps used (DGC's own u for DGC
  // tensors, which no sparse exchange touches any more). Non-finite: the rank's own optimizer
  // (or GradScaler) sees it; momentum stays untouched.
  const bool zero = options_.nonfinite == NonFinitePolicy::kZero;
  const uint64_t bad = path_->local_step(t, data, handle.clip_scale, zero);
  engine_.steps_.stats.nonfinite += bad;
  if (bad > 0 && !zero && options_.nonfinite == NonFinitePolicy::kError) {
    handle.code = ErrorCode::kInvalidArgument;
    handle.message = work_name(handle.id) +
                     " holds NaN/Inf values in a LocalSGD local step (GRADEX_NONFINITE=error)";
  }
}

void Engine::Executor::execute(const std::vector<ReadyWork>& ready) {
  std::vector<Job> jobs;
  jobs.reserve(ready.size());
  // Gradients that some rank found non-finite: excluded from the exchange on every rank, their
  // state untouched everywhere; the policy decides what every rank's caller gets.
  std::vector<std::pair<Job, const ReadyWork*>> skipped;
  {
    std::lock_guard<std::mutex> lock(engine_.mutex_);
    for (const ReadyWork& w : ready) {
      auto f = engine_.table_.in_flight.find(w.id);
      GX_CHECK(f != engine_.table_.in_flight.end());  // ready means this rank announced it
      const Handle& handle = engine_.table_.handles[f->second];
      Job job;
      job.id = w.id;
      job.tensor = &engine_.table_.tensors.at(w.id.key);
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
  // What the routes will do on the agreed link, by their own rules (sync/route/route.h), so that
  // the planner prices what is sent.
  engine_.policy_->set_link_paths(link_paths());
  // The planner decides (collective when due); the engine applies its switches under its lock
  // (applied_policy and explain read the policies), before anything is routed.
  const RoundDecision decision = engine_.policy_->plan_round(*engine_.comm_, link_, jobs);
  if (!decision.switches.empty()) {
    std::lock_guard<std::mutex> lock(engine_.mutex_);
    for (const PolicySwitch& s : decision.switches) {
      path_->switch_policy(*s.tensor, s.to);
      // Leaving the 8-bit route for DGC: its residuals join DGC's (a dense route takes them
      // along in its transfer).
      if (is_sparse(s.to.rung.codec)) path_->int8_to_dgc_residual(*s.tensor, engine_.world_size_);
    }
    engine_.steps_.stats.policy_switches += decision.switches.size();
  }

  // Routes, from agreed data only (policy, agreed counter, anchor presence), so that every rank
  // cuts the same units (sync/route/route.h). The counters advance here: only this thread reads
  // them (inspect).
  for (Job& job : jobs) {
    TensorState& t = *job.tensor;
    const bool gradient = job.id.kind != WorkKind::kAverage;
    const bool sparse_step =
        gradient && is_sparse(t.policy.rung.codec) && path_->sparse_step(t, job.step);
    route::assign(job, t, sparse_step, options_.half_on_wire);
    if (gradient) ++t.step;
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
    std::lock_guard<std::mutex> lock(engine_.mutex_);
    for (auto& [job, w] : skipped) {
      ++job.tensor->exchanges;
      ++engine_.steps_.stats.tensors;
      if (options_.nonfinite == NonFinitePolicy::kError)
        engine_.table_.complete(job.id, ErrorCode::kInvalidArgument,
                                work_name(job.id) + " holds NaN/Inf values on ranks " +
                                    rank_list(w->nonfinite_ranks) +
                                    " (GRADEX_NONFINITE=error); no rank changed its state for it");
      else
        engine_.table_.complete(job.id, ErrorCode::kOk, "");
    }
    engine_.cv_.notify_all();
  }
  if (jobs.empty()) return;

  pipeline::PlanOptions plan_options;
  plan_options.fusion_bytes = options_.fusion_bytes;
  plan_options.dense_wire = options_.half_on_wire ? options_.half_type : DType::kFloat32;
  plan_options.sparse_group_elements = latency_bound_group()
                                           ? std::numeric_limits<uint64_t>::max()
                                           : options_.collectives.sparse_group_bytes / 4;
  plan_options.rider_bytes = link_paths().rider_bytes;
  std::deque<Unit> units = pipeline::plan(jobs, plan_options);
  GX_LOG(kDebug) << "round: " << jobs.size() << " tensor(s) in " << units.size() << " unit(s)";
  pipeline::Stages stages;
  stages.prepare = [this](Unit& u) { prepare_unit(u); };
  stages.transfer = [this](Unit& u) { transfer(u); };
  stages.finish = [this](Unit& u) { finish_unit(u); };
  ThreadPool& pool = shared_pool();
  pipeline::run(units, stages, pool, pipeline::lookahead_for(pool.threads()));
}

const LinkPaths& Engine::Executor::link_paths() {
  if (link_paths_generation_ == link_.generation()) return link_paths_;
  const LinkModel* link = link_.model();
  link_paths_ =
      route::link_paths(link, options_, hierarchy(), engine_.comm_->receives_any_length());
  if (link != nullptr && link->latency_bound())
    link_paths_.coalesce_window_s = link->link().alpha_s * kCoalesceExpectLatencies;
  link_paths_generation_ = link_.generation();
  return link_paths_;
}

bool Engine::Executor::latency_bound_group() const {
  // A group size the user wrote is honoured; the agreed model exists from the first sparse unit
  // on (every rank got it in that unit's collective), so every rank plans the same units.
  const LinkModel* model = link_.model();
  return model != nullptr && model->latency_bound() &&
         config_.source_of("GRADEX_SPARSE_GROUP_MB") == config::Source::kDefault;
}

void Engine::Executor::transfer(Unit& unit) {
  if (before_transfer_) before_transfer_(unit);
  route::Context ctx{*engine_.comm_, *path_,  sparse_gather_, link_,
                     options_,       config_, hierarchy(),    engine_.world_size_};
  const route::Transfer& route = route::select(unit, ctx.hosts);
  // The route's link probe is not the unit's: it runs before the unit's bytes are counted.
  const auto planned_from = std::chrono::steady_clock::now();
  route.plan(ctx);
  if (engine_.trace_) engine_.traced_comm_->drain("link probe", timeline::Args());
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t sent_before = engine_.comm_->bytes_sent();
  const uint64_t received_before = engine_.comm_->bytes_received();
  route.prepare(unit, ctx);
  route.exchange(unit, ctx);
  unit.counters.wire_bytes += engine_.comm_->bytes_sent() - sent_before;
  unit.counters.received_bytes += engine_.comm_->bytes_received() - received_before;
  route.finish(unit, ctx);
  if (engine_.trace_) {
    const auto t1 = std::chrono::steady_clock::now();
    if (t0 - planned_from > std::chrono::microseconds(50))
      engine_.trace_->span(engine_.trace_row(), "link probe", planned_from, t0);
    timeline::Args args = timeline::Args::from_members(unit.timeline_args);
    args.add("collective", route.name())
        .add("one_hop", unit.one_hop ? "yes" : "no")
        .add("bytes_sent", engine_.comm_->bytes_sent() - sent_before)
        .add("bytes_received", engine_.comm_->bytes_received() - received_before);
    engine_.trace_->span(engine_.trace_row(), "transfer", t0, t1, args);
    engine_.traced_comm_->drain(route.name(), timeline::Args::from_members(unit.timeline_args));
  }
  GX_LOG(kDebug) << "unit of " << unit.jobs.size() << " tensor(s) by " << route.name()
                 << (unit.one_hop ? " in one hop" : "") << ": "
                 << engine_.comm_->bytes_sent() - sent_before << " bytes sent in "
                 << unit.counters.transfer_seconds * 1e3 << " ms";
}

void Engine::Executor::complete_unit(Unit& unit) {
  std::lock_guard<std::mutex> lock(engine_.mutex_);
  for (Job* job : unit.jobs) {
    TensorState& t = *job->tensor;
    ++t.exchanges;
    ++engine_.steps_.stats.tensors;
    engine_.steps_.stats.dense_bytes += ring_allreduce_bytes(t.numel * 4, engine_.world_size_);
    if (job->id.kind == WorkKind::kAverage) ++engine_.steps_.stats.parameter_averages;
    const route::JobRole role = route::role_of(*job);
    if (role.selects) ++engine_.steps_.stats.sparse_exchanges;
    if (role.dense_step) ++engine_.steps_.stats.dense_fallbacks;
    if (job->nonfinite_result && options_.nonfinite == NonFinitePolicy::kError)
      engine_.table_.complete(job->id, ErrorCode::kInvalidArgument,
                              work_name(job->id) +
                                  " has NaN/Inf values in its average (a rank submitted "
                                  "non-finite values and GRADEX_NONFINITE=error)");
    else
      engine_.table_.complete(job->id, ErrorCode::kOk, "");
  }
  const pipeline::UnitCounters& c = unit.counters;
  engine_.policy_->observe_unit(unit);  // what the unit's route ran, and its measured times
  engine_.steps_.stats.bytes_sent += c.wire_bytes;
  engine_.steps_.stats.bytes_received += c.received_bytes;
  engine_.steps_.stats.saturated += c.saturated;
  if (engine_.steps_.stats.first_saturated_tensor.empty())
    engine_.steps_.stats.first_saturated_tensor = c.first_saturated;
  engine_.steps_.stats.compress_seconds += c.prepare_seconds;
  engine_.steps_.stats.communicate_seconds += c.transfer_seconds;
  engine_.steps_.stats.decode_seconds += c.finish_seconds;
  engine_.steps_.stats.staged_bytes = path_->staged_bytes();
  engine_.steps_.last_complete = std::chrono::steady_clock::now();
  if (engine_.trace_) {
    engine_.trace_->instant(engine_.trace_row(), "complete", engine_.steps_.last_complete,
                            timeline::Args()
                                .add("tensors", static_cast<uint64_t>(unit.jobs.size()))
                                .add("keys", unit.keys()));
  }
  engine_.cv_.notify_all();
}

}  // namespace gradex::sync
