// Engine slots of the TensorFlow op library: which gradex_engine_t an op's `engine` attribute
// means, and the completion waiters that turn finished engine handles into calls of the kernels'
// `done`.
//
// An op names an engine by a small integer (its slot) rather than by address: graphs traced before
// gxt.shutdown() then fail cleanly ("engine slot 3 is not open") instead of touching freed memory.
// The Python package binds a slot to an engine after creating it (gradex_tf_bind) and unbinds it
// before destroying the engine (gradex_tf_unbind), which first completes every job still in flight.
//
// The C API reports completion through gradex_wait only, so each slot owns waiter threads: a waiter
// takes a job, waits for its handles and runs its callback; the pool grows while every waiter is
// busy, so a job blocked on a late rank never delays the jobs queued behind it. Waiters are the
// only place where anything blocks: kernels submit and return at once.
#ifndef GRADEX_PLUGINS_TENSORFLOW_SLOTS_H_
#define GRADEX_PLUGINS_TENSORFLOW_SLOTS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gradex/gradex.h"

namespace gradex_tf {

// Handles submitted by one kernel invocation. `complete` runs once, on the slot's completion
// waiter, after every handle has been waited for (each handle is always released, even after a
// failure), with the first failure's status and message, or GRADEX_OK.
struct Job {
  std::vector<gradex_handle_t> handles;
  std::function<void(gradex_status_t, const std::string&)> complete;
};

// One bound engine. Kernels use it between acquire() and enqueue()/release(); close() waits for
// them, then for every queued job, so that the engine can be destroyed afterwards.
class Slot {
 public:
  explicit Slot(gradex_engine_t* engine);
  ~Slot();  // close()
  Slot(const Slot&) = delete;
  Slot& operator=(const Slot&) = delete;

  gradex_engine_t* engine() const { return engine_; }
  // Starts a use (before submitting to the engine); false once the slot is closing.
  bool acquire();
  // Ends a use by queueing a job whose handles have all been submitted. Never blocks on the engine.
  void enqueue(Job job);
  // Ends a use that submitted nothing.
  void release();
  // Refuses new uses, waits for current ones, completes every queued job and joins the waiters.
  void close();

 private:
  struct State;
  void start_waiter();
  gradex_engine_t* engine_;
  std::unique_ptr<State> state_;
};

// The open slot `id` (shared: it stays valid while a kernel uses it), or nullptr with `*error` set.
std::shared_ptr<Slot> find_slot(int64_t id, std::string* error);

}  // namespace gradex_tf

extern "C" {
// Binds slot `id` (> 0) to `engine`. Returns 0, or 1 when the slot is taken or the arguments are
// bad.
__attribute__((visibility("default"))) int gradex_tf_bind(int64_t id, void* engine);
// Closes slot `id`: later ops on it fail; waits until its queued jobs have completed (bounded by
// the engine's GRADEX_TIMEOUT_S). Returns 0, or 1 when the slot was not bound.
__attribute__((visibility("default"))) int gradex_tf_unbind(int64_t id);
// The TensorFlow version this library was compiled against (tf.__version__ at build time).
__attribute__((visibility("default"))) const char* gradex_tf_built_for(void);
}

#endif  // GRADEX_PLUGINS_TENSORFLOW_SLOTS_H_
