// The part of a tensor's engine state that lives in a device backend (compress/backend/backend.h):
// CUDA tensors always, float32 host tensors when GRADEX_BACKEND selects a host backend (so that CI
// runs exactly the code CUDA tensors run). Owned by TensorState::device; touched by the progress
// thread only while one of the tensor's handles is in flight, like the rest of TensorState.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "compress/backend/backend.h"
#include "compress/backend/staging.h"
#include "compress/options.h"
#include "compress/wire/codec.h"

namespace gradex::sync {

struct DeviceTensor {
  // Registered as CUDA memory (device_index is fixed by the first gradex_submit_device); else host
  // memory on a host backend.
  bool cuda = false;
  int device_index = -1;
  compress::backend::BackendPtr backend;  // null until a CUDA tensor's first submission
  // DGC policy: u and v in backend memory (created with the backend).
  compress::backend::DgcStatePtr dgc;
  compress::DgcOptions dgc_options;
  // Checkpointed state loaded before the backend was known; restored when it is.
  std::vector<uint8_t> pending_state;
  std::vector<float> pending_momentum;
  // Dense policy: gradex's momentum u (GRADEX_MOMENTUM > 0), zeroed on first use.
  compress::backend::BufferPtr momentum;
  // A DGC dense step's output (numel floats), allocated on the first such step.
  compress::backend::BufferPtr dense_out;
  std::unique_ptr<compress::backend::SelectionStager> stager;
  std::unique_ptr<compress::backend::PayloadApplier> applier;
  // The submitted gradient is ready on the caller's stream (recorded at submission).
  compress::backend::EventPtr ready;
  // Completion of the current submission, recorded on gradex's stream once the result is queued;
  // shared with the handle table so gradex_handle_event works after the handle was released.
  std::shared_ptr<compress::backend::Event> done;
  uint64_t last_handle = 0;
  uint64_t key_id = 0;
  compress::WireOptions wire;
  std::vector<uint8_t> encoded;
  compress::wire::DecodedPayload decoded;
};

}  // namespace gradex::sync
