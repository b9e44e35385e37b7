// UcxCommunicator: sleeping until the next collective. A rank with nothing to do waits in the
// kernel (the worker's event fd plus the caller's wake fd) until another rank's first message of
// the next collective arrives; it finds that message with a non-removing tag probe, so the
// collective itself receives it later as usual. Control messages (liveness probes, abort notices)
// wake the sleeper too and are serviced by progress() as in any other wait.
#include <poll.h>

#include <algorithm>
#include <chrono>

#include "comm/ucx/ucx_communicator.h"

namespace gradex::comm::ucx {
namespace {

// A collective's sub-tags occupy the low 16 bits of its user tag (communicator.h).
constexpr int kSubTagBits = 16;
// Without an event fd the wait polls; its sleeps grow to this (the latency of joining a round).
constexpr Millis kPollingSleepMax(5);

bool readable(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & POLLIN) != 0;
}

// Milliseconds for poll(2), rounded up so that a wait never ends early and never spins at 0.
int poll_ms(Millis timeout) {
  return static_cast<int>(std::clamp<Millis::rep>(timeout.count(), 1, 1 << 30));
}

Millis left_until(Clock::time_point deadline) {
  auto left = std::chrono::ceil<Millis>(deadline - Clock::now());
  return left.count() > 0 ? left : Millis(0);
}

}  // namespace

bool UcxCommunicator::collective_message_waiting(uint64_t tag) {
  // On the wire: user tag << kRankBits | source rank, control bit 63 clear. Matching every bit
  // from the sequence number up (control bit included) and none below finds any sub-tag of this
  // collective from any peer.
  const uint64_t wire = tag << kRankBits;
  const uint64_t mask = ~((uint64_t{1} << (kRankBits + kSubTagBits)) - 1);
  ucp_tag_recv_info_t info{};
  return ucp_tag_probe_nb(worker_->get(), wire, mask, /*remove=*/0, &info) != nullptr;
}

bool UcxCommunicator::sleep_on_events(int extra_fd, Millis timeout) {
  if (event_fd_ < 0) return false;
  ucs_status_t st = ucp_worker_arm(worker_->get());
  if (st == UCS_ERR_BUSY) return true;  // events pending: the caller progresses at once
  if (st != UCS_OK) return false;
  pollfd fds[2] = {{event_fd_, POLLIN, 0}, {extra_fd, POLLIN, 0}};
  ::poll(fds, extra_fd >= 0 ? 2 : 1, poll_ms(timeout));
  return true;
}

bool UcxCommunicator::wait_for_next_collective(int wake_fd, Millis max_wait) {
  static const char* const kOperation = "wait for the next collective";
  take_interrupt(kOperation, {});
  check_usable(kOperation, rank_);
  if (size_ == 1) {  // nobody else can start a collective: wait for the caller's fd only
    pollfd p{wake_fd, POLLIN, 0};
    ::poll(&p, wake_fd >= 0 ? 1 : 0, poll_ms(max_wait));
    return false;
  }
  const uint64_t tag = following_collective_seq() << kSubTagBits;
  const auto deadline = Clock::now() + max_wait;
  const std::vector<UcxRequest*> none;
  Millis polling_sleep(0);
  for (;;) {
    // Bounded: a flood of control messages must not keep this loop from its checks.
    for (int i = 0; i < 256 && progress(); ++i) {
    }
    throw_if_failed(kOperation, none);
    if (collective_message_waiting(tag)) return true;
    if (readable(wake_fd)) return false;
    const Millis left = left_until(deadline);
    if (left.count() == 0) return false;
    if (sleep_on_events(wake_fd, left)) continue;
    // No event fd: short sleeps, growing to kPollingSleepMax, woken early by the wake fd.
    polling_sleep = std::clamp(polling_sleep * 2, Millis(1), kPollingSleepMax);
    pollfd p{wake_fd, POLLIN, 0};
    ::poll(&p, wake_fd >= 0 ? 1 : 0, poll_ms(std::min(polling_sleep, left)));
  }
}

}  // namespace gradex::comm::ucx
