// A level-triggered wake-up for the engine's progress thread, as a file descriptor (an eventfd), so
// that the thread can sleep in one poll(2) on it and on the transport's events together
// (comm::Communicator::wait_for_next_collective). signal() is safe from any thread; the fd stays
// readable until drain().
#pragma once

#include <chrono>

namespace gradex::sync {

class WakeEvent {
 public:
  WakeEvent();  // TransportError when the kernel refuses an eventfd (out of descriptors)
  ~WakeEvent();
  WakeEvent(const WakeEvent&) = delete;
  WakeEvent& operator=(const WakeEvent&) = delete;

  int fd() const { return fd_; }
  void signal();
  // Clears the signal. Call before checking what the signal announces, so that a signal sent
  // after the check is never lost.
  void drain();
  // Sleeps until signalled (the signal stays until drain()) or `max_wait` has passed.
  void wait(std::chrono::milliseconds max_wait) const;

 private:
  int fd_ = -1;
};

}  // namespace gradex::sync
