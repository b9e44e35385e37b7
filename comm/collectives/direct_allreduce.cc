// direct_allreduce_sum: a reduce-scatter and an allgather of direct messages (contract in
// comm/collectives.h). Every rank sends segment k of its buffer straight to rank k, rank k sums
// the P contributions in the ring's order (its own first, then k+1, ..., k-1), then sends the sum
// straight to every rank. Two message latencies whatever the world size, where the ring chains
// 2(P-1); the same bytes per rank ((P-1)/P of the buffer out and in, per phase), but P-1 messages
// arrive at once at every rank in each phase, which only pays where latency, not a shallow switch
// queue, bounds the exchange (the engine decides from the agreed link model:
// sync/data/dense_exchange.h). Two ranks swap their whole buffers instead, in one message latency:
// the same bytes as the two phases' halves, and nothing arrives at once. The ring's order makes
// every result bit-identical to allreduce_sum's, so the two are interchangeable at any step.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/thread_buffer.h"
#include "comm/collectives.h"
#include "comm/collectives/received_length.h"
#include "comm/collectives/reduce.h"

namespace gradex::comm {
namespace {

struct DirectSlotsTag {};

size_t seg_len(size_t count, int P, int k) {
  return count / static_cast<size_t>(P) + (static_cast<size_t>(k) < count % static_cast<size_t>(P));
}
size_t seg_begin(size_t count, int P, int k) {
  const size_t k_ = static_cast<size_t>(k), P_ = static_cast<size_t>(P);
  return k_ * (count / P_) + std::min(k_, count % P_);
}

void check_length(Communicator& comm, const Request& request, size_t expected, int peer,
                  const char* phase, size_t count, DType dtype) {
  expect_received(comm, request, expected, peer, [&] {
    const std::string me = std::to_string(comm.rank());
    return ReceivedText{"direct allreduce", "",
                        std::string(" in the ") + phase + ": ranks " + std::to_string(peer) +
                            " and " + me + " disagree on the buffer (rank " + me + " sums " +
                            std::to_string(count) + " x " + dtype_name(dtype) + ")"};
  });
}

// Two ranks: each sends its whole buffer and sums both segments itself, each with the operands in
// the ring's order (segment k: acc = x_k, then acc = x_(k+1) + acc), so both ranks hold the ring's
// bits, NaN payloads included. The buffer travels in one piece per connection to the peer (piece
// i on lane i, comm/communicator.h), so that a striped path carries it on every TCP flow.
void swap_and_sum(Communicator& comm, uint8_t* bytes, size_t count, DType dtype) {
  const int r = comm.rank(), other = 1 - r;
  const size_t elem = dtype_size(dtype);
  const size_t whole = count * elem;
  const uint64_t tag = comm.next_collective_tag();
  const size_t pieces = std::clamp<size_t>(static_cast<size_t>(comm.connections_per_peer()), 1,
                                           std::min<size_t>(count, kTagLanes));
  auto piece_begin = [&](size_t i) { return count * i / pieces; };
  // One element more than the buffer: a longer last piece is measured, not truncated (a longer
  // earlier one fails the receive, naming the peer).
  uint8_t* theirs = thread_buffer<DirectSlotsTag>(whole + elem);
  std::vector<RequestPtr> recvs, sends;
  for (size_t i = 0; i < pieces; ++i) {
    const size_t b = piece_begin(i), n = (piece_begin(i + 1) - b) * elem;
    recvs.push_back(
        comm.irecv(other, tag + tag_lane(i), theirs + b * elem, n + (i + 1 == pieces ? elem : 0)));
    sends.push_back(comm.isend(other, tag + tag_lane(i), bytes + b * elem, n));
  }
  comm.wait_all(recvs, "direct allreduce");
  for (size_t i = 0; i < pieces; ++i)
    check_length(comm, *recvs[i], (piece_begin(i + 1) - piece_begin(i)) * elem, other, "exchange",
                 count, dtype);
  comm.wait_all(sends, "direct allreduce");  // this rank's buffer is summed into below
  const size_t mine_begin = seg_begin(count, 2, r) * elem, mine_len = seg_len(count, 2, r);
  const size_t their_begin = seg_begin(count, 2, other) * elem,
               their_len = seg_len(count, 2, other);
  sum_into(bytes + mine_begin, theirs + mine_begin, mine_len, dtype);
  sum_into(theirs + their_begin, bytes + their_begin, their_len, dtype);
  std::memcpy(bytes + their_begin, theirs + their_begin, their_len * elem);
}

}  // namespace

void direct_allreduce_sum(Communicator& comm, void* data, size_t count, DType dtype) {
  const int P = comm.size(), r = comm.rank();
  if (P < 2 || count == 0) return;
  if (P == 2) return swap_and_sum(comm, static_cast<uint8_t*>(data), count, dtype);
  auto* bytes = static_cast<uint8_t*>(data);
  const size_t elem = dtype_size(dtype);
  const size_t mine = seg_len(count, P, r) * elem;
  uint8_t* own = bytes + seg_begin(count, P, r) * elem;
  const uint64_t tag = comm.next_collective_tag();

  // Reduce-scatter: the P-1 contributions to this rank's segment land in slots (slot of rank q at
  // position (q - r - 1) mod P, the order they are summed in); a longer message is measured, not
  // truncated, so every slot holds the whole segment's length plus one element.
  const size_t slot_bytes = mine + elem;
  uint8_t* slots = thread_buffer<DirectSlotsTag>(static_cast<size_t>(P - 1) * slot_bytes);
  std::vector<RequestPtr> recvs(static_cast<size_t>(P - 1)), sends;
  for (int j = 1; j < P; ++j) {
    const int q = (r + j) % P;
    recvs[static_cast<size_t>(j - 1)] =
        comm.irecv(q, tag, slots + static_cast<size_t>(j - 1) * slot_bytes, slot_bytes);
  }
  for (int j = 1; j < P; ++j) {  // staggered: at step j every rank sends to r + j
    const int k = (r + j) % P;
    sends.push_back(
        comm.isend(k, tag, bytes + seg_begin(count, P, k) * elem, seg_len(count, P, k) * elem));
  }
  // The ring's order: acc = own; acc = x_{r+1} + acc; ...; acc = x_{r-1} + acc.
  std::vector<RequestPtr> one(1);
  for (int j = 1; j < P; ++j) {
    one[0] = std::move(recvs[static_cast<size_t>(j - 1)]);
    comm.wait_all(one, "direct allreduce");
    check_length(comm, *one[0], mine, (r + j) % P, "reduce-scatter", count, dtype);
    sum_into(own, slots + static_cast<size_t>(j - 1) * slot_bytes, mine / elem, dtype);
  }
  // The segments sent above are overwritten by the allgather: their sends must be done.
  comm.wait_all(sends, "direct allreduce");

  // Allgather: this rank's sum to every rank, every other segment from its owner.
  sends.clear();
  recvs.clear();
  recvs.resize(static_cast<size_t>(P - 1));
  for (int j = 1; j < P; ++j) {
    const int q = (r - j + P) % P;
    recvs[static_cast<size_t>(j - 1)] =
        comm.irecv(q, tag + 1, bytes + seg_begin(count, P, q) * elem, seg_len(count, P, q) * elem);
  }
  for (int j = 1; j < P; ++j)
    sends.push_back(comm.isend((r + j) % P, tag + 1, own, mine));
  comm.wait_all(recvs, "direct allreduce");
  for (int j = 1; j < P; ++j) {
    const int q = (r - j + P) % P;
    check_length(comm, *recvs[static_cast<size_t>(j - 1)], seg_len(count, P, q) * elem, q,
                 "allgather", count, dtype);
  }
  comm.wait_all(sends, "direct allreduce");
}

}  // namespace gradex::comm
