// The device path of gradex_torch_ops; see cuda_device.h for the contract.
#include "cuda_device.h"

#include <string>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace gradex_torch {

void submit_on_device(Submission& s) {
  const c10::DeviceIndex index = s.tensor.device().index();
  const c10::cuda::CUDAGuard guard(s.tensor.device());
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(index);
  gradex_handle_t handle = 0;
  const gradex_status_t status =
      s.absent
          ? gradex_submit_device_absent(s.engine, s.key.c_str(), s.tensor.data_ptr(),
                                        GRADEX_DEVICE_CUDA, static_cast<int>(index),
                                        stream.stream(), &handle)
          : gradex_submit_device(s.engine, s.key.c_str(), s.tensor.data_ptr(), GRADEX_DEVICE_CUDA,
                                 static_cast<int>(index), stream.stream(), &handle);
  std::string error = status == GRADEX_OK ? std::string() : std::string(gradex_last_error());
  std::lock_guard<std::mutex> lock(s.mu);
  s.status = status;
  s.error = std::move(error);
  s.handle = handle;
  s.handed_over = true;
}

void order_after(Submission& s) {
  const c10::DeviceIndex index = s.tensor.device().index();
  const c10::cuda::CUDAGuard guard(s.tensor.device());
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(index);
  const gradex_status_t status = gradex_handle_event(s.engine, s.handle, stream.stream());
  if (status != GRADEX_OK) throw_status(status, gradex_last_error());
  s.tensor.record_stream(stream);
}

}  // namespace gradex_torch
