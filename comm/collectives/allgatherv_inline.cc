// allgatherv_inline: the allgatherv in one round trip for small payloads.
//
// Round 1 (tag): every rank sends every other rank one message, [u64 size] followed by the payload
// itself when size <= inline_max_bytes (inline), or the size alone when it is larger (following).
// Receives are posted at inline_max_bytes + 8 bytes for every peer up front; the received length
// tells what came, and is checked against the size the message carries. When no payload follows,
// the call ends here: one round trip, where the two-round collectives pay a size round first.
// Round 2 (tag + 1 onwards): the following payloads, whose sizes every rank now knows, move as in
// the two-round collectives, directly or around the ring as options.ring_for decides from those
// sizes (identical everywhere, so every rank runs the same round 2).
#include <cstring>
#include <string>

#include "base/error.h"
#include "comm/collectives.h"
#include "comm/collectives/allgatherv_prologue.h"

namespace gradex::comm {
namespace {

constexpr size_t kHeader = sizeof(uint64_t);

[[noreturn]] void throw_malformed(const char* operation, const Communicator& comm, int peer,
                                  const std::string& what) {
  const int r = comm.rank();
  throw MismatchError(std::string(operation) + ": rank " + std::to_string(r) +
                      " received from rank " + std::to_string(peer) + " " + what + ": ranks " +
                      std::to_string(peer) + " and " + std::to_string(r) +
                      " are not in the same collective or disagree on its inline maximum");
}

}  // namespace

const char* allgatherv_path_name(AllgathervPath path) {
  switch (path) {
    case AllgathervPath::kLocal:
      return "local";
    case AllgathervPath::kOneRound:
      return "one-round";
    case AllgathervPath::kDirect:
      return "direct";
    case AllgathervPath::kRing:
      return "ring";
    case AllgathervPath::kDirectUnsized:
      return "direct, no size round";
    case AllgathervPath::kRingUnsized:
      return "ring, no size round";
  }
  return "?";
}

AllgathervPath allgatherv_inline(Communicator& comm, const void* data, size_t bytes,
                                 std::vector<Bytes>& result, const AllgathervOptions& options,
                                 const char* operation) {
  uint64_t tag = 0;
  if (!detail::take_own_slot(comm, data, bytes, result, &tag)) return AllgathervPath::kLocal;
  const int P = comm.size();
  const int r = comm.rank();
  const auto* mine = static_cast<const uint8_t*>(data);
  const size_t max = options.inline_max_bytes;

  // This thread's buffers, kept between calls: a receive slot per peer at the posted maximum (its
  // size stays put, so nothing is cleared per call) and the outgoing message.
  thread_local std::vector<Bytes> slots;
  thread_local Bytes out;
  thread_local std::vector<uint64_t> sizes;
  slots.resize(static_cast<size_t>(P));
  const bool inline_mine = bytes <= max;
  out.resize(kHeader + (inline_mine ? bytes : 0));
  const uint64_t size_field = bytes;
  std::memcpy(out.data(), &size_field, kHeader);
  if (inline_mine && bytes > 0) std::memcpy(out.data() + kHeader, mine, bytes);

  // Requests at 2q (receive from q) and 2q + 1 (send to q).
  std::vector<RequestPtr> requests(2 * static_cast<size_t>(P));
  for (int q = 0; q < P; ++q) {
    if (q == r) continue;
    Bytes& slot = slots[static_cast<size_t>(q)];
    if (slot.size() != kHeader + max) slot.resize(kHeader + max);
    const size_t i = 2 * static_cast<size_t>(q);
    requests[i] = comm.irecv(q, tag, slot.data(), slot.size());
    requests[i + 1] = comm.isend(q, tag, out.data(), out.size());
  }
  comm.wait_all(requests, operation);

  sizes.assign(static_cast<size_t>(P), 0);
  sizes[static_cast<size_t>(r)] = bytes;
  for (int q = 0; q < P; ++q) {
    if (q == r) continue;
    const size_t got = comm.recv_length(*requests[2 * static_cast<size_t>(q)]);
    if (got < kHeader)
      throw_malformed(operation, comm, q,
                      "a message of " + std::to_string(got) + " bytes, shorter than its " +
                          std::to_string(kHeader) + "-byte size");
    uint64_t size = 0;
    std::memcpy(&size, slots[static_cast<size_t>(q)].data(), kHeader);
    const size_t expected = size <= max ? kHeader + size : kHeader;
    if (got != expected)
      throw_malformed(operation, comm, q,
                      std::to_string(got) + " bytes announcing a payload of " +
                          std::to_string(size) + " bytes, expected " + std::to_string(expected) +
                          " (inline maximum " + std::to_string(max) + ")");
    sizes[static_cast<size_t>(q)] = size;
  }
  detail::check_announced_sizes(operation, sizes);

  // Inline payloads into their slots; the following ones' sizes make round 2's `travel`.
  bool any_following = false;
  for (int q = 0; q < P; ++q) {
    const uint64_t size = sizes[static_cast<size_t>(q)];
    const bool following = size > max;
    any_following = any_following || following;
    if (q == r) continue;
    Bytes& slot = result[static_cast<size_t>(q)];
    if (following) {
      slot.resize(size);
    } else {
      const uint8_t* p = slots[static_cast<size_t>(q)].data() + kHeader;
      slot.assign(p, p + size);
    }
  }
  if (!any_following) return AllgathervPath::kOneRound;
  for (uint64_t& size : sizes)
    if (size <= max) size = 0;  // already delivered
  const bool ring = options.ring_for && options.ring_for(sizes);
  if (ring) {
    detail::ring_payloads(comm, operation, tag + 1, data, sizes, result);
    return AllgathervPath::kRing;
  }
  detail::direct_payloads(comm, operation, tag + 1, data, sizes, result);
  return AllgathervPath::kDirect;
}

}  // namespace gradex::comm
