// One tensor handed to the engine by an op of gradex_torch_ops, from submission until gradex::wait.
#ifndef GRADEX_PLUGINS_TORCH_SUBMISSION_H_
#define GRADEX_PLUGINS_TORCH_SUBMISSION_H_

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include <ATen/core/Tensor.h>

#include "gradex/gradex.h"

namespace gradex_torch {

enum class Kind { kGradient, kParameters };  // gradex_submit or gradex_average

struct Submission {
  gradex_engine_t* engine = nullptr;
  std::string key;
  Kind kind = Kind::kGradient;
  at::Tensor tensor;       // the caller's tensor: holds the result once gradex::wait returns
  bool on_device = false;  // gradex_submit_device: the engine works on `tensor` itself
  bool absent = false;     // gradex_submit_absent / _device_absent: this rank contributes zeros
  at::Tensor host;         // staged CUDA tensors only: the pinned host copy the engine works on
  std::shared_ptr<void> ready;  // CUDA tensors only: event recorded after the copy into `host`

  // The hand-over to the engine: immediate for CPU tensors; done by the staging thread for CUDA
  // tensors once their copy into `host` has completed. Guarded by `mu`.
  std::mutex mu;
  std::condition_variable cv;
  bool handed_over = false;
  gradex_status_t status = GRADEX_OK;  // of gradex_submit / gradex_average
  std::string error;                   // gradex_last_error() of the thread that handed it over
  gradex_handle_t handle = 0;
};

// Calls gradex_submit (gradex_submit_absent when s.absent) or gradex_average with `data` from the
// calling thread and records the outcome in `s` (status, error message, handle), then wakes
// waiters. Never throws.
void hand_over(Submission& s, void* data);

// Throws a c10::Error "gradex[<STATUS>]: <message>" (the format the Python package parses).
[[noreturn]] void throw_status(gradex_status_t status, const std::string& message);

}  // namespace gradex_torch

#endif  // GRADEX_PLUGINS_TORCH_SUBMISSION_H_
