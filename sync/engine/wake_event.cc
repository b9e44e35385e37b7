#include "sync/engine/wake_event.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "base/error.h"

namespace gradex::sync {

WakeEvent::WakeEvent() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (fd_ < 0)
    throw TransportError(std::string("eventfd for the engine's wake-ups failed: ") +
                         std::strerror(errno));
}

WakeEvent::~WakeEvent() {
  ::close(fd_);
}

void WakeEvent::signal() {
  const uint64_t one = 1;
  // EAGAIN only when the counter is about to overflow: it is readable then anyway.
  while (::write(fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
  }
}

void WakeEvent::drain() {
  uint64_t count = 0;
  while (::read(fd_, &count, sizeof(count)) < 0 && errno == EINTR) {
  }
}

void WakeEvent::wait(std::chrono::milliseconds max_wait) const {
  pollfd p{fd_, POLLIN, 0};
  ::poll(&p, 1, static_cast<int>(std::max<std::chrono::milliseconds::rep>(0, max_wait.count())));
}

}  // namespace gradex::sync
