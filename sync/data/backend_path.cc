// BackendPath: registration, submission, inspection, preparation, completion, LocalSGD's local step
// and checkpoints. The dense transfer is in sync/data/dense_exchange.cc.
#include "sync/data/backend_path.h"

#include <cmath>
#include <cstring>

#include "base/check.h"
#include "base/error.h"
#include "base/log.h"
#include "base/thread_pool.h"
#include "compress/dgc/compressor.h"
#include "compress/dgc/parallel.h"
#include "sync/data/backend_lane.h"
#include "sync/data/backend_tensor.h"
#include "sync/data/codec_factory.h"
#include "sync/data/gather_rider.h"
#include "sync/policy/policy.h"

namespace gradex::sync {

namespace be = compress::backend;

BackendPath::BackendPath(const config::Config& config, const EngineOptions& options, int world_size)
    : config_(config), options_(options), world_size_(world_size) {
  // "classic" is the former name of the CPU backend's path (it replaced the classic host code).
  const std::string& choice = config.get_string("GRADEX_BACKEND");
  host_backend_ = choice == "thrust-omp" ? be::DeviceType::kThrustOmp : be::DeviceType::kCpu;
  // Fail at engine creation, naming the variable, when the chosen host backend is not built.
  if (!be::backend_available(host_backend_))
    throw ConfigError("GRADEX_BACKEND=" + choice + ": " +
                      "this gradex was built without that backend (Thrust headers or OpenMP "
                      "missing)");
}

BackendPath::~BackendPath() = default;

BackendPath::Lane& BackendPath::lane(be::Backend& backend, Stage stage) {
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<Lane>& slot = lanes_[{&backend, stage}];
  if (!slot) slot = std::make_unique<Lane>(backend);
  return *slot;
}

void BackendPath::attach(TensorState& t, bool cuda) {
  if (cuda && t.dtype != DType::kFloat32)
    throw InvalidArgument("tensor '" + t.key + "': CUDA tensors must be float32 (this one is " +
                          dtype_name(t.dtype) +
                          "); stage 16-bit device tensors through host memory");
  auto d = std::make_unique<BackendTensor>();
  d->cuda = cuda;
  // The policy's sparsity (an override may differ from GRADEX_SPARSITY).
  if (is_sparse(t.policy.rung.codec)) d->dgc_options = dgc_options(t.policy.rung.sparsity);
  t.backend = std::move(d);
  if (!cuda) bind(t, be::get_backend(host_backend_));
}

compress::DgcOptions BackendPath::dgc_options(double sparsity) const {
  compress::DgcOptions o =
      sparse_codec_options(sparse_codec(options_), config_, options_, world_size_, sparsity);
  // The prepare stage spreads a unit's tensors over the pool (Engine::Executor::prepare_unit); a
  // unit holds about GRADEX_SPARSE_GROUP_MB of gradient (a larger tensor travels alone), so a
  // tensor larger than a 1/(2T) share of that is split across threads too. Splitting never changes
  // a result.
  o.parallel_min_elements = compress::dgc::split_min_elements(
      shared_pool().threads(), std::max<uint64_t>(options_.collectives.sparse_group_bytes / 4, 1));
  return o;
}

std::unique_ptr<be::DgcCodec> BackendPath::make_codec(const TensorState& t,
                                                      const compress::DgcOptions& options) const {
  return make_sparse_codec(sparse_codec(options_), *t.backend->backend, t.key, t.numel, t.rows,
                           options, compress::wire_options_from_config(config_), options_);
}

void BackendPath::bind(TensorState& t, be::BackendPtr backend) {
  BackendTensor& d = *t.backend;
  d.backend = std::move(backend);
  if (t.dtype != DType::kFloat32) d.f32 = d.backend->allocate(std::max<size_t>(t.numel, 1) * 4);
  if (is_sparse(t.policy.rung.codec)) {
    d.dgc = make_codec(t, d.dgc_options);
    if (!d.pending_state.empty()) {
      std::vector<uint8_t> blob = std::move(d.pending_state);
      d.pending_state.clear();
      load_dgc(t, blob.data(), blob.size());
    }
  }
  if (!d.pending_momentum.empty()) {
    std::vector<float> u = std::move(d.pending_momentum);
    d.pending_momentum.clear();
    load_momentum(t, u.data(), u.size());
  }
  GX_LOG(kDebug) << "tensor '" << t.key << "' on the " << d.backend->name() << " backend";
}

void BackendPath::on_submit(TensorState& t, bool cuda_call, int device_index, void* stream,
                            uint64_t handle) {
  BackendTensor& d = *t.backend;
  if (cuda_call != d.cuda)
    throw InvalidArgument("tensor '" + t.key + "' was registered as " +
                          (d.cuda ? "CUDA memory: submit it with gradex_submit_device"
                                  : "host memory: submit it with gradex_submit"));
  if (d.cuda) {
    if (!d.backend) {
      bind(t, be::get_backend(be::DeviceType::kCuda, device_index));
      d.device_index = device_index;
    } else if (device_index != d.device_index) {
      throw InvalidArgument("tensor '" + t.key + "' lives on CUDA device " +
                            std::to_string(d.device_index) + ", submitted from device " +
                            std::to_string(device_index));
    }
  }
  be::StreamPtr caller = d.backend->wrap_stream(stream);
  if (!d.ready) d.ready = d.backend->create_event();
  d.ready->record(*caller);
  d.done = std::shared_ptr<be::Event>(d.backend->create_event());
  std::lock_guard<std::mutex> lock(mu_);
  if (d.last_handle) events_.erase(d.last_handle);
  events_[handle] = {d.done, d.backend};
  d.last_handle = handle;
}

bool BackendPath::handle_event(uint64_t handle, void* stream) {
  HandleEvent found;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = events_.find(handle);
    if (it == events_.end()) return false;
    found = it->second;
  }
  found.backend->wrap_stream(stream)->wait(*found.event);
  return true;
}

void BackendPath::wait_ready(TensorState& t, Lane& l) {
  if (t.backend->ready) l.stream->wait(*t.backend->ready);
}

bool BackendPath::concurrent_stages(const TensorState& t) const {
  const BackendTensor* d = t.backend.get();
  return d != nullptr && d->backend != nullptr && d->backend->type() == be::DeviceType::kCpu;
}

float* BackendPath::values(TensorState& t, void* data) {
  return t.backend->f32 ? t.backend->f32->as<float>() : static_cast<float*>(data);
}

void BackendPath::store_values(TensorState& t, void* data, Lane& l) {
  BackendTensor& d = *t.backend;
  if (d.f32)
    d.backend->to_half(d.f32->as<float>(), static_cast<uint16_t*>(data), t.numel, t.dtype, 1.0f,
                       *l.stream);
}

uint64_t BackendPath::scan_nonfinite(TensorState& t, void* data, bool zero) {
  BackendTensor& d = *t.backend;
  Lane& l = lane(*d.backend);
  wait_ready(t, l);
  if (d.f32)  // widening is exact: NaN/Inf exactly where the 16-bit values have them
    d.backend->from_half(static_cast<const uint16_t*>(data), d.f32->as<float>(), t.numel, t.dtype,
                         1.0f, false, *l.stream);
  float* x = values(t, data);
  const size_t bad = d.backend->count_nonfinite(x, t.numel, *l.stream);
  if (bad > 0 && zero) d.backend->zero_nonfinite(x, t.numel, *l.stream);
  if (d.ready) d.ready->record(*l.stream);  // the next stage waits for the zeroing
  return bad;
}

float BackendPath::clip_factor(float step_clip, TensorState& t, const float* values, Lane& l) {
  if (options_.clip_norm <= 0) return 1.0f;
  if (step_clip >= 0) return step_clip;
  if (!warned_no_norm_.exchange(true)) {
    GX_LOG(kWarn) << "GRADEX_CLIP_NORM is set but no gradient norm was given for this step "
                  << "(gradex_set_gradient_norm): each tensor is clipped by its own norm";
  }
  const double sq = t.backend->backend->sum_squares(values, t.numel, *l.stream);
  return clip_scale_for_norm(options_.clip_norm, world_size_, std::sqrt(sq));
}

void BackendPath::apply_momentum(TensorState& t, float* values, float scale, Lane& l) {
  BackendTensor& d = *t.backend;
  float* u = nullptr;
  if (options_.momentum > 0) {
    if (d.dgc) {
      u = d.dgc->state().momentum_buffer();  // LocalSGD continues DGC's own u
    } else {
      if (!d.momentum) {
        d.momentum = d.backend->allocate(t.numel * 4);
        d.backend->fill_zero(d.momentum->data(), t.numel * 4, *l.stream);
      }
      u = d.momentum->as<float>();
    }
  }
  d.backend->apply_momentum(values, u, t.numel, options_.momentum, options_.nesterov, scale,
                            *l.stream);
}

bool BackendPath::sparse_step(TensorState& t, uint64_t step) {
  be::DgcState& state = t.backend->dgc->state();
  state.set_step(step);
  return sparse_is_cheaper(state.density(), world_size_);
}

void BackendPath::prepare(TensorState& t, void* data, float step_clip, uint64_t step, bool sparse,
                          std::vector<uint8_t>& payload_out) {
  BackendTensor& d = *t.backend;
  Lane& l = lane(*d.backend, Stage::kPrepare);
  wait_ready(t, l);
  float* x = values(t, data);
  if (!d.dgc) {
    // gradex owns momentum on dense tensors too (send u, keep u), after clipping.
    if (options_.momentum > 0 || options_.clip_norm > 0)
      apply_momentum(t, x, clip_factor(step_clip, t, x, l), l);
  } else {
    const float scale = clip_factor(step_clip, t, x, l);
    d.dgc->state().set_step(step);
    if (sparse) {
      // x is left all zeros: finish() adds every rank's payload straight into it.
      const size_t before = d.dgc->staged_bytes();
      d.dgc->encode_step(x, scale, *l.stream, payload_out);
      staged_bytes_ += d.dgc->staged_bytes() - before;
    } else {
      d.dgc->dense_step(x, scale, *l.stream);
    }
  }
  d.ready->record(*l.stream);  // the transfer or finish stage waits for this
}

void BackendPath::prepare_absent(TensorState& t, void* data, uint64_t step, bool sparse,
                                 std::vector<uint8_t>& payload_out) {
  BackendTensor& d = *t.backend;
  Lane& l = lane(*d.backend, Stage::kPrepare);
  wait_ready(t, l);
  float* x = values(t, data);
  d.backend->fill_zero(x, t.numel * 4, *l.stream);  // receives the average (sparse: the sum)
  if (d.dgc) {
    d.dgc->state().set_step(step + 1);  // where a present rank's step leaves DGC's counter
    if (sparse) d.dgc->encode_empty(payload_out);
  }
  d.ready->record(*l.stream);
}

void BackendPath::skip(TensorState& t, void* data, bool fill_nan) {
  BackendTensor& d = *t.backend;
  Lane& l = lane(*d.backend);
  wait_ready(t, l);
  if (fill_nan) {
    if (d.f32)  // the caller's buffer is host memory: a quiet NaN in its 16-bit type
      d.backend->to_half(l.nans(t.numel), static_cast<uint16_t*>(data), t.numel, t.dtype, 1.0f,
                         *l.stream);
    else
      d.backend->copy(data, l.nans(t.numel), t.numel * 4, *l.stream);
  }
  if (d.done) d.done->record(*l.stream);
}

void BackendPath::finish(TensorState& t, void* data,
                         const std::vector<compress::wire::PayloadSpan>& payloads, bool sparse) {
  BackendTensor& d = *t.backend;
  Lane& l = lane(*d.backend, Stage::kFinish);
  wait_ready(t, l);
  if (sparse) {
    // Every rank sums the same payloads in rank order, so the averages are bit-identical.
    const size_t before = d.dgc->staged_bytes();
    d.dgc->sum_payloads(payloads, 1.0f / static_cast<float>(world_size_), values(t, data),
                        *l.stream);
    staged_bytes_ += d.dgc->staged_bytes() - before;
  }
  store_values(t, data, l);
  if (d.done) d.done->record(*l.stream);
}

uint64_t BackendPath::encode_rider(TensorState& t, void* data, DType wire,
                                   std::vector<uint8_t>& payload_out) {
  BackendTensor& d = *t.backend;
  Lane& l = lane(*d.backend, Stage::kPrepare);
  const float* x = values(t, data);
  be::BufferPtr host;
  if (!d.backend->host_accessible()) {
    host = d.backend->allocate_staging(t.numel * 4);
    d.backend->copy(host->data(), x, t.numel * 4, *l.stream);
    x = host->as<float>();
  }
  l.synchronize();  // the prepare stage's work on the values is done
  return rider::encode(x, t.numel, t.key, wire, world_size_, payload_out);
}

bool BackendPath::finish_rider(TensorState& t, void* data,
                               const std::vector<compress::wire::PayloadSpan>& payloads,
                               DType wire) {
  BackendTensor& d = *t.backend;
  Lane& l = lane(*d.backend, Stage::kFinish);
  wait_ready(t, l);
  float* x = values(t, data);
  bool nonfinite = false;
  if (d.backend->host_accessible()) {
    l.synchronize();
    nonfinite = rider::average(payloads, t.key, t.numel, wire, x);
  } else {
    be::BufferPtr host = d.backend->allocate_staging(t.numel * 4);
    nonfinite = rider::average(payloads, t.key, t.numel, wire, host->as<float>());
    d.backend->copy(x, host->data(), t.numel * 4, *l.stream);
    l.synchronize();  // the staging buffer dies here
  }
  store_values(t, data, l);
  if (d.done) d.done->record(*l.stream);
  return nonfinite;
}

void BackendPath::return_to_residual(TensorState& t,
                                     const compress::wire::DecodedPayload& dropped) {
  BackendTensor& d = *t.backend;
  GX_CHECK(d.dgc != nullptr);
  Lane& l = lane(*d.backend);
  wait_ready(t, l);
  d.dgc->return_to_residual(dropped, *l.stream);
  l.synchronize();  // the finish stage reads the state next, on another lane
}

uint64_t BackendPath::local_step(TensorState& t, void* data, float step_clip, bool zero) {
  BackendTensor& d = *t.backend;
  Lane& l = lane(*d.backend);
  wait_ready(t, l);
  uint64_t bad = 0;
  if (options_.momentum > 0 || options_.clip_norm > 0) {
    bad = scan_nonfinite(t, data, zero);
    // Non-finite: the rank's own optimizer (or GradScaler) sees it; momentum stays untouched.
    if (bad == 0 || zero) {
      float* x = values(t, data);
      apply_momentum(t, x, clip_factor(step_clip, t, x, l), l);
      store_values(t, data, l);
    }
  }
  if (d.done) d.done->record(*l.stream);
  return bad;
}

void BackendPath::switch_policy(TensorState& t, const AppliedPolicy& to) {
  BackendTensor& d = *t.backend;
  const bool same_codec = d.dgc && d.dgc_options.sparsity == to.rung.sparsity;
  if (is_sparse(to.rung.codec) && !same_codec) {
    if (!d.backend)
      throw InvalidArgument("tensor '" + t.key +
                            "': its policy cannot change before its first submission");
    const compress::DgcOptions options = dgc_options(to.rung.sparsity);
    std::unique_ptr<be::DgcCodec> codec = make_codec(t, options);
    Lane& l = lane(*d.backend);
    wait_ready(t, l);  // the previous exchange's stages are done with u and v
    if (d.dgc) {
      // DGC at another sparsity (or again after dense steps): u, v and the step count move in
      // DgcCompressor's blob format, which holds no sparsity, so nothing unsent is lost.
      const std::vector<uint8_t> blob = d.dgc->state().save_state(*d.backend, *l.stream);
      codec->state().load_state(blob.data(), blob.size(), *d.backend, *l.stream);
    } else if (d.momentum && codec->state().momentum_buffer() != nullptr) {
      // From dense: its momentum continues as DGC's u (the new residual is all zeros).
      d.backend->copy(codec->state().momentum_buffer(), d.momentum->data(), t.numel * 4, *l.stream);
      l.synchronize();  // d.momentum is freed below
    }
    d.momentum.reset();
    d.dgc = std::move(codec);
    d.dgc_options = options;
    if (d.ready) d.ready->record(*l.stream);  // prepare waits for the moved state
  }
  t.policy = to;
}

// --- checkpoints and diagnostics ----------------------------------------------------------------

bool BackendPath::has_dgc(const TensorState& t) const {
  return is_sparse(t.policy.rung.codec) || (t.backend && t.backend->dgc);
}

std::vector<float> BackendPath::download(TensorState& t, const float* src, size_t n) {
  std::vector<float> out(n);
  if (n == 0 || src == nullptr) return src ? out : std::vector<float>();
  be::Backend& b = *t.backend->backend;
  Lane& l = lane(b);
  be::BufferPtr host = b.allocate_staging(n * 4);
  b.copy(host->data(), src, n * 4, *l.stream);
  l.synchronize();
  std::memcpy(out.data(), host->data(), n * 4);
  return out;
}

void BackendPath::upload(TensorState& t, float* dst, const float* src, size_t n) {
  if (n == 0) return;
  be::Backend& b = *t.backend->backend;
  Lane& l = lane(b);
  be::BufferPtr host = b.allocate_staging(n * 4);
  std::memcpy(host->data(), src, n * 4);
  b.copy(dst, host->data(), n * 4, *l.stream);
  l.synchronize();  // the staging buffer dies here
}

std::vector<uint8_t> BackendPath::save_dgc(TensorState& t) {
  BackendTensor& d = *t.backend;
  if (!d.backend) {  // a CUDA tensor never submitted: its state is what was loaded, or empty
    if (!d.pending_state.empty()) return d.pending_state;
    return compress::DgcCompressor(t.numel, d.dgc_options).save_state();
  }
  return d.dgc->state().save_state(*d.backend, *lane(*d.backend).stream);
}

uint64_t BackendPath::validate_dgc(const TensorState& t, const uint8_t* blob, size_t size) const {
  compress::DgcCompressor parsed(
      t.numel, has_dgc(t) ? t.backend->dgc_options : dgc_options(options_.sparsity));
  parsed.load_state(blob, size);
  return parsed.steps_done();
}

void BackendPath::load_dgc(TensorState& t, const uint8_t* blob, size_t size) {
  BackendTensor& d = *t.backend;
  if (!d.backend) {
    d.pending_state.assign(blob, blob + size);
    return;
  }
  if (!d.dgc) {  // adopted by a dense-policy tensor (GRADEX_POLICY=auto)
    d.dgc_options = dgc_options(options_.sparsity);
    d.dgc = make_codec(t, d.dgc_options);
    d.momentum.reset();
  }
  d.dgc->state().load_state(blob, size, *d.backend, *lane(*d.backend).stream);
}

std::vector<float> BackendPath::residual(TensorState& t) {
  BackendTensor& d = *t.backend;
  if (!has_dgc(t)) return {};
  if (!d.backend) {
    compress::DgcCompressor c(t.numel, d.dgc_options);
    if (!d.pending_state.empty()) c.load_state(d.pending_state.data(), d.pending_state.size());
    return std::vector<float>(c.residual(), c.residual() + t.numel);
  }
  return download(t, d.dgc->state().residual(), t.numel);
}

std::vector<float> BackendPath::momentum(TensorState& t) {
  BackendTensor& d = *t.backend;
  if (!d.backend) return d.pending_momentum;
  if (d.dgc) return download(t, d.dgc->state().momentum_buffer(), t.numel);
  return d.momentum ? download(t, d.momentum->as<float>(), t.numel) : std::vector<float>();
}

void BackendPath::load_momentum(TensorState& t, const float* values, size_t n) {
  BackendTensor& d = *t.backend;
  if (n == 0) {
    d.momentum.reset();
    d.pending_momentum.clear();
    return;
  }
  if (!d.backend) {  // restored when the tensor's first submission binds its backend
    d.pending_momentum.assign(values, values + n);
    return;
  }
  if (!d.momentum) d.momentum = d.backend->allocate(t.numel * 4);
  upload(t, d.momentum->as<float>(), values, n);
}

bool BackendPath::snapshot_dgc(TensorState& t) {
  BackendTensor& d = *t.backend;
  if (!d.backend || !d.dgc) return false;
  d.dgc->state().snapshot(*d.backend, *lane(*d.backend).stream);
  return true;
}

bool BackendPath::dgc_snapshot_taken(const TensorState& t) const {
  const BackendTensor& d = *t.backend;
  return d.backend && d.dgc && d.dgc->state().has_snapshot();
}

void BackendPath::rollback_dgc(TensorState& t) {
  BackendTensor& d = *t.backend;
  GX_CHECK(d.backend && d.dgc);
  GX_CHECK(d.dgc->state().rollback(*d.backend, *lane(*d.backend).stream));
}

void BackendPath::copy_momentum(TensorState& t, std::vector<float>& out) {
  BackendTensor& d = *t.backend;
  if (d.backend && !d.cuda && d.momentum) {  // host memory: no staging
    const float* u = d.momentum->as<float>();
    out.assign(u, u + t.numel);
    return;
  }
  const std::vector<float> u = momentum(t);
  out.assign(u.begin(), u.end());
}

void BackendPath::restore_momentum(TensorState& t, const std::vector<float>& values) {
  BackendTensor& d = *t.backend;
  if (d.backend && !d.cuda && d.momentum && values.size() == t.numel) {
    std::memcpy(d.momentum->as<float>(), values.data(), values.size() * 4);
    return;
  }
  load_momentum(t, values.data(), values.size());
}

}  // namespace gradex::sync
