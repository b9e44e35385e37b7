// The fused dense bucket shared by the dense routes (contract in dense_bucket.h).
#include "sync/route/dense_bucket.h"

#include <chrono>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/wall_time.h"
#include "comm/collectives.h"
#include "comm/hierarchical.h"
#include "sync/data/backend_path.h"
#include "sync/data/dense_exchange.h"

namespace gradex::sync::route {
namespace {

std::string key_list(const std::vector<DenseItem>& items) {
  std::string keys;
  for (size_t i = 0; i < items.size() && i < 8; ++i)
    keys += (keys.empty() ? "'" : ", '") + (items[i].key ? *items[i].key : "?") + "'";
  if (items.size() > 8) keys += ", ...";
  return keys;
}

// The bucket's sum over the ranks, in place: over the hierarchy's groups when it has one (its
// step across the groups direct when `direct`), else direct or by the ring (the same bits).
void dense_allreduce(comm::Communicator& comm, DenseBucket& bucket,
                     const DenseExchangeOptions& options, const std::vector<DenseItem>& items,
                     DenseCounters& counters) {
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t sent_before = comm.bytes_sent();
  try {
    if (options.hierarchy != nullptr)
      comm::hierarchical_allreduce_sum(comm, *options.hierarchy, bucket.bytes, bucket.count,
                                       bucket.wire, options.direct);
    else if (options.direct)
      comm::direct_allreduce_sum(comm, bucket.bytes, bucket.count, bucket.wire);
    else
      comm::allreduce_sum(comm, bucket.bytes, bucket.count, bucket.wire);
  } catch (const Error& e) {
    throw Error(e.code(), "dense bucket of " + std::to_string(items.size()) + " tensor(s) [" +
                              key_list(items) + "], " + std::to_string(bucket.count) + " x " +
                              dtype_name(bucket.wire) + ": " + e.what());
  }
  counters.wire_bytes += comm.bytes_sent() - sent_before;
  counters.communicate_seconds += seconds_since(t0);
}

}  // namespace

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
  DenseBucket bucket = ctx.path.stage_dense(items, tensor, ctx.comm.size(), options, dc);
  dense_allreduce(ctx.comm, bucket, options, items, dc);
  ctx.path.unstage_dense(bucket, items, tensor, options, dc);
  for (size_t i = 0; i < items.size(); ++i)
    unit.jobs[i]->nonfinite_result = items[i].nonfinite_result;
  unit.counters.saturated += dc.saturated;
  if (dc.first_saturated != nullptr) unit.counters.first_saturated = *dc.first_saturated;
  unit.counters.prepare_seconds += dc.cast_seconds;
  unit.counters.transfer_seconds += dc.communicate_seconds;
}

}  // namespace gradex::sync::route
