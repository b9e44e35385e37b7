// Engine slots and their completion waiters (see slots.h).
#include "slots.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace gradex_tf {

// Waiters: a job is waited for by an idle waiter thread; when none is idle another is started (up
// to kMaxWaiters). One blocked job (e.g. a key some rank submits late) therefore never delays the
// completion of the jobs behind it, which could otherwise deadlock ranks that issue ops in
// different orders; waiters block in gradex_wait instead of polling.
constexpr size_t kMaxWaiters = 64;

struct Slot::State {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Job> queue;
  std::vector<std::thread> waiters;
  size_t idle = 0;        // waiters blocked on `cv`, ready for a job
  int users = 0;          // kernels between acquire() and enqueue()/release()
  bool closing = false;   // no new uses
  bool stopping = false;  // waiters leave once the queue is empty
};

namespace {

std::mutex slots_mu;
std::unordered_map<int64_t, std::shared_ptr<Slot>> slots;

// Waits for every handle of `job` and runs its callback. The callback never throws (kernels only
// set a status and call `done`); a throwing std::function would terminate the process either way.
void finish(gradex_engine_t* engine, Job& job) {
  gradex_status_t first = GRADEX_OK;
  std::string message;
  for (gradex_handle_t handle : job.handles) {
    const gradex_status_t status = gradex_wait(engine, handle);
    if (status != GRADEX_OK && first == GRADEX_OK) {
      first = status;
      message = gradex_last_error();
    }
  }
  job.complete(first, message);
}

}  // namespace

Slot::Slot(gradex_engine_t* engine) : engine_(engine), state_(std::make_unique<State>()) {}

void Slot::start_waiter() {
  // Called with state_->mu held.
  State* s = state_.get();
  s->waiters.emplace_back([this, s] {
    std::unique_lock<std::mutex> lock(s->mu);
    for (;;) {
      ++s->idle;
      s->cv.wait(lock, [s] { return (s->stopping && s->users == 0) || !s->queue.empty(); });
      --s->idle;
      if (s->queue.empty()) return;  // stopping, and everything queued has completed
      Job job = std::move(s->queue.front());
      s->queue.pop_front();
      lock.unlock();
      finish(engine_, job);
      lock.lock();
    }
  });
}

Slot::~Slot() {
  close();
}

bool Slot::acquire() {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->closing) return false;
  ++state_->users;
  return true;
}

void Slot::enqueue(Job job) {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->queue.push_back(std::move(job));
    --state_->users;
    if (state_->idle < state_->queue.size() && state_->waiters.size() < kMaxWaiters) start_waiter();
  }
  state_->cv.notify_one();
}

void Slot::release() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    --state_->users;
  }
  state_->cv.notify_all();
}

void Slot::close() {
  {
    std::unique_lock<std::mutex> lock(state_->mu);
    state_->closing = true;
    state_->cv.wait(lock, [this] { return state_->users == 0; });
    state_->stopping = true;
  }
  state_->cv.notify_all();
  // No new waiter starts once stopping is set (enqueue needs a use, and closing refuses new ones).
  for (std::thread& t : state_->waiters)
    if (t.joinable()) t.join();
}

std::shared_ptr<Slot> find_slot(int64_t id, std::string* error) {
  std::lock_guard<std::mutex> lock(slots_mu);
  auto it = slots.find(id);
  if (it == slots.end()) {
    *error = "gradex engine slot " + std::to_string(id) +
             " is not open: call gradex.tensorflow.init() first (a graph traced before "
             "gxt.shutdown() cannot run after it)";
    return nullptr;
  }
  return it->second;
}

}  // namespace gradex_tf

int gradex_tf_bind(int64_t id, void* engine) {
  if (id <= 0 || engine == nullptr) return 1;
  std::lock_guard<std::mutex> lock(gradex_tf::slots_mu);
  if (gradex_tf::slots.count(id) != 0) return 1;
  gradex_tf::slots.emplace(
      id, std::make_shared<gradex_tf::Slot>(static_cast<gradex_engine_t*>(engine)));
  return 0;
}

int gradex_tf_unbind(int64_t id) {
  std::shared_ptr<gradex_tf::Slot> slot;
  {
    std::lock_guard<std::mutex> lock(gradex_tf::slots_mu);
    auto it = gradex_tf::slots.find(id);
    if (it == gradex_tf::slots.end()) return 1;
    slot = std::move(it->second);
    gradex_tf::slots.erase(it);
  }
  // Kernels that found the slot before it was erased finish their submission first; then every
  // queued job completes, so the caller may destroy the engine when this returns.
  slot->close();
  return 0;
}
