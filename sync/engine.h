// The exchange engine: what a framework plugin drives each training step (through the C API).
// submit() queues a tensor and returns at once; a background thread negotiates readiness across
// ranks (sync/negotiator.h), then exchanges ready tensors — dense ones fused, DGC ones sparse — and
// completes their handles. wait() is the only place a caller blocks. Any transport failure is
// sticky: every outstanding and later handle fails with the same message.
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
#include "comm/topology/host_topology.h"
#include "sync/agreed_link.h"
#include "sync/localsgd.h"
#include "sync/negotiator.h"
#include "sync/options.h"
#include "sync/policy_source.h"
#include "sync/sparse_gather.h"
#include "sync/stats.h"
#include "sync/stats_report.h"
#include "sync/submission_timeline.h"
#include "sync/tensor_state.h"
#include "sync/wake_event.h"

namespace gradex::sync {

class BackendPath;    // sync/backend_path.h
namespace timeline {  // sync/timeline/
class Recorder;
class TracedCommunicator;
}  // namespace timeline
namespace pipeline {  // sync/pipeline.h
struct Job;
struct Unit;
}  // namespace pipeline

class Engine {
 public:
  // Collective: bootstraps and connects every rank through `store`. `api_version`: the version of
  // the API this engine is driven through, part of the start-up agreement (sync/agreement.h):
  // capi/ passes GRADEX_API_VERSION; C++ callers that bypass the C API (gradex-bench) keep 0, a
  // value no C API release uses.
  Engine(config::Config config, std::shared_ptr<comm::Store> store, int rank, int world_size,
         uint32_t api_version = 0);
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
  // predicted and measured times (sync/codec_planner.h). gradex_explain, gradex-bench plan.
  std::string explain() const;
  // The hierarchical exchange's layout for this membership, in words (sync/exchange_layout.h):
  // "flat (...)" or "hierarchical over regions (...)" / "... host(s) as groups".
  std::string layout_description() const;
  // GRADEX_POLICY=auto: `steps` more exchange steps from the next one (0: no horizon rule), set
  // identically on every rank before its next submissions (CodecPlanner::set_horizon). No effect
  // under GRADEX_POLICY=fixed.
  void set_policy_horizon(uint64_t steps);

  // The DGC residual of a sparse tensor (empty for dense ones): for tests and diagnostics.
  std::vector<float> residual_of(const std::string& key);
  // gradex's momentum buffer u of a tensor (DGC's u for DGC tensors; empty when GRADEX_MOMENTUM is
  // 0 or before the first exchange of a dense tensor): for tests and diagnostics.
  std::vector<float> momentum_of(const std::string& key);

  std::vector<uint8_t> save_state();
  void load_state(const uint8_t* data, size_t size);

  // Step transactions (torchft's commit protocol; sync/engine_snapshot.cc). Both wait
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
  // abort notice); a new one bootstraps through `store`; the start-up agreement (sync/agreement.h)
  // runs again, and under GRADEX_POLICY=auto the link probe reruns at the first exchange. What is
  // kept, by tensor key: registrations and policies, DGC residuals and momenta, dense momenta,
  // exchange counters, LocalSGD anchors and the step count, the cost model's measurements.
  // What restarts: negotiation and its cache, the plan epochs of GRADEX_POLICY=auto. A fatal
  // error of the old membership (a dead peer, abort()) is cleared by a successful reconfiguration
  // unless abort() was called during it. On failure (bootstrap, agreement) the engine stays failed
  // with that error and may be reconfigured again. InvalidArgument for a rank outside
  // [0, world_size) or after shutdown(). Not concurrently with itself or shutdown().
  void reconfigure(std::shared_ptr<comm::Store> store, int rank, int world_size);
  // Any thread, at any time: every handle in flight and every later submission fails with
  // kAborted carrying `reason`, within milliseconds (the progress thread leaves its current
  // collective within about 10 ms), and the peers learn it through the abort notice
  // (Communicator::abort): theirs fail the same way, naming this rank. When no reconfigure() or
  // shutdown() is running, returns after the progress thread has stopped (no buffer of a failed
  // handle is written afterwards). The engine stays usable for a later reconfigure().
  void abort(const std::string& reason);

 private:
  struct Handle {
    WorkId id;
    void* data = nullptr;
    bool done = false;
    ErrorCode code = ErrorCode::kOk;
    std::string message;
    // The clipping factor of this gradient's step (-1: none given; clip by the tensor's own norm).
    float clip_scale = -1.0f;
    bool absent = false;  // submit_absent: this rank contributes zeros, its state untouched
  };
  uint64_t enqueue(WorkKind kind, const std::string& key, void* data, bool device_call = false,
                   bool cuda = false, int device_index = 0, void* stream = nullptr,
                   bool absent = false);
  // LocalSGD's local phase: the gradient stays on this rank, but gradex's momentum (and clipping)
  // still apply to it, in place, so that an optimizer at momentum 0 trains like SGD with momentum
  // in every phase. Called from enqueue with mutex_ held; completes `handle`.
  void local_step(TensorState& tensor, void* data, Handle& handle);
  // The progress thread. It runs a negotiation round only when this rank has something to
  // announce (a submission, its leaving) or to decide (rank 0's deadlines: Negotiator::
  // next_decision), and otherwise sleeps until one of those or until another rank starts a round,
  // which it then joins (Communicator::wait_for_next_collective): an idle engine costs no CPU.
  void run();
  // Moves what enqueue() queued into `announce` (appending) and reads leaving_.
  void take_announcements(std::vector<Announcement>& announce, bool& leaving);
  // Removes announcements whose handle was answered before they went out (and all but the newest
  // of a key's), and marks parameter averages with this rank's LocalSGD anchor presence.
  // On a latency-bound link (the agreed link model) every negotiation round costs a round trip:
  // submissions arriving together (a framework handing over a step's tensors one call after
  // another) join the round of the first, the thread waiting while new ones keep coming (a quiet
  // kCoalesceQuiet ends it), at most kCoalesceLatencyShare of the latency and kCoalesceMaxS.
  // Beyond that it also waits for the groups that the previous step says come soon
  // (SubmissionTimeline: the keys submitted there within kCoalesceExpectLatencies message
  // latencies of the step's first submission), at most that long after this step's first (the
  // auto policy's timeline plans with the same grouping: coalesce_ready_times). Elsewhere a round
  // starts at once.
  void coalesce_submissions(std::vector<Announcement>& announce, bool& leaving);
  static constexpr double kCoalesceMaxS = 2e-3;
  static constexpr double kCoalesceLatencyShare = 0.1;
  static constexpr std::chrono::microseconds kCoalesceQuiet{250};
  void finalize_announcements(std::vector<Announcement>& announce);
  // One round (all ranks in lockstep) and the execution of what became ready; `all_left` when
  // every rank left in this round with nothing outstanding.
  void run_round(std::vector<Announcement>& announce, bool leaving, bool& all_left);
  // Fills in what this rank announces about its gradients: the exchange counter and whether the
  // gradient holds NaN/Inf (GRADEX_NONFINITE=zero replaces them here, before anything else).
  void inspect(std::vector<Announcement>& announce);
  void execute(const std::vector<ReadyWork>& ready);
  void complete(const WorkId& id, ErrorCode code, const std::string& message);
  std::string with_own_size(const NegotiationFailure& f) const;
  void fail_everything(ErrorCode code, const std::string& message);
  std::unique_lock<std::mutex> wait_until_idle();
  [[noreturn]] void throw_handle_error(const Handle& h) const;
  // Bootstraps the communicator of a membership (collective), proves the agreement, and installs
  // it with a fresh negotiator (engine creation and reconfigure()).
  void connect(std::shared_ptr<comm::Store> store, int rank, int world_size);
  // With mutex_ held: every handle in flight completes with `code` and `message`.
  void fail_in_flight(ErrorCode code, const std::string& message);

  // execute()'s pipeline stages (sync/pipeline.h). prepare and finish run on any thread (the
  // worker pool or the progress thread) and touch only their unit's tensors; transfer runs on the
  // progress thread (the only caller of comm_); complete_unit takes mutex_.
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
  // How many wire bytes of a round's dense gradients ride its DGC gather (sync/gather_rider.h):
  // all with GRADEX_DENSE_COLLECTIVE=gather; under auto, on a latency-bound link, what
  // LinkModel::rider_bytes allows; none on the hierarchical exchange or with ring/direct.
  uint64_t rider_bytes() const;
  // payloads: a sparse job's payload from every rank, in rank order (empty for dense jobs).
  void finish(pipeline::Job& job, const std::vector<std::pair<const uint8_t*, size_t>>& payloads);
  void finish_unit(pipeline::Unit& unit);
  void complete_unit(pipeline::Unit& unit);
  // Test hook (tests/sync/engine_pipeline_test.cc, through EngineTestAccess): called on the
  // progress thread before each unit's transfer. Set it before the first submit.
  std::function<void(const pipeline::Unit&)> before_transfer_;
  // Test hook: called before each job's prepare, on the thread that prepares it (a worker when the
  // unit is spread over the pool). Set it before the first submit.
  std::function<void(const pipeline::Job&)> before_prepare_;
  friend struct EngineTestAccess;

  config::Config config_;
  EngineOptions options_;
  int rank_;
  int world_size_;
  // GRADEX_TIMELINE's recorder (null: off; every event site tests it once). Declared before comm_,
  // which refers to it while the timeline is on, so that it outlives it.
  std::unique_ptr<timeline::Recorder> trace_;
  std::unique_ptr<comm::Communicator> comm_;
  // comm_ itself when the timeline is on (it counts every peer's traffic), else null.
  timeline::TracedCommunicator* traced_comm_ = nullptr;
  // The timeline's row for the calling thread: the progress thread's, or a worker's.
  int trace_row() const;
  // The current step's last submission and last completion (mutex_): what the framework waited
  // on gradex (Stats::exposed_seconds, the timeline's wait row). Negotiation rounds so far, for
  // the timeline (progress thread).
  std::chrono::steady_clock::time_point step_last_submit_{};
  std::chrono::steady_clock::time_point step_last_complete_{};
  uint64_t trace_rounds_ = 0;
  std::thread::id trace_progress_thread_;  // set by run() before its first round
  // The groups of comm_'s hierarchical exchange (hosts or regions, sync/exchange_layout.h) when
  // it is on for this membership, else null; set by connect().
  std::unique_ptr<comm::HostTopology> hierarchy_;
  std::string layout_description_;
  const comm::HostTopology* hierarchy() const { return hierarchy_.get(); }
  std::unique_ptr<Negotiator> negotiator_;
  // How DGC units travel (sync/sparse_gather.h): one round trip when small, direct or ring above.
  SparseGather sparse_gather_{options_.sparse_collective};
  // The membership's one link model (sync/link_model.h), probed the first time a decision needs
  // it; every route, the gather and the planner price through it.
  AgreedLink link_{options_.port_queue_s, options_.port_queue_explicit};
  // Every tensor's data work, through the tensor's backend (sync/backend_path.h).
  std::unique_ptr<BackendPath> path_;
  // Every tensor's policy: GRADEX_POLICY's source (sync/policy_source.h). Initialized here, after
  // config_, options_ and world_size_.
  std::unique_ptr<PolicySource> policy_ = PolicySource::create(config_, options_, world_size_);
  LocalSgdSchedule localsgd_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  // Wakes the progress thread (enqueue, shutdown): it sleeps on this fd and the transport's events.
  WakeEvent wake_;
  std::map<std::string, TensorState> tensors_;
  std::map<uint64_t, Handle> handles_;
  std::map<WorkId, uint64_t> in_flight_;  // work id -> handle
  std::vector<Announcement> to_announce_;
  SubmissionTimeline timeline_;  // this rank's gradient submissions (coalesce_submissions)
  uint64_t next_handle_ = 1;
  uint64_t completed_steps_ = 0;
  float step_clip_scale_ = -1.0f;  // set_gradient_norm's factor for the current step; -1: none
  Stats stats_;
  Stats stats_at_last_step_;
  Stats last_step_stats_;
  StatsReporter stats_reporter_;  // GRADEX_STATS_EVERY and the one-time warnings (end_step)
  bool leaving_ = false;
  // Held by reconfigure() and shutdown() for their whole work (they join thread_); abort() joins
  // thread_ only when it can take it at once.
  std::mutex membership_mutex_;
  uint64_t aborts_ = 0;  // abort() calls so far (mutex_)
  // Memberships so far (1 until the first reconfigure()), and the tensors exchanged in the
  // current one (progress thread).
  uint64_t connects_ = 0;
  uint32_t api_version_ = 0;  // for the start-up agreement of every membership
  std::set<std::string> exchanged_in_membership_;
  ErrorCode fatal_code_ = ErrorCode::kOk;
  std::string fatal_message_;
  std::thread thread_;

  // snapshot_state()'s buffers (mutex_).
  struct TensorSnapshot {
    bool taken = false;
    bool sparse = false;  // the tensor's codec was sparse (a switch since refuses the rollback)
    bool has_dgc = false;
    bool in_state = false;     // the DGC state keeps its own snapshot (BackendPath::snapshot_dgc)
    std::vector<uint8_t> dgc;  // else DGC's state blob (BackendPath::save_dgc)
    std::vector<float> momentum;  // a dense tensor's u (empty: none yet)
    std::vector<float> anchor;
    std::vector<float> int8_residual, int8_owner_residual;  // the 8-bit route's (empty: none)
    int int8_world = 0;
    uint64_t int8_layout = 0;
    uint64_t step = 0;
    uint64_t exchanges = 0;
  };
  struct Snapshot {
    bool valid = false;
    std::map<std::string, TensorSnapshot> tensors;
    uint64_t completed_steps = 0;
    float step_clip_scale = -1.0f;
  };
  Snapshot snapshot_;
};

}  // namespace gradex::sync
