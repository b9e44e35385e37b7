// The fused dense bucket shared by the dense routes (contract in dense_bucket.h).
#include "sync/route/dense_bucket.h"

#include <vector>

#include "sync/backend_path.h"
#include "sync/dense_exchange.h"

namespace gradex::sync::route {

void plan_dense(Context& ctx) {
  using Collective = EngineOptions::DenseCollective;
  const bool dense_auto = ctx.options.dense_collective == Collective::kAuto ||
                          ctx.options.dense_collective == Collective::kGather;
  // The model decides the direct exchange, flat or across a hierarchy's hosts (or regions).
  if (dense_auto && ctx.world_size > 1) ctx.link.agree(ctx.comm);
}

void fold_int8_residuals(pipeline::Unit& unit, Context& ctx) {
  for (pipeline::Job* job : unit.jobs)
    if (job->id.kind == WorkKind::kGradient && !job->tensor->int8_residual.empty())
      ctx.path.int8_fold(*job->tensor, static_cast<float*>(job->values), ctx.world_size);
}

void exchange_dense(pipeline::Unit& unit, Context& ctx, bool fp32_wire) {
  const EngineOptions& o = ctx.options;
  std::vector<DenseItem> items;
  items.reserve(unit.jobs.size());
  for (pipeline::Job* job : unit.jobs)
    items.push_back({job->values, job->values_dtype, job->tensor->numel, false, &job->tensor->key});
  DenseExchangeOptions options{
      o.fusion_bytes, o.half_on_wire && !fp32_wire, o.half_type, o.nonfinite, ctx.hosts, {}};
  const bool dense_auto = o.dense_collective == EngineOptions::DenseCollective::kAuto ||
                          o.dense_collective == EngineOptions::DenseCollective::kGather;
  if (o.dense_collective == EngineOptions::DenseCollective::kDirect) {
    options.direct_for = [](uint64_t) { return true; };
  } else if (const LinkModel* model = ctx.link.model(); dense_auto && model && !ctx.hosts) {
    options.direct_for = [model](uint64_t bytes) { return model->dense_direct_for(bytes); };
  } else if (dense_auto && model && model->latency_bound()) {
    // Across a hierarchy's groups on a latency-bound link: between two groups the direct exchange
    // is one swap (no incast, the ring's bytes, half its latencies); between more, as priced.
    const bool two_groups = ctx.hosts->hosts.size() == 2;
    options.direct_for = [model, two_groups](uint64_t bytes) {
      return two_groups || model->dense_direct_for(bytes);
    };
  }
  // Gradients are cast on their tensors' backends; parameter averages on the CPU backend.
  std::vector<TensorState*> tensor(unit.jobs.size(), nullptr);
  for (size_t i = 0; i < unit.jobs.size(); ++i)
    if (unit.jobs[i]->id.kind == WorkKind::kGradient) tensor[i] = unit.jobs[i]->tensor;
  DenseCounters dc;
  ctx.path.dense_average(ctx.comm, items, tensor, options, dc);
  for (size_t i = 0; i < items.size(); ++i)
    unit.jobs[i]->nonfinite_result = items[i].nonfinite_result;
  unit.counters.saturated += dc.saturated;
  if (dc.first_saturated != nullptr) unit.counters.first_saturated = *dc.first_saturated;
  unit.counters.prepare_seconds += dc.cast_seconds;
  unit.counters.transfer_seconds += dc.communicate_seconds;
}

}  // namespace gradex::sync::route
