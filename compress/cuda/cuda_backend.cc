// The CUDA backend (libgradex_backend_cuda.so): the Thrust/CUB launchers of dgc_cuda.h and
// ops_cuda.h behind compress/backend/backend.h. Loaded by backend::get_backend() with dlopen;
// exports only the two extern "C" entry points at the bottom.
//
// Ordering: every operation is queued on the caller's stream. Operations that return counts (the
// DGC step, to_half, count_nonfinite) wait for that stream's work only; nothing here ever calls
// cudaDeviceSynchronize. Fusion copies are cudaMemcpyAsync device-to-device per tensor.
#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "base/error.h"
#include "compress/backend/backend.h"
#include "compress/backend/buffered_dgc_state.h"
#include "compress/backend/validate.h"
#include "compress/cuda/cuda_resources.h"
#include "compress/cuda/dgc_cuda.h"
#include "compress/cuda/ops_cuda.h"
#include "compress/dgc/schedule.h"
#include "compress/thrust/step_info.h"

namespace gradex::compress::cuda {
namespace {

using backend::BufferPtr;

class CudaDgc final : public backend::BufferedDgcState {
 public:
  CudaDgc(size_t numel, const DgcOptions& o, int device)
      : BufferedDgcState(numel, o), device_(device) {
    DeviceGuard guard(device_);
    v_ = DeviceBuffer::make(n_ * 4, device_);
    if (n_) check(cudaMemsetAsync(v_->data(), 0, n_ * 4, nullptr), "cudaMemsetAsync");
    if (o_.momentum > 0) {
      u_ = DeviceBuffer::make(n_ * 4, device_);
      if (n_) check(cudaMemsetAsync(u_->data(), 0, n_ * 4, nullptr), "cudaMemsetAsync");
    }
    // The zeroing ran on the default stream, which the engine's non-blocking streams do not
    // order against: wait for it here, once per tensor (the default stream only, not the device).
    check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
    idx_ = DeviceBuffer::make(cap_ * 4, device_);
    val_ = DeviceBuffer::make(cap_ * 4, device_);
  }
  const uint32_t* selected_indices() const override { return idx_->as<uint32_t>(); }
  const float* selected_values() const override { return val_->as<float>(); }

  backend::DgcStepInfo step(const float* grad, float grad_scale, backend::Stream& stream) override {
    backend::require_pointers(n_, "cuda dgc step", grad);
    DeviceGuard guard(device_);
    thrust_dgc::StepParams p = thrust_dgc::make_step_params(o_, n_, step_);
    p.grad_scale = grad_scale;
    const size_t need = dgc_workspace_bytes(p);
    // The workspace grows to the largest step (warm-up steps need more) and then stays.
    if (!work_ || work_->bytes() < need) work_ = DeviceBuffer::make(need, device_);
    thrust_dgc::StepResult r =
        dgc_step(p, grad, momentum_buffer(), v_->as<float>(), idx_->as<uint32_t>(),
                 val_->as<float>(), work_->data(), work_->bytes(), native_stream(stream));
    return thrust_dgc::step_info(r, o_, step_++);
  }

  void step_dense(const float* grad, float* dense_out, float grad_scale,
                  backend::Stream& stream) override {
    backend::require_pointers(n_, "cuda dgc step_dense", grad, dense_out);
    DeviceGuard guard(device_);
    thrust_dgc::StepParams p = thrust_dgc::make_step_params(o_, n_, step_);
    p.grad_scale = grad_scale;
    dgc_step_dense(p, grad, momentum_buffer(), v_->as<float>(), dense_out, native_stream(stream));
    ++step_;
  }

 private:
  int device_;
  BufferPtr idx_, val_, work_;
};

class CudaBackend final : public backend::Backend {
 public:
  CudaBackend(int device, std::string name) : device_(device), name_(std::move(name)) {}
  backend::DeviceType type() const override { return backend::DeviceType::kCuda; }
  std::string name() const override { return name_; }
  bool host_accessible() const override { return false; }

  BufferPtr allocate(size_t bytes) override { return DeviceBuffer::make(bytes, device_); }
  BufferPtr allocate_staging(size_t bytes) override {
    DeviceGuard guard(device_);
    return PinnedBuffer::make(bytes);
  }
  backend::StreamPtr create_stream() override { return CudaStream::create(device_); }
  backend::StreamPtr wrap_stream(void* native) override {
    return CudaStream::wrap(static_cast<cudaStream_t>(native));
  }
  backend::EventPtr create_event() override { return std::make_unique<CudaEvent>(device_); }
  void copy(void* dst, const void* src, size_t bytes, backend::Stream& stream) override {
    if (bytes == 0) return;
    backend::require_pointers(bytes, "cuda copy", dst, src);
    DeviceGuard guard(device_);
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, native_stream(stream)),
          "cudaMemcpyAsync");
  }
  void fill_zero(void* dst, size_t bytes, backend::Stream& stream) override {
    if (bytes == 0) return;
    backend::require_pointers(bytes, "cuda fill_zero", dst);
    DeviceGuard guard(device_);
    check(cudaMemsetAsync(dst, 0, bytes, native_stream(stream)), "cudaMemsetAsync");
  }

 protected:
  backend::DgcStatePtr do_create_dgc(size_t numel, const DgcOptions& options) override {
    return std::make_unique<CudaDgc>(numel, options, device_);
  }

  backend::CastCounts do_to_half(const float* in, uint16_t* out, size_t n, DType type, float scale,
                                 backend::Stream& stream) override {
    DeviceGuard guard(device_);
    thrust_dgc::CastCounts c = cuda::to_half(in, out, n, type, scale, native_stream(stream));
    return {c.saturated, c.nonfinite};
  }
  void do_from_half(const uint16_t* in, float* out, size_t n, DType type, float scale, bool add,
                    backend::Stream& stream) override {
    DeviceGuard guard(device_);
    cuda::from_half(in, out, n, type == DType::kBFloat16, scale, add, native_stream(stream));
  }
  size_t do_count_nonfinite(const float* x, size_t n, backend::Stream& stream) override {
    DeviceGuard guard(device_);
    return cuda::count_nonfinite(x, n, native_stream(stream));
  }

  double do_sum_squares(const float* x, size_t n, backend::Stream& stream) override {
    DeviceGuard guard(device_);
    return cuda::sum_squares(x, n, native_stream(stream));
  }
  void do_zero_nonfinite(float* x, size_t n, backend::Stream& stream) override {
    DeviceGuard guard(device_);
    cuda::zero_nonfinite(x, n, native_stream(stream));
  }
  void do_apply_momentum(float* g, float* u, size_t n, float momentum, bool nesterov,
                         float grad_scale, backend::Stream& stream) override {
    DeviceGuard guard(device_);
    cuda::apply_momentum(g, u, n, momentum, nesterov, grad_scale, native_stream(stream));
  }

  void do_gather(const backend::FusionEntry* entries, size_t count, float* bucket,
                 backend::Stream& stream) override {
    DeviceGuard guard(device_);
    for (size_t i = 0; i < count; ++i)
      if (entries[i].numel)
        check(cudaMemcpyAsync(bucket + entries[i].offset, entries[i].data, entries[i].numel * 4,
                              cudaMemcpyDeviceToDevice, native_stream(stream)),
              "gather");
  }
  void do_scatter(const float* bucket, const backend::FusionEntry* entries, size_t count,
                  backend::Stream& stream) override {
    DeviceGuard guard(device_);
    for (size_t i = 0; i < count; ++i)
      if (entries[i].numel)
        check(cudaMemcpyAsync(entries[i].data, bucket + entries[i].offset, entries[i].numel * 4,
                              cudaMemcpyDeviceToDevice, native_stream(stream)),
              "scatter");
  }

  void do_scatter_add(const uint32_t* indices, const float* values, size_t count, float* out,
                      size_t numel, float scale, backend::Stream& stream) override {
    DeviceGuard guard(device_);
    cuda::scatter_add(indices, values, count, out, scale, native_stream(stream));
  }

 private:
  int device_;
  std::string name_;
};

void copy_message(const std::string& msg, char* err, size_t size) {
  if (err == nullptr || size == 0) return;
  std::strncpy(err, msg.c_str(), size - 1);
  err[size - 1] = '\0';
}

}  // namespace
}  // namespace gradex::compress::cuda

extern "C" __attribute__((visibility("default"))) int gradex_backend_cuda_abi() {
  return gradex::compress::backend::kCudaBackendAbi;
}

// A backend for CUDA device `device`, or null with a message (no runtime, no device, bad index).
extern "C" __attribute__((visibility("default"))) gradex::compress::backend::Backend*
gradex_backend_cuda_create(int device, char* err, size_t err_size) {
  using namespace gradex::compress::cuda;
  try {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
      copy_message(std::string("no usable CUDA runtime or driver: ") + cudaGetErrorString(e), err,
                   err_size);
      return nullptr;
    }
    if (device < 0 || device >= count) {
      copy_message("device index " + std::to_string(device) + " out of range (" +
                       std::to_string(count) + " CUDA devices)",
                   err, err_size);
      return nullptr;
    }
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    return new CudaBackend(device, "cuda:" + std::to_string(device) + " (" + prop.name + ")");
  } catch (const std::exception& ex) {
    copy_message(ex.what(), err, err_size);
    return nullptr;
  }
}
