// The staging fallback of gradex_torch_ops for CUDA tensors registered as host memory (16-bit
// tensors, parameter averages, and every CUDA tensor when the CUDA backend library cannot load;
// float32 gradients normally take cuda_device.h's path). The tensor is staged through pinned host
// memory, ordered on the caller's current stream and without any device-wide synchronisation:
//   stage():     copy device -> pinned host on the current stream, record an event; a staging
//                thread waits for that event only, then hands the host buffer to the engine (so
//                the calling thread, e.g. autograd's, never blocks on the GPU);
//   copy_back(): after the engine finished, copy pinned host -> device on the current stream of
//                the thread that waits (non-blocking; torch's pinned allocator keeps the buffer
//                alive until the copy has run).
#ifndef GRADEX_PLUGINS_TORCH_CUDA_STAGING_H_
#define GRADEX_PLUGINS_TORCH_CUDA_STAGING_H_

#include <memory>

#include "submission.h"

namespace gradex_torch {

void stage(const std::shared_ptr<Submission>& s);
void copy_back(Submission& s);

}  // namespace gradex_torch

#endif  // GRADEX_PLUGINS_TORCH_CUDA_STAGING_H_
