// CUDA staging of gradex_torch_ops; see cuda_staging.h for the contract.
#include "cuda_staging.h"

#include <deque>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace gradex_torch {
namespace {

// Hands staged submissions to the engine once their device-to-host copy has completed, in
// submission order. One thread per process, created on first use and deliberately never destroyed:
// joining it from a static destructor at interpreter exit could block, and the OS reclaims it.
class Stager {
 public:
  static Stager& instance() {
    static Stager* stager = new Stager();
    return *stager;
  }

  void enqueue(std::shared_ptr<Submission> s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(s));
    }
    cv_.notify_one();
  }

 private:
  Stager() : thread_([this] { run(); }) { thread_.detach(); }

  void run() {
    for (;;) {
      std::shared_ptr<Submission> s;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !queue_.empty(); });
        s = std::move(queue_.front());
        queue_.pop_front();
      }
      try {
        // Waits for this copy only (cudaEventSynchronize), never for the device.
        static_cast<at::cuda::CUDAEvent*>(s->ready.get())->synchronize();
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(s->mu);
        s->status = GRADEX_ERR_INTERNAL;
        s->error = std::string("staging '") + s->key + "' to host failed: " + e.what();
        s->handed_over = true;
        s->cv.notify_all();
        continue;
      }
      hand_over(*s, s->host.data_ptr());
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Submission>> queue_;
  std::thread thread_;
};

}  // namespace

void stage(const std::shared_ptr<Submission>& s) {
  const c10::cuda::CUDAGuard guard(s->tensor.device());
  const auto stream = c10::cuda::getCurrentCUDAStream(s->tensor.device().index());
  s->host = at::empty(s->tensor.sizes(), s->tensor.options().device(at::kCPU).pinned_memory(true));
  s->host.copy_(s->tensor, /*non_blocking=*/true);
  auto event = std::make_shared<at::cuda::CUDAEvent>(cudaEventDisableTiming);
  event->record(stream);
  s->ready = event;
  Stager::instance().enqueue(s);
}

void copy_back(Submission& s) {
  const c10::cuda::CUDAGuard guard(s.tensor.device());
  s.tensor.copy_(s.host, /*non_blocking=*/true);
}

}  // namespace gradex_torch
