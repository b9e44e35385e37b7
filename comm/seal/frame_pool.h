// Buffers for sealed frames, reused across messages. A large frame in a fresh allocation costs
// the kernel's page faults and zeroing of every page on first touch, on top of the cipher's pass:
// measured on the engine's dense 16-bit route (ResNet-50, 4 ranks, loopback), fresh buffers doubled
// the step's CPU. One pool per communicator; not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>

namespace gradex::comm::seal {

class FramePool {
 public:
  struct Buffer {
    std::unique_ptr<uint8_t[]> data;
    size_t capacity = 0;
    uint8_t* get() const { return data.get(); }
    explicit operator bool() const { return data != nullptr; }
  };

  // Keeps at most `max_pooled_bytes` of free buffers.
  explicit FramePool(size_t max_pooled_bytes = size_t{256} << 20) : max_pooled_(max_pooled_bytes) {}

  // A buffer of at least `bytes`: a pooled one no more than twice as large (plus a page), else a
  // new one (capacity rounded up to whole pages).
  Buffer acquire(size_t bytes);
  // Returns a buffer to the pool (dropped when the pool is full).
  void release(Buffer buffer);
  size_t pooled_bytes() const { return pooled_; }

 private:
  std::multimap<size_t, std::unique_ptr<uint8_t[]>> free_;  // by capacity
  size_t pooled_ = 0;
  size_t max_pooled_;
};

}  // namespace gradex::comm::seal
