// Where every tensor's exchange policy comes from: one interface, two implementations, chosen
// once by GRADEX_POLICY. The engine calls the source at each point a policy may be decided or fed
// (registration, submission, step end, routing, unit completion, reconfiguration, state restore,
// explain) and never asks which one it holds.
//   FixedPolicySource  GRADEX_POLICY=fixed: the chain of sync/policy/policy.h, decided at
//                      registration and never changed; every other call is a no-op.
//   AutoPolicySource   GRADEX_POLICY=auto: the cost model's agreed plans
//                      (sync/policy/codec_planner.h).
// Both honour GRADEX_SPARSITY_OVERRIDES through the one matcher, override_policy
// (sync/policy/policy.h).
#pragma once

#include <memory>

// AutoPolicySource holds the planner; its header also declares what the interface names
// (pipeline::Job and Unit, the communicator, options and policy vocabulary).
#include "sync/policy/codec_planner.h"

namespace gradex::sync {

class PolicySource {
 public:
  // GRADEX_POLICY's source. ConfigError for an invalid GRADEX_POLICY_LADDER.
  static std::unique_ptr<PolicySource> create(const config::Config& config,
                                              const EngineOptions& options, int world_size);
  virtual ~PolicySource() = default;

  // Engine::register_tensor (state mutex held): the tensor's policy until a plan changes it.
  virtual AppliedPolicy on_register(const std::string& key, uint64_t numel, uint64_t rows,
                                    bool cuda) = 0;
  // Engine::enqueue, a gradient submitted for exchange (state mutex held).
  virtual void on_submit(const std::string& key) { (void)key; }
  // Engine::end_step (state mutex held).
  virtual void on_end_step() {}
  // Engine::reconfigure, a new membership (progress thread stopped).
  virtual void on_reconfigure(int world_size) { (void)world_size; }
  // Progress thread, before routing `jobs` (this round's ready work); may be collective. Returns
  // the policy switches the engine applies before routing (CodecPlanner::plan_round). `link`: the
  // membership's link model, agreed here when the source needs it.
  virtual RoundDecision plan_round(comm::Communicator& comm, AgreedLink& link,
                                   const std::vector<pipeline::Job>& jobs) {
    (void)comm, (void)link, (void)jobs;
    return {};
  }
  // Any thread, when a unit completes: its measured times.
  virtual void observe_unit(const pipeline::Unit& unit) { (void)unit; }
  // gradex_set_policy_horizon (CodecPlanner::set_horizon); no effect on a fixed source.
  virtual void set_horizon(uint64_t steps) { (void)steps; }
  // Progress thread, before each plan_round: what the engine does on the agreed link
  // (LinkPaths, sync/policy/codec_planner.h).
  virtual void set_link_paths(const LinkPaths& paths) { (void)paths; }
  // Engine::restore: whether a saved DGC state may be restored into a tensor that is dense now
  // (its dense steps then flush the residual), because a later plan may make it DGC again.
  virtual bool adopts_saved_codec(bool cuda) const = 0;
  // The head of Engine::explain, before the per-tensor lines.
  virtual std::string explain() const = 0;
  // This host's ranks per core, max(1, ranks / cores), as the auto planner counted them at its
  // probe (1: a fixed policy, or not probed yet). Host-local: callers agree it themselves.
  virtual double cpu_share() const { return 1.0; }
  // Whether the source's first plan agrees the membership's link (a probe across hosts): the
  // engine may then probe during its start instead (Engine::connect).
  virtual bool probes_link() const { return false; }
  // The start-up measurements that need no peer (the auto planner's codec calibration, tens of
  // milliseconds of CPU), taken now rather than inside the first plan's round, by a start that is
  // off the steps' path (Engine::connect's probe on a long path, the delayed exchange's lanes
  // connecting in the background). The progress thread is not running or idle. Once per
  // membership; no effect on a fixed source.
  virtual void calibrate_now() {}
};

class FixedPolicySource final : public PolicySource {
 public:
  explicit FixedPolicySource(const EngineOptions& options) : options_(options) {}
  AppliedPolicy on_register(const std::string& key, uint64_t numel, uint64_t rows,
                            bool cuda) override;
  bool adopts_saved_codec(bool) const override { return false; }
  std::string explain() const override;

 private:
  EngineOptions options_;
};

class AutoPolicySource final : public PolicySource {
 public:
  AutoPolicySource(const EngineOptions& options, std::unique_ptr<CodecPlanner> planner)
      : options_(options), planner_(std::move(planner)) {}
  // Host tensors start as CodecPlanner::initial_policy says; CUDA tensors keep the fixed chain's
  // policy (their switches are not exercised on a GPU yet).
  AppliedPolicy on_register(const std::string& key, uint64_t numel, uint64_t rows,
                            bool cuda) override;
  void on_submit(const std::string& key) override { planner_->on_submit(key); }
  void on_end_step() override { planner_->on_end_step(); }
  void on_reconfigure(int world_size) override { planner_->on_reconfigure(world_size); }
  RoundDecision plan_round(comm::Communicator& comm, AgreedLink& link,
                           const std::vector<pipeline::Job>& jobs) override {
    return planner_->plan_round(comm, link, jobs);
  }
  void observe_unit(const pipeline::Unit& unit) override { planner_->observe_unit(unit); }
  void set_horizon(uint64_t steps) override { planner_->set_horizon(steps); }
  void set_link_paths(const LinkPaths& paths) override { planner_->set_link_paths(paths); }
  // Host tensors start dense and a plan may make them DGC: a saved DGC state is adopted.
  bool adopts_saved_codec(bool cuda) const override { return !cuda; }
  std::string explain() const override;
  double cpu_share() const override { return planner_->cpu_share(); }
  bool probes_link() const override { return planner_->probes_link(); }
  void calibrate_now() override { planner_->calibrate_now(); }

  CodecPlanner& planner() { return *planner_; }  // tests: CodecPlanner::set_choice_hook

 private:
  EngineOptions options_;
  std::unique_ptr<CodecPlanner> planner_;
};

}  // namespace gradex::sync
