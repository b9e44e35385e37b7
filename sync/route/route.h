// Routes: every path a tensor's bytes can take on the wire, one file each under sync/route/, behind
// one interface. A route owns its tensors' whole journey between the engine's per-tensor stage
// work and the wire: it packs the round's jobs into units (select.cc), frames and unframes what its
// collective carries, agrees the link model it chooses by, runs its collective, and says what the
// unit cost in the link model's terms. The engine, the pipeline and the planner ask the route;
// none of them reads a job's path (sync/route/path.h), which only assign() writes.
//
// clang-format off
//   path                 file                     what travels
//   kDense               dense.cc                 fused allreduce on the dense wire type (fp32, or
//                                                 16-bit with GRADEX_FP16/BF16): ring, direct or
//                                                 hierarchical (sync/data/dense_exchange.h)
//   kDgcDenseStep        (rides kDense buckets)   a DGC tensor sent densely (its warm-up steps)
//   kDenseFp32           dense_fp32.cc            the auto policy's fp32 rung on a 16-bit wire
//   kInt8                int8.cc                  8-bit blocks with error feedback through
//                                                 comm::encoded_allreduce
//                                                 (sync/data/int8_exchange.h)
//   kInt4                int8.cc                  the same at 4 bits
//   kFirstAverage        first_average.cc         LocalSGD's first parameter average, fp32
//   kSparse              sparse.cc                DGC payloads in one allgatherv
//                                                 (sync/data/sparse_gather.h), and the dense
//                                                 gradients riding it (sync/data/gather_rider.h)
//   kSparseHierarchical  sparse_hierarchical.cc   DGC host sums re-selected per host, then
//                                                 gathered across hosts (GRADEX_HIERARCHICAL)
// clang-format on
//
// A unit's journey (Engine::Executor::prepare_unit, transfer, finish_unit):
//   pack       the engine's per-job prepare work (momentum, clipping, DGC selection: `each`), run
//              by the route over the unit's jobs, and the route's framing of their payloads
//   plan       collectives the route agrees on before the unit's bytes are counted (the probe)
//   prepare    work on the unit's values that must precede the collective
//   exchange   the collective; it records what it ran (Unit::sample: the terms it cost)
//   finish     per-unit results and counters
//   unpack     every rank's payloads for each job, for the engine's per-job finish work
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "base/config.h"
#include "comm/communicator.h"
#include "comm/topology/host_topology.h"
#include "compress/wire/message.h"
#include "sync/data/sparse_gather.h"
#include "sync/data/tensor_state.h"
#include "sync/engine/options.h"
#include "sync/engine/pipeline.h"
#include "sync/policy/agreed_link.h"
#include "sync/route/path.h"

namespace gradex::sync {
class BackendPath;  // sync/data/backend_path.h
}

namespace gradex::sync::route {

// What a route reads and drives: the engine's state for the current membership.
struct Context {
  comm::Communicator& comm;
  BackendPath& path;     // every tensor's data work, through its backend
  SparseGather& gather;  // the DGC allgather
  AgreedLink& link;      // the membership's link model (sync/policy/link_model.h)
  const EngineOptions& options;
  const config::Config& config;
  const comm::HostTopology* hosts;  // the layout when the hierarchical exchange is on, else null
  int world_size;
};

// The engine's per-job prepare work, as the route's pack step runs it: `prepare(j, out)` prepares
// job j of the unit, appending any payload it selects to `out`; `spread(fn)` runs fn(j) for every
// job, concurrently where the engine's pool allows (null: the route runs them in order).
struct JobWork {
  std::function<void(size_t j, std::vector<uint8_t>& out)> prepare;
  std::function<void(const std::function<void(size_t)>& fn)> spread;
};

// Every rank's payloads of each job of a unit (by job, then by rank or host), for the finish.
using Payloads = std::vector<std::vector<compress::wire::PayloadSpan>>;

class Transfer {
 public:
  virtual ~Transfer() = default;
  virtual Path path() const = 0;
  const char* name() const { return path_name(path()); }
  // Default: every job prepared into its own Job::payload (a dense job selects none), nothing
  // framed.
  virtual void pack(pipeline::Unit& unit, const JobWork& work) const;
  virtual void plan(Context& ctx) const { (void)ctx; }
  virtual void prepare(pipeline::Unit& unit, Context& ctx) const { (void)unit, (void)ctx; }
  virtual void exchange(pipeline::Unit& unit, Context& ctx) const = 0;
  virtual void finish(pipeline::Unit& unit, Context& ctx) const { (void)unit, (void)ctx; }
  // Default: no payloads (dense jobs find their averages in place).
  virtual Payloads unpack(const pipeline::Unit& unit, const Context& ctx) const;
};

// Sets a job's path from agreed data only (the work kind, the tensor's rung and anchor, whether
// this is a DGC sparse step, whether the dense wire is 16-bit: sync/policy/policy.h), so that every
// rank cuts the same units.
void assign(pipeline::Job& job, const TensorState& tensor, bool sparse_step, bool half_on_wire);
// The path of one job (kDgcDenseStep for a DGC tensor's dense step): job.path.
Path path_of(const pipeline::Job& job);
// The path of a unit's collective: its jobs' (pipeline::plan never mixes paths in a unit), with
// kDgcDenseStep riding kDense and kSparse hierarchical when `hosts` is set.
Path path_of(const pipeline::Unit& unit, const comm::HostTopology* hosts);
// The route object of a unit's path_of(unit, hosts) (stateless, shared).
const Transfer& select(const pipeline::Unit& unit, const comm::HostTopology* hosts);

// The routes' packing of a round's jobs into units (select.cc; the contract is pipeline::plan's).
std::deque<pipeline::Unit> pack(std::vector<pipeline::Job>& jobs,
                                const pipeline::PlanOptions& options);

// What the engine's per-job stages need to know of a job's route (select.cc):
struct JobRole {
  bool first_average = false;  // LocalSGD's first average: sends the caller's values, sets anchors
  bool selects = false;        // a DGC sparse step: its prepare selects a payload
  bool dense_step = false;     // a DGC tensor's dense warm-up step (rides the dense buckets)
  bool summed_in_place = false;  // its values are averaged in place by a dense allreduce
};
JobRole role_of(const pipeline::Job& job);

// The one direct-or-ring rule of the dense routes' buckets (dense_bucket.cc): a bucket of up to
// this many wire bytes is summed by the direct exchange (comm::direct_allreduce_sum; across a
// hierarchy's groups, its step across them), a larger one around the ring. Flat:
// GRADEX_DENSE_COLLECTIVE=direct every bucket, ring none, auto and gather up to the agreed link
// model's LinkModel::dense_direct_max_bytes (none before the model is agreed). Across a hierarchy's
// groups on a latency-bound link every bucket between two groups (one swap: no incast, the ring's
// bytes, half its latencies), between more the model's maximum; elsewhere none.
uint64_t dense_direct_max_bytes(const EngineOptions& options, const LinkModel* link,
                                const comm::HostTopology* hosts);
// The 8-bit and 4-bit routes' one hop: flat only, up to LinkModel::quantized_one_hop_max_bytes.
uint64_t quantized_one_hop_max_bytes(const LinkModel* link, const comm::HostTopology* hosts);
// How many wire bytes of a round's dense gradients ride its DGC gather (sync/data/gather_rider.h):
// all with GRADEX_DENSE_COLLECTIVE=gather; under auto, on a latency-bound link, what
// LinkModel::rider_bytes allows; none across a hierarchy (it re-selects DGC payloads per host),
// before the link is agreed, or with ring/direct.
uint64_t rider_bytes(const EngineOptions& options, const LinkModel* link,
                     const comm::HostTopology* hosts);
// What the routes do on `link` (null: not agreed yet) for the planner (link_paths.cc), from the
// rules above and the gather's (SparseGather): the same numbers the routes decide by. A function
// of its arguments alone, which hold for a whole agreed model: the executor derives it once per
// model (AgreedLink::generation), not every round.
LinkPaths link_paths(const LinkModel* link, const EngineOptions& options,
                     const comm::HostTopology* hosts, bool receives_any_length);

}  // namespace gradex::sync::route
