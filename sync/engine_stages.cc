// The per-tensor work of the engine's pipeline stages (sync/pipeline.h): prepare (gradex momentum
// for dense-policy tensors, the DGC step, LocalSGD deltas) and finish (decode of every rank's
// payload, casts back into the caller's buffer, LocalSGD anchors). These run on the worker pool or
// on the progress thread and touch only their own job's tensor. The per-tensor arithmetic and its
// order are those of the engine before the pipeline, so results are bit-identical to it.
#include <chrono>
#include <cstring>

#include "base/check.h"
#include "sync/byte_io.h"
#include "sync/device_path.h"
#include "sync/engine.h"
#include "sync/engine_internal.h"
#include "sync/momentum.h"
#include "sync/pipeline.h"
#include "sync/sparse_exchange.h"

namespace gradex::sync {
namespace {

using Clock = std::chrono::steady_clock;
using detail::from_float;
using detail::to_float;
using pipeline::Job;
using pipeline::Route;
using pipeline::Unit;
using PayloadView = std::pair<const uint8_t*, size_t>;

template <typename T>
void put_le(std::vector<uint8_t>& out, T value) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &value, sizeof(T));
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// An fp32 view of a gradient: the caller's buffer itself, or the tensor's scratch for 16-bit
// tensors (momentum and DGC are computed in fp32, before any cast to the wire type).
float* fp32_values(Job& job) {
  TensorState& t = *job.tensor;
  job.values_dtype = DType::kFloat32;
  if (t.dtype == DType::kFloat32) {
    job.values = job.data;
    return static_cast<float*>(job.data);
  }
  t.scratch.resize(t.numel);
  to_float(job.data, t.dtype, t.numel, t.scratch.data());
  job.staged = true;
  job.values = t.scratch.data();
  return t.scratch.data();
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
    // Later averages send (parameters - anchor): small deltas lose far less in 16 bits.
    job.delta.resize(t.numel);
    to_float(job.data, t.dtype, t.numel, job.delta.data());
    for (uint64_t i = 0; i < t.numel; ++i)
      job.delta[i] -= t.anchor[i];
    job.values = job.delta.data();
    job.values_dtype = DType::kFloat32;
    return;
  }
  if (t.device) {  // [device path] clipping, momentum, the DGC step on the tensor's backend
    device_->prepare(t, job.data, job.clip, job.step, job.route == Route::kSparse, payload_out);
    job.values = job.data;
    job.values_dtype = DType::kFloat32;
    return;
  }
  // Without DGC state: a dense-policy tensor. A tensor with DGC state whose policy became dense
  // (GRADEX_POLICY=auto) takes DGC's dense step below, which flushes its residual.
  if (!t.codec) {
    if (options_.momentum > 0 || options_.clip_norm > 0) {
      // gradex owns momentum on this path too: send u (Nesterov: g + m*u), keep u.
      float* values = fp32_values(job);
      const float scale = clip_factor(job.clip, values, t.numel);
      if (options_.momentum > 0 && t.momentum.size() != t.numel) t.momentum.assign(t.numel, 0.0f);
      apply_momentum(values, t.momentum.data(), t.numel,
                     {options_.momentum, options_.nesterov, scale});
    } else {
      job.values = job.data;
      job.values_dtype = t.dtype;
    }
    return;
  }
  // A DGC tensor: a sparse step (compressed into this rank's payload) or a dense one.
  float* values = fp32_values(job);
  const float scale = clip_factor(job.clip, values, t.numel);
  t.codec->set_step(job.step);
  if (job.route == Route::kSparse) {
    // The gradient buffer is left all zeros: finish() adds every rank's payload straight into it.
    const std::vector<uint8_t>& payload = t.codec->compress_and_clear(values, scale);
    payload_out.insert(payload_out.end(), payload.begin(), payload.end());
  } else
    t.codec->dense_step(values, scale);
}

void Engine::prepare_unit(Unit& unit) {
  auto t0 = Clock::now();
  // A DGC unit's message: [u32 tensor count], then per tensor [u64 length][payload], each payload
  // encoded in place (the count lets a receiver name ranks that cut different units).
  std::vector<uint8_t>& m = unit.message;
  m.clear();
  if (unit.route == Route::kSparse) put_le<uint32_t>(m, static_cast<uint32_t>(unit.jobs.size()));
  for (Job* job : unit.jobs) {
    const size_t at = m.size();
    if (unit.route == Route::kSparse) put_le<uint64_t>(m, 0);
    prepare(*job, m);
    if (unit.route == Route::kSparse) {
      const uint64_t length = m.size() - at - sizeof(uint64_t);
      std::memcpy(m.data() + at, &length, sizeof length);
    }
  }
  unit.counters.prepare_seconds += seconds_since(t0);
}

void Engine::finish(Job& job, const std::vector<PayloadView>& payloads) {
  TensorState& t = *job.tensor;
  if (t.device && job.id.kind == WorkKind::kGradient) {
    // [device path] the sparse average on the tensor's backend; the completion event.
    device_->finish(t, job.data, payloads, job.route == Route::kSparse);
    return;
  }
  if (job.route == Route::kSparse) {
    // Every rank adds the same payloads in rank order, so the averages are bit-identical.
    sum_payloads(*t.codec, t.key, payloads, 1.0f / static_cast<float>(world_size_),
                 static_cast<float*>(job.values));
  }
  if (job.route == Route::kFirstAverage) {
    t.anchor.resize(t.numel);
    to_float(job.data, t.dtype, t.numel, t.anchor.data());
  } else if (job.id.kind == WorkKind::kAverage) {
    for (uint64_t k = 0; k < t.numel; ++k)
      job.delta[k] += t.anchor[k];
    from_float(job.delta.data(), t.numel, t.dtype, job.data);
    to_float(job.data, t.dtype, t.numel, t.anchor.data());
  } else if (job.staged) {
    from_float(t.scratch.data(), t.numel, t.dtype, job.data);
  }
}

void Engine::finish_unit(Unit& unit) {
  auto t0 = Clock::now();
  std::vector<std::vector<PayloadView>> payloads(unit.jobs.size());
  if (unit.route == Route::kSparse) {
    GX_CHECK_EQ(unit.received.size(), static_cast<size_t>(world_size_));
    for (size_t r = 0; r < unit.received.size(); ++r) {
      const comm::Bytes& m = unit.received[r];
      const std::string what = "sparse message from rank " + std::to_string(r);
      ByteReader reader(m.data(), m.size(), what);
      const uint32_t count = reader.get<uint32_t>();
      if (count != unit.jobs.size())
        throw CorruptPayload(what + " holds " + std::to_string(count) + " tensor(s) where [" +
                             unit.keys() + "] were expected (ranks with different " +
                             "GRADEX_SPARSE_GROUP_MB?)");
      for (size_t j = 0; j < unit.jobs.size(); ++j) {
        const uint64_t length = reader.get<uint64_t>();
        payloads[j].push_back({reader.get_bytes(length), length});
      }
      reader.expect_end();
    }
  }
  for (size_t j = 0; j < unit.jobs.size(); ++j)
    finish(*unit.jobs[j], payloads[j]);
  unit.counters.finish_seconds += seconds_since(t0);
  complete_unit(unit);
}

}  // namespace gradex::sync
