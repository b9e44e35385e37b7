#include "sync/engine.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "base/check.h"
#include "base/log.h"
#include "base/thread_pool.h"
#include "sync/agreement.h"
#include "sync/backend_path.h"
#include "sync/backend_tensor.h"
#include "sync/engine_internal.h"
#include "sync/exchange_layout.h"
#include "sync/policy_settings.h"
#include "sync/timeline/recorder.h"
#include "sync/timeline/traced_communicator.h"

namespace gradex::sync {
namespace {

using Clock = std::chrono::steady_clock;
using detail::work_name;

comm::CommOptions comm_options(const config::Config& c, const EngineOptions& o) {
  comm::CommOptions co = comm::comm_options_from_config(c);
  co.timeout = o.timeout;
  return co;
}

}  // namespace

Engine::Engine(config::Config config, std::shared_ptr<comm::Store> store, int rank, int world_size,
               uint32_t api_version)
    : config_(with_resolved_policy(std::move(config), rank == 0)),
      options_(engine_options_from_config(config_)),
      rank_(rank),
      world_size_(world_size),
      localsgd_(options_.localsgd_period, options_.localsgd_warmup_steps) {
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw InvalidArgument("rank " + std::to_string(rank) + " is not in [0, world size " +
                          std::to_string(world_size) + ")");
  path_ = std::make_unique<BackendPath>(config_, options_, world_size_);
  api_version_ = api_version;
  if (!options_.timeline_dir.empty()) {
    trace_ = std::make_unique<timeline::Recorder>(options_.timeline_dir, rank, world_size);
    trace_->name_row(timeline::kWaitRow, "framework waits on gradex");
  }
  connect(std::move(store), rank, world_size);
  // The worker pool is per process and sized once: by the first engine's GRADEX_THREADS.
  const int threads = static_cast<int>(config_.get_int("GRADEX_THREADS"));
  if (!configure_shared_pool(threads)) {
    GX_LOG(kWarn) << "GRADEX_THREADS=" << threads << " ignored: this process's worker pool "
                  << "already runs " << shared_pool().threads() << " threads";
  }
  thread_ = std::thread([this] { run(); });
}

void Engine::connect(std::shared_ptr<comm::Store> store, int rank, int world_size) {
  std::unique_ptr<comm::Communicator> comm = comm::create_ucx_communicator(
      std::move(store), rank, world_size, comm_options(config_, options_));
  // Every rank's options that must be equal are, or every rank stops here (sync/agreement.h).
  agreement::require_agreement(comm, config_, agreement::Scope::kEngine, api_version_);
  // The hierarchical exchange's groups (hosts, or regions measured here): collective, so at the
  // same point on every rank, before any unit.
  ExchangeLayout layout = exchange_layout(*comm, config_, options_);
  if (rank == 0) {
    GX_LOG(kInfo) << "exchange layout: " << layout.description;
  }
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
  std::lock_guard<std::mutex> lock(mutex_);
  ++connects_;
  exchanged_in_membership_.clear();
  comm_ = std::move(comm);
  traced_comm_ = traced;
  negotiator_ = std::move(negotiator);
  rank_ = rank;
  world_size_ = world_size;
  path_->set_world_size(world_size);
  policy_->on_reconfigure(world_size);
  // Layout and link model belong to the membership.
  hierarchy_ = std::move(layout.groups);
  layout_description_ = std::move(layout.description);
  sparse_gather_.reset();
  link_.reset();
}

std::string Engine::layout_description() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return layout_description_;
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
    if (leaving_) throw InvalidArgument("reconfigure: the engine is shut down");
    aborts_before = aborts_;
    // Submissions fail from here until the new membership is up.
    if (fatal_code_ == ErrorCode::kOk) {
      fatal_code_ = ErrorCode::kAborted;
      fatal_message_ = message + " (a reconfiguration is in progress)";
    }
    fail_in_flight(ErrorCode::kAborted, message);
    if (comm_) comm_->interrupt(ErrorCode::kAborted, message);
    wake_.signal();
  }
  if (thread_.joinable()) thread_.join();
  std::unique_ptr<comm::Communicator> old;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    negotiator_.reset();  // refers to the old communicator
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
    fatal_code_ = e.code();
    fatal_message_ = std::string("reconfiguration failed: ") + e.what();
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborts_ == aborts_before) {
      fatal_code_ = ErrorCode::kOk;
      fatal_message_.clear();
    }
  }
  GX_LOG(kInfo) << "reconfigured: rank " << rank << " of " << world_size;
  thread_ = std::thread([this] { run(); });
}

void Engine::abort(const std::string& reason) {
  const std::string message = "aborted (gradex_engine_abort): " + reason;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++aborts_;
    fatal_code_ = ErrorCode::kAborted;  // the caller's decision wins over an earlier failure
    fatal_message_ = message;
    fail_in_flight(ErrorCode::kAborted, message);
    if (comm_) comm_->interrupt(ErrorCode::kAborted, message);
    wake_.signal();
    cv_.notify_all();
  }
  GX_LOG(kWarn) << message;
  std::unique_lock<std::mutex> membership(membership_mutex_, std::try_to_lock);
  if (membership.owns_lock() && thread_.joinable()) thread_.join();
}

void Engine::fail_in_flight(ErrorCode code, const std::string& message) {
  for (auto& [id, h] : in_flight_) {
    Handle& handle = handles_[h];
    handle.done = true;
    handle.code = code;
    handle.message = work_name(id) + ": " + message;
  }
  in_flight_.clear();
  to_announce_.clear();
  cv_.notify_all();
}

int Engine::trace_row() const {
  return trace_->thread_row(std::this_thread::get_id() == trace_progress_thread_ ? "progress thread"
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
  auto it = tensors_.find(key);
  if (it != tensors_.end()) {
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
  path_->attach(t, cuda);
  GX_LOG(kDebug) << "registered '" << key << "' (" << numel << " x " << dtype_name(dtype)
                 << "): " << rung_name(t.policy.rung) << ", " << t.policy.reason;
  tensors_.emplace(key, std::move(t));
}

uint64_t Engine::enqueue(WorkKind kind, const std::string& key, void* data, bool device_call,
                         bool cuda, int device_index, void* stream, bool absent) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fatal_code_ != ErrorCode::kOk) throw Error(fatal_code_, fatal_message_);
  if (leaving_) throw InvalidArgument("the engine is shutting down");
  auto t = tensors_.find(key);
  if (t == tensors_.end())
    throw InvalidArgument("tensor '" + key + "' was never registered (gradex_register_tensor)");
  if (data == nullptr && t->second.numel > 0)
    throw InvalidArgument("tensor '" + key + "' submitted with a null data pointer");
  WorkId id{kind, key};
  if (absent && !localsgd_.exchanges_gradients(completed_steps_))
    throw InvalidArgument("tensor '" + key +
                          "' submitted absent during LocalSGD's local phase, which exchanges "
                          "nothing (join is not supported with LocalSGD)");
  if (in_flight_.count(id))
    throw InvalidArgument(work_name(id) +
                          " was submitted again before its previous exchange "
                          "completed");
  // Memory checks, the caller's stream, the handle's completion event. Parameter averages
  // (LocalSGD, every H steps) always take host memory, whatever the tensor's registration says.
  if (kind == WorkKind::kGradient)
    path_->on_submit(t->second, device_call && cuda, device_index, stream, next_handle_);
  uint64_t h = next_handle_++;
  Handle& handle = handles_[h];
  handle.id = id;
  handle.data = data;
  handle.clip_scale = step_clip_scale_;
  handle.absent = absent;
  if (kind == WorkKind::kGradient && !localsgd_.exchanges_gradients(completed_steps_)) {
    local_step(t->second, data, handle);  // LocalSGD's local phase: nothing is exchanged
    handle.done = true;
    return h;
  }
  in_flight_[id] = h;
  const Clock::time_point now = Clock::now();
  if (kind == WorkKind::kGradient) {
    policy_->on_submit(key);  // ready time
    timeline_.on_submit(key, now);
  }
  step_last_submit_ = now;
  if (trace_) {
    const TensorState& ts = t->second;
    trace_->instant(trace_->thread_row("framework thread"),
                    kind == WorkKind::kGradient ? "submit" : "submit parameters", now,
                    timeline::Args()
                        .add("key", key)
                        .add("bytes", ts.numel * dtype_size(ts.dtype))
                        .add("step", completed_steps_)
                        .add("codec", rung_name(ts.policy.rung)));
  }
  to_announce_.push_back({id, t->second.numel, t->second.dtype});
  wake_.signal();
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
    if (handle == 0 || handle >= next_handle_)
      throw InvalidArgument("unknown handle " + std::to_string(handle));
    auto it = handles_.find(handle);
    if (it != handles_.end() && !it->second.done)
      throw InvalidArgument("handle " + std::to_string(handle) +
                            " is not complete yet (call after gradex_wait, or after gradex_test "
                            "reported it done)");
  }
  // A host tensor's handle has nothing to order: its result was in place when it completed.
  path_->handle_event(handle, stream);
}

uint64_t Engine::average(const std::string& key, void* data) {
  return enqueue(WorkKind::kAverage, key, data);
}

void Engine::throw_handle_error(const Handle& h) const {
  throw Error(h.code, h.message);
}

void Engine::wait(uint64_t handle) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = handles_.find(handle);
  if (it == handles_.end())
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
  handles_.erase(it);
  if (trace_)
    trace_->span(trace_->thread_row("framework thread"), "wait", waited_from, Clock::now(),
                 timeline::Args().add("key", h.id.key));
  if (h.code != ErrorCode::kOk) throw_handle_error(h);
}

bool Engine::test(uint64_t handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = handles_.find(handle);
  if (it == handles_.end())
    throw InvalidArgument("unknown or already released handle " + std::to_string(handle));
  if (!it->second.done) return false;
  Handle h = std::move(it->second);
  handles_.erase(it);
  if (h.code != ErrorCode::kOk) throw_handle_error(h);
  return true;
}

void Engine::set_gradient_norm(double norm) {
  if (norm < 0) throw InvalidArgument("gradient norm must be >= 0, got " + std::to_string(norm));
  std::lock_guard<std::mutex> lock(mutex_);
  if (options_.clip_norm <= 0) return;
  step_clip_scale_ = clip_scale_for_norm(options_.clip_norm, world_size_, norm);
}

float Engine::step_clip_scale() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return step_clip_scale_;
}

bool Engine::end_step() {
  std::lock_guard<std::mutex> lock(mutex_);
  step_clip_scale_ = -1.0f;
  policy_->on_end_step();
  ++completed_steps_;
  stats_.steps = completed_steps_;
  const bool waited =
      step_last_submit_ != Clock::time_point{} && step_last_complete_ > step_last_submit_;
  if (waited)
    stats_.exposed_seconds +=
        std::chrono::duration<double>(step_last_complete_ - step_last_submit_).count();
  last_step_stats_ = stats_.minus(stats_at_last_step_);
  stats_at_last_step_ = stats_;
  stats_reporter_.after_step(config_, rank_, stats_);
  if (trace_) {
    // What the framework waited on gradex this step: from its last submission (the backward pass
    // has handed everything over) to the last completion, when that came later.
    const Clock::time_point now = Clock::now();
    if (waited)
      trace_->span(timeline::kWaitRow, "framework waits on gradex", step_last_submit_,
                   step_last_complete_,
                   timeline::Args()
                       .add("step", completed_steps_ - 1)
                       .add("bytes_sent", last_step_stats_.bytes_sent)
                       .add("tensors", last_step_stats_.tensors));
    trace_->instant(timeline::kWaitRow, "step end", now,
                    timeline::Args().add("step", completed_steps_ - 1));
    trace_->maybe_flush();
  }
  step_last_submit_ = step_last_complete_ = Clock::time_point{};
  return localsgd_.average_after(completed_steps_);
}

bool Engine::exchanges_gradients() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return localsgd_.exchanges_gradients(completed_steps_);
}

Stats Engine::stats(bool last_step) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_step ? last_step_stats_ : stats_;
}

AppliedPolicy Engine::applied_policy(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = tensors_.find(key);
  if (it == tensors_.end()) throw InvalidArgument("tensor '" + key + "' was never registered");
  return it->second.policy;
}

std::string Engine::with_own_size(const NegotiationFailure& f) const {
  // A mismatch found before this rank announced the key names only the ranks that had: add this
  // rank's own size, so every rank's message says what it submitted. Called with mutex_ held.
  const std::string own = "rank " + std::to_string(rank_) + ": ";
  auto t = tensors_.find(f.id.key);
  if (t == tensors_.end() || f.message.find(own) != std::string::npos || f.message.empty() ||
      f.message.back() != ')')
    return f.message;
  return f.message.substr(0, f.message.size() - 1) + ", " + own + std::to_string(t->second.numel) +
         " x " + dtype_name(t->second.dtype) + " (not yet announced))";
}

void Engine::complete(const WorkId& id, ErrorCode code, const std::string& message) {
  // Called with mutex_ held.
  auto it = in_flight_.find(id);
  if (it == in_flight_.end()) return;  // another rank's key this rank never submitted
  Handle& h = handles_[it->second];
  h.done = true;
  h.code = code;
  h.message = message;
  in_flight_.erase(it);
}

void Engine::fail_everything(ErrorCode code, const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fatal_code_ == ErrorCode::kOk) {
    fatal_code_ = code;
    fatal_message_ = message;
    GX_LOG(kError) << message;
  }
  for (auto& [id, h] : in_flight_) {
    Handle& handle = handles_[h];
    handle.done = true;
    handle.code = fatal_code_;
    handle.message = fatal_message_;
  }
  in_flight_.clear();
  to_announce_.clear();
  cv_.notify_all();
}

void Engine::take_announcements(std::vector<Announcement>& announce, bool& leaving) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (announce.empty()) {
    announce.swap(to_announce_);
  } else {
    announce.insert(announce.end(), to_announce_.begin(), to_announce_.end());
    to_announce_.clear();
  }
  leaving = leaving_;
}

void Engine::run() {
  trace_progress_thread_ = std::this_thread::get_id();
  // The longest single sleep: the thread then re-checks its deadlines (and lets the transport
  // progress) about once a second, which costs nothing measurable.
  constexpr auto kMaxSleep = std::chrono::milliseconds(1000);
  auto leave_deadline = Clock::time_point::max();
  bool announced_leaving = false;
  // GRADEX_TEST_FAIL_ROUND: tests make this rank fail on its own before this round.
  const int64_t fail_round = config_.get_int("GRADEX_TEST_FAIL_ROUND");
  int64_t rounds = 0;
  try {
    for (;;) {
      wake_.drain();  // before looking at the queue: a later enqueue() signals again
      std::vector<Announcement> announce;
      bool leaving = false;
      take_announcements(announce, leaving);
      finalize_announcements(announce);
      const auto now = Clock::now();
      // Others may still be finishing work that rank 0 aborts only after the timeout: wait longer.
      if (leaving && leave_deadline == Clock::time_point::max())
        leave_deadline = now + 2 * options_.timeout + std::chrono::seconds(5);
      if (leaving && now > leave_deadline) {
        GX_LOG(kWarn) << "leaving without every rank's agreement after twice GRADEX_TIMEOUT_S";
        break;
      }
      // A round of this rank's own: something to announce, its leaving to announce once (the last
      // rank to leave thereby starts the round in which all leave), or a deadline of rank 0's.
      const auto decide_at = negotiator_->next_decision();
      const bool own_round =
          !announce.empty() || (leaving && !announced_leaving) || now >= decide_at;
      if (!own_round) {
        // Nothing to do: sleep until enqueue()/shutdown() signal, a deadline, or another rank
        // starts the next round (its first message arrives), then join that round.
        const auto until = std::min({decide_at, leave_deadline, now + kMaxSleep});
        const auto max_sleep = std::chrono::ceil<std::chrono::milliseconds>(until - now);
        if (!comm_->wait_for_next_collective(wake_.fd(), max_sleep)) continue;
        take_announcements(announce, leaving);
        finalize_announcements(announce);
      }
      if (!announce.empty()) {
        const auto coalesce_from = Clock::now();
        coalesce_submissions(announce, leaving);
        // The timeline shows a wait for more submissions (a latency-bound link) as a phase.
        if (trace_ && Clock::now() - coalesce_from > std::chrono::microseconds(20))
          trace_->span(trace_row(), "coalesce", coalesce_from, Clock::now(),
                       timeline::Args().add("announced", static_cast<uint64_t>(announce.size())));
      }
      if (++rounds == fail_round)
        throw InternalError("failure injected before negotiation round " + std::to_string(rounds) +
                            " (GRADEX_TEST_FAIL_ROUND)");
      bool all_left = false;
      run_round(announce, leaving, all_left);
      announced_leaving = leaving;
      if (all_left) break;
    }
  } catch (const Error& e) {
    // Every failure of this thread ends here: the peers learn it at once (Communicator::abort;
    // nothing is sent when the failure came from a peer or was announced by the transport).
    comm_->abort(e.code(), e.what());
    fail_everything(e.code(), e.what());
    return;
  } catch (const std::exception& e) {
    const std::string message = std::string("progress thread: ") + e.what();
    comm_->abort(ErrorCode::kInternal, message);
    fail_everything(ErrorCode::kInternal, message);
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  cv_.notify_all();
}

void Engine::coalesce_submissions(std::vector<Announcement>& announce, bool& leaving) {
  const LinkModel* model = link_.model();
  if (model == nullptr || !model->latency_bound()) return;
  auto seconds = [](double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  };
  const auto quiet_limit =
      Clock::now() + seconds(std::min(kCoalesceMaxS, model->link().alpha_s * kCoalesceLatencyShare));
  const auto window = seconds(model->link().alpha_s * kCoalesceExpectLatencies);
  size_t seen = announce.size();
  while (!leaving) {
    const auto now = Clock::now();
    bool expecting = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      expecting = timeline_.expects_more(window, now);
    }
    if (!expecting && now >= quiet_limit) break;
    std::this_thread::sleep_for(kCoalesceQuiet);
    take_announcements(announce, leaving);
    const bool grew = announce.size() != seen;
    seen = announce.size();
    if (!grew && !expecting) break;
  }
  finalize_announcements(announce);
}

void Engine::finalize_announcements(std::vector<Announcement>& announce) {
  // A submission can be answered before it is announced: rank 0's timeout abort of its key, or a
  // mismatch verdict, completes the handle in the round during which it was queued. An aborted
  // key's entry is gone, and announcing it would leave an entry with no handle behind; a
  // mismatched key's entry waits for every rank's announcement, so it is announced all the same
  // (else the entry stays until rank 0's timeout abort, and every rank's shutdown waits that
  // long). Of a key resubmitted since, the newest announcement is the one that counts.
  std::lock_guard<std::mutex> lock(mutex_);
  std::map<WorkId, size_t> newest;
  for (size_t i = 0; i < announce.size(); ++i)
    newest[announce[i].id] = i;
  std::vector<Announcement> kept;
  kept.reserve(announce.size());
  for (size_t i = 0; i < announce.size(); ++i) {
    Announcement& a = announce[i];
    if (newest[a.id] != i) continue;
    if (!in_flight_.count(a.id) && !negotiator_->awaits_announcement(a.id)) continue;
    // A parameter average's counter says whether this rank holds a LocalSGD anchor (the first
    // average sends full values, later ones deltas): ranks that differ fail as a mismatch.
    if (a.id.kind == WorkKind::kAverage) a.step = tensors_.at(a.id.key).anchor.empty() ? 0 : 1;
    kept.push_back(std::move(a));
  }
  announce.swap(kept);
}

void Engine::run_round(std::vector<Announcement>& announce, bool leaving, bool& all_left) {
  const auto inspected_from = Clock::now();
  inspect(announce);
  const auto t0 = Clock::now();
  // The scan for NaN/Inf reads every announced gradient once: on a large model, milliseconds.
  if (trace_ && !announce.empty())
    trace_->span(trace_row(), "inspect", inspected_from, t0,
                 timeline::Args().add("announced", static_cast<uint64_t>(announce.size())));
  RoundResult r = negotiator_->round(announce, leaving);
  if (trace_) {
    // Every rank runs every round, in the same order: their numbers match across the ranks' files
    // (what `gradex-bench timeline` aligns the clocks on).
    const timeline::Args args = timeline::Args()
                                    .add("round", trace_rounds_)
                                    .add("announced", static_cast<uint64_t>(announce.size()))
                                    .add("ready", static_cast<uint64_t>(r.ready.size()));
    trace_->span(trace_row(), "negotiate", t0, Clock::now(), args);
    traced_comm_->drain("negotiation", timeline::Args().add("round", trace_rounds_));
    ++trace_rounds_;
  }
  if (!r.ready.empty()) {
    GX_LOG(kDebug) << "negotiation round: " << r.ready.size() << " ready in "
                   << std::chrono::duration<double, std::milli>(Clock::now() - t0).count() << " ms";
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.control_bytes = negotiator_->control_bytes();
    for (const auto& f : r.failed)
      complete(f.id, f.code, f.code == ErrorCode::kMismatch ? with_own_size(f) : f.message);
    if (!r.failed.empty()) cv_.notify_all();
  }
  if (!r.ready.empty()) execute(r.ready);
  // Leave only when nothing is pending anywhere: every rank reports leaving in the same round, and
  // leaving ranks submit nothing new, so outstanding keys can only be aborted ones (rank 0 starts
  // the round that aborts them at their deadline).
  all_left = r.all_leaving && negotiator_->outstanding() == 0;
}

std::unique_lock<std::mutex> Engine::wait_until_idle() {
  std::unique_lock<std::mutex> lock(mutex_);
  auto deadline = Clock::now() + options_.timeout + std::chrono::seconds(5);
  while (!in_flight_.empty()) {
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !in_flight_.empty())
      throw TimeoutError("save/load state", -1,
                         std::to_string(in_flight_.size()) + " exchanges still in flight");
  }
  return lock;
}

void Engine::shutdown() {
  std::lock_guard<std::mutex> membership(membership_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    leaving_ = true;
    if (!thread_.joinable()) return;
    wake_.signal();
  }
  thread_.join();
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [id, h] : in_flight_) {
    Handle& handle = handles_[h];
    handle.done = true;
    handle.code = ErrorCode::kInvalidArgument;
    handle.message = work_name(id) + " was still in flight when the engine shut down";
  }
  in_flight_.clear();
  cv_.notify_all();
}

}  // namespace gradex::sync
