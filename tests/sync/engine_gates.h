// The engine's test hooks (sync/engine/engine.h, through EngineTestAccess) and Gates, which holds
// the progress thread before a chosen unit's transfer: tests use it to put many tensors into one
// negotiation round (submit a gate tensor, wait until its transfer is reached, submit the rest,
// release it) and to watch the units that travel.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "capi/engine_access.h"
#include "sync/engine/engine.h"
#include "sync/engine/engine_executor.h"
#include "sync/engine/pipeline.h"

namespace gradex::sync {
// The engine's test hook (engine.h): a function the progress thread calls before each transfer.
struct EngineTestAccess {
  static void before_transfer(Engine& e, std::function<void(const pipeline::Unit&)> hook) {
    e.executor_->before_transfer_ = std::move(hook);
  }
  // Called before each job's prepare, on the thread that prepares it.
  static void before_prepare(Engine& e, std::function<void(const pipeline::Job&)> hook) {
    e.executor_->before_prepare_ = std::move(hook);
  }
};
}  // namespace gradex::sync

namespace gradex::test {

// Holds the progress thread before the transfer of a unit holding a gated key until the test
// releases it (bounded: after 60 s it goes on and the test's own checks fail). Also records every
// unit that travelled: its path, keys and this rank's message (DGC units), and which thread is
// the progress thread.
class Gates {
 public:
  struct Sent {
    sync::route::Path path;
    std::vector<std::string> keys;
    std::vector<uint8_t> message;
  };
  void gate(const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    state_[key] = kClosed;
  }
  // The hook (progress thread).
  void on_transfer(const sync::pipeline::Unit& unit) {
    std::unique_lock<std::mutex> lock(mutex_);
    progress_thread_ = std::this_thread::get_id();
    Sent s{unit.path, {}, unit.message};
    for (const auto* job : unit.jobs)
      s.keys.push_back(job->id.key);
    sent_.push_back(s);
    for (const std::string& key : s.keys) {
      auto it = state_.find(key);
      if (it == state_.end() || it->second != kClosed) continue;
      it->second = kReached;
      cv_.notify_all();
      cv_.wait_for(lock, std::chrono::seconds(60), [&] { return it->second == kOpen; });
    }
  }
  bool wait_reached(const std::string& key) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, std::chrono::seconds(60), [&] { return state_[key] == kReached; });
  }
  void release(const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    state_[key] = kOpen;
    cv_.notify_all();
  }
  std::vector<Sent> sent() {
    std::lock_guard<std::mutex> lock(mutex_);
    return sent_;
  }
  // The progress thread (known once a transfer has been reached).
  std::thread::id progress_thread() {
    std::lock_guard<std::mutex> lock(mutex_);
    return progress_thread_;
  }

 private:
  enum State { kClosed, kReached, kOpen };
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::string, State> state_;
  std::vector<Sent> sent_;
  std::thread::id progress_thread_;
};

inline std::shared_ptr<Gates> install_gates(gradex_engine_t* engine) {
  auto gates = std::make_shared<Gates>();
  gradex::sync::EngineTestAccess::before_transfer(
      gradex::capi::engine_of(engine),
      [gates](const sync::pipeline::Unit& u) { gates->on_transfer(u); });
  return gates;
}

}  // namespace gradex::test
