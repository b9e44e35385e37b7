// Grow-only scratch memory for hot paths: one buffer per (Tag, thread), grown to the largest size
// asked for and never shrunk or zero-filled, so a steady-state caller allocates nothing. The
// contents are undefined on return; callers write every byte they later read. Distinct tags give
// distinct buffers, so nested users on one thread (a fusion bucket and the ring's receive slots)
// never share memory. The pointer stays valid until the same thread asks the same tag for more.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace gradex {

template <typename Tag>
uint8_t* thread_buffer(size_t bytes) {
  thread_local std::unique_ptr<uint8_t[]> buffer;
  thread_local size_t capacity = 0;
  if (bytes > capacity) {
    buffer.reset(new uint8_t[bytes]);
    capacity = bytes;
  }
  return buffer.get();
}

}  // namespace gradex
