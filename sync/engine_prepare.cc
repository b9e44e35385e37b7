// What the engine does to a gradient before (or instead of) exchanging it: the non-finite scan and
// exchange counter that go into negotiation (inspect), and LocalSGD's local step, which applies
// gradex's momentum in place without any exchange. The data work is the tensor's backend's
// (sync/backend_path.h).
#include "sync/backend_path.h"
#include "sync/engine.h"
#include "sync/engine_internal.h"

namespace gradex::sync {

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
  for (Item& it : items) {
    // The counter is written only by this thread (execute), so it is read without the lock.
    it.a->step = it.tensor->step;
    const uint64_t bad = path_->scan_nonfinite(*it.tensor, it.data, zero);
    total += bad;
    it.a->nonfinite = bad > 0 && !zero;
  }
  if (total > 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.nonfinite += total;
  }
}

void Engine::local_step(TensorState& t, void* data, Handle& handle) {
  // This rank's momentum continues: the same u its synchronous steps used (DGC's own u for DGC
  // tensors, which no sparse exchange touches any more). Non-finite: the rank's own optimizer
  // (or GradScaler) sees it; momentum stays untouched.
  const bool zero = options_.nonfinite == NonFinitePolicy::kZero;
  const uint64_t bad = path_->local_step(t, data, handle.clip_scale, zero);
  stats_.nonfinite += bad;
  if (bad > 0 && !zero && options_.nonfinite == NonFinitePolicy::kError) {
    handle.code = ErrorCode::kInvalidArgument;
    handle.message = work_name(handle.id) +
                     " holds NaN/Inf values in a LocalSGD local step (GRADEX_NONFINITE=error)";
  }
}

}  // namespace gradex::sync
