// gradex_torch_ops: TORCH_LIBRARY(gradex) ops that hand torch tensors to the gradex C API.
//
//   gradex::submit(int engine, str key, Tensor(a!) grad) -> int         exchange a gradient
//   gradex::submit_device(int engine, str key, Tensor(a!) grad) -> int  the same, on the GPU
//   gradex::submit_absent(int engine, str key, Tensor(a!) grad, bool on_device) -> int
//                                      a rank with no gradient (gx.join): zeros contributed, its
//                                      momentum and DGC state untouched; `grad` receives the
//                                      average
//   gradex::average(int engine, str key, Tensor(a!) param) -> int       average parameters
//   gradex::wait(int ticket) -> ()     block until done; the tensor holds the result (on CUDA:
//                                      ordered on the waiting thread's current stream)
//   gradex::has_cuda() -> bool         whether this build has the CUDA paths
//
// `engine` is the gradex_engine_t* as an integer, owned by the Python package (ctypes binding of
// the C API); it must outlive every ticket it issued. Tensors must be contiguous,
// float32/float16/bfloat16, registered under `key` with their element count and dtype, and left
// untouched until wait returns. A ticket is consumed by wait, whatever its outcome. CPU tensors are
// handed to the engine in place. CUDA tensors: submit_device hands a float32 tensor registered as
// GRADEX_DEVICE_CUDA to the engine in place (cuda_device.h: compressed on the GPU); submit and
// average stage a CUDA tensor registered as host memory through pinned host memory
// (cuda_staging.h: the fallback for 16-bit tensors, parameter averages and builds whose CUDA
// backend cannot load). Failures throw c10::Error "gradex[<STATUS>]: <message>" with the engine's
// message.
#include <atomic>
#include <cstdint>
#include <unordered_map>

#include <torch/library.h>

#include "gradex/status_name.h"
#include "submission.h"
#ifdef GRADEX_TORCH_CUDA
#include "cuda_device.h"
#include "cuda_staging.h"
#endif

namespace gradex_torch {
namespace {

// Tickets in flight. A ticket is an opaque number so that Python never holds a C++ pointer.
std::mutex registry_mu;
std::unordered_map<int64_t, std::shared_ptr<Submission>> registry;
int64_t next_ticket = 1;

int64_t start(int64_t engine, const std::string& key, const at::Tensor& t, Kind kind,
              bool on_device = false, bool absent = false) {
  if (engine == 0) throw_status(GRADEX_ERR_INVALID_ARGUMENT, "the engine is closed");
  const auto dtype = t.scalar_type();
  if (dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16) {
    throw_status(GRADEX_ERR_INVALID_ARGUMENT,
                 "tensor '" + key + "' has dtype " + std::string(c10::toString(dtype)) +
                     "; gradex exchanges float32, float16 and bfloat16");
  }
  if (!t.is_contiguous()) {
    throw_status(GRADEX_ERR_INVALID_ARGUMENT, "tensor '" + key + "' is not contiguous");
  }
  auto s = std::make_shared<Submission>();
  s->engine = reinterpret_cast<gradex_engine_t*>(static_cast<uintptr_t>(engine));
  s->key = key;
  s->kind = kind;
  s->absent = absent;
  s->tensor = t;
  if (on_device) {
    if (!t.is_cuda() || dtype != at::kFloat || kind != Kind::kGradient)
      throw_status(GRADEX_ERR_INVALID_ARGUMENT,
                   "tensor '" + key +
                       "': gradex::submit_device takes float32 CUDA gradients, got " +
                       std::string(c10::toString(dtype)) + " on " + t.device().str());
#ifdef GRADEX_TORCH_CUDA
    s->on_device = true;
    submit_on_device(*s);
    if (s->status != GRADEX_OK) throw_status(s->status, s->error);
#else
    throw_status(GRADEX_ERR_INVALID_ARGUMENT,
                 "tensor '" + key + "' is on " + t.device().str() +
                     " but this gradex_torch_ops was built without CUDA support");
#endif
  } else if (t.is_cuda()) {
#ifdef GRADEX_TORCH_CUDA
    stage(s);
#else
    throw_status(GRADEX_ERR_INVALID_ARGUMENT,
                 "tensor '" + key + "' is on " + t.device().str() +
                     " but this gradex_torch_ops was built without CUDA support");
#endif
  } else if (t.device().is_cpu()) {
    hand_over(*s, t.data_ptr());
    if (s->status != GRADEX_OK) throw_status(s->status, s->error);
  } else {
    throw_status(GRADEX_ERR_INVALID_ARGUMENT, "tensor '" + key + "' is on " + t.device().str() +
                                                  "; gradex takes CPU and CUDA tensors");
  }
  std::lock_guard<std::mutex> lock(registry_mu);
  const int64_t ticket = next_ticket++;
  registry.emplace(ticket, std::move(s));
  return ticket;
}

int64_t submit_op(int64_t engine, c10::string_view key, const at::Tensor& grad) {
  return start(engine, std::string(key), grad, Kind::kGradient);
}

int64_t submit_device_op(int64_t engine, c10::string_view key, const at::Tensor& grad) {
  return start(engine, std::string(key), grad, Kind::kGradient, /*on_device=*/true);
}

int64_t submit_absent_op(int64_t engine, c10::string_view key, const at::Tensor& grad,
                         bool on_device) {
  return start(engine, std::string(key), grad, Kind::kGradient, on_device, /*absent=*/true);
}

int64_t average_op(int64_t engine, c10::string_view key, const at::Tensor& param) {
  return start(engine, std::string(key), param, Kind::kParameters);
}

void wait_op(int64_t ticket) {
  std::shared_ptr<Submission> s;
  {
    std::lock_guard<std::mutex> lock(registry_mu);
    auto it = registry.find(ticket);
    if (it == registry.end()) {
      throw_status(GRADEX_ERR_INVALID_ARGUMENT,
                   "unknown ticket " + std::to_string(ticket) + " (already waited for?)");
    }
    s = std::move(it->second);
    registry.erase(it);
  }
  {
    std::unique_lock<std::mutex> lock(s->mu);
    s->cv.wait(lock, [&] { return s->handed_over; });
  }
  if (s->status != GRADEX_OK) throw_status(s->status, s->error);
  const gradex_status_t status = gradex_wait(s->engine, s->handle);
  if (status != GRADEX_OK) throw_status(status, gradex_last_error());
#ifdef GRADEX_TORCH_CUDA
  if (s->on_device)
    order_after(*s);
  else if (s->tensor.is_cuda())
    copy_back(*s);
#endif
}

bool has_cuda_op() {
#ifdef GRADEX_TORCH_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace

void hand_over(Submission& s, void* data) {
  gradex_handle_t handle = 0;
  const gradex_status_t status =
      s.kind != Kind::kGradient ? gradex_average(s.engine, s.key.c_str(), data, &handle)
      : s.absent                ? gradex_submit_absent(s.engine, s.key.c_str(), data, &handle)
                                : gradex_submit(s.engine, s.key.c_str(), data, &handle);
  std::string error = status == GRADEX_OK ? std::string() : std::string(gradex_last_error());
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.status = status;
    s.error = std::move(error);
    s.handle = handle;
    s.handed_over = true;
  }
  s.cv.notify_all();
}

void throw_status(gradex_status_t status, const std::string& message) {
  TORCH_CHECK(false, "gradex[", gradex_status_name(status), "]: ", message);
}

}  // namespace gradex_torch

TORCH_LIBRARY(gradex, m) {
  m.def("submit(int engine, str key, Tensor(a!) grad) -> int", &gradex_torch::submit_op);
  m.def("submit_device(int engine, str key, Tensor(a!) grad) -> int",
        &gradex_torch::submit_device_op);
  m.def("submit_absent(int engine, str key, Tensor(a!) grad, bool on_device) -> int",
        &gradex_torch::submit_absent_op);
  m.def("average(int engine, str key, Tensor(a!) param) -> int", &gradex_torch::average_op);
  m.def("wait(int ticket) -> ()", &gradex_torch::wait_op);
  m.def("has_cuda() -> bool", &gradex_torch::has_cuda_op);
}
