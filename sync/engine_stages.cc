// The per-tensor work of the engine's pipeline stages (sync/pipeline.h): prepare (a gradient's
// clipping, momentum and DGC step on its backend, sync/backend_path.h; LocalSGD deltas) and finish
// (every rank's payload summed, casts back into the caller's buffer, LocalSGD anchors), and the
// framing of a DGC unit's message (compress/wire/message.h). These run on the worker pool or on
// the progress thread and touch only their own job's tensor.
#include <chrono>
#include <cstring>

#include "base/check.h"
#include "base/error.h"
#include "base/thread_pool.h"
#include "compress/wire/message.h"
#include "sync/backend_path.h"
#include "sync/engine.h"
#include "sync/engine_internal.h"
#include "sync/pipeline.h"

namespace gradex::sync {
namespace {

using Clock = std::chrono::steady_clock;
using detail::from_float;
using detail::to_float;
using detail::work_name;
using pipeline::Job;
using pipeline::Route;
using pipeline::Unit;
namespace wire = compress::wire;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

void Engine::prepare(Job& job, std::vector<uint8_t>& payload_out) {
  TensorState& t = *job.tensor;
  if (job.route == Route::kFirstAverage) {
    // Full values in fp32, which also establishes an identical anchor everywhere.
    job.values = job.data;
    job.values_dtype = t.dtype;
    return;
  }
  if (job.id.kind == WorkKind::kAverage) {
    // Later averages send (parameters - anchor): small deltas lose far less in 16 bits. A value
    // equal to its anchor sends 0 even when it is infinite (an attention mask's -inf buffer), where
    // the subtraction would give NaN; for finite values x - x is +0 anyway.
    job.delta.resize(t.numel);
    to_float(job.data, t.dtype, t.numel, job.delta.data());
    for (uint64_t i = 0; i < t.numel; ++i)
      job.delta[i] = job.delta[i] == t.anchor[i] ? 0.0f : job.delta[i] - t.anchor[i];
    job.values = job.delta.data();
    job.values_dtype = DType::kFloat32;
    return;
  }
  if (job.absent)
    path_->prepare_absent(t, job.data, job.step, job.route == Route::kSparse, payload_out);
  else
    path_->prepare(t, job.data, job.clip, job.step, job.route == Route::kSparse, payload_out);
  job.values = path_->values(t, job.data);
  job.values_dtype = DType::kFloat32;
}

void Engine::prepare_named(Job& job, std::vector<uint8_t>& payload_out) {
  try {
    if (before_prepare_) before_prepare_(job);
    prepare(job, payload_out);
  } catch (const Error& e) {
    throw Error(e.code(), "prepare of " + work_name(job.id) + ": " + e.what());
  } catch (const std::exception& e) {
    throw InternalError("prepare of " + work_name(job.id) + ": " + e.what());
  }
}

namespace {

// Elements a job's prepare stage computes on (0: it only points at the caller's buffer): the
// weights by which a unit's jobs are spread over the pool.
uint64_t prepare_work(const Job& job, const EngineOptions& options) {
  if (job.route == Route::kFirstAverage) return 0;
  const bool dense_gradient = job.id.kind == WorkKind::kGradient && job.route == Route::kDense &&
                              !job.dgc_dense_step && !job.absent;
  if (dense_gradient && options.momentum <= 0 && options.clip_norm <= 0) return 0;
  return job.tensor->numel;
}

}  // namespace

void Engine::prepare_unit(Unit& unit) {
  auto t0 = Clock::now();
  // A DGC unit's message frames one payload per tensor, in job order.
  std::vector<uint8_t>& m = unit.message;
  m.clear();
  const bool sparse = unit.route == Route::kSparse;
  const size_t n = unit.jobs.size();
  ThreadPool& pool = shared_pool();
  // Jobs whose backend allows it are spread over the pool, largest first (each tensor's work is
  // independent: its own momentum, residual and selection; a large tensor is also split inside its
  // DGC step, compress/dgc/parallel.h). Every payload is encoded into the job's own buffer and
  // framed in job order, so the message does not depend on the pool or on timing.
  std::vector<size_t> host_jobs;  // indices into unit.jobs
  std::vector<uint64_t> weight;   // their work, in elements
  uint64_t total = 0;
  for (size_t j = 0; j < n; ++j) {
    const Job& job = *unit.jobs[j];
    // Parameter averages (LocalSGD) are host code whatever holds the tensor.
    if (job.id.kind == WorkKind::kGradient && !path_->concurrent_stages(*job.tensor)) continue;
    host_jobs.push_back(j);
    weight.push_back(prepare_work(job, options_));
    total += weight.back();
  }
  if (pipeline::spread_prepare(pool.threads(), host_jobs.size(), total)) {
    // Device jobs first, here and in order (their stage's stream is fed by one thread).
    size_t next_host = 0;
    for (size_t j = 0; j < n; ++j) {
      if (next_host < host_jobs.size() && host_jobs[next_host] == j) {
        ++next_host;
        continue;
      }
      unit.jobs[j]->payload.clear();
      prepare_named(*unit.jobs[j], unit.jobs[j]->payload);
    }
    pool.parallel_for_heaviest_first(weight, [&](int i) {
      Job& job = *unit.jobs[host_jobs[static_cast<size_t>(i)]];
      job.payload.clear();
      prepare_named(job, job.payload);
    });
    if (sparse) {
      wire::begin_message(m, static_cast<uint32_t>(n));
      for (Job* job : unit.jobs) {
        const size_t at = wire::begin_payload(m);
        m.insert(m.end(), job->payload.begin(), job->payload.end());
        wire::end_payload(m, at);
      }
    }
  } else {
    if (sparse) wire::begin_message(m, static_cast<uint32_t>(n));
    for (Job* job : unit.jobs) {
      const size_t at = sparse ? wire::begin_payload(m) : 0;
      prepare_named(*job, m);
      if (sparse) wire::end_payload(m, at);
    }
  }
  unit.counters.prepare_seconds += seconds_since(t0);
}

void Engine::finish(Job& job, const std::vector<wire::PayloadSpan>& payloads) {
  TensorState& t = *job.tensor;
  if (job.id.kind == WorkKind::kGradient) {
    path_->finish(t, job.data, payloads, job.route == Route::kSparse);
    return;
  }
  if (job.route == Route::kFirstAverage) {
    t.anchor.resize(t.numel);
    to_float(job.data, t.dtype, t.numel, t.anchor.data());
  } else if (job.id.kind == WorkKind::kAverage) {
    for (uint64_t k = 0; k < t.numel; ++k)
      job.delta[k] += t.anchor[k];
    from_float(job.delta.data(), t.numel, t.dtype, job.data);
    to_float(job.data, t.dtype, t.numel, t.anchor.data());
  }
}

void Engine::finish_unit(Unit& unit) {
  auto t0 = Clock::now();
  std::vector<std::vector<wire::PayloadSpan>> payloads(unit.jobs.size());
  if (unit.route == Route::kSparse) {
    // One message per rank, or per host under the hierarchical exchange (its host payloads,
    // sync/hierarchical_sparse.cc); summed in that order either way.
    const bool per_host = hierarchy_ != nullptr;
    GX_CHECK_EQ(unit.received.size(), per_host ? static_cast<size_t>(hierarchy_->host_count())
                                               : static_cast<size_t>(world_size_));
    std::vector<wire::PayloadSpan> spans;
    for (size_t r = 0; r < unit.received.size(); ++r) {
      const comm::Bytes& m = unit.received[r];
      const std::string what =
          (per_host ? "sparse message of host " : "sparse message from rank ") + std::to_string(r);
      const uint32_t count = wire::message_count(m.data(), m.size(), what);
      if (count != unit.jobs.size())
        throw CorruptPayload(what + " holds " + std::to_string(count) + " tensor(s) where [" +
                             unit.keys() + "] were expected (ranks with different " +
                             "GRADEX_SPARSE_GROUP_MB?)");
      wire::split_message(m.data(), m.size(), unit.jobs.size(), what, spans);
      for (size_t j = 0; j < unit.jobs.size(); ++j)
        payloads[j].push_back(spans[j]);
    }
  }
  for (size_t j = 0; j < unit.jobs.size(); ++j)
    finish(*unit.jobs[j], payloads[j]);
  unit.counters.finish_seconds += seconds_since(t0);
  complete_unit(unit);
}

}  // namespace gradex::sync
