// The part of a tensor's engine state that lives in its backend (compress/backend/backend.h): host
// tensors on the CPU backend (GRADEX_BACKEND=thrust-omp: the CUDA backend's Thrust code on
// OpenMP), CUDA tensors on the CUDA backend. Owned by TensorState::backend; touched by the
// progress thread only while one of the tensor's handles is in flight, like the rest of
// TensorState.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "compress/backend/backend.h"
#include "compress/backend/dgc_codec.h"
#include "compress/options.h"

namespace gradex::sync {

struct BackendTensor {
  // Registered as CUDA memory (device_index is fixed by the first gradex_submit_device); else host
  // memory.
  bool cuda = false;
  int device_index = -1;
  compress::backend::BackendPtr backend;  // null until a CUDA tensor's first submission
  // DGC policy: the codec (u and v in backend memory), created with the backend.
  std::unique_ptr<compress::backend::DgcCodec> dgc;
  compress::DgcOptions dgc_options;
  // Checkpointed state loaded before the backend was known; restored when it is.
  std::vector<uint8_t> pending_state;
  std::vector<float> pending_momentum;
  // Dense policy: gradex's momentum u (GRADEX_MOMENTUM > 0), zeroed on first use.
  compress::backend::BufferPtr momentum;
  // A 16-bit host tensor's fp32 values (numel floats): filled from the caller's buffer when the
  // gradient is inspected, computed on in every stage, cast back when the result is written.
  compress::backend::BufferPtr f32;
  // The submitted gradient is ready on the caller's stream (recorded at submission).
  compress::backend::EventPtr ready;
  // Completion of the current submission, recorded on gradex's stream once the result is queued;
  // shared with the handle table so gradex_handle_event works after the handle was released.
  std::shared_ptr<compress::backend::Event> done;
  uint64_t last_handle = 0;
};

}  // namespace gradex::sync
