// An in-process Store: for a single-rank job (no networking needed) and for tests that run ranks
// as threads. Thread-safe; blocking calls wait on a condition variable.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "comm/rendezvous/store.h"

namespace gradex::comm {

class MemoryStore : public Store {
 public:
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Millis timeout) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, Bytes> data_;
};

}  // namespace gradex::comm
