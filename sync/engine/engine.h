// The exchange engine: what a framework plugin drives each training step (through the C API).
// submit() queues a tensor and returns at once; a background thread negotiates readiness across
// ranks (sync/negotiation/negotiator.h), then exchanges ready tensors — dense ones fused, DGC ones
// sparse — and completes their handles. wait() is the only place a caller blocks. Any transport
// failure is sticky: every outstanding and later handle fails with the same message.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/config.h"
#include "base/error.h"
#include "comm/communicator.h"
#include "sync/data/tensor_state.h"
#include "sync/engine/localsgd.h"
#include "sync/engine/options.h"
#include "sync/engine/stats.h"
#include "sync/engine/stats_report.h"
#include "sync/engine/tensor_table.h"
#include "sync/policy/policy_source.h"

namespace gradex::sync {

class AgreedLink;     // sync/policy/agreed_link.h
class BackendPath;    // sync/data/backend_path.h
namespace timeline {  // sync/timeline/
class Recorder;
class TracedCommunicator;
}  // namespace timeline
namespace pipeline {  // sync/engine/pipeline.h
struct Job;
struct Unit;
}  // namespace pipeline

class Engine {
 public:
  // Collective: bootstraps and connects every rank through `store`. `api_version`: the version of
  // the API this engine is driven through, part of the start-up agreement
  // (sync/negotiation/agreement.h): capi/ passes GRADEX_API_VERSION; C++ callers that bypass the C
  // API (gradex-bench) keep 0, a value no C API release uses. `adopted_link`: a model agreed over
  // the same ranks and hosts (the delayed exchange's lanes get their delayed engine's), taken at
  // the start (when it holds one) instead of probing the link there; null: the engine agrees its
  // own.
  Engine(config::Config config, std::shared_ptr<comm::Store> store, int rank, int world_size,
         uint32_t api_version = 0, const AgreedLink* adopted_link = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  const config::Config& config() const { return config_; }
  const EngineOptions& options() const { return options_; }

  // `cuda`: the tensor's memory is CUDA device memory (submitted with submit_device). `rows`: the
  // tensor's output rows when the plugin knows its shape (0: unknown), for GRADEX_POLICY=auto's
  // per-row floor; InvalidArgument when it does not divide numel.
  void register_tensor(const std::string& key, uint64_t numel, DType dtype, bool cuda = false,
                       uint64_t rows = 0);
  uint64_t submit(const std::string& key, void* data);
  // A gradient in a device's memory (cuda) or host memory (!cuda), ready on `stream`
  // (the caller's cudaStream_t; null: the default stream). The handle completes once the average
  // is queued on gradex's stream; handle_event() orders the caller's stream after it.
  uint64_t submit_device(const std::string& key, void* data, bool cuda, int device_index,
                         void* stream);
  // Makes `stream` wait (on the device, never the host) for a completed device handle's result.
  // Valid after wait()/test() reported the handle done, until its tensor is submitted again.
  void handle_event(uint64_t handle, void* stream);
  // An absent contribution (a rank that has run out of data, gx.join): the exchange runs as for
  // submit()/submit_device() on every rank, in the same units and collectives, but this rank
  // contributes exact zeros (a DGC tensor an empty selection) and leaves the tensor's momentum
  // and DGC residual untouched; the exchange counter advances as for any exchange. `data` is
  // never read; it receives the average over all ranks (of which this one contributed nothing).
  // Never non-finite, never clipped. InvalidArgument during LocalSGD's local phase (there is no
  // exchange to be absent from).
  uint64_t submit_absent(const std::string& key, void* data, bool device_call = false,
                         bool cuda = false, int device_index = 0, void* stream = nullptr);
  // Host-memory gradients (submit, or submit_absent where `absent`) queued together: the progress
  // thread sees all of them or none, so they go into one negotiation round (the delay's lanes
  // submit a step's tensors at its end). Handles in the order given; on an error, those before
  // the failing one stay submitted.
  struct HostSubmission {
    const std::string* key;
    void* data;
    bool absent;
  };
  std::vector<uint64_t> submit_together(const std::vector<HostSubmission>& submissions);
  uint64_t average(const std::string& key, void* data);
  // Blocks until done; throws the handle's error. Releases the handle.
  void wait(uint64_t handle);
  // True (and releases the handle, throwing its error if it failed) when done.
  bool test(uint64_t handle);

  // GRADEX_CLIP_NORM > 0: this rank's L2 norm over every gradient it submits in the current step
  // (as clip_grad_norm_ computes it). Gradients submitted after this call, until end_step(), are
  // scaled by min(1, GRADEX_CLIP_NORM / sqrt(world size) / norm) before any momentum or residual
  // sees them. Without the call, each tensor is clipped by its own norm at the same limit. Ignored
  // when clipping is off. Throws InvalidArgument for a negative norm.
  void set_gradient_norm(double norm);
  // The clipping factor set_gradient_norm() fixed for this step, or -1 when none was set.
  float step_clip_scale() const;

  // Ends a step; returns whether LocalSGD wants the parameters averaged now.
  bool end_step();
  bool exchanges_gradients() const;
  Stats stats(bool last_step) const;
  // The policy chosen for a registered tensor (for tests and gradex-bench).
  AppliedPolicy applied_policy(const std::string& key) const;
  // Each tensor's codec with the reason; under GRADEX_POLICY=auto the newest plan with its
  // predicted and measured times (sync/policy/codec_planner.h). gradex_explain, gradex-bench plan.
  std::string explain() const;
  // The hierarchical exchange's layout for this membership, in words (sync/data/exchange_layout.h):
  // "flat (...)" or "hierarchical over regions (...)" / "... host(s) as groups".
  std::string layout_description() const;
  // GRADEX_POLICY=auto: `steps` more exchange steps from the next one (0: no horizon rule), set
  // identically on every rank before its next submissions (CodecPlanner::set_horizon). No effect
  // under GRADEX_POLICY=fixed.
  void set_policy_horizon(uint64_t steps);

  // Before this engine's first exchange: it takes `model` (another engine's agreed link model,
  // link_model_copy) instead of probing its own, for another membership over the same ranks (the
  // delayed exchange's lanes, sync/delay/delay_lanes.h, made on another thread while that engine
  // keeps exchanging). No effect when the copy holds no model.
  void adopt_link_model(const AgreedLink& model);
  // Before this engine's first exchange, from a thread off the steps' path (the lanes' start): the
  // auto planner's start-up measurements that need no peer (PolicySource::calibrate_now), which
  // its first plan would otherwise take inside that exchange. Waits until idle.
  void calibrate_policy();
  // A copy of this membership's agreed link model (empty when not probed yet); waits until idle.
  std::unique_ptr<AgreedLink> link_model_copy();
  // The agreed model's round trip between the farthest ranks (twice the flat tier's alpha), 0 when
  // not probed yet. The same on every rank.
  double link_round_trip_s();
  // Whether the agreed link model says latency-bound (sync/policy/link_model.h): 1 yes, 0 no, -1
  // not probed yet. The same on every rank.
  int link_latency_bound();
  // Before the probe: whether the round trips this membership's start measured (the regions'
  // discovery) already say latency-bound, as the probe will (it takes a long path's latency from
  // them): 1 yes, 0 no or not measured. The same on every rank; waits until idle.
  int start_latency_bound();
  // This host's ranks per core as GRADEX_POLICY=auto counted them (PolicySource::cpu_share; 1
  // under a fixed policy). Host-local, not agreed.
  double cpu_share() const;

  // The DGC residual of a sparse tensor (empty for dense ones): for tests and diagnostics.
  std::vector<float> residual_of(const std::string& key);
  // gradex's momentum buffer u of a tensor (DGC's u for DGC tensors; empty when GRADEX_MOMENTUM is
  // 0 or before the first exchange of a dense tensor): for tests and diagnostics.
  std::vector<float> momentum_of(const std::string& key);

  std::vector<uint8_t> save_state();
  void load_state(const uint8_t* data, size_t size);

  // Step transactions (torchft's commit protocol; sync/engine/engine_snapshot.cc). Both wait
  // for the exchanges in flight (bounded by the timeout). snapshot_state() records every
  // per-tensor value a step changes (DGC's complete state, dense momentum, exchange counter,
  // LocalSGD anchor) and the step count, into buffers kept from one snapshot to the next;
  // StateError after a fatal error (reconfigure first). rollback_state() restores the last
  // snapshot bit for bit (also after an abort or a peer failure: a failed step rolls back), so a
  // step that does not commit leaves the state as if it never ran; tensors registered since are
  // reset to their registration state. StateError without a snapshot, or when GRADEX_POLICY=auto
  // switched a tensor's policy since (nothing is changed then). Every rank must roll back the same
  // steps (their counters must agree). Statistics are not rolled back.
  void snapshot_state();
  void rollback_state();

  // Leaves the job: waits (bounded by the timeout) until every rank has left, then stops the
  // thread.
  void shutdown();

  // A new membership (torchft reconfigures its process group on every quorum change),
  // without destroying the engine. Collective over the NEW members: each calls it (a newcomer
  // creates its engine instead) with the same store namespace, which must not hold the keys of
  // an earlier membership (a new store or a new prefix). Every handle of the old membership still
  // in flight fails at once with kAborted; the old communicator is torn down (its peers get the
  // abort notice); a new one bootstraps through `store`; the start-up agreement
  // (sync/negotiation/agreement.h) runs again, and under GRADEX_POLICY=auto the link probe reruns
  // at the first exchange. What is kept, by tensor key: registrations and policies, DGC residuals
  // and momenta, dense momenta, exchange counters, LocalSGD anchors and the step count, the cost
  // model's measurements. What restarts: negotiation and its cache, the plan epochs of
  // GRADEX_POLICY=auto. A fatal error of the old membership (a dead peer, abort()) is cleared by a
  // successful reconfiguration unless abort() was called during it. On failure (bootstrap,
  // agreement) the engine stays failed with that error and may be reconfigured again.
  // InvalidArgument for a rank outside [0, world_size) or after shutdown(). Not concurrently with
  // itself or shutdown().
  void reconfigure(std::shared_ptr<comm::Store> store, int rank, int world_size);
  // Any thread, at any time: every handle in flight and every later submission fails with
  // kAborted carrying `reason`, within milliseconds (the progress thread leaves its current
  // collective within about 10 ms), and the peers learn it through the abort notice
  // (Communicator::abort): theirs fail the same way, naming this rank. When no reconfigure() or
  // shutdown() is running, returns after the progress thread has stopped (no buffer of a failed
  // handle is written afterwards). The engine stays usable for a later reconfigure().
  void abort(const std::string& reason);

 private:
  using Handle = TensorTable::Handle;
  // The progress loop (negotiation, coalescing: sync/engine/engine_progress.h) and the executor (a
  // round's units: sync/engine/engine_executor.h). Nested so that they reach the engine's shared
  // state (options, communicator, lock, statistics) without widening its interface.
  class ProgressLoop;
  class Executor;
  friend class ProgressLoop;
  friend class Executor;

  // The current step's accounting (mutex_).
  struct StepAccount {
    uint64_t completed = 0;
    float clip_scale = -1.0f;  // set_gradient_norm's factor for the current step; -1: none
    Stats stats;
    Stats at_last_step;
    Stats last_step;
    StatsReporter reporter;  // GRADEX_STATS_EVERY and the one-time warnings (end_step)
    // The step's last submission and last completion: what the framework waited on gradex
    // (Stats::exposed_seconds, the timeline's wait row).
    std::chrono::steady_clock::time_point last_submit{};
    std::chrono::steady_clock::time_point last_complete{};
  };
  // A fatal error: sticky until a reconfiguration (mutex_).
  struct Failure {
    ErrorCode code = ErrorCode::kOk;
    std::string message;
  };

  uint64_t enqueue(WorkKind kind, const std::string& key, void* data, bool device_call = false,
                   bool cuda = false, int device_index = 0, void* stream = nullptr,
                   bool absent = false);
  uint64_t enqueue_locked(WorkKind kind, const std::string& key, void* data, bool device_call,
                          bool cuda, int device_index, void* stream, bool absent);  // mutex_ held
  void fail_everything(ErrorCode code, const std::string& message);
  std::unique_lock<std::mutex> wait_until_idle();
  [[noreturn]] void throw_handle_error(const Handle& h) const;
  // Bootstraps the communicator of a membership (collective), proves the agreement, and installs
  // it with a fresh negotiator (engine creation and reconfigure()); it takes `adopted_link`
  // (the constructor's) or probes the link where the first plan would (probes_during_start).
  void connect(std::shared_ptr<comm::Store> store, int rank, int world_size,
               const AgreedLink* adopted_link = nullptr);
  // Whether the round trips the membership's start measured say latency-bound (no lock: the
  // link's known round trips change only in connect()).
  bool start_says_latency_bound() const;
  // Whether connect() probes the link when given none to adopt: several ranks and a policy whose
  // first plan would probe it (the probe is the same one the plan would run).
  bool probes_during_start() const;
  // With mutex_ held: every handle in flight completes with `code` and `message`.
  void fail_in_flight(ErrorCode code, const std::string& message);
  // Starts the progress thread (engine creation and reconfigure()).
  void start_progress();
  // The timeline's row for the calling thread: the progress thread's, or a worker's.
  int trace_row() const;
  friend struct EngineTestAccess;

  config::Config config_;
  EngineOptions options_;
  int rank_;
  int world_size_;
  uint32_t api_version_ = 0;  // for the start-up agreement of every membership
  // GRADEX_TIMELINE's recorder (null: off; every event site tests it once). Declared before comm_,
  // which refers to it while the timeline is on, so that it outlives it.
  std::unique_ptr<timeline::Recorder> trace_;
  std::unique_ptr<comm::Communicator> comm_;
  // comm_ itself when the timeline is on (it counts every peer's traffic), else null.
  timeline::TracedCommunicator* traced_comm_ = nullptr;
  // Every tensor's policy: GRADEX_POLICY's source (sync/policy/policy_source.h). Initialized here,
  // after config_, options_ and world_size_.
  std::unique_ptr<PolicySource> policy_ = PolicySource::create(config_, options_, world_size_);
  LocalSgdSchedule localsgd_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  // Held by reconfigure() and shutdown() for their whole work (they join the progress thread);
  // abort() joins it only when it can take it at once.
  std::mutex membership_mutex_;
  uint64_t aborts_ = 0;  // abort() calls so far (mutex_)
  Failure fatal_;
  StepAccount steps_;
  TensorTable table_;  // mutex_
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<ProgressLoop> loop_;
};

}  // namespace gradex::sync
