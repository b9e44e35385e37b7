// The engine's executor: what happens to a round's ready work once the negotiation agreed on it.
// It inspects what this rank announces, gives every job a route, cuts the round into units
// (sync/engine/pipeline.h) and runs them through their stages: prepare and finish
// (engine_stages.cc) on the worker pool or the progress thread, touching only their unit's tensors;
// transfer (the unit's route object, sync/route/) on the progress thread, the only caller of the
// communicator; complete_unit under the engine's lock. It owns what the units travel over in this
// membership: the hierarchical layout, the agreed link model, the sparse gather, and every tensor's
// backend work (sync/data/backend_path.h). Internal to the engine's source files.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "comm/topology/host_topology.h"
#include "sync/data/backend_path.h"
#include "sync/data/exchange_layout.h"
#include "sync/data/sparse_gather.h"
#include "sync/engine/engine.h"
#include "sync/engine/pipeline.h"
#include "sync/policy/agreed_link.h"

namespace gradex::sync {

class Engine::Executor {
 public:
  Executor(Engine& engine, const config::Config& config, const EngineOptions& options,
           int world_size);

  // A new membership's layout (hosts or regions, null: flat) and description; the link model and
  // the gather's choices restart.
  void on_connect(ExchangeLayout layout);

  // Fills in what this rank announces about its gradients: the exchange counter and whether the
  // gradient holds NaN/Inf (GRADEX_NONFINITE=zero replaces them here, before anything else).
  void inspect(std::vector<Announcement>& announce);
  // Runs a round's ready work to completion (progress thread).
  void execute(const std::vector<ReadyWork>& ready);
  // LocalSGD's local phase: the gradient stays on this rank, but gradex's momentum (and clipping)
  // still apply to it, in place, so that an optimizer at momentum 0 trains like SGD with momentum
  // in every phase. Called from enqueue with the engine's mutex held; completes `handle`.
  void local_step(TensorState& tensor, void* data, Handle& handle);

  BackendPath& path() { return *path_; }
  const AgreedLink& link() const { return link_; }
  AgreedLink& link() { return link_; }
  const std::string& layout_description() const { return layout_description_; }

 private:
  friend struct EngineTestAccess;
  const comm::HostTopology* hierarchy() const { return hierarchy_.get(); }
  // A sparse job appends its encoded payload to payload_out (the unit's message).
  void prepare(pipeline::Job& job, std::vector<uint8_t>& payload_out);
  void prepare_unit(pipeline::Unit& unit);
  // prepare(), with any error naming the job's tensor.
  void prepare_named(pipeline::Job& job, std::vector<uint8_t>& payload_out);
  // Runs the unit's route object (sync/route/route.h): plan, prepare, exchange, finish.
  void transfer(pipeline::Unit& unit);
  // True when a round's DGC tensors travel as one unit: on a latency-bound link (the agreed link
  // model: LinkModel::latency_bound), unless GRADEX_SPARSE_GROUP_MB was given.
  bool latency_bound_group() const;
  // What the routes do on the agreed link (route::link_paths, the planner's prices and the round's
  // riders), derived again only when the agreed model changes (AgreedLink::generation): once or
  // twice per membership, not every round.
  const LinkPaths& link_paths();
  // payloads: a sparse job's payload from every rank, in rank order (empty for dense jobs).
  void finish(pipeline::Job& job, const std::vector<std::pair<const uint8_t*, size_t>>& payloads);
  void finish_unit(pipeline::Unit& unit);
  void complete_unit(pipeline::Unit& unit);

  Engine& engine_;
  const config::Config& config_;  // the engine's
  const EngineOptions& options_;  // the engine's
  // Every tensor's data work, through the tensor's backend (sync/data/backend_path.h).
  std::unique_ptr<BackendPath> path_;
  // How DGC units travel (sync/data/sparse_gather.h): one round trip when small, direct or ring
  // above.
  SparseGather sparse_gather_;
  // The membership's one link model (sync/policy/link_model.h), probed the first time a decision
  // needs it; every route, the gather and the planner price through it.
  AgreedLink link_;
  LinkPaths link_paths_;                           // link_paths(), for link_paths_generation_
  std::optional<uint64_t> link_paths_generation_;  // none: not derived in this membership yet
  // The groups of the hierarchical exchange (hosts or regions, sync/data/exchange_layout.h) when it
  // is on for this membership, else null.
  std::unique_ptr<comm::HostTopology> hierarchy_;
  std::string layout_description_;
  // Memberships so far (1 until the first reconfigure()), and the tensors exchanged in the
  // current one (progress thread).
  uint64_t connects_ = 0;
  std::set<std::string> exchanged_in_membership_;
  // Test hook (tests/sync/engine_pipeline_test.cc, through EngineTestAccess): called on the
  // progress thread before each unit's transfer. Set it before the first submit.
  std::function<void(const pipeline::Unit&)> before_transfer_;
  // Test hook: called before each job's prepare, on the thread that prepares it (a worker when the
  // unit is spread over the pool). Set it before the first submit.
  std::function<void(const pipeline::Job&)> before_prepare_;
};

}  // namespace gradex::sync
