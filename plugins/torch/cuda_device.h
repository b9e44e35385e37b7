// The device path of gradex_torch_ops (built with the CUDA path): a float32 CUDA tensor registered
// as GRADEX_DEVICE_CUDA is handed to the engine in place, with the caller's current stream, and
// gradex computes on the GPU (only payloads and 16-bit dense buckets cross PCIe):
//   submit_on_device(): gradex_submit_device with the current stream of the tensor's device; the
//                       engine records an event on it, so the calling thread never blocks;
//   order_after():      after gradex_wait, the current stream of the waiting thread waits on the
//                       device for gradex's completion event (gradex_handle_event), and the
//                       tensor's memory is marked as used by that stream (so the caching allocator
//                       cannot hand it out before gradex is done with it).
#ifndef GRADEX_PLUGINS_TORCH_CUDA_DEVICE_H_
#define GRADEX_PLUGINS_TORCH_CUDA_DEVICE_H_

#include "submission.h"

namespace gradex_torch {

void submit_on_device(Submission& s);
void order_after(Submission& s);

}  // namespace gradex_torch

#endif  // GRADEX_PLUGINS_TORCH_CUDA_DEVICE_H_
