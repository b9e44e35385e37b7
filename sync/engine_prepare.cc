// What the engine does to a gradient before (or instead of) exchanging it: the non-finite scan and
// exchange counter that go into negotiation (inspect), the clipping factor, and LocalSGD's local
// step, which applies gradex's momentum in place without any exchange.
#include "base/log.h"
#include "sync/device_path.h"
#include "sync/engine.h"
#include "sync/engine_internal.h"
#include "sync/momentum.h"
#include "sync/nonfinite.h"
#include "sync/sparse_exchange.h"

namespace gradex::sync {

using detail::from_float;
using detail::to_float;
using detail::work_name;

void Engine::inspect(std::vector<Announcement>& announce) {
  struct Item {
    Announcement* a;
    void* data;
    TensorState* tensor;
  };
  std::vector<Item> items;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Announcement& a : announce) {
      if (a.id.kind != WorkKind::kGradient) continue;
      auto f = in_flight_.find(a.id);
      if (f == in_flight_.end()) continue;  // failed meanwhile (the announcement still goes out)
      items.push_back({&a, handles_[f->second].data, &tensors_.at(a.id.key)});
    }
  }
  const bool zero = options_.nonfinite == NonFinitePolicy::kZero;
  uint64_t total = 0;
  const std::string* first_bad = nullptr;  // for the one-time warning (sync/stats_report.h)
  for (Item& it : items) {
    // The counter is written only by this thread (execute), so it is read without the lock.
    it.a->step = it.tensor->step;
    uint64_t bad = it.tensor->device  // [device path] count_nonfinite on the backend
                       ? device_->scan_nonfinite(*it.tensor, it.data, zero)
                       : scan_nonfinite(it.data, it.tensor->dtype, it.tensor->numel, zero);
    total += bad;
    if (bad > 0 && first_bad == nullptr) first_bad = &it.tensor->key;
    it.a->nonfinite = bad > 0 && !zero;
  }
  if (total > 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.nonfinite += total;
    if (stats_.first_nonfinite_tensor.empty()) stats_.first_nonfinite_tensor = *first_bad;
  }
}

float Engine::clip_factor(float step_scale, const float* values, uint64_t n) {
  if (options_.clip_norm <= 0) return 1.0f;
  if (step_scale >= 0) return step_scale;
  if (!warned_no_norm_.exchange(true)) {
    GX_LOG(kWarn) << "GRADEX_CLIP_NORM is set but no gradient norm was given for this step "
                  << "(gradex_set_gradient_norm): each tensor is clipped by its own norm";
  }
  return clip_scale_for_norm(options_.clip_norm, world_size_, l2_norm(values, n));
}

void Engine::local_step(TensorState& t, void* data, Handle& handle) {
  if (t.device) {  // [device path] the same step on the tensor's backend
    const bool zero = options_.nonfinite == NonFinitePolicy::kZero;
    const uint64_t bad = device_->local_step(t, data, handle.clip_scale, zero);
    stats_.nonfinite += bad;
    if (bad > 0 && !zero && options_.nonfinite == NonFinitePolicy::kError) {
      handle.code = ErrorCode::kInvalidArgument;
      handle.message = work_name(handle.id) +
                       " holds NaN/Inf values in a LocalSGD local step (GRADEX_NONFINITE=error)";
    }
    return;
  }
  if (options_.momentum <= 0 && options_.clip_norm <= 0) return;  // left exactly as it is
  // Non-finite: the rank's own optimizer (or GradScaler) sees it; momentum stays untouched.
  const bool zero = options_.nonfinite == NonFinitePolicy::kZero;
  const uint64_t bad = scan_nonfinite(data, t.dtype, t.numel, zero);
  stats_.nonfinite += bad;
  if (bad > 0 && !zero) {
    if (options_.nonfinite == NonFinitePolicy::kError) {
      handle.code = ErrorCode::kInvalidArgument;
      handle.message = work_name(handle.id) +
                       " holds NaN/Inf values in a LocalSGD local step (GRADEX_NONFINITE=error)";
    }
    return;
  }
  float* values = static_cast<float*>(data);
  if (t.dtype != DType::kFloat32) {
    t.scratch.resize(t.numel);
    to_float(data, t.dtype, t.numel, t.scratch.data());
    values = t.scratch.data();
  }
  const float scale = clip_factor(handle.clip_scale, values, t.numel);
  // This rank's momentum continues: the same u its synchronous steps used (DGC's own u for DGC
  // tensors, which no sparse exchange touches any more).
  float* u = nullptr;
  if (options_.momentum > 0) {
    if (t.codec) {
      u = t.codec->momentum();
    } else {
      if (t.momentum.size() != t.numel) t.momentum.assign(t.numel, 0.0f);
      u = t.momentum.data();
    }
  }
  apply_momentum(values, u, t.numel, {options_.momentum, options_.nesterov, scale});
  if (t.dtype != DType::kFloat32) from_float(values, t.numel, t.dtype, data);
}

}  // namespace gradex::sync
