// DevicePath: registration, submission, inspection, preparation, completion, LocalSGD's local step
// and checkpoints of device tensors. The exchanges themselves are in sync/device_exchange.cc.
#include "sync/device_path.h"

#include <cmath>
#include <cstring>

#include "base/error.h"
#include "base/log.h"
#include "compress/dgc/compressor.h"
#include "sync/device_lane.h"
#include "sync/device_tensor.h"
#include "sync/momentum.h"
#include "sync/policy.h"

namespace gradex::sync {

namespace be = compress::backend;

DevicePath::DevicePath(const config::Config& config, const EngineOptions& options, int world_size)
    : config_(config), options_(options), world_size_(world_size) {
  const std::string& choice = config.get_string("GRADEX_BACKEND");
  host_tensors_ = choice != "classic";
  host_backend_ = choice == "thrust-omp" ? be::DeviceType::kThrustOmp : be::DeviceType::kCpu;
  // Fail at engine creation, naming the variable, when the chosen host backend is not built.
  if (host_tensors_ && !be::backend_available(host_backend_))
    throw ConfigError("GRADEX_BACKEND=" + choice + ": " +
                      "this gradex was built without that backend (Thrust headers or OpenMP "
                      "missing)");
}

DevicePath::~DevicePath() = default;

DevicePath::Lane& DevicePath::lane(be::Backend& backend, Stage stage) {
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<Lane>& slot = lanes_[{&backend, stage}];
  if (!slot) slot = std::make_unique<Lane>(backend);
  return *slot;
}

void DevicePath::attach(TensorState& t, bool cuda) {
  if (!cuda && (!host_tensors_ || t.dtype != DType::kFloat32)) return;  // the host path
  if (cuda && t.dtype != DType::kFloat32)
    throw InvalidArgument("tensor '" + t.key + "': CUDA tensors must be float32 (this one is " +
                          dtype_name(t.dtype) +
                          "); stage 16-bit device tensors through host memory");
  auto d = std::make_unique<DeviceTensor>();
  d->cuda = cuda;
  d->key_id = tensor_key_id(t.key);
  d->wire = compress::wire_options_from_config(config_);
  if (t.policy.kind == ExchangeKind::kSparse) {
    d->dgc_options = compress::dgc_options_from_config(config_, world_size_);
    d->dgc_options.sparsity = t.policy.sparsity;  // as SparseCodec: the policy's sparsity,
    d->dgc_options.clip_norm = 0;                 // and the engine clips (whole-step norm)
  }
  t.device = std::move(d);
  if (!cuda) bind(t, be::get_backend(host_backend_));
}

void DevicePath::bind(TensorState& t, be::BackendPtr backend) {
  DeviceTensor& d = *t.device;
  d.backend = std::move(backend);
  if (t.policy.kind == ExchangeKind::kSparse) {
    d.dgc = d.backend->create_dgc(t.numel, d.dgc_options);
    d.stager = std::make_unique<be::SelectionStager>(*d.backend);
    d.applier = std::make_unique<be::PayloadApplier>(*d.backend);
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

void DevicePath::on_submit(TensorState& t, bool cuda_call, int device_index, void* stream,
                           uint64_t handle) {
  DeviceTensor& d = *t.device;
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

bool DevicePath::handle_event(uint64_t handle, void* stream) {
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

void DevicePath::wait_ready(TensorState& t, Lane& l) {
  if (t.device->ready) l.stream->wait(*t.device->ready);
}

uint64_t DevicePath::scan_nonfinite(TensorState& t, void* data, bool zero) {
  DeviceTensor& d = *t.device;
  Lane& l = lane(*d.backend);
  wait_ready(t, l);
  auto* x = static_cast<float*>(data);
  const size_t bad = d.backend->count_nonfinite(x, t.numel, *l.stream);
  if (bad > 0 && zero) d.backend->zero_nonfinite(x, t.numel, *l.stream);
  if (d.ready) d.ready->record(*l.stream);  // the next stage waits for the zeroing
  return bad;
}

float DevicePath::clip_factor(float step_clip, TensorState& t, const float* values, Lane& l) {
  if (options_.clip_norm <= 0) return 1.0f;
  if (step_clip >= 0) return step_clip;
  if (!warned_no_norm_.exchange(true)) {
    GX_LOG(kWarn) << "GRADEX_CLIP_NORM is set but no gradient norm was given for this step "
                  << "(gradex_set_gradient_norm): each device tensor is clipped by its own norm";
  }
  const double sq = t.device->backend->sum_squares(values, t.numel, *l.stream);
  return clip_scale_for_norm(options_.clip_norm, world_size_, std::sqrt(sq));
}

void DevicePath::apply_momentum(TensorState& t, float* values, float scale, Lane& l) {
  DeviceTensor& d = *t.device;
  float* u = nullptr;
  if (options_.momentum > 0) {
    if (d.dgc) {
      u = d.dgc->momentum_buffer();  // LocalSGD continues DGC's own u
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

bool DevicePath::sparse_step(TensorState& t, uint64_t step) {
  DeviceTensor& d = *t.device;
  d.dgc->set_step(step);
  return sparse_is_cheaper(d.dgc->density(), world_size_);
}

void DevicePath::prepare(TensorState& t, void* data, float step_clip, uint64_t step, bool sparse,
                         std::vector<uint8_t>& payload_out) {
  DeviceTensor& d = *t.device;
  Lane& l = lane(*d.backend, Stage::kPrepare);
  wait_ready(t, l);
  auto* values = static_cast<float*>(data);
  if (!d.dgc) {
    // As the host path: gradex owns momentum here too (send u, keep u), after clipping.
    if (options_.momentum > 0 || options_.clip_norm > 0)
      apply_momentum(t, values, clip_factor(step_clip, t, values, l), l);
  } else {
    const float scale = clip_factor(step_clip, t, values, l);
    d.dgc->set_step(step);
    if (sparse) {
      const be::DgcStepInfo info = d.dgc->step(values, scale, *l.stream);
      const size_t before = d.stager->bytes_staged();
      const compress::wire::SparseRef ref = d.stager->stage(*d.dgc, info, *l.stream);
      staged_bytes_ += d.stager->bytes_staged() - before;
      compress::wire::encode(ref, d.key_id, d.wire, d.encoded);
      payload_out.insert(payload_out.end(), d.encoded.begin(), d.encoded.end());
    } else {
      if (!d.dense_out) d.dense_out = d.backend->allocate(t.numel * 4);
      d.dgc->step_dense(values, d.dense_out->as<float>(), scale, *l.stream);
      d.backend->copy(values, d.dense_out->data(), t.numel * 4, *l.stream);
    }
  }
  d.ready->record(*l.stream);  // the transfer or finish stage waits for this
}

void DevicePath::skip(TensorState& t, void* data, bool fill_nan) {
  DeviceTensor& d = *t.device;
  Lane& l = lane(*d.backend);
  wait_ready(t, l);
  if (fill_nan) d.backend->copy(data, l.nans(t.numel), t.numel * 4, *l.stream);
  if (d.done) d.done->record(*l.stream);
}

void DevicePath::finish(TensorState& t, void* data,
                        const std::vector<std::pair<const uint8_t*, size_t>>& payloads,
                        bool sparse) {
  DeviceTensor& d = *t.device;
  Lane& l = lane(*d.backend, Stage::kFinish);
  wait_ready(t, l);
  if (sparse) {
    // Every rank sums the same payloads in rank order, so the averages are bit-identical.
    auto* out = static_cast<float*>(data);
    d.backend->fill_zero(out, t.numel * 4, *l.stream);
    const float scale = 1.0f / static_cast<float>(world_size_);
    for (size_t r = 0; r < payloads.size(); ++r) {
      try {
        compress::wire::decode(payloads[r].first, payloads[r].second, d.decoded);
        if (d.decoded.header.key != d.key_id)
          throw CorruptPayload("payload for tensor '" + t.key + "' carries another tensor's key");
        const size_t before = d.applier->bytes_staged();
        d.applier->apply(d.decoded, out, t.numel, scale, *l.stream);
        staged_bytes_ += d.applier->bytes_staged() - before;
      } catch (const CorruptPayload& e) {
        throw CorruptPayload("tensor '" + t.key + "' from rank " + std::to_string(r) + ": " +
                             e.what());
      }
    }
  }
  if (d.done) d.done->record(*l.stream);
}

uint64_t DevicePath::local_step(TensorState& t, void* data, float step_clip, bool zero) {
  DeviceTensor& d = *t.device;
  Lane& l = lane(*d.backend);
  wait_ready(t, l);
  uint64_t bad = 0;
  if (options_.momentum > 0 || options_.clip_norm > 0) {
    auto* values = static_cast<float*>(data);
    bad = scan_nonfinite(t, data, zero);
    // Non-finite: the rank's own optimizer (or GradScaler) sees it; momentum stays untouched.
    if (bad == 0 || zero) apply_momentum(t, values, clip_factor(step_clip, t, values, l), l);
  }
  if (d.done) d.done->record(*l.stream);
  return bad;
}

// --- checkpoints and diagnostics ----------------------------------------------------------------

bool DevicePath::has_dgc(const TensorState& t) const {
  return t.device && t.policy.kind == ExchangeKind::kSparse;
}

std::vector<float> DevicePath::download(TensorState& t, const float* src, size_t n) {
  std::vector<float> out(n);
  if (n == 0 || src == nullptr) return src ? out : std::vector<float>();
  be::Backend& b = *t.device->backend;
  Lane& l = lane(b);
  be::BufferPtr host = b.allocate_staging(n * 4);
  b.copy(host->data(), src, n * 4, *l.stream);
  l.synchronize();
  std::memcpy(out.data(), host->data(), n * 4);
  return out;
}

void DevicePath::upload(TensorState& t, float* dst, const float* src, size_t n) {
  if (n == 0) return;
  be::Backend& b = *t.device->backend;
  Lane& l = lane(b);
  be::BufferPtr host = b.allocate_staging(n * 4);
  std::memcpy(host->data(), src, n * 4);
  b.copy(dst, host->data(), n * 4, *l.stream);
  l.synchronize();  // the staging buffer dies here
}

std::vector<uint8_t> DevicePath::save_dgc(TensorState& t) {
  DeviceTensor& d = *t.device;
  if (!d.backend) {  // a CUDA tensor never submitted: its state is what was loaded, or empty
    if (!d.pending_state.empty()) return d.pending_state;
    return compress::DgcCompressor(t.numel, d.dgc_options).save_state();
  }
  return d.dgc->save_state(*d.backend, *lane(*d.backend).stream);
}

uint64_t DevicePath::validate_dgc(const TensorState& t, const uint8_t* blob, size_t size) const {
  compress::DgcCompressor parsed(t.numel, t.device->dgc_options);
  parsed.load_state(blob, size);
  return parsed.steps_done();
}

void DevicePath::load_dgc(TensorState& t, const uint8_t* blob, size_t size) {
  DeviceTensor& d = *t.device;
  if (!d.backend) {
    d.pending_state.assign(blob, blob + size);
    return;
  }
  d.dgc->load_state(blob, size, *d.backend, *lane(*d.backend).stream);
}

std::vector<float> DevicePath::residual(TensorState& t) {
  DeviceTensor& d = *t.device;
  if (!has_dgc(t)) return {};
  if (!d.backend) {
    compress::DgcCompressor c(t.numel, d.dgc_options);
    if (!d.pending_state.empty()) c.load_state(d.pending_state.data(), d.pending_state.size());
    return std::vector<float>(c.residual(), c.residual() + t.numel);
  }
  return download(t, d.dgc->residual(), t.numel);
}

std::vector<float> DevicePath::momentum(TensorState& t) {
  DeviceTensor& d = *t.device;
  if (!d.backend) return d.pending_momentum;
  if (d.dgc) return download(t, d.dgc->momentum_buffer(), t.numel);
  return d.momentum ? download(t, d.momentum->as<float>(), t.numel) : std::vector<float>();
}

void DevicePath::load_momentum(TensorState& t, const float* values, size_t n) {
  DeviceTensor& d = *t.device;
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

}  // namespace gradex::sync
