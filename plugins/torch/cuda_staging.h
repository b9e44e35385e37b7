// The CUDA path of gradex_torch_ops (built when torch has CUDA and a CUDA toolkit is present).
//
// The C API works on host memory in this build, so a CUDA tensor is staged through pinned host
// memory, ordered on the caller's current stream and without any device-wide synchronisation:
//   stage():     copy device -> pinned host on the current stream, record an event; a staging
//   thread waits
//                for that event only, then hands the host buffer to the engine (so the calling
//                thread, e.g. autograd's, never blocks on the GPU);
//   copy_back(): after the engine finished, copy pinned host -> device on the current stream of the
//   thread
//                that waits (non-blocking; torch's pinned allocator keeps the buffer alive until
//                the copy has run).
#ifndef GRADEX_PLUGINS_TORCH_CUDA_STAGING_H_
#define GRADEX_PLUGINS_TORCH_CUDA_STAGING_H_

#include <memory>

#include "submission.h"

namespace gradex_torch {

void stage(const std::shared_ptr<Submission>& s);
void copy_back(Submission& s);

}  // namespace gradex_torch

#endif  // GRADEX_PLUGINS_TORCH_CUDA_STAGING_H_
