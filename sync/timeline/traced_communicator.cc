#include "sync/timeline/traced_communicator.h"

#include <utility>

#include "base/check.h"

namespace gradex::sync::timeline {

class TracedCommunicator::TracedRequest final : public comm::Request {
 public:
  TracedRequest(comm::RequestPtr inner, int peer, bool receive, size_t bytes)
      : inner(std::move(inner)),
        peer_(peer),
        receive(receive),
        bytes(bytes),
        posted(Clock::now()) {}
  int peer() const override { return peer_; }

  comm::RequestPtr inner;
  int peer_;
  bool receive;
  size_t bytes;  // a send's length; a receive's once it completed
  Clock::time_point posted;
  bool done = false;
};

TracedCommunicator::TracedCommunicator(std::unique_ptr<comm::Communicator> inner,
                                       Recorder& recorder)
    : inner_(std::move(inner)), recorder_(recorder) {
  for (auto& t : traffic_)
    t.resize(static_cast<size_t>(inner_->size()));
  for (int p = 0; p < inner_->size(); ++p) {
    if (p == inner_->rank()) continue;
    recorder_.name_row(send_row(p), "sends to rank " + std::to_string(p));
    recorder_.name_row(recv_row(p), "receives from rank " + std::to_string(p));
  }
}

comm::RequestPtr TracedCommunicator::isend(int peer, uint64_t tag, const void* data, size_t bytes) {
  return std::make_unique<TracedRequest>(inner_->isend(peer, tag, data, bytes), peer, false, bytes);
}

comm::RequestPtr TracedCommunicator::irecv(int peer, uint64_t tag, void* data, size_t bytes) {
  return std::make_unique<TracedRequest>(inner_->irecv(peer, tag, data, bytes), peer, true, 0);
}

comm::RequestPtr TracedCommunicator::irecv_any_length(int peer, uint64_t tag, comm::Bytes& out,
                                                      size_t max_bytes) {
  return std::make_unique<TracedRequest>(inner_->irecv_any_length(peer, tag, out, max_bytes), peer,
                                         true, 0);
}

TracedCommunicator::TracedRequest& TracedCommunicator::traced(comm::Request& request) const {
  // Every request this communicator hands out is a TracedRequest (the engine and its collectives
  // see no other communicator).
  return static_cast<TracedRequest&>(request);
}

void TracedCommunicator::completed(TracedRequest& r) {
  if (r.done) return;
  r.done = true;
  if (r.receive && r.inner != nullptr) r.bytes = inner_->recv_length(*r.inner);
  GX_CHECK_GE(r.peer_, 0);
  GX_CHECK_LT(r.peer_, inner_->size());
  Traffic& t = traffic_[r.receive ? 1 : 0][static_cast<size_t>(r.peer_)];
  const Clock::time_point now = Clock::now();
  if (t.messages == 0 || r.posted < t.first) t.first = r.posted;
  t.last = now;
  t.bytes += r.bytes;
  ++t.messages;
}

bool TracedCommunicator::test(comm::Request& request, const char* operation) {
  TracedRequest& r = traced(request);
  const bool done = inner_->test(*r.inner, operation);
  if (done) completed(r);
  return done;
}

void TracedCommunicator::wait_all(std::vector<comm::RequestPtr>& requests, const char* operation) {
  // The inner requests travel to the inner wait_all and back into their wrappers, also when it
  // throws (it cancels what did not complete; the wrappers then release cancelled requests).
  std::vector<comm::RequestPtr> inner;
  inner.reserve(requests.size());
  for (auto& request : requests)
    inner.push_back(request != nullptr ? std::move(traced(*request).inner) : nullptr);
  auto give_back = [&] {
    for (size_t i = 0; i < requests.size(); ++i)
      if (requests[i] != nullptr) traced(*requests[i]).inner = std::move(inner[i]);
  };
  try {
    inner_->wait_all(inner, operation);
  } catch (...) {
    give_back();
    throw;
  }
  give_back();
  for (auto& request : requests)
    if (request != nullptr) completed(traced(*request));
}

size_t TracedCommunicator::recv_length(const comm::Request& request) const {
  return inner_->recv_length(*traced(const_cast<comm::Request&>(request)).inner);
}

void TracedCommunicator::drain(const std::string& what, const Args& args) {
  for (int direction = 0; direction < 2; ++direction) {
    for (size_t p = 0; p < traffic_[direction].size(); ++p) {
      Traffic& t = traffic_[direction][p];
      if (t.messages == 0) continue;
      Args a = args;
      a.add("bytes", t.bytes).add("messages", t.messages).add("peer", static_cast<uint64_t>(p));
      const int peer = static_cast<int>(p);
      recorder_.span(direction == 0 ? send_row(peer) : recv_row(peer),
                     (direction == 0 ? "send " : "recv ") + what, t.first, t.last, a);
      t = Traffic();
    }
  }
}

void TracedCommunicator::discard() {
  for (auto& direction : traffic_)
    for (Traffic& t : direction)
      t = Traffic();
}

}  // namespace gradex::sync::timeline
