// allreduce_sum: ring reduce-scatter then ring allgather, as one chain of 2(P-1) steps.
//
// The buffer is cut into P segments (the first count % P segments one element longer). At step s
// rank r sends segment send_seg(s) to rank r+1 and receives segment recv_seg(s) from rank r-1:
//   reduce-scatter, s in [0, P-1):  send (r - s) mod P,      receive (r - s - 1) mod P, summed in
//   allgather, t = s - (P-1):       send (r + 1 - t) mod P,  receive (r - t) mod P, copied
// so send_seg(s + 1) == recv_seg(s): what a rank receives at one step it forwards at the next.
// Every step moves its segment in chunks of options().ring_chunk_bytes. Receives are posted a
// window ahead; when chunk c of step s arrives it is reduced (or lands in place) and chunk c of
// step s + 1 is sent immediately, so reduction and forwarding overlap the transfers behind them.
// Chunk c of step s travels with tag + s + tag_lane(c): consecutive chunks take different lanes,
// so a communicator with several connections per peer (CommOptions::stripes) spreads a step over
// them; chunks c and c + kTagLanes share a tag and are matched in order (UCX tag matching is
// ordered per sender and tag, and one tag keeps to one connection).
// Every received chunk's length is checked against the one this rank expects: ranks that disagree
// on the count (or dtype) fail with a MismatchError naming both ranks and both lengths, never with
// a silently wrong sum. Reduce-scatter chunks are received into full-size slots so that a longer
// message is measured rather than truncated.
#include <algorithm>
#include <cstring>
#include <memory>

#include "base/check.h"
#include "base/error.h"
#include "base/thread_buffer.h"
#include "comm/collectives.h"
#include "comm/collectives/reduce.h"

namespace gradex::comm {
namespace {

constexpr size_t kRecvWindow = 8;  // chunks received ahead of the one being reduced

// The receive window's slots (base/thread_buffer.h): every byte a slot is read for has just been
// received into it.
struct RingSlotsTag {};
uint8_t* scratch_slots(size_t bytes) {
  return thread_buffer<RingSlotsTag>(bytes);
}

class RingAllreduce {
 public:
  RingAllreduce(Communicator& comm, void* data, size_t count, DType dtype)
      : comm_(comm),
        data_(static_cast<uint8_t*>(data)),
        count_(count),
        dtype_(dtype),
        elem_(dtype_size(dtype)),
        P_(comm.size()),
        r_(comm.rank()),
        steps_(2 * (P_ - 1)),
        chunk_elems_(std::max<size_t>(1, comm.options().ring_chunk_bytes / elem_)) {
    GX_CHECK_LT(steps_, 1 << kTagLaneShift);  // steps are sub-tags below the lane bits
    tag_ = comm.next_collective_tag();
    scratch_ = scratch_slots(kRecvWindow * chunk_elems_ * elem_);
    sends_.resize(static_cast<size_t>(steps_));
    one_.resize(1);
  }

  void run() {
    // Step 0 sends this rank's own segment: all of it is ready now.
    for (size_t c = 0; c < chunks(send_seg(0)); ++c)
      post_send(0, c);
    // Receives in (step, chunk) order, a window ahead of processing.
    std::vector<std::pair<int, size_t>> order;
    for (int s = 0; s < steps_; ++s)
      for (size_t c = 0; c < chunks(recv_seg(s)); ++c)
        order.emplace_back(s, c);
    std::vector<RequestPtr> recvs(order.size());
    size_t posted = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      while (posted < order.size() && posted < i + kRecvWindow &&
             can_post(order[posted].first, order[posted].second)) {
        post_recv(order[posted].first, order[posted].second, posted % kRecvWindow, recvs[posted]);
        ++posted;
      }
      auto [s, c] = order[i];
      check_length(s, c, wait_recv(recvs[i]));
      if (s < P_ - 1)
        sum_into(chunk_ptr(recv_seg(s), c), slot(i % kRecvWindow), chunk_len(recv_seg(s), c),
                 dtype_);
      if (s + 1 < steps_) post_send(s + 1, c);
    }
    for (auto& step : sends_)
      comm_.wait_all(step, "allreduce");
  }

 private:
  size_t seg_len(int k) const { return count_ / P_ + (static_cast<size_t>(k) < count_ % P_); }
  size_t seg_begin(int k) const {
    size_t k_ = static_cast<size_t>(k);
    return k_ * (count_ / P_) + std::min(k_, count_ % P_);
  }
  size_t chunks(int k) const { return (seg_len(k) + chunk_elems_ - 1) / chunk_elems_; }
  size_t chunk_len(int k, size_t c) const {
    return std::min(chunk_elems_, seg_len(k) - c * chunk_elems_);
  }
  uint8_t* chunk_ptr(int k, size_t c) { return data_ + (seg_begin(k) + c * chunk_elems_) * elem_; }
  uint8_t* slot(size_t i) { return scratch_ + i * chunk_elems_ * elem_; }

  // One request at a time through a reused one-element vector (no allocation per chunk).
  void wait_one(RequestPtr& request) {
    if (!request) return;
    one_[0] = std::move(request);
    comm_.wait_all(one_, "allreduce");
    one_[0].reset();
  }
  // Waits for a receive and returns the number of bytes that arrived.
  size_t wait_recv(RequestPtr& request) {
    one_[0] = std::move(request);
    comm_.wait_all(one_, "allreduce");
    const size_t received = comm_.recv_length(*one_[0]);
    one_[0].reset();
    return received;
  }
  int mod(int x) const { return ((x % P_) + P_) % P_; }
  int send_seg(int s) const { return s < P_ - 1 ? mod(r_ - s) : mod(r_ + 1 - (s - (P_ - 1))); }
  int recv_seg(int s) const { return s < P_ - 1 ? mod(r_ - s - 1) : mod(r_ - (s - (P_ - 1))); }
  int right() const { return (r_ + 1) % P_; }
  int left() const { return (r_ + P_ - 1) % P_; }

  void check_length(int s, size_t c, size_t received) const {
    const int k = recv_seg(s);
    const size_t expected = chunk_len(k, c) * elem_;
    if (received == expected) return;
    throw MismatchError("allreduce: rank " + std::to_string(r_) + " received " +
                        std::to_string(received) + " bytes from rank " + std::to_string(left()) +
                        " for " + (s < P_ - 1 ? "reduce-scatter" : "allgather") + " step " +
                        std::to_string(s) + " (segment " + std::to_string(k) + ", chunk " +
                        std::to_string(c) + "), expected " + std::to_string(expected) + ": ranks " +
                        std::to_string(left()) + " and " + std::to_string(r_) +
                        " disagree on the buffer (rank " + std::to_string(r_) + " sums " +
                        std::to_string(count_) + " x " + dtype_name(dtype_) + ")");
  }

  uint64_t chunk_tag(int s, size_t c) const {
    return tag_ + static_cast<uint64_t>(s) + tag_lane(c);
  }

  void post_send(int s, size_t c) {
    int k = send_seg(s);
    sends_[static_cast<size_t>(s)].push_back(
        comm_.isend(right(), chunk_tag(s, c), chunk_ptr(k, c), chunk_len(k, c) * elem_));
  }

  // An allgather receive overwrites the region of reduce-scatter send (s - (P-1), c); it can only
  // be posted once that send exists (it always does by the time the receive is next in line).
  bool can_post(int s, size_t c) const {
    return s < P_ - 1 || c < sends_[static_cast<size_t>(s - (P_ - 1))].size();
  }

  void post_recv(int s, size_t c, size_t slot_index, RequestPtr& out) {
    int k = recv_seg(s);
    size_t bytes = chunk_len(k, c) * elem_;
    if (s < P_ - 1) {
      // A whole slot: a longer chunk than expected is then measured, not truncated.
      out = comm_.irecv(left(), chunk_tag(s, c), slot(slot_index), chunk_elems_ * elem_);
      return;
    }
    // Allgather lands in place, over the region this rank sent at reduce-scatter step
    // t = s - (P-1): that send must have left the buffer first.
    int t = s - (P_ - 1);
    wait_one(sends_[static_cast<size_t>(t)][c]);
    out = comm_.irecv(left(), chunk_tag(s, c), chunk_ptr(k, c), bytes);
  }

  Communicator& comm_;
  uint8_t* data_;
  size_t count_;
  DType dtype_;
  size_t elem_;
  int P_;
  int r_;
  int steps_;
  size_t chunk_elems_;
  uint64_t tag_ = 0;
  // The thread's receive slots (scratch_slots): they outlive every request of this call.
  uint8_t* scratch_ = nullptr;
  std::vector<std::vector<RequestPtr>> sends_;  // per step, per chunk
  std::vector<RequestPtr> one_;
};

}  // namespace

void allreduce_sum(Communicator& comm, void* data, size_t count, DType dtype) {
  if (comm.size() == 1 || count == 0) return;
  GX_CHECK(data != nullptr);
  RingAllreduce(comm, data, count, dtype).run();
}

}  // namespace gradex::comm
