// Engine::execute: one round's ready work, end to end. Gradients are prepared (gradex momentum for
// dense-policy tensors, a DGC step for DGC tensors: sparse, or dense when that is cheaper this
// step), exchanged (dense tensors fused into ring allreduces, sparse payloads in one allgatherv),
// then written back and their handles completed.
#include <algorithm>
#include <chrono>
#include <limits>

#include "base/check.h"
#include "base/log.h"
#include "sync/dense_exchange.h"
#include "sync/device_path.h"
#include "sync/engine.h"
#include "sync/engine_internal.h"
#include "sync/momentum.h"
#include "sync/sparse_exchange.h"

namespace gradex::sync {
namespace {

using Clock = std::chrono::steady_clock;
using detail::from_float;
using detail::to_float;
using detail::work_name;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks)
    s += (s.empty() ? "" : ", ") + std::to_string(r);
  return "[" + s + "]";
}

void fill_nan(void* data, DType dtype, uint64_t n) {
  if (dtype == DType::kFloat32) {
    std::fill_n(static_cast<float*>(data), n, std::numeric_limits<float>::quiet_NaN());
  } else {
    // A quiet NaN in either 16-bit format.
    const uint16_t nan = dtype == DType::kFloat16 ? 0x7e00u : 0x7fc0u;
    std::fill_n(static_cast<uint16_t*>(data), n, nan);
  }
}

}  // namespace

void Engine::execute(const std::vector<ReadyWork>& ready) {
  struct Job {
    WorkId id;
    TensorState* tensor;
    void* data;
    bool staged = false;  // the values travel in tensor->scratch (fp32) and are cast back after
    float clip = -1.0f;   // the step's clipping factor captured at submission (-1: none)
  };
  std::vector<Job> jobs;
  // Gradients that some rank found non-finite: excluded from the exchange on every rank, their
  // state untouched everywhere; the policy decides what every rank's caller gets.
  std::vector<std::pair<Job, const ReadyWork*>> skipped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const ReadyWork& w : ready) {
      auto f = in_flight_.find(w.id);
      GX_CHECK(f != in_flight_.end());  // ready means this rank announced it
      const Handle& handle = handles_[f->second];
      Job job{w.id, &tensors_.at(w.id.key), handle.data, false, handle.clip_scale};
      if (w.id.kind == WorkKind::kGradient) {
        if (w.steps_differed) {
          GX_LOG(kWarn) << "tensor '" << w.id.key << "': ranks announced different exchange "
                        << "counters (restored from different checkpoints?); all continue at "
                        << w.step;
        }
        job.tensor->step = w.step;
      }
      if (w.nonfinite_ranks.empty())
        jobs.push_back(job);
      else
        skipped.push_back({job, &w});
    }
  }

  // An fp32 view of a gradient: the caller's buffer itself, or the tensor's scratch for 16-bit
  // tensors (momentum and DGC are computed in fp32, before any cast to the wire type).
  auto fp32_values = [](Job& job) {
    TensorState& t = *job.tensor;
    if (t.dtype == DType::kFloat32) return static_cast<float*>(job.data);
    t.scratch.resize(t.numel);
    to_float(job.data, t.dtype, t.numel, t.scratch.data());
    job.staged = true;
    return t.scratch.data();
  };

  std::vector<DenseItem> dense, first_average;
  std::vector<SparseItem> sparse;
  std::vector<Job*> dense_jobs, first_average_jobs, sparse_jobs;
  // Buffers for LocalSGD deltas; stable addresses until the round ends.
  std::vector<std::vector<float>> deltas;
  deltas.reserve(jobs.size());
  uint64_t fallbacks = 0, sparse_count = 0, params = 0, dense_equivalent = 0;
  DeviceRound device_round;  // [device path] this round's device tensors
  auto t0 = Clock::now();
  for (Job& job : jobs) {
    TensorState& t = *job.tensor;
    dense_equivalent += ring_allreduce_bytes(t.numel * 4, world_size_);
    if (job.id.kind == WorkKind::kAverage) {
      ++params;
      if (t.anchor.empty()) {
        // First average: full values in fp32, which also establishes an identical anchor
        // everywhere.
        first_average.push_back({job.data, t.dtype, t.numel, false, &t.key});
        first_average_jobs.push_back(&job);
      } else {
        // Later averages send (parameters - anchor): small deltas lose far less in 16 bits.
        deltas.emplace_back(t.numel);
        to_float(job.data, t.dtype, t.numel, deltas.back().data());
        for (uint64_t i = 0; i < t.numel; ++i)
          deltas.back()[i] -= t.anchor[i];
        dense.push_back({deltas.back().data(), DType::kFloat32, t.numel, false, &t.key});
        dense_jobs.push_back(&job);
      }
      continue;
    }
    if (t.device) {  // [device path] momentum, clipping, DGC on the tensor's backend
      DeviceStep k = device_->prepare(t, job.data, job.clip, dense, sparse, device_round);
      (k == DeviceStep::kSparse ? sparse_jobs : dense_jobs).push_back(&job);
      sparse_count += k == DeviceStep::kSparse;
      fallbacks += k == DeviceStep::kDgcDense;
      continue;
    }
    if (t.policy.kind == ExchangeKind::kDense) {
      if (options_.momentum > 0 || options_.clip_norm > 0) {
        // gradex owns momentum on this path too: send u (Nesterov: g + m*u), keep u.
        float* values = fp32_values(job);
        const float scale = clip_factor(job.clip, values, t.numel);
        if (options_.momentum > 0 && t.momentum.size() != t.numel) t.momentum.assign(t.numel, 0.0f);
        apply_momentum(values, t.momentum.data(), t.numel,
                       {options_.momentum, options_.nesterov, scale});
        dense.push_back({values, DType::kFloat32, t.numel, false, &t.key});
      } else {
        dense.push_back({job.data, t.dtype, t.numel, false, &t.key});
      }
      dense_jobs.push_back(&job);
      continue;
    }
    float* values = fp32_values(job);
    const float scale = clip_factor(job.clip, values, t.numel);
    t.codec->set_step(t.step);
    if (sparse_is_cheaper(t.codec->density_at(t.step), world_size_)) {
      sparse.push_back({&t.key, t.codec.get(), values, scale});
      sparse_jobs.push_back(&job);
      ++sparse_count;
    } else {
      t.codec->dense_step(values, scale);
      dense.push_back({values, DType::kFloat32, t.numel, false, &t.key});
      dense_jobs.push_back(&job);
      ++fallbacks;
    }
  }
  for (Job& job : jobs)
    if (job.id.kind == WorkKind::kGradient) ++job.tensor->step;
  for (auto& [job, w] : skipped) {
    ++job.tensor->step;  // the exchange happened (skipped identically everywhere)
    const bool propagate = options_.nonfinite == NonFinitePolicy::kPropagate;
    if (job.tensor->device)  // [device path] NaN fill on the tensor's backend
      device_->skip(*job.tensor, job.data, propagate, device_round);
    else if (propagate)
      fill_nan(job.data, job.tensor->dtype, job.tensor->numel);
  }
  double prepare_seconds = seconds_since(t0);

  DenseExchangeOptions dense_options{options_.fusion_bytes, options_.half_on_wire,
                                     options_.half_type, options_.nonfinite};
  DenseCounters dc;
  uint64_t received_before = comm_->bytes_received();
  if (device_round.dense.empty())
    dense_average(*comm_, dense, dense_options, dc);
  else  // [device path] the same buckets; device tensors cast and staged on their backends
    device_->dense_average(*comm_, dense, device_round, dense_options, dc);
  if (!first_average.empty()) {
    DenseExchangeOptions fp32 = dense_options;
    fp32.half_on_wire = false;
    dense_average(*comm_, first_average, fp32, dc);
  }
  SparseCounters sc;
  if (!sparse.empty() && device_round.sparse.empty())
    sparse_average(*comm_, sparse, sc, options_.sparse_ring_for(world_size_));
  else if (!sparse.empty())  // [device path] the same message; device payloads staged
    device_->sparse_average(*comm_, sparse, device_round, sc,
                            options_.sparse_ring_for(world_size_));
  uint64_t received = comm_->bytes_received() - received_before;

  // Results back into the caller's buffers (16-bit tensors, LocalSGD anchors).
  auto t1 = Clock::now();
  size_t delta_index = 0;
  std::vector<std::pair<Job*, bool>> finished;  // job, result is non-finite
  for (size_t i = 0; i < dense_jobs.size(); ++i) {
    Job& job = *dense_jobs[i];
    TensorState& t = *job.tensor;
    if (job.id.kind == WorkKind::kAverage) {
      std::vector<float>& delta = deltas[delta_index++];
      for (uint64_t k = 0; k < t.numel; ++k)
        delta[k] += t.anchor[k];
      from_float(delta.data(), t.numel, t.dtype, job.data);
      to_float(job.data, t.dtype, t.numel, t.anchor.data());
    } else if (job.staged) {
      from_float(t.scratch.data(), t.numel, t.dtype, job.data);
    }
    finished.push_back({&job, dense[i].nonfinite_result});
  }
  for (size_t i = 0; i < first_average_jobs.size(); ++i) {
    Job& job = *first_average_jobs[i];
    TensorState& t = *job.tensor;
    t.anchor.resize(t.numel);
    to_float(job.data, t.dtype, t.numel, t.anchor.data());
    finished.push_back({&job, first_average[i].nonfinite_result});
  }
  for (size_t i = 0; i < sparse_jobs.size(); ++i) {
    Job& job = *sparse_jobs[i];
    TensorState& t = *job.tensor;
    if (job.staged) from_float(t.scratch.data(), t.numel, t.dtype, job.data);
    finished.push_back({&job, false});
  }
  device_->finish(device_round);  // [device path] completion events, before the handles
  double finish_seconds = seconds_since(t1);

  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [job, nonfinite] : finished) {
    ++job->tensor->exchanges;
    if (nonfinite && options_.nonfinite == NonFinitePolicy::kError)
      complete(job->id, ErrorCode::kInvalidArgument,
               work_name(job->id) +
                   " has NaN/Inf values in its average (a rank submitted "
                   "non-finite values and GRADEX_NONFINITE=error)");
    else
      complete(job->id, ErrorCode::kOk, "");
  }
  for (auto& [job, w] : skipped) {
    ++job.tensor->exchanges;
    if (options_.nonfinite == NonFinitePolicy::kError)
      complete(job.id, ErrorCode::kInvalidArgument,
               work_name(job.id) + " holds NaN/Inf values on ranks " +
                   rank_list(w->nonfinite_ranks) +
                   " (GRADEX_NONFINITE=error); no rank changed its state for it");
    else
      complete(job.id, ErrorCode::kOk, "");
  }
  stats_.tensors += jobs.size() + skipped.size();
  stats_.bytes_sent += dc.wire_bytes + sc.wire_bytes;
  stats_.bytes_received += received;
  stats_.dense_bytes += dense_equivalent;
  stats_.sparse_exchanges += sparse_count;
  stats_.dense_fallbacks += fallbacks;
  stats_.parameter_averages += params;
  stats_.staged_bytes = device_->staged_bytes();  // [device path]
  stats_.saturated += dc.saturated;
  stats_.compress_seconds += prepare_seconds + dc.cast_seconds + sc.compress_seconds;
  stats_.communicate_seconds += dc.communicate_seconds + sc.communicate_seconds;
  stats_.decode_seconds += sc.decode_seconds + finish_seconds;
  cv_.notify_all();
}

}  // namespace gradex::sync
