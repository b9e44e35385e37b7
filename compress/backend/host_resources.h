// Memory, streams and events of the host backends (kCpu, kThrustOmp), and their common base:
// backend memory is ordinary host memory, and every operation has finished when its call returns,
// so a stream is only an ordering token and an event is always reached.
#pragma once

#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "base/error.h"
#include "compress/backend/backend.h"

namespace gradex::compress::backend {

// 64-byte aligned host memory (one cache line; enough for every vector width the kernels use).
class HostBuffer final : public Buffer {
 public:
  static BufferPtr make(size_t bytes) {
    void* p = nullptr;
    if (bytes > 0 && posix_memalign(&p, 64, bytes) != 0)
      throw InvalidArgument("host backend: cannot allocate " + std::to_string(bytes) + " bytes");
    return BufferPtr(new HostBuffer(p, bytes));
  }
  ~HostBuffer() override { std::free(data()); }

 private:
  HostBuffer(void* p, size_t bytes) : Buffer(p, bytes) {}
};

class HostStream final : public Stream {
 public:
  void* native() const override { return nullptr; }
  void wait(Event&) override {}  // host work is complete when its call returns
};

class HostEvent final : public Event {
 public:
  void record(Stream&) override {}
  bool ready() override { return true; }
  void synchronize() override {}
};

// Memory operations shared by the host backends.
inline void host_copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (dst == nullptr || src == nullptr) throw InvalidArgument("backend copy: null pointer");
  std::memmove(dst, src, bytes);
}
inline void host_fill_zero(void* dst, size_t bytes) {
  if (bytes == 0) return;
  if (dst == nullptr) throw InvalidArgument("backend fill_zero: null pointer");
  std::memset(dst, 0, bytes);
}

// What the host backends share: host memory for device and staging buffers alike, streams and
// events that are already complete, copies and fills on the caller's thread, the identity (device
// type `Type`, named as device_type_name names it) and DGC states of type `State` (constructed
// from numel and options). Subclasses supply the kernels (casts, reductions, fusion).
template <DeviceType Type, typename State>
class HostBackend : public Backend {
 public:
  DeviceType type() const override { return Type; }
  std::string name() const override { return device_type_name(Type); }
  bool host_accessible() const override { return true; }
  BufferPtr allocate(size_t bytes) override { return HostBuffer::make(bytes); }
  BufferPtr allocate_staging(size_t bytes) override { return HostBuffer::make(bytes); }
  StreamPtr create_stream() override { return std::make_unique<HostStream>(); }
  StreamPtr wrap_stream(void*) override { return std::make_unique<HostStream>(); }
  EventPtr create_event() override { return std::make_unique<HostEvent>(); }
  void copy(void* dst, const void* src, size_t bytes, Stream&) override {
    host_copy(dst, src, bytes);
  }
  void fill_zero(void* dst, size_t bytes, Stream&) override { host_fill_zero(dst, bytes); }

 protected:
  DgcStatePtr do_create_dgc(size_t numel, const DgcOptions& options) override {
    return std::make_unique<State>(numel, options);
  }
};

}  // namespace gradex::compress::backend
