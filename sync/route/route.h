// Routes: every path a tensor's bytes can take on the wire, one file each under sync/route/, behind
// one interface. Each job carries its path (pipeline::Job::path, sync/route/path.h), which only
// assign() writes; pipeline::plan packs units by it and the engine asks select() for a unit's
// route object and runs it.
//
// clang-format off
//   path                 file                     what travels
//   kDense               dense.cc                 fused allreduce on the dense wire type (fp32, or
//                                                 16-bit with GRADEX_FP16/BF16): ring, direct or
//                                                 hierarchical (sync/dense_exchange.h)
//   kDgcDenseStep        (rides kDense buckets)   a DGC tensor sent densely (its warm-up steps)
//   kDenseFp32           dense_fp32.cc            the auto policy's fp32 rung on a 16-bit wire
//   kInt8                int8.cc                  8-bit blocks with error feedback through
//                                                 comm::encoded_allreduce (sync/int8_exchange.h)
//   kInt4                int8.cc                  the same at 4 bits
//   kFirstAverage        first_average.cc         LocalSGD's first parameter average, fp32
//   kSparse              sparse.cc                DGC payloads in one allgatherv
//                                                 (sync/sparse_gather.h), and the dense
//                                                 gradients riding it (sync/gather_rider.h)
//   kSparseHierarchical  sparse_hierarchical.cc   DGC host sums re-selected per host, then
//                                                 gathered across hosts (GRADEX_HIERARCHICAL)
// clang-format on
//
// A route's transfer has four steps, run in order on the progress thread for one unit (one
// collective's worth of jobs, sync/pipeline.h): plan (collectives the route agrees on before the
// unit's bytes are counted: the link probe), prepare (work on the unit's values that must precede
// the collective), exchange (the collective), finish (per-job results and the unit's counters).
// The pipeline's own prepare and finish stages (momentum, DGC encode; decode, cast back) stay in
// engine_stages.cc.
#pragma once

#include <cstdint>

#include "base/config.h"
#include "comm/communicator.h"
#include "comm/topology/host_topology.h"
#include "sync/agreed_link.h"
#include "sync/options.h"
#include "sync/pipeline.h"
#include "sync/route/path.h"
#include "sync/sparse_gather.h"
#include "sync/tensor_state.h"

namespace gradex::sync {
class BackendPath;  // sync/backend_path.h
}

namespace gradex::sync::route {

// What a route reads and drives: the engine's state for the current membership.
struct Context {
  comm::Communicator& comm;
  BackendPath& path;     // every tensor's data work, through its backend
  SparseGather& gather;  // the DGC allgather
  AgreedLink& link;      // the membership's link model (sync/link_model.h)
  const EngineOptions& options;
  const config::Config& config;
  const comm::HostTopology* hosts;  // the layout when the hierarchical exchange is on, else null
  int world_size;
};

class Transfer {
 public:
  virtual ~Transfer() = default;
  virtual Path path() const = 0;
  virtual void plan(Context& ctx) const { (void)ctx; }
  virtual void prepare(pipeline::Unit& unit, Context& ctx) const { (void)unit, (void)ctx; }
  virtual void exchange(pipeline::Unit& unit, Context& ctx) const = 0;
  virtual void finish(pipeline::Unit& unit, Context& ctx) const { (void)unit, (void)ctx; }
};

// Sets a job's path from agreed data only (the work kind, the tensor's rung and anchor, whether
// this is a DGC sparse step, whether the dense wire is 16-bit: sync/policy.h), so that every rank
// cuts the same units.
void assign(pipeline::Job& job, const TensorState& tensor, bool sparse_step, bool half_on_wire);
// The path of one job (kDgcDenseStep for a DGC tensor's dense step): job.path.
Path path_of(const pipeline::Job& job);
// The path of a unit's collective: its jobs' (pipeline::plan never mixes paths in a unit), with
// kDgcDenseStep riding kDense and kSparse hierarchical when `hosts` is set.
Path path_of(const pipeline::Unit& unit, const comm::HostTopology* hosts);
// The route object of a unit's path_of(unit, hosts) (stateless, shared).
const Transfer& select(const pipeline::Unit& unit, const comm::HostTopology* hosts);

}  // namespace gradex::sync::route
