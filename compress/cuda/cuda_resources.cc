#include "compress/cuda/cuda_resources.h"

#include "base/error.h"

namespace gradex::compress::cuda {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw InternalError(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

DeviceGuard::DeviceGuard(int device) {
  check(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ != device) {
    check(cudaSetDevice(device), "cudaSetDevice");
    changed_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  if (changed_) cudaSetDevice(previous_);
}

backend::BufferPtr DeviceBuffer::make(size_t bytes, int device) {
  DeviceGuard guard(device);
  void* p = nullptr;
  if (bytes > 0) check(cudaMalloc(&p, bytes), "cudaMalloc");
  return backend::BufferPtr(new DeviceBuffer(p, bytes));
}

DeviceBuffer::~DeviceBuffer() {
  if (data()) cudaFree(data());
}

backend::BufferPtr PinnedBuffer::make(size_t bytes) {
  void* p = nullptr;
  if (bytes > 0) check(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), "cudaHostAlloc");
  return backend::BufferPtr(new PinnedBuffer(p, bytes));
}

PinnedBuffer::~PinnedBuffer() {
  if (data()) cudaFreeHost(data());
}

backend::StreamPtr CudaStream::create(int device) {
  DeviceGuard guard(device);
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return backend::StreamPtr(new CudaStream(s, true));
}

backend::StreamPtr CudaStream::wrap(cudaStream_t stream) {
  return backend::StreamPtr(new CudaStream(stream, false));
}

CudaStream::~CudaStream() {
  if (owned_) cudaStreamDestroy(stream_);
}

void CudaStream::wait(backend::Event& event) {
  auto* e = dynamic_cast<CudaEvent*>(&event);
  if (!e) throw InvalidArgument("CUDA stream: can only wait on an event of the CUDA backend");
  check(cudaStreamWaitEvent(stream_, e->get(), 0), "cudaStreamWaitEvent");
}

CudaEvent::CudaEvent(int device) {
  DeviceGuard guard(device);
  check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
}

CudaEvent::~CudaEvent() {
  if (event_) cudaEventDestroy(event_);
}

void CudaEvent::record(backend::Stream& stream) {
  check(cudaEventRecord(event_, native_stream(stream)), "cudaEventRecord");
}

bool CudaEvent::ready() {
  const cudaError_t e = cudaEventQuery(event_);
  if (e == cudaErrorNotReady) return false;
  check(e, "cudaEventQuery");
  return true;
}

void CudaEvent::synchronize() {
  check(cudaEventSynchronize(event_), "cudaEventSynchronize");
}

cudaStream_t native_stream(backend::Stream& stream) {
  auto* s = dynamic_cast<CudaStream*>(&stream);
  if (!s) throw InvalidArgument("CUDA backend: the stream belongs to another backend");
  return s->get();
}

}  // namespace gradex::compress::cuda
