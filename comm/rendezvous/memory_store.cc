#include "comm/rendezvous/memory_store.h"

#include <cstring>

#include "base/error.h"
#include "comm/rendezvous/socket.h"

namespace gradex::comm {
namespace {

std::string seconds(Millis t) {
  return format_seconds(static_cast<double>(t.count()) / 1000.0);
}

}  // namespace

void MemoryStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    data_[key] = value;
  }
  changed_.notify_all();
}

Bytes MemoryStore::get(const std::string& key, Millis timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!changed_.wait_for(lock, timeout, [&] { return data_.count(key) > 0; }))
    throw TimeoutError("store get", -1, "key '" + key + "' was not set within " + seconds(timeout));
  return data_[key];
}

void MemoryStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  const std::string* missing = nullptr;
  auto all_present = [&] {
    for (const auto& k : keys) {
      if (!data_.count(k)) {
        missing = &k;
        return false;
      }
    }
    return true;
  };
  if (!changed_.wait_for(lock, timeout, all_present))
    throw TimeoutError("store wait", -1,
                       "key '" + *missing + "' was not set within " + seconds(timeout));
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  int64_t value = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Bytes& b = data_[key];
    if (b.empty()) b.assign(8, 0);
    if (b.size() != 8)
      throw InvalidArgument("store add failed: key '" + key + "' holds a value, not a counter");
    for (int i = 0; i < 8; ++i)
      value |= static_cast<int64_t>(static_cast<uint64_t>(b[i]) << (8 * i));
    value += delta;
    for (int i = 0; i < 8; ++i)
      b[i] = static_cast<uint8_t>(static_cast<uint64_t>(value) >> (8 * i));
  }
  changed_.notify_all();
  return value;
}

}  // namespace gradex::comm
