#include "outer/outer_optimizer.h"

#include <chrono>
#include <cstring>

#include "base/check.h"
#include "base/log.h"
#include "base/wall_time.h"
#include "comm/collectives.h"
#include "outer/codecs.h"
#include "outer/fragment_exchange.h"
#include "outer/fragments.h"
#include "outer/outer_job.h"
#include "sync/negotiation/agreement.h"

namespace gradex::outer {
namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

OuterOptimizer::OuterOptimizer(config::Config config, std::shared_ptr<comm::Store> store, int rank,
                               int world_size, uint32_t api_version)
    : config_(std::move(config)),
      options_(outer_options_from_config(config_)),
      rank_(rank),
      world_(world_size),
      api_version_(api_version) {
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw InvalidArgument("rank " + std::to_string(rank) + " of world size " +
                          std::to_string(world_size) + " is out of range");
  comm_ = comm::create_ucx_communicator(std::move(store), rank, world_size,
                                        comm::comm_options_from_config(config_));
  sync::agreement::require_agreement(comm_, config_, sync::agreement::Scope::kOuter, api_version_);
}

OuterOptimizer::~OuterOptimizer() {
  try {
    shutdown();
  } catch (const std::exception& e) {
    GX_LOG(kWarn) << "DiLoCo shutdown: " << e.what();
  }
}

void OuterOptimizer::add_tensor(const std::string& key, float* data, uint64_t numel,
                                bool is_buffer) {
  if (started_) throw InvalidArgument("DiLoCo: tensor '" + key + "' added after start()");
  if (key.empty()) throw InvalidArgument("DiLoCo: tensor key must not be empty");
  if (data == nullptr && numel > 0)
    throw InvalidArgument("DiLoCo: tensor '" + key + "' has a null data pointer");
  for (const auto& t : tensors_)
    if (t.key == key) throw InvalidArgument("DiLoCo: tensor '" + key + "' added twice");
  tensors_.push_back(Tensor{key, data, numel, is_buffer});
}

void OuterOptimizer::start() {
  if (started_) throw InvalidArgument("DiLoCo: start() called twice");
  begin(true);
}

void OuterOptimizer::start_local(uint64_t step) {
  if (started_) throw InvalidArgument("DiLoCo: start_local() after a start");
  begin(false);
  step_ = step;
}

void OuterOptimizer::begin(bool from_rank0) {
  if (!comm_) throw InvalidArgument("DiLoCo: start after a failed reconfiguration");
  std::vector<uint64_t> sizes;
  std::vector<Tensor*> params;
  for (auto& t : tensors_) {
    if (t.is_buffer) {
      t.offset = buffer_numel_;
      buffer_numel_ += t.numel;
      buffers_.push_back(&t);
    } else {
      sizes.push_back(t.numel);
      params.push_back(&t);
    }
  }
  std::vector<size_t> first = split_fragments(sizes, options_.fragments);
  for (int64_t f = 0; f < options_.fragments; ++f) {
    uint64_t n = 0;
    for (size_t i = first[static_cast<size_t>(f)]; i < first[static_cast<size_t>(f) + 1]; ++i) {
      params[i]->fragment = f;
      params[i]->offset = n;
      n += params[i]->numel;
    }
    fragments_.push_back(std::make_unique<FragmentExchange>(options_, f, n, rank_, world_));
  }
  // start(): rank 0's values everywhere, so the global copies start identical.
  for (auto& t : tensors_) {
    if (from_rank0 && t.numel > 0) comm::broadcast(*comm_, t.data, 4 * t.numel, 0);
    if (!t.is_buffer) {
      auto& g = fragments_[static_cast<size_t>(t.fragment)]->global();
      std::memcpy(g.data() + t.offset, t.data, 4 * t.numel);
    }
  }
  last_merge_.assign(static_cast<size_t>(options_.fragments), 0);
  // Statistics count the exchanges only, not this one-time broadcast (as DDP's is not counted).
  bytes_at_start_[0] = comm_->bytes_sent();
  bytes_at_start_[1] = comm_->bytes_received();
  started_ = true;
  worker_ = std::thread([this] { run_worker(); });
}

void OuterOptimizer::require_started(const char* what) const {
  if (!started_) throw InvalidArgument(std::string("DiLoCo: ") + what + " before start()");
  if (stopped_) throw InvalidArgument(std::string("DiLoCo: ") + what + " after shutdown()");
}

void OuterOptimizer::check_failed() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (failed_code_ != ErrorCode::kOk) throw Error(failed_code_, failed_message_);
}

int OuterOptimizer::step() {
  require_started("step()");
  check_failed();
  ++step_;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.steps;
  }
  int merged = 0;
  while (!pending_.empty() && pending_.front()->merge_step <= step_) {
    auto job = pending_.front();
    pending_.pop_front();
    finish(job);
    ++merged;
  }
  for (int64_t f : fragments_due(step_, options_.fragments, options_.period)) {
    launch(f, f == 0 && buffer_numel_ > 0);
    if (options_.delay == 0) {
      auto job = pending_.back();
      pending_.pop_back();
      finish(job);
      ++merged;
    }
  }
  return merged;
}

void OuterOptimizer::launch(int64_t fragment, bool with_buffers) {
  auto job = std::make_shared<Job>();
  job->fragment = fragment;
  job->launch_step = step_;
  job->merge_step = step_ + static_cast<uint64_t>(options_.delay);
  if (fragment >= 0) {
    job->local = local_of(fragment);
    job->values = fragments_[static_cast<size_t>(fragment)]->contribution(job->local);
  }
  if (with_buffers) {
    job->buffers.resize(buffer_numel_);
    for (const Tensor* t : buffers_)
      if (t->numel) std::memcpy(job->buffers.data() + t->offset, t->data, 4 * t->numel);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(job);
  }
  cv_.notify_all();
  pending_.push_back(job);
}

std::vector<float> OuterOptimizer::local_of(int64_t fragment) const {
  std::vector<float> local(fragments_[static_cast<size_t>(fragment)]->numel());
  for (const auto& t : tensors_)
    if (!t.is_buffer && t.fragment == fragment && t.numel)
      std::memcpy(local.data() + t.offset, t.data, 4 * t.numel);
  return local;
}

void OuterOptimizer::finish(const std::shared_ptr<Job>& job) {
  wait_for(job);
  merge(*job);
}

void OuterOptimizer::wait_for(const std::shared_ptr<Job>& job) {
  auto t0 = Clock::now();
  bool waited = false;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    // The worker completes or fails every job within the communicator's timeout.
    while (!job->done) {
      waited = true;
      cv_.wait(lock);
    }
    if (waited) {
      ++stats_.waits;
      stats_.wait_seconds += seconds_since(t0);
    }
    if (job->code != ErrorCode::kOk) throw Error(job->code, job->message);
  }
}

void OuterOptimizer::merge(const Job& job) {
  if (job.fragment >= 0) {
    fragments_[static_cast<size_t>(job.fragment)]->commit();
    const auto& g = fragments_[static_cast<size_t>(job.fragment)]->global();
    const float a = static_cast<float>(options_.mixing);
    for (auto& t : tensors_) {
      if (t.is_buffer || t.fragment != job.fragment || t.numel == 0) continue;
      if (a == 0.0f) {
        std::memcpy(t.data, g.data() + t.offset, 4 * t.numel);
      } else {
        for (uint64_t i = 0; i < t.numel; ++i)
          t.data[i] = (1.0f - a) * g[t.offset + i] + a * t.data[i];
      }
    }
    last_merge_[static_cast<size_t>(job.fragment)] = step_;
  }
  for (Tensor* t : buffers_)
    if (!job.buffers.empty() && t->numel)
      std::memcpy(t->data, job.buffers.data() + t->offset, 4 * t->numel);
  std::lock_guard<std::mutex> lock(mutex_);
  if (job.fragment >= 0) ++stats_.syncs;
}

void OuterOptimizer::drop_pending_after_failure() {
  // The worker completes every job within the communicator's timeout; after a failure, queued
  // ones fail at once without touching the network.
  std::unique_lock<std::mutex> lock(mutex_);
  for (const auto& job : pending_)
    cv_.wait(lock, [&] { return job->done; });
  pending_.clear();
}

void OuterOptimizer::synchronize() {
  require_started("synchronize()");
  check_failed();
  while (!pending_.empty()) {
    auto job = pending_.front();
    pending_.pop_front();
    finish(job);
  }
  if (buffer_numel_ > 0) {
    launch(-1, true);
    auto job = pending_.back();
    pending_.pop_back();
    finish(job);
  }
  for (auto& t : tensors_) {
    if (t.is_buffer || t.numel == 0) continue;
    const auto& g = fragments_[static_cast<size_t>(t.fragment)]->global();
    std::memcpy(t.data, g.data() + t.offset, 4 * t.numel);
  }
}

void OuterOptimizer::run_worker() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return quit_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = queue_.front();
      queue_.pop_front();
    }
    run_job(*job);
  }
}

void OuterOptimizer::run_job(Job& job) {
  auto t0 = Clock::now();
  ErrorCode code = ErrorCode::kOk;
  std::string message;
  uint64_t nonfinite = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    code = failed_code_;
    message = failed_message_;
  }
  if (code == ErrorCode::kOk) {
    try {
      if (job.fragment >= 0)
        nonfinite = fragments_[static_cast<size_t>(job.fragment)]->exchange(*comm_, job.values);
      if (!job.buffers.empty()) {
        Fp32Codec codec;
        const float P = static_cast<float>(world_);
        comm::encoded_allreduce(*comm_, codec, codec, job.buffers.data(), job.buffers.data(),
                                job.buffers.size(), [P](float* v, size_t n, size_t) {
                                  for (size_t i = 0; i < n; ++i)
                                    v[i] = v[i] / P;
                                });
      }
    } catch (const Error& e) {
      code = e.code();
      message = std::string("DiLoCo exchange of fragment ") + std::to_string(job.fragment) + ": " +
                e.what();
      GX_LOG(kError) << message;
    } catch (const std::exception& e) {
      code = ErrorCode::kInternal;
      message = std::string("DiLoCo exchange: ") + e.what();
      GX_LOG(kError) << message;
    }
    // The other ranks learn at once (nothing is sent when the failure came from a peer).
    if (code != ErrorCode::kOk) comm_->abort(code, message);
  }
  // The communicator's counters are only touched by this thread once the worker runs.
  const uint64_t sent = comm_->bytes_sent(), received = comm_->bytes_received();
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.bytes_sent = sent - bytes_at_start_[0];
  stats_.bytes_received = received - bytes_at_start_[1];
  job.done = true;
  job.code = code;
  job.message = message;
  if (code != ErrorCode::kOk && failed_code_ == ErrorCode::kOk) {
    failed_code_ = code;
    failed_message_ = message;
  }
  const uint64_t P = static_cast<uint64_t>(world_);
  const uint64_t n = job.values.size() + job.buffers.size();
  stats_.dense_bytes += P > 1 ? 2 * (P - 1) * 4 * n / P : 0;
  stats_.nonfinite += nonfinite;
  stats_.communicate_seconds += seconds_since(t0);
  cv_.notify_all();
}

std::vector<float> OuterOptimizer::global_of(const std::string& key) const {
  for (const auto& t : tensors_) {
    if (t.key != key) continue;
    if (t.is_buffer || !started_)
      throw InvalidArgument("DiLoCo: '" + key + "' has no global copy (a buffer, or not started)");
    const auto& g = fragments_[static_cast<size_t>(t.fragment)]->global();
    return std::vector<float>(g.begin() + static_cast<long>(t.offset),
                              g.begin() + static_cast<long>(t.offset + t.numel));
  }
  throw InvalidArgument("DiLoCo: no tensor '" + key + "'");
}

std::vector<uint64_t> OuterOptimizer::last_merge_steps() const {
  return last_merge_;
}

int64_t OuterOptimizer::fragment_of(const std::string& key) const {
  for (const auto& t : tensors_)
    if (t.key == key) return t.is_buffer ? -1 : t.fragment;
  throw InvalidArgument("DiLoCo: no tensor '" + key + "'");
}

OuterStats OuterOptimizer::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  OuterStats s = stats_;
  return s;
}

void OuterOptimizer::reconfigure(std::shared_ptr<comm::Store> store, int rank, int world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw InvalidArgument("DiLoCo reconfigure: rank " + std::to_string(rank) + " of world size " +
                          std::to_string(world_size) + " is out of range");
  if (stopped_) throw InvalidArgument("DiLoCo: reconfigure() after shutdown()");
  const std::string message = "DiLoCo: the membership changed (reconfiguration to rank " +
                              std::to_string(rank) + " of " + std::to_string(world_size) +
                              "): exchanges of the earlier membership were dropped";
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_code_ == ErrorCode::kOk) {
      failed_code_ = ErrorCode::kAborted;  // queued jobs fail without touching the network
      failed_message_ = message;
    }
    quit_ = true;
  }
  if (comm_) comm_->interrupt(ErrorCode::kAborted, message);  // the running job leaves now
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  pending_.clear();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.clear();
  }
  if (comm_) comm_->abort(ErrorCode::kAborted, message);
  comm_.reset();
  try {
    comm_ = comm::create_ucx_communicator(std::move(store), rank, world_size,
                                          comm::comm_options_from_config(config_));
    sync::agreement::require_agreement(comm_, config_, sync::agreement::Scope::kOuter,
                                       api_version_);
  } catch (const Error& e) {
    comm_.reset();
    std::lock_guard<std::mutex> lock(mutex_);
    failed_code_ = e.code();
    failed_message_ = std::string("DiLoCo reconfiguration failed: ") + e.what();
    throw;
  }
  rank_ = rank;
  world_ = world_size;
  for (auto& f : fragments_)
    f->set_membership(rank, world_size);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // The new communicator counts from 0; the statistics continue (modular arithmetic).
    bytes_at_start_[0] = comm_->bytes_sent() - stats_.bytes_sent;
    bytes_at_start_[1] = comm_->bytes_received() - stats_.bytes_received;
    failed_code_ = ErrorCode::kOk;
    failed_message_.clear();
    quit_ = false;
  }
  GX_LOG(kInfo) << "DiLoCo reconfigured: rank " << rank << " of " << world_size;
  if (started_) worker_ = std::thread([this] { run_worker(); });
}

void OuterOptimizer::shutdown() {
  if (stopped_) return;
  stopped_ = true;
  if (!worker_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    quit_ = true;
  }
  cv_.notify_all();
  worker_.join();  // runs what is queued first: every rank launched the same exchanges
  pending_.clear();
  bool failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    failed = failed_code_ != ErrorCode::kOk;
  }
  // Leave together, so that no rank tears its endpoints down under a peer's last messages.
  if (!failed) comm::barrier(*comm_);
}

}  // namespace gradex::outer
