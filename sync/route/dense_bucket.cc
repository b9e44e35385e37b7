// The fused dense bucket shared by the dense routes (contract in dense_bucket.h).
#include "sync/route/dense_bucket.h"

#include <vector>

#include "sync/backend_path.h"
#include "sync/dense_exchange.h"

namespace gradex::sync::route {

void plan_dense(Context& ctx) {
  using Collective = EngineOptions::DenseCollective;
  const bool dense_auto = ctx.options.collectives.dense == Collective::kAuto ||
                          ctx.options.collectives.dense == Collective::kGather;
  // The model decides the direct exchange, flat or across a hierarchy's hosts (or regions).
  if (dense_auto && ctx.world_size > 1) ctx.link.agree(ctx.comm);
}

uint64_t dense_direct_max_bytes(const EngineOptions& options, const LinkModel* link,
                                const comm::HostTopology* hosts) {
  using Collective = EngineOptions::DenseCollective;
  if (options.collectives.dense == Collective::kDirect) return UINT64_MAX;
  const bool dense_auto = options.collectives.dense == Collective::kAuto ||
                          options.collectives.dense == Collective::kGather;
  if (!dense_auto || link == nullptr || link->world_size < 2) return 0;
  if (hosts == nullptr) return link->dense_direct_max_bytes();
  if (!link->latency_bound()) return 0;
  return hosts->hosts.size() == 2 ? UINT64_MAX : link->dense_direct_max_bytes();
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
  const bool half = o.half_on_wire && !fp32_wire;
  // The unit is one bucket (route::pack): one decision, by the one rule.
  uint64_t elements = 0;
  for (const pipeline::Job* job : unit.jobs)
    elements += job->tensor->numel;
  const uint64_t bytes = elements * (half ? dtype_size(o.half_type) : 4);
  const bool direct =
      ctx.world_size > 1 && bytes <= dense_direct_max_bytes(o, ctx.link.model(), ctx.hosts);
  DenseExchangeOptions options{half, o.half_type, o.nonfinite, ctx.hosts, direct};
  unit.sample.codec = half ? Codec::kHalf : Codec::kFp32;
  // Across a hierarchy the planner prices the flat ring (its groups are not modelled yet).
  const bool priced_direct = direct && ctx.hosts == nullptr;
  unit.sample.terms = collective_terms(Collective::kAllreduce,
                                       priced_direct ? Algorithm::kDirect : Algorithm::kRing,
                                       static_cast<double>(bytes), ctx.world_size);
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
