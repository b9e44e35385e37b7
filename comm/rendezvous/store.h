// Bootstrap key-value store. gradex never assumes who serves it: standalone runs use TcpStore
// (tcp_store.h), a framework plugin injects its own (e.g. torch.distributed's store) through the C
// API.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gradex::comm {

using Bytes = std::vector<uint8_t>;
using Millis = std::chrono::milliseconds;

class Store {
 public:
  virtual ~Store() = default;
  // Sets (or overwrites) a key.
  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Blocks until the key exists, then returns its value. TimeoutError naming the key after
  // `timeout`.
  virtual Bytes get(const std::string& key, Millis timeout) = 0;
  // Blocks until every key exists. TimeoutError naming the first missing key after `timeout`.
  virtual void wait(const std::vector<std::string>& keys, Millis timeout) = 0;
  // Atomically adds `delta` to an integer counter (created at 0) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
};

// A view of `base` in which every key is prefixed with `prefix` (so several communicators, or
// several runs, can share one store without colliding).
std::shared_ptr<Store> make_prefix_store(std::shared_ptr<Store> base, std::string prefix);

}  // namespace gradex::comm
