// FramePool (frame_pool.h).
#include "comm/seal/frame_pool.h"

namespace gradex::comm::seal {
namespace {

constexpr size_t kPage = 4096;

}  // namespace

FramePool::Buffer FramePool::acquire(size_t bytes) {
  auto it = free_.lower_bound(bytes);
  if (it != free_.end() && it->first <= 2 * bytes + kPage) {
    Buffer b{std::move(it->second), it->first};
    pooled_ -= it->first;
    free_.erase(it);
    return b;
  }
  const size_t capacity = (bytes + kPage - 1) / kPage * kPage + (bytes == 0 ? kPage : 0);
  return Buffer{std::unique_ptr<uint8_t[]>(new uint8_t[capacity]), capacity};
}

void FramePool::release(Buffer buffer) {
  if (!buffer || buffer.capacity > max_pooled_) return;
  // Full: the largest buffers make room first (a smaller one is as likely to be reused and
  // pins less memory).
  while (pooled_ + buffer.capacity > max_pooled_ && !free_.empty()) {
    auto largest = std::prev(free_.end());
    if (largest->first <= buffer.capacity) return;  // the new one would be the largest: drop it
    pooled_ -= largest->first;
    free_.erase(largest);
  }
  pooled_ += buffer.capacity;
  free_.emplace(buffer.capacity, std::move(buffer.data));
}

}  // namespace gradex::comm::seal
