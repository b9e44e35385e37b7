// Negotiation messages, format 3 (the layout is documented in sync/negotiation/negotiator.h):
// encoding one rank's announcements against the negotiation cache, and decoding a peer's message
// back into full announcements, so that the negotiator's table sees exactly what format 2 carried.
// Both sides use the cache as it was at the start of the round
// (sync/negotiation/negotiation_cache.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "sync/negotiation/negotiation_cache.h"
#include "sync/negotiation/negotiator_types.h"

namespace gradex::sync {

constexpr uint8_t kNegotiationVersion = 3;

struct NegotiationMessage {
  bool leaving = false;
  // Full-form announcements in message order, then cached ones in id order.
  std::vector<Announcement> announcements;
  std::vector<WorkId> aborts;  // rank 0 only
};

// A cached key whose size and dtype are those cached goes as bits; any other announcement (an
// uncached key, a changed size or dtype, a second announcement of the same key) in full form.
std::vector<uint8_t> encode_negotiation(const std::vector<Announcement>& announcements,
                                        bool leaving, const std::vector<WorkId>& aborts,
                                        const NegotiationCache& cache);

// CorruptPayload naming rank `from` for anything malformed: another version, unknown flags, kinds
// or dtypes, another cache fingerprint or a cache id not in use here (the ranks' caches would
// differ), an exception for a key the message does not announce, aborts from a rank other than 0,
// truncation or trailing bytes.
NegotiationMessage decode_negotiation(int from, const uint8_t* data, size_t size,
                                      const NegotiationCache& cache);

}  // namespace gradex::sync
