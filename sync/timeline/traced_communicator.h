// The engine's communicator while GRADEX_TIMELINE is on: every call goes to the communicator it
// wraps, and each message is counted against its peer and direction (bytes, messages, when the
// first was posted and the last completed), so that a unit's transfer or a negotiation round
// shows every peer's sends and receives on the timeline (drain()).
//
// Requests are wrapped to see their completion: test(), wait_all() and recv_length() hand the
// wrapped request to the inner communicator, so the inner one only ever sees its own. A message is
// complete when test() or wait_all() reports it; a receive's bytes are its received length then.
// Like any Communicator it is used by one thread at a time (the progress thread).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "sync/timeline/recorder.h"

namespace gradex::sync::timeline {

class TracedCommunicator final : public comm::Communicator {
 public:
  TracedCommunicator(std::unique_ptr<comm::Communicator> inner, Recorder& recorder);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const comm::CommOptions& options() const override { return inner_->options(); }
  comm::RequestPtr isend(int peer, uint64_t tag, const void* data, size_t bytes) override;
  comm::RequestPtr irecv(int peer, uint64_t tag, void* data, size_t bytes) override;
  bool receives_any_length() const override { return inner_->receives_any_length(); }
  comm::RequestPtr irecv_any_length(int peer, uint64_t tag, comm::Bytes& out,
                                    size_t max_bytes) override;
  bool progress() override { return inner_->progress(); }
  bool test(comm::Request& request, const char* operation) override;
  void wait_all(std::vector<comm::RequestPtr>& requests, const char* operation) override;
  size_t recv_length(const comm::Request& request) const override;
  uint64_t next_collective_tag() override { return inner_->next_collective_tag(); }
  bool wait_for_next_collective(int wake_fd, comm::Millis max_wait) override {
    return inner_->wait_for_next_collective(wake_fd, max_wait);
  }
  std::vector<int> unresponsive_peers() override { return inner_->unresponsive_peers(); }
  void abort(ErrorCode code, const std::string& message) override { inner_->abort(code, message); }
  std::vector<std::string> rank_hosts() const override { return inner_->rank_hosts(); }
  int connections_per_peer() const override { return inner_->connections_per_peer(); }
  void interrupt(ErrorCode code, const std::string& message) override {
    inner_->interrupt(code, message);
  }
  uint64_t bytes_sent() const override { return inner_->bytes_sent(); }
  uint64_t bytes_received() const override { return inner_->bytes_received(); }

  // Records one span per peer and direction for the messages completed since the last drain() or
  // discard(), named "send <what>" / "recv <what>" on the peer's rows, with their bytes and
  // message count plus `args`' members, then forgets them.
  void drain(const std::string& what, const Args& args);
  // Forgets the messages completed so far (traffic that belongs to no recorded phase).
  void discard();

 private:
  struct Traffic {
    uint64_t bytes = 0;
    uint64_t messages = 0;
    Clock::time_point first{};
    Clock::time_point last{};
  };
  class TracedRequest;
  void completed(TracedRequest& request);
  TracedRequest& traced(comm::Request& request) const;

  std::unique_ptr<comm::Communicator> inner_;
  Recorder& recorder_;
  // By peer: [0] sends, [1] receives.
  std::vector<Traffic> traffic_[2];
};

}  // namespace gradex::sync::timeline
