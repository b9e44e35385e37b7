// The engine's tensor table: every registered tensor's state, the handles of submissions and
// which of them are in flight, and snapshot_state()'s buffers. It holds no lock: the engine's
// mutex guards it (a tensor's per-exchange state is also written by the progress thread and the
// worker pool, which own it while its unit runs: sync/engine/pipeline.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/error.h"
#include "sync/data/tensor_state.h"
#include "sync/negotiation/negotiator.h"

namespace gradex::sync {

class TensorTable {
 public:
  struct Handle {
    WorkId id;
    void* data = nullptr;
    bool done = false;
    ErrorCode code = ErrorCode::kOk;
    std::string message;
    // The clipping factor of this gradient's step (-1: none given; clip by the tensor's own norm).
    float clip_scale = -1.0f;
    bool absent = false;  // submit_absent: this rank contributes zeros, its state untouched
  };

  // snapshot_state()'s record of one tensor.
  struct TensorSnapshot {
    bool taken = false;
    bool sparse = false;  // the tensor's codec was sparse (a switch since refuses the rollback)
    bool has_dgc = false;
    bool in_state = false;     // the DGC state keeps its own snapshot (BackendPath::snapshot_dgc)
    std::vector<uint8_t> dgc;  // else DGC's state blob (BackendPath::save_dgc)
    std::vector<float> momentum;  // a dense tensor's u (empty: none yet)
    std::vector<float> anchor;
    std::vector<float> int8_residual, int8_owner_residual;  // the 8-bit route's (empty: none)
    int int8_world = 0;
    uint64_t int8_layout = 0;
    uint64_t step = 0;
    uint64_t exchanges = 0;
  };
  struct Snapshot {
    bool valid = false;
    std::map<std::string, TensorSnapshot> tensors;
    uint64_t completed_steps = 0;
    float step_clip_scale = -1.0f;
  };

  // The registered tensor `key`; InvalidArgument naming it when it was never registered.
  TensorState& at(const std::string& key);
  const TensorState& at(const std::string& key) const;

  // A new handle for `id`'s submission of `data` (not yet in flight).
  uint64_t open(const WorkId& id, void* data, float clip_scale, bool absent);
  // The in-flight work `id` completes with `code` and `message`; nothing when this rank never
  // submitted it (another rank's key).
  void complete(const WorkId& id, ErrorCode code, const std::string& message);
  // Every handle in flight completes with `code`; its message is `message`, after the work's name
  // when `prefix_name`.
  void fail_in_flight(ErrorCode code, const std::string& message, bool prefix_name);

  // A mismatch found before this rank announced the key names only the ranks that had: `f`'s
  // message with this rank's own size added, so every rank's message says what it submitted.
  std::string with_own_size(const NegotiationFailure& f, int rank) const;

  std::map<std::string, TensorState> tensors;
  std::map<uint64_t, Handle> handles;
  std::map<WorkId, uint64_t> in_flight;  // work id -> handle
  uint64_t next_handle = 1;
  Snapshot snapshot;
};

// "tensor 'key'" or "parameters 'key'": how errors name a submission.
std::string work_name(const WorkId& id);

}  // namespace gradex::sync
