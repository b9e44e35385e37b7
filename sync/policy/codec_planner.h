// GRADEX_POLICY=auto inside the engine: the cost model's observations, the
// agreed re-plans and the policy switches, behind a few calls from the engine.
//
// Agreement. Decisions depend only on data every rank has identically: rank 0's numbers (the
// Snapshot, broadcast at each re-plan), the shared options, and the agreed exchange counters of
// the round's ready gradients (the round's ready list is identical on every rank). Plans are made
// in Engine::Executor::execute:
//   - the first with the first ready gradients (step 0), from the start-up probe's link, the
//     codecs measured at start-up and the registered sizes and rows; no compute has been measured
//     yet, so it assumes none: every tensor compressed as far as the link requires, which is what
//     a slow link needs from step 1 (a blanket dense start costs up to 60x there, measured);
//   - a refinement at step min(4, GRADEX_POLICY_INTERVAL), once whole steps have been measured
//     (backward span, ready times, the gap to the next step): on a link that the compute hides,
//     it takes the compression back (fidelity first) after a few steps rather than after an
//     interval;
//   - then one at every multiple of GRADEX_POLICY_INTERVAL;
//   - and, over the first GRADEX_POLICY_RAMP_STEPS steps, one at each quarter of the fidelity
//     ramp (sync/policy/codec_choice.h), whose cap on DGC's sparsity rises there.
// Every rank is then in the same round and runs the same broadcast. A tensor takes the newest
// plan's choice at its first exchange and when its own counter enters a new epoch, i.e. at an
// agreed step of its own, before its units are planned, so every rank plans the same units.
//
// Switching keeps error feedback exact:
//   dense -> DGC      the tensor's momentum u moves into the new DGC state; the residual starts 0;
//   DGC -> DGC at s'  the whole DGC state (u, v, step) moves into a codec at the new sparsity;
//   DGC -> dense      the DGC state is kept and every later step is its dense step, which sends
//                     u + v and empties v (the residual is flushed through the dense path), then
//                     keeps u: an ordinary momentum step (compress/backend/dgc_codec.h:
//                     dense_step).
// The switches run on the tensor's own backend (BackendPath::switch_policy,
// sync/data/backend_path.h). CUDA tensors keep their registered (fixed) policy: their switches are
// not tested on a GPU yet.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/config.h"
#include "comm/communicator.h"
#include "sync/data/tensor_state.h"
#include "sync/engine/first_exchanges.h"
#include "sync/engine/options.h"
#include "sync/policy/agreed_link.h"
#include "sync/policy/codec_calibration.h"
#include "sync/policy/codec_choice.h"
#include "sync/policy/cost_model.h"
#include "sync/policy/link_probe.h"

namespace gradex::sync {

namespace pipeline {
struct Job;
struct Unit;
}  // namespace pipeline

// What the planner decided for a round (CodecPlanner::plan_round): the tensors whose policy
// changes before they are routed. The engine applies it under its lock (Engine::applied_policy
// and explain read the policies), keeping error feedback exact (BackendPath::switch_policy).
struct PolicySwitch {
  TensorState* tensor;
  AppliedPolicy to;
};
struct RoundDecision {
  std::vector<PolicySwitch> switches;
};

struct PlannerOptions {
  uint64_t interval = 20;  // GRADEX_POLICY_INTERVAL
  bool probe = true;       // GRADEX_POLICY_PROBE
  bool learn_link = true;  // GRADEX_POLICY_LEARN_LINK
  cost::ChoiceOptions choice;
};

class CodecPlanner {
 public:
  // Null for GRADEX_POLICY=fixed. ConfigError for an invalid GRADEX_POLICY_LADDER.
  static std::unique_ptr<CodecPlanner> create(const config::Config& config,
                                              const EngineOptions& options, int world_size);
  CodecPlanner(const config::Config& config, const EngineOptions& options, int world_size,
               PlannerOptions planner);

  // GRADEX_OPTIMIZER=adam (create calls it): the sparse rung becomes the Adam codec at
  // GRADEX_ADAM_SPARSITY in place of GRADEX_POLICY_LADDER's DGC rungs (none when it is 0); the
  // horizon rule is dropped while GRADEX_ADAM_DECAY < 1.
  static void adam_rungs(const EngineOptions& options, cost::ChoiceOptions& choice);

  // The policy a tensor has until its first exchange: an override's, else dense on the configured
  // wire; the first plan replaces it before anything is sent.
  AppliedPolicy initial_policy(const std::string& key) const;
  void on_register(const std::string& key, uint64_t numel, uint64_t rows);
  void on_submit(const std::string& key);
  void on_end_step();
  // A new membership (Engine::reconfigure; progress thread stopped): the link probe runs again
  // at the next plan_round, and the plan epochs restart so that every member, survivor or
  // newcomer, re-plans and applies the same plan at the same agreed step. Measurements are kept.
  void on_reconfigure(int world_size);
  // Any thread: the training's horizon learnt after creation (gradex_set_policy_horizon), `steps`
  // more exchange steps from the next one (0: none). The next plan_round with gradients makes
  // it absolute from their agreed step and re-plans there; every rank must call it alike before
  // submitting that step, so every rank re-plans in the same round.
  void set_horizon(uint64_t steps);
  // Progress thread: PolicySource::set_link_paths (the routes' rules, route::link_paths). The
  // timeline then plans the submissions within the window of a step's first as ready together
  // (coalesce_ready_times), and the plan prices dense tensors up to the size with the direct
  // exchange's latencies, DGC gathers without their size round where they skip it, and 8-bit and
  // 4-bit tensors up to the size with the one hop's (ChoiceOptions). Measured units are fitted as
  // they ran (pipeline::Unit::sample), not from these.
  void set_link_paths(const LinkPaths& paths) { link_paths_ = paths; }
  uint64_t horizon() const;
  // Whether the first plan probes the membership's link (GRADEX_POLICY_PROBE).
  bool probes_link() const { return planner_.probe; }
  // Progress thread not running or idle: the codecs' calibration, measure_startup's local part,
  // once per membership (PolicySource::calibrate_now).
  void calibrate_now();

  // Progress thread, the executor (Engine::Executor::execute), before routing `jobs` (this round's
  // ready work). Collective when due: the start-up measurement (measure_startup) at the first
  // call, an agreed re-plan at a new epoch. Returns the policy switches of the jobs whose tensors
  // enter an epoch, which the engine applies (BackendPath::switch_policy) before routing; nothing
  // here touches a tensor's state.
  RoundDecision plan_round(comm::Communicator& comm, AgreedLink& link,
                           const std::vector<pipeline::Job>& jobs);
  // Any thread, when a unit completes: its measured times feed the model.
  void observe_unit(const pipeline::Unit& unit);

  // The newest plan with predicted and measured times, the agreed numbers and this rank's
  // measured step tail (gradex_explain, gradex-bench plan).
  std::string explain() const;
  // This host's max(1, ranks / cores) once the first plan has probed (1 before): not agreed.
  double cpu_share() const { return startup_.cpu_share.load(); }

  // Test hook: called at each re-plan for every tensor of the plan with the plan's epoch; a rung
  // it returns replaces the model's choice (tests force switches on links that would not). Set
  // it before the first submission, identically on every rank.
  using ChoiceHook = std::function<std::optional<cost::Rung>(const std::string&, uint64_t)>;
  void set_choice_hook(ChoiceHook hook) { choice_hook_ = std::move(hook); }

 private:
  // The first call's measurements (collective): the codecs' calibration; the link agreed
  // (GRADEX_POLICY_PROBE; the link is the engine's AgreedLink, its host and flat tiers become the
  // cost model's priors) or the hosts gathered; the collective's peer class; the cores this
  // machine's ranks share.
  void measure_startup(comm::Communicator& comm, AgreedLink& link);
  // The first refinement's step (see above).
  static constexpr uint64_t kFirstRefineStep = 4;
  uint64_t first_refine() const;
  // Plan starts besides the multiples of the interval: first_refine and the fidelity ramp's
  // stage starts (cost::ramp_stage_starts), the horizon rule's (cost::horizon_stage_starts),
  // ascending.
  std::vector<uint64_t> extra_starts() const;
  // Plan epochs: a new one at every multiple of the interval and at every extra start.
  uint64_t epoch_of(uint64_t step) const;
  uint64_t epoch_start(uint64_t epoch) const;
  void replan(comm::Communicator& comm, uint64_t epoch);
  // The choice's inputs from `numbers`; with `rungs`, every tensor forced to its rung there (the
  // plan in force, re-predicted).
  std::vector<cost::TensorInput> inputs_of(const cost::Snapshot& numbers,
                                           const std::map<std::string, cost::Rung>* rungs) const;
  cost::ChoiceOptions choice_options(const cost::Snapshot& numbers) const;
  // What sync/policy/codec_calibration.h measures at start-up: this planner's settings.
  CalibrationSettings calibration() const;
  // A chosen rung as the policy it applies (sync/policy/policy.h: canonical_rung), with its reason.
  AppliedPolicy policy_for(const Rung& rung) const;
  std::optional<cost::Rung> forced_rung(const std::string& key) const;
  // The numbers a plan is made from (link, per-element costs, step, corrections), one line.
  std::string describe_numbers(const cost::Snapshot& numbers) const;

  config::Config config_;
  EngineOptions options_;
  int world_size_;
  PlannerOptions planner_;
  cost::CostModel model_;
  // Progress thread only:
  // What the start-up measured for this membership (plan_round' first call).
  struct Startup {
    bool probed = false;
    // The codecs' (calibrate_now, or measure_startup's first step); read by explain().
    std::atomic<bool> calibrated{false};
    cost::PeerClass link_class = cost::PeerClass::kSameHost;
    bool one_lane = false;  // this host: no more cores than ranks
    // This host: max(1, ranks / cores) (cost::Snapshot::cpu_share); set on the progress thread,
    // read by observe_unit on any.
    std::atomic<double> cpu_share{1.0};
  } startup_;
  // The plan in force: its epoch, whether one was made, each tensor's epoch of its last switch.
  struct Epochs {
    uint64_t plan = 0;
    bool planned = false;
    std::map<std::string, uint64_t> applied;
  } epochs_;
  std::map<std::string, cost::Rung> choice_;
  ChoiceHook choice_hook_;
  struct Horizon {
    // set_horizon's value until the progress thread applies it (-1: none pending).
    std::atomic<int64_t> pending{-1};
    std::atomic<uint64_t> steps{0};  // planner_.choice.horizon_steps, for explain()
  } horizon_;
  LinkPaths link_paths_;  // progress thread (set_link_paths; replan reads it)
  // Read by explain() from any thread:
  mutable std::mutex mutex_;
  cost::Plan plan_;
  cost::Snapshot agreed_;
  uint64_t plans_made_ = 0;
  std::map<std::string, double> measured_s_;  // per tensor, moving average
  // Exchanges that run a tensor's codec for the first time (plan_round marks them):
  // observe_unit keeps no record of their units.
  FirstExchanges first_exchanges_;
  // Units measured since the last plan (observe_unit), for Snapshot::codec_factor; bounded.
  static constexpr size_t kMaxUnitRecords = 4096;
  std::vector<cost::UnitRecord> unit_records_;
  cost::UnitMemory unit_memory_;  // progress thread only (replan)
};

// The auto policy's rungs beyond 16-bit under an Adam-family optimizer (EngineOptions::adam_codec).
// By default the 8-bit rung (every coordinate every step, 8-bit codes with error feedback) and not
// the Adam codec: at 100 Mbit/s on the race's held-out tasks under AdamW (two seeds each) the Adam
// codec ended 0.5-1.2 points below DDP's final accuracy and never reached it, where the 8-bit rung
// ended at most 0.5 below, reaching it in two of four runs 2.6-2.7x sooner than DDP, at 0.68-0.73x
// the codec's steps per second (docs/pytorch.md). The Adam codec is on the ladder when the user
// asks for it: its sparsity set (GRADEX_ADAM_SPARSITY, or GRADEX_SPARSITY for every codec), or the
// 8-bit rung turned off (GRADEX_POLICY_INT8=0); GRADEX_POLICY_INT8 as set when set. After 8-bit,
// the 4-bit rung (the same route at about half the bytes): on by default where the Adam codec is
// not on the ladder, GRADEX_POLICY_INT4 as set when set. In a single-process simulation of the
// race's held-out tasks (4 ranks' gradients, AdamW, 150 steps, two seeds) averaging through 4-bit
// error-feedback codes ended within 0.25 points of exact averaging, as 8-bit did.
struct AdamLadder {
  bool int8 = true;
  bool int4 = true;
  bool adam_codec = false;
};
AdamLadder adam_ladder(const config::Config& config);

// GRADEX_POLICY_FIDELITY_INT8 as the planner applies it: as set when set; by default on, except
// under an Adam-family optimizer (EngineOptions::adam_codec), where the 8-bit rung under the caps
// ended AdamW 1.1-1.4 points of final accuracy lower on the LAN race's held-out tasks.
bool fidelity_int8_enabled(const config::Config& config, const EngineOptions& options);

}  // namespace gradex::sync
