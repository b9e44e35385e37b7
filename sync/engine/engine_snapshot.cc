// Engine::snapshot_state / rollback_state: step transactions for torchft's commit protocol: a
// step that does not commit leaves gradex's state as if it never ran. The snapshot holds
// every per-tensor value a step changes (DGC's complete state, dense momentum, the 8-bit route's
// residuals, exchange counter, LocalSGD anchor) and the engine's step count, in buffers kept from
// one snapshot to the next: on host memory a snapshot is a few memcpys and allocates nothing after
// the first.
#include <cstring>

#include "compress/dgc/compressor.h"
#include "sync/data/backend_path.h"
#include "sync/data/backend_tensor.h"
#include "sync/engine/engine.h"
#include "sync/engine/engine_executor.h"

namespace gradex::sync {

using TensorSnapshot = TensorTable::TensorSnapshot;

void Engine::snapshot_state() {
  auto lock = wait_until_idle();
  BackendPath& path = executor_->path();
  if (fatal_.code != ErrorCode::kOk)
    throw StateError("snapshot refused: the engine failed (" + fatal_.message +
                     "); its state may be partly updated (roll back to the last snapshot, or "
                     "reconfigure first)");
  for (auto& [key, t] : table_.tensors) {
    TensorSnapshot& s = table_.snapshot.tensors[key];  // kept between snapshots: no new buffers
    s.sparse = is_sparse(t.policy.rung.codec);
    s.has_dgc = path.has_dgc(t);
    if (s.has_dgc) {
      // Kept inside the DGC state itself (CPU: a copy of u, v and the threshold history into
      // buffers it keeps); a CUDA tensor not bound yet keeps its blob here.
      s.in_state = path.snapshot_dgc(t);
      if (!s.in_state) {
        const std::vector<uint8_t> blob = path.save_dgc(t);
        s.dgc.assign(blob.begin(), blob.end());
      }
      s.momentum.clear();
    } else {
      path.copy_momentum(t, s.momentum);
      s.dgc.clear();
    }
    s.anchor.assign(t.anchor.begin(), t.anchor.end());
    s.int8_residual.assign(t.int8_residual.begin(), t.int8_residual.end());
    s.int8_owner_residual.assign(t.int8_owner_residual.begin(), t.int8_owner_residual.end());
    s.int8_world = t.int8_world;
    s.int8_layout = t.int8_layout;
    s.step = t.step;
    s.exchanges = t.exchanges;
    s.taken = true;
  }
  // A tensor registered after the last snapshot and gone since cannot be: tensors are never
  // unregistered. Entries of earlier snapshots all belong to registered tensors.
  table_.snapshot.completed_steps = steps_.completed;
  table_.snapshot.step_clip_scale = steps_.clip_scale;
  table_.snapshot.valid = true;
}

void Engine::rollback_state() {
  auto lock = wait_until_idle();
  BackendPath& path = executor_->path();
  if (!table_.snapshot.valid)
    throw StateError("rollback without a snapshot (gradex_state_snapshot)");
  // Validate everything first: a rollback that cannot restore every tensor changes nothing.
  for (auto& [key, t] : table_.tensors) {
    auto it = table_.snapshot.tensors.find(key);
    if (it == table_.snapshot.tensors.end() || !it->second.taken) continue;  // registered since
    const TensorSnapshot& s = it->second;
    if (s.sparse != is_sparse(t.policy.rung.codec) || s.has_dgc != path.has_dgc(t) ||
        (s.in_state && !path.dgc_snapshot_taken(t)))
      throw StateError("rollback: tensor '" + key +
                       "' changed its policy since the snapshot (GRADEX_POLICY=auto switched it); "
                       "its state cannot be restored");
  }
  for (auto& [key, t] : table_.tensors) {
    auto it = table_.snapshot.tensors.find(key);
    if (it == table_.snapshot.tensors.end() || !it->second.taken) {
      // Registered after the snapshot: back to the state of a fresh registration.
      if (path.has_dgc(t)) {
        const std::vector<uint8_t> fresh =
            compress::DgcCompressor(t.numel, t.backend->dgc_options).save_state();
        path.load_dgc(t, fresh.data(), fresh.size());
      } else {
        path.load_momentum(t, nullptr, 0);
      }
      t.anchor.clear();
      t.int8_residual.clear();
      t.int8_owner_residual.clear();
      t.int8_world = 0;
      t.int8_layout = 0;
      t.step = 0;
      t.exchanges = 0;
      continue;
    }
    const TensorSnapshot& s = it->second;
    if (s.has_dgc && s.in_state)
      path.rollback_dgc(t);
    else if (s.has_dgc)
      path.load_dgc(t, s.dgc.data(), s.dgc.size());
    else
      path.restore_momentum(t, s.momentum);
    t.anchor.assign(s.anchor.begin(), s.anchor.end());
    t.int8_residual.assign(s.int8_residual.begin(), s.int8_residual.end());
    t.int8_owner_residual.assign(s.int8_owner_residual.begin(), s.int8_owner_residual.end());
    t.int8_world = s.int8_world;
    t.int8_layout = s.int8_layout;
    t.step = s.step;
    t.exchanges = s.exchanges;
  }
  steps_.completed = table_.snapshot.completed_steps;
  steps_.stats.steps = steps_.completed;
  steps_.clip_scale = table_.snapshot.step_clip_scale;
}

}  // namespace gradex::sync
