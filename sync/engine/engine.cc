#include "sync/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "base/check.h"
#include "base/log.h"
#include "base/thread_pool.h"
#include "sync/data/backend_path.h"
#include "sync/data/backend_tensor.h"
#include "sync/data/exchange_layout.h"
#include "sync/engine/engine_executor.h"
#include "sync/engine/engine_progress.h"
#include "sync/negotiation/agreement.h"
#include "sync/policy/policy_settings.h"
#include "sync/timeline/recorder.h"
#include "sync/timeline/traced_communicator.h"

namespace gradex::sync {
namespace {

using Clock = std::chrono::steady_clock;

comm::CommOptions comm_options(const config::Config& c, const EngineOptions& o) {
  comm::CommOptions co = comm::comm_options_from_config(c);
  co.timeout = o.timeout;
  return co;
}

}  // namespace

Engine::Engine(config::Config config, std::shared_ptr<comm::Store> store, int rank, int world_size,
               uint32_t api_version, const AgreedLink* adopted_link)
    : config_(with_resolved_policy(std::move(config), rank == 0)),
      options_(engine_options_from_config(config_)),
      rank_(rank),
      world_size_(world_size),
      localsgd_(options_.localsgd.period, options_.localsgd.warmup_steps) {
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw InvalidArgument("rank " + std::to_string(rank) + " is not in [0, world size " +
                          std::to_string(world_size) + ")");
  executor_ = std::make_unique<Executor>(*this, config_, options_, world_size_);
  loop_ = std::make_unique<ProgressLoop>(*this);
  api_version_ = api_version;
  if (!options_.timeline_dir.empty()) {
    trace_ = std::make_unique<timeline::Recorder>(options_.timeline_dir, rank, world_size);
    trace_->name_row(timeline::kWaitRow, "framework waits on gradex");
  }
  connect(std::move(store), rank, world_size, adopted_link);
  // The worker pool is per process and sized once: by the first engine's GRADEX_THREADS.
  const int threads = static_cast<int>(config_.get_int("GRADEX_THREADS"));
  if (!configure_shared_pool(threads)) {
    GX_LOG(kWarn) << "GRADEX_THREADS=" << threads << " ignored: this process's worker pool "
                  << "already runs " << shared_pool().threads() << " threads";
  }
  loop_->start();
}

void Engine::connect(std::shared_ptr<comm::Store> store, int rank, int world_size,
                     const AgreedLink* adopted_link) {
  const auto started = Clock::now();
  std::unique_ptr<comm::Communicator> comm = comm::create_ucx_communicator(
      std::move(store), rank, world_size, comm_options(config_, options_));
  const auto connected = Clock::now();
  // Every rank's options that must be equal are, or every rank stops here
  // (sync/negotiation/agreement.h).
  agreement::require_agreement(comm, config_, agreement::Scope::kEngine, api_version_);
  const auto agreed = Clock::now();
  // The hierarchical exchange's groups (hosts, or regions measured here): collective, so at the
  // same point on every rank, before any unit.
  ExchangeLayout layout = exchange_layout(*comm, config_, options_);
  const auto laid_out = Clock::now();
  if (rank == 0) GX_LOG(kInfo) << "exchange layout: " << layout.description;
  // GRADEX_TIMELINE: every later message is counted per peer (the start-up agreement and the
  // layout above belong to no step).
  timeline::TracedCommunicator* traced = nullptr;
  if (trace_) {
    auto wrapped = std::make_unique<timeline::TracedCommunicator>(std::move(comm), *trace_);
    traced = wrapped.get();
    comm = std::move(wrapped);
  }
  auto negotiator = std::make_unique<Negotiator>(*comm, options_.timeout);
  negotiator->set_stall_inspector(make_stall_inspector(config_, options_.timeout));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    comm_ = std::move(comm);
    traced_comm_ = traced;
    loop_->set_negotiator(std::move(negotiator));
    rank_ = rank;
    world_size_ = world_size;
    executor_->path().set_world_size(world_size);
    policy_->on_reconfigure(world_size);
    // Layout and link model belong to the membership.
    executor_->on_connect(std::move(layout));
    if (adopted_link != nullptr) executor_->link().adopt(*adopted_link);
  }
  // The auto policy's first plan agrees the link: a probe across hosts, tens of round trips on a
  // long path and on a LAN ~1 s of streams at line rate. It runs here, in the start, rather than
  // inside the first step: a plugin that starts the engine before the training's first backward
  // pass (gx.State given its DDP module and optimizer) overlaps it with whatever the process does
  // meanwhile, and a start in the first step costs the same either way. The progress thread has
  // not started (constructor) or is stopped (reconfigure), so the communicator is this thread's.
  // The codecs' calibration (CPU alone) joins the probe here: the first plan then only agrees its
  // numbers.
  const bool probed_here = adopted_link == nullptr && probes_during_start();
  auto probed = laid_out;
  if (probed_here) {
    executor_->link().agree(*comm_);
    probed = Clock::now();
    policy_->calibrate_now();
  }
  if (rank == 0) {
    // What the start costs, by part: across a WAN each is a chain of round trips.
    GX_LOG(kInfo) << "start: connected in " << log::ms_between(started, connected)
                  << " ms, options agreed in " << log::ms_between(connected, agreed)
                  << " ms, layout in " << log::ms_between(agreed, laid_out) << " ms"
                  << (probed_here ? ", link probed in " + log::ms_between(laid_out, probed) +
                                        (start_says_latency_bound() ? " ms (a long path)" : " ms") +
                                        ", codecs calibrated in " +
                                        log::ms_between(probed, Clock::now()) + " ms"
                                  : "");
  }
}

bool Engine::start_says_latency_bound() const {
  return executor_->link().known_farthest_round_trip_s() / 2 >= LinkModel::kLatencyBoundS;
}

bool Engine::probes_during_start() const {
  return world_size_ > 1 && policy_->probes_link();
}

std::string Engine::layout_description() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return executor_->layout_description();
}

void Engine::reconfigure(std::shared_ptr<comm::Store> store, int rank, int world_size) {
  if (store == nullptr) throw InvalidArgument("reconfigure: the store is NULL");
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw InvalidArgument("reconfigure: rank " + std::to_string(rank) +
                          " is not in [0, world size " + std::to_string(world_size) + ")");
  std::lock_guard<std::mutex> membership(membership_mutex_);
  const std::string message =
      "the membership changed (reconfiguration from rank " + std::to_string(rank_) + " of " +
      std::to_string(world_size_) + " to rank " + std::to_string(rank) + " of " +
      std::to_string(world_size) + "): work of the earlier membership was aborted";
  uint64_t aborts_before = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (loop_->leaving()) throw InvalidArgument("reconfigure: the engine is shut down");
    aborts_before = aborts_;
    // Submissions fail from here until the new membership is up.
    if (fatal_.code == ErrorCode::kOk) {
      fatal_.code = ErrorCode::kAborted;
      fatal_.message = message + " (a reconfiguration is in progress)";
    }
    fail_in_flight(ErrorCode::kAborted, message);
    if (comm_) comm_->interrupt(ErrorCode::kAborted, message);
    loop_->wake();
  }
  loop_->join();
  std::unique_ptr<comm::Communicator> old;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    loop_->set_negotiator(nullptr);  // refers to the old communicator
    old = std::move(comm_);
  }
  // The old peers learn it at once (nothing is sent when the old membership had failed already);
  // a failed communicator closes without the goodbye barrier, so teardown is bounded.
  if (old) old->abort(ErrorCode::kAborted, message);
  old.reset();
  try {
    connect(std::move(store), rank, world_size);
  } catch (const Error& e) {
    std::lock_guard<std::mutex> lock(mutex_);
    fatal_.code = e.code();
    fatal_.message = std::string("reconfiguration failed: ") + e.what();
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborts_ == aborts_before) {
      fatal_.code = ErrorCode::kOk;
      fatal_.message.clear();
    }
  }
  GX_LOG(kInfo) << "reconfigured: rank " << rank << " of " << world_size;
  loop_->start();
}

void Engine::abort(const std::string& reason) {
  const std::string message = "aborted (gradex_engine_abort): " + reason;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++aborts_;
    fatal_.code = ErrorCode::kAborted;  // the caller's decision wins over an earlier failure
    fatal_.message = message;
    fail_in_flight(ErrorCode::kAborted, message);
    if (comm_) comm_->interrupt(ErrorCode::kAborted, message);
    loop_->wake();
    cv_.notify_all();
  }
  GX_LOG(kWarn) << message;
  std::unique_lock<std::mutex> membership(membership_mutex_, std::try_to_lock);
  if (membership.owns_lock()) loop_->join();
}

void Engine::fail_in_flight(ErrorCode code, const std::string& message) {
  table_.fail_in_flight(code, ": " + message, true);
  loop_->drop_announcements();
  cv_.notify_all();
}

int Engine::trace_row() const {
  return trace_->thread_row(std::this_thread::get_id() == loop_->thread_id() ? "progress thread"
                                                                             : "worker");
}

Engine::~Engine() {
  try {
    shutdown();
  } catch (const std::exception& e) {
    GX_LOG(kWarn) << "engine shutdown: " << e.what();
  }
}

void Engine::register_tensor(const std::string& key, uint64_t numel, DType dtype, bool cuda,
                             uint64_t rows) {
  if (key.empty()) throw InvalidArgument("tensor key must not be empty");
  if (rows > 0 && numel % rows != 0)
    throw InvalidArgument("tensor '" + key + "': " + std::to_string(rows) +
                          " rows do not divide its " + std::to_string(numel) + " elements");
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = table_.tensors.find(key);
  if (it != table_.tensors.end()) {
    if (it->second.numel != numel || it->second.dtype != dtype)
      throw InvalidArgument("tensor '" + key + "' is already registered as " +
                            std::to_string(it->second.numel) + " x " +
                            dtype_name(it->second.dtype) + ", not " + std::to_string(numel) +
                            " x " + dtype_name(dtype));
    if (it->second.backend->cuda != cuda)
      throw InvalidArgument("tensor '" + key + "' is already registered in " +
                            (cuda ? "host" : "CUDA") + " memory");
    return;
  }
  TensorState t;
  t.key = key;
  t.numel = numel;
  t.dtype = dtype;
  t.rows = rows;
  t.policy = policy_->on_register(key, numel, rows, cuda);
  executor_->path().attach(t, cuda);
  GX_LOG(kDebug) << "registered '" << key << "' (" << numel << " x " << dtype_name(dtype)
                 << "): " << rung_name(t.policy.rung) << ", " << t.policy.reason;
  table_.tensors.emplace(key, std::move(t));
}

uint64_t Engine::enqueue(WorkKind kind, const std::string& key, void* data, bool device_call,
                         bool cuda, int device_index, void* stream, bool absent) {
  std::lock_guard<std::mutex> lock(mutex_);
  return enqueue_locked(kind, key, data, device_call, cuda, device_index, stream, absent);
}

std::vector<uint64_t> Engine::submit_together(const std::vector<HostSubmission>& submissions) {
  std::vector<uint64_t> handles;
  handles.reserve(submissions.size());
  std::lock_guard<std::mutex> lock(mutex_);
  for (const HostSubmission& s : submissions)
    handles.push_back(
        enqueue_locked(WorkKind::kGradient, *s.key, s.data, false, false, 0, nullptr, s.absent));
  return handles;
}

uint64_t Engine::enqueue_locked(WorkKind kind, const std::string& key, void* data, bool device_call,
                                bool cuda, int device_index, void* stream, bool absent) {
  if (fatal_.code != ErrorCode::kOk) throw Error(fatal_.code, fatal_.message);
  if (loop_->leaving()) throw InvalidArgument("the engine is shutting down");
  auto t = table_.tensors.find(key);
  if (t == table_.tensors.end())
    throw InvalidArgument("tensor '" + key + "' was never registered (gradex_register_tensor)");
  if (data == nullptr && t->second.numel > 0)
    throw InvalidArgument("tensor '" + key + "' submitted with a null data pointer");
  WorkId id{kind, key};
  if (absent && !localsgd_.exchanges_gradients(steps_.completed))
    throw InvalidArgument("tensor '" + key +
                          "' submitted absent during LocalSGD's local phase, which exchanges "
                          "nothing (join is not supported with LocalSGD)");
  if (table_.in_flight.count(id))
    throw InvalidArgument(work_name(id) +
                          " was submitted again before its previous exchange "
                          "completed");
  // Memory checks, the caller's stream, the handle's completion event. Parameter averages
  // (LocalSGD, every H steps) always take host memory, whatever the tensor's registration says.
  if (kind == WorkKind::kGradient)
    executor_->path().on_submit(t->second, device_call && cuda, device_index, stream,
                                table_.next_handle);
  const uint64_t h = table_.open(id, data, steps_.clip_scale, absent);
  Handle& handle = table_.handles[h];
  if (kind == WorkKind::kGradient && !localsgd_.exchanges_gradients(steps_.completed)) {
    executor_->local_step(t->second, data, handle);  // LocalSGD's local phase: nothing is exchanged
    handle.done = true;
    return h;
  }
  table_.in_flight[id] = h;
  const Clock::time_point now = Clock::now();
  if (kind == WorkKind::kGradient) {
    policy_->on_submit(key);  // ready time
    loop_->on_submit(key, now);
  }
  steps_.last_submit = now;
  if (trace_) {
    const TensorState& ts = t->second;
    trace_->instant(trace_->thread_row("framework thread"),
                    kind == WorkKind::kGradient ? "submit" : "submit parameters", now,
                    timeline::Args()
                        .add("key", key)
                        .add("bytes", ts.numel * dtype_size(ts.dtype))
                        .add("step", steps_.completed)
                        .add("codec", rung_name(ts.policy.rung)));
  }
  loop_->announce({id, t->second.numel, t->second.dtype});
  return h;
}

uint64_t Engine::submit(const std::string& key, void* data) {
  return enqueue(WorkKind::kGradient, key, data);
}
uint64_t Engine::submit_device(const std::string& key, void* data, bool cuda, int device_index,
                               void* stream) {
  if (device_index < 0)
    throw InvalidArgument("tensor '" + key + "': device index " + std::to_string(device_index) +
                          " is negative");
  return enqueue(WorkKind::kGradient, key, data, true, cuda, device_index, stream);
}

uint64_t Engine::submit_absent(const std::string& key, void* data, bool device_call, bool cuda,
                               int device_index, void* stream) {
  if (device_index < 0)
    throw InvalidArgument("tensor '" + key + "': device index " + std::to_string(device_index) +
                          " is negative");
  return enqueue(WorkKind::kGradient, key, data, device_call, cuda, device_index, stream, true);
}

void Engine::handle_event(uint64_t handle, void* stream) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (handle == 0 || handle >= table_.next_handle)
      throw InvalidArgument("unknown handle " + std::to_string(handle));
    auto it = table_.handles.find(handle);
    if (it != table_.handles.end() && !it->second.done)
      throw InvalidArgument("handle " + std::to_string(handle) +
                            " is not complete yet (call after gradex_wait, or after gradex_test "
                            "reported it done)");
  }
  // A host tensor's handle has nothing to order: its result was in place when it completed.
  executor_->path().handle_event(handle, stream);
}

uint64_t Engine::average(const std::string& key, void* data) {
  return enqueue(WorkKind::kAverage, key, data);
}

void Engine::throw_handle_error(const Handle& h) const {
  throw Error(h.code, h.message);
}

void Engine::wait(uint64_t handle) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = table_.handles.find(handle);
  if (it == table_.handles.end())
    throw InvalidArgument("unknown or already released handle " + std::to_string(handle));
  // The progress thread resolves every handle within the negotiation timeout (a missing peer makes
  // rank 0 abort the key) or fails it when the transport fails; the extra margin only guards
  // against a gradex bug turning into a hang.
  const Clock::time_point waited_from = Clock::now();
  auto deadline = waited_from + 2 * options_.timeout + std::chrono::seconds(30);
  while (!it->second.done) {
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !it->second.done)
      throw TimeoutError("wait for " + work_name(it->second.id), -1,
                         "not completed within twice GRADEX_TIMEOUT_S");
  }
  Handle h = std::move(it->second);
  table_.handles.erase(it);
  if (trace_)
    trace_->span(trace_->thread_row("framework thread"), "wait", waited_from, Clock::now(),
                 timeline::Args().add("key", h.id.key));
  if (h.code != ErrorCode::kOk) throw_handle_error(h);
}

bool Engine::test(uint64_t handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = table_.handles.find(handle);
  if (it == table_.handles.end())
    throw InvalidArgument("unknown or already released handle " + std::to_string(handle));
  if (!it->second.done) return false;
  Handle h = std::move(it->second);
  table_.handles.erase(it);
  if (h.code != ErrorCode::kOk) throw_handle_error(h);
  return true;
}

void Engine::set_gradient_norm(double norm) {
  if (norm < 0) throw InvalidArgument("gradient norm must be >= 0, got " + std::to_string(norm));
  std::lock_guard<std::mutex> lock(mutex_);
  if (options_.clip_norm <= 0) return;
  steps_.clip_scale = clip_scale_for_norm(options_.clip_norm, world_size_, norm);
}

float Engine::step_clip_scale() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return steps_.clip_scale;
}

bool Engine::end_step() {
  std::lock_guard<std::mutex> lock(mutex_);
  steps_.clip_scale = -1.0f;
  policy_->on_end_step();
  ++steps_.completed;
  steps_.stats.steps = steps_.completed;
  const bool waited =
      steps_.last_submit != Clock::time_point{} && steps_.last_complete > steps_.last_submit;
  if (waited)
    steps_.stats.exposed_seconds +=
        std::chrono::duration<double>(steps_.last_complete - steps_.last_submit).count();
  steps_.last_step = steps_.stats.minus(steps_.at_last_step);
  steps_.at_last_step = steps_.stats;
  steps_.reporter.after_step(config_, rank_, steps_.stats);
  if (trace_) {
    // What the framework waited on gradex this step: from its last submission (the backward pass
    // has handed everything over) to the last completion, when that came later.
    const Clock::time_point now = Clock::now();
    if (waited)
      trace_->span(timeline::kWaitRow, "framework waits on gradex", steps_.last_submit,
                   steps_.last_complete,
                   timeline::Args()
                       .add("step", steps_.completed - 1)
                       .add("bytes_sent", steps_.last_step.bytes_sent)
                       .add("tensors", steps_.last_step.tensors));
    trace_->instant(timeline::kWaitRow, "step end", now,
                    timeline::Args().add("step", steps_.completed - 1));
    trace_->maybe_flush();
  }
  steps_.last_submit = steps_.last_complete = Clock::time_point{};
  return localsgd_.average_after(steps_.completed);
}

bool Engine::exchanges_gradients() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return localsgd_.exchanges_gradients(steps_.completed);
}

Stats Engine::stats(bool last_step) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_step ? steps_.last_step : steps_.stats;
}

AppliedPolicy Engine::applied_policy(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return table_.at(key).policy;
}

void Engine::fail_everything(ErrorCode code, const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fatal_.code == ErrorCode::kOk) {
    fatal_.code = code;
    fatal_.message = message;
    GX_LOG(kError) << message;
  }
  table_.fail_in_flight(fatal_.code, fatal_.message, false);
  loop_->drop_announcements();
  cv_.notify_all();
}

std::unique_lock<std::mutex> Engine::wait_until_idle() {
  std::unique_lock<std::mutex> lock(mutex_);
  auto deadline = Clock::now() + options_.timeout + std::chrono::seconds(5);
  while (!table_.in_flight.empty()) {
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !table_.in_flight.empty())
      throw TimeoutError("save/load state", -1,
                         std::to_string(table_.in_flight.size()) + " exchanges still in flight");
  }
  return lock;
}

void Engine::shutdown() {
  std::lock_guard<std::mutex> membership(membership_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!loop_->leave()) return;
  }
  loop_->join();
  std::lock_guard<std::mutex> lock(mutex_);
  table_.fail_in_flight(ErrorCode::kInvalidArgument,
                        " was still in flight when the engine shut down", true);
  cv_.notify_all();
}

}  // namespace gradex::sync
