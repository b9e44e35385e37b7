// The negotiation cache (message format 3, sync/negotiation/negotiator.h): keys that have once
// become ready on every rank get a small cache id, so later announcements of them travel as bits
// instead of names. Every rank's cache changes only at the end of a round, from that round's
// verdicts, in the same order everywhere (failures first, then ready keys in (kind, key) order), so
// the caches of all ranks hold the same keys under the same ids at the start of every round.
//
// An id is the smallest one not in use (so ids stay dense after evictions); the cache holds at
// most `capacity` keys, and a key that becomes ready while it is full simply stays uncached (its
// announcements keep the full form). A key that fails (mismatch, timeout) is evicted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "base/dtype.h"
#include "sync/negotiation/negotiator_types.h"

namespace gradex::sync {

struct CachedKey {
  WorkId id;
  uint64_t numel = 0;
  DType dtype = DType::kFloat32;
  uint64_t last_step = 0;  // the step every rank agreed on the last time the key was ready
};

class NegotiationCache {
 public:
  explicit NegotiationCache(size_t capacity) : capacity_(capacity) {}

  // The id of a cached key, or nullopt.
  std::optional<uint32_t> find(const WorkId& id) const;
  // The key under `id`, or nullptr when the id is not in use.
  const CachedKey* at(uint64_t id) const {
    return id < slots_.size() && slots_[id] ? &*slots_[id] : nullptr;
  }
  // Ids in use are below this (it shrinks only when the highest ids are evicted).
  size_t id_space() const { return slots_.size(); }
  size_t size() const { return index_.size(); }
  size_t capacity() const { return capacity_; }
  // A digest of which key (kind, key, numel, dtype) holds which id, equal on ranks whose caches
  // agree. Messages that refer to cache ids carry it, so that ranks whose caches differed (a bug,
  // or ranks built with another capacity) fail loudly instead of reading another key's bits.
  uint32_t fingerprint() const { return static_cast<uint32_t>(digest_ ^ (digest_ >> 32)); }

  // The counter a rank is expected to announce for a cached key, computable identically on every
  // rank: a gradient's exchange counter moves to agreed step + 1 after each exchange; parameter
  // averages announce their anchor presence, which stays what was last agreed.
  uint64_t expected_step(const CachedKey& k) const {
    return k.last_step + (k.id.kind == WorkKind::kGradient ? 1 : 0);
  }

  // End-of-round updates (see the order above). ready(): caches the key when there is room, or
  // records its agreed step when it is cached already. evict(): no-op for uncached keys.
  void ready(const WorkId& id, uint64_t numel, DType dtype, uint64_t step);
  void evict(const WorkId& id);

 private:
  size_t capacity_;
  std::vector<std::optional<CachedKey>> slots_;  // by id
  std::map<WorkId, uint32_t> index_;
  std::set<uint32_t> free_;  // ids below slots_.size() not in use
  uint64_t digest_ = 0;      // XOR of every entry's hash (order-independent, O(1) updates)
};

}  // namespace gradex::sync
