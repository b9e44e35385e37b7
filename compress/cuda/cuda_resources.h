// RAII owners of CUDA resources for the CUDA backend (host C++, built into
// libgradex_backend_cuda.so with the CUDA runtime): device memory, pinned host memory, streams,
// events, and a guard that makes a device current for a scope. Destructors never throw (a failed
// release during process exit is ignored: the runtime may already be unloading).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "compress/backend/backend.h"

namespace gradex::compress::cuda {

// Throws InternalError "CUDA error in <what>: <runtime message>" unless e is cudaSuccess.
void check(cudaError_t e, const char* what);

// Makes `device` current until the end of the scope, then restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool changed_ = false;
};

// cudaMalloc'ed memory.
class DeviceBuffer final : public backend::Buffer {
 public:
  static backend::BufferPtr make(size_t bytes, int device);
  ~DeviceBuffer() override;

 private:
  DeviceBuffer(void* p, size_t bytes) : Buffer(p, bytes) {}
};

// cudaHostAlloc'ed (pinned) host memory: the staging area for UCX.
class PinnedBuffer final : public backend::Buffer {
 public:
  static backend::BufferPtr make(size_t bytes);
  ~PinnedBuffer() override;

 private:
  PinnedBuffer(void* p, size_t bytes) : Buffer(p, bytes) {}
};

class CudaStream final : public backend::Stream {
 public:
  // Owned: a new non-blocking stream on `device`. Wrapped: the caller's stream, not destroyed.
  static backend::StreamPtr create(int device);
  static backend::StreamPtr wrap(cudaStream_t stream);
  ~CudaStream() override;
  void* native() const override { return stream_; }
  cudaStream_t get() const { return stream_; }
  void wait(backend::Event& event) override;

 private:
  CudaStream(cudaStream_t s, bool owned) : stream_(s), owned_(owned) {}
  cudaStream_t stream_;
  bool owned_;
};

class CudaEvent final : public backend::Event {
 public:
  explicit CudaEvent(int device);
  ~CudaEvent() override;
  void record(backend::Stream& stream) override;
  bool ready() override;
  void synchronize() override;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// The cudaStream_t of a backend stream (InvalidArgument for a stream of another backend).
cudaStream_t native_stream(backend::Stream& stream);

}  // namespace gradex::compress::cuda
