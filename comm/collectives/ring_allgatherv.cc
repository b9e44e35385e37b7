// ring_allgatherv: the payload sizes travel in one direct exchange (8 bytes per peer), then the
// payloads travel around the ring: at step s rank r forwards to r+1 the payload of rank r-s, which
// it received from r-1 at step s-1. Every link carries one payload at a time, so no uplink holds
// P-1 payloads at once (the direct allgatherv's incast). Payloads move in
// options().ring_chunk_bytes chunks, and a chunk is forwarded as soon as it has arrived, so a
// large payload crosses the ring in about (P-1) chunk times plus its own transfer time.
//
// Tags: tag (sizes), tag + 1 + s + tag_lane(k) (chunk k of the payload of ring step s: consecutive
// chunks take different lanes, hence connections when the communicator stripes; chunks k and
// k + kTagLanes share a tag and are matched in the order they were sent). Every received chunk's
// length is checked against the size its origin announced.
#include <algorithm>
#include <string>

#include "base/check.h"
#include "base/error.h"
#include "comm/collectives.h"
#include "comm/collectives/allgatherv_prologue.h"

namespace gradex::comm {

namespace detail {

void ring_payloads(Communicator& comm, const char* operation, uint64_t tag, const void* data,
                   const std::vector<uint64_t>& travel, std::vector<Bytes>& result) {
  const int P = comm.size();
  const int r = comm.rank();
  GX_CHECK_LT(static_cast<uint64_t>(P), uint64_t{1} << 16);
  const int left = (r + P - 1) % P;
  const int right = (r + 1) % P;
  const size_t chunk = std::max<size_t>(1, comm.options().ring_chunk_bytes);
  auto origin_of_step = [&](int s) { return (r - 1 - s + 2 * P) % P; };  // received at step s
  auto length_of = [&](int origin) { return travel[static_cast<size_t>(origin)]; };
  // Lanes sit above the step sub-tags; in a world too large for that, every chunk keeps lane 0.
  const bool lanes = P < (1 << kTagLaneShift);
  auto chunk_tag = [&](int s, size_t k) {
    return tag + static_cast<uint64_t>(s) + (lanes ? tag_lane(k) : 0);
  };

  // Every receive is posted up front (the caller sized the buffers), in (step, chunk) order; step
  // s's chunks start at first[s]. An origin with nothing to travel has no chunks.
  std::vector<RequestPtr> recvs;
  std::vector<size_t> first(static_cast<size_t>(P), 0);
  const size_t bytes = length_of(r);
  size_t sends_needed = (bytes + chunk - 1) / chunk;
  for (int s = 0; s < P - 1; ++s) {
    const int o = origin_of_step(s);
    uint8_t* slot = result[static_cast<size_t>(o)].data();
    const size_t length = length_of(o);
    first[static_cast<size_t>(s)] = recvs.size();
    for (size_t off = 0; off < length; off += chunk)
      recvs.push_back(
          comm.irecv(left, chunk_tag(s, off / chunk), slot + off, std::min(chunk, length - off)));
    if (s + 1 < P - 1) sends_needed += (length + chunk - 1) / chunk;
  }
  first[static_cast<size_t>(P - 1)] = recvs.size();

  std::vector<RequestPtr> sends;
  sends.reserve(sends_needed);
  const auto* mine = static_cast<const uint8_t*>(data);
  for (size_t off = 0; off < bytes; off += chunk)
    sends.push_back(
        comm.isend(right, chunk_tag(0, off / chunk), mine + off, std::min(chunk, bytes - off)));

  std::vector<RequestPtr> one(1);
  for (int s = 0; s < P - 1; ++s) {
    const int o = origin_of_step(s);
    uint8_t* slot = result[static_cast<size_t>(o)].data();
    const size_t length = length_of(o);
    const size_t begin = first[static_cast<size_t>(s)], end = first[static_cast<size_t>(s + 1)];
    for (size_t k = 0; k < end - begin; ++k) {
      one[0] = std::move(recvs[begin + k]);
      comm.wait_all(one, operation);
      const size_t off = k * chunk;
      const size_t want = std::min(chunk, length - off);
      const size_t got = comm.recv_length(*one[0]);
      if (got != want)
        throw MismatchError(std::string(operation) + ": chunk " + std::to_string(k) + " of rank " +
                            std::to_string(o) + "'s payload (from rank " + std::to_string(left) +
                            ") has " + std::to_string(got) + " bytes, expected " +
                            std::to_string(want) + " of the " + std::to_string(length) +
                            " announced");
      one[0].reset();
      // The payload of step s is forwarded at step s + 1, except to its own origin.
      if (s + 1 < P - 1) sends.push_back(comm.isend(right, chunk_tag(s + 1, k), slot + off, want));
    }
  }
  comm.wait_all(sends, operation);
}

}  // namespace detail

void ring_allgatherv(Communicator& comm, const void* data, size_t bytes,
                     std::vector<Bytes>& result) {
  detail::two_round_allgatherv(comm, "ring_allgatherv", "ring_allgatherv sizes", data, bytes,
                               result, detail::ring_payloads);
}

std::vector<Bytes> ring_allgatherv(Communicator& comm, const void* data, size_t bytes) {
  std::vector<Bytes> result;
  ring_allgatherv(comm, data, bytes, result);
  return result;
}

}  // namespace gradex::comm
