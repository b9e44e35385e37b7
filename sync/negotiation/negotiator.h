// Cross-rank matching of submitted tensors by key. Ranks may submit in any order; each round every
// rank announces what became pending locally since the last round (one allgatherv, one round trip
// while the messages fit GRADEX_ALLGATHER_INLINE_KB), and every rank
// applies all announcements in rank order to an identical table, so all ranks reach the same
// verdicts in the same round without a coordinator's extra messages:
//   - a key announced by every rank with equal size and dtype is ready (ready keys of a round are
//     ordered by (kind, key), identically everywhere);
//   - a key announced with different sizes or dtypes fails on every rank that announced it, with a
//     message naming the key, the ranks and their sizes; ranks that announce it later fail the same
//     way as soon as they do;
//   - a key some ranks announced and others did not for longer than the timeout fails too. Only
//     rank 0's clock decides this (it announces the abort), so ranks cannot disagree on it; a
//     rank announcing the key in the round of its abort is answered by the abort too;
//   - a parameter average announced by ranks that hold a LocalSGD anchor and ranks that do not
//     (its counter: 1 with an anchor, 0 without) fails as a mismatch naming both groups.
// Each gradient announcement also carries the tensor's exchange counter and a non-finite flag, so
// that decisions which change state are taken from values every rank sees identically: the
// agreed step of a ready key is the largest counter announced (DGC's schedule, dense-or-sparse),
// and its non-finite ranks are those whose gradient held NaN/Inf this time. Both are known to
// every rank before any rank touches the tensor's momentum or residual.
//
// Cached negotiation: a key that has become ready once (consistently on every rank) gets a cache
// id, identical on every rank (sync/negotiation/negotiation_cache.h: assigned at the end of the
// round, in the round's (kind, key) order, smallest free id first; at most `cache_capacity` keys; a
// key that fails is evicted). Later announcements of it travel as one bit, its counter only when it
// is not the one every rank expects (last agreed step + 1 for gradients, the last agreed value for
// parameter averages), so a
// steady-state round costs a few bytes plus one bit per announced tensor. Decoding turns bits back
// into full announcements before anything else happens, so verdicts, error messages and the
// timeout are exactly those of the full form. An announcement whose size or dtype differs from
// the cached one goes in full form, and fails as a mismatch as it always did.
//
// Message format (version 3, little-endian, one message per rank per round, gathered in one round
// trip by comm::allgatherv_inline; a build whose rounds take two round trips lacks
// GRADEX_ALLGATHER_INLINE_KB, which the start-up agreement then names; varint = unsigned LEB128,
// at most 10 bytes):
//   u8 version (3), u8 flags (bit 0: this rank is leaving; bit 1: a non-finite bit vector follows
//   the announced bits);
//   full announcements: varint count, then per announcement: u8 work kind, u8 dtype, u8 flags
//   (bit 0: non-finite gradient), u64 numel, u64 step (the tensor's exchange counter; for
//   parameter averages 1 when the rank holds a LocalSGD anchor, else 0), string key (u32 length +
//   bytes); cached announcements: varint bit count B; when B > 0: u32 cache fingerprint (equal on
//   every rank, NegotiationCache::fingerprint), varint first id L, ceil(B/8) bytes whose bit i (LSB
//   first) announces cache id L + i, then (flag bit 1) ceil(B/8) bytes of non-finite bits for the
//   same ids (a subset); bits past B are zero;
//   counter exceptions: varint count, then per exception: varint cache id (announced above),
//   varint step;
//   aborts (rank 0 only): varint count, then per abort: u8 work kind, string key.
// A message with nothing to say is 6 bytes. A peer sending another version, a cache fingerprint
// other than this rank's, or a cache id not in use, is a CorruptPayload naming it.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "comm/communicator.h"
#include "sync/engine/stall_inspector.h"
#include "sync/negotiation/negotiation_cache.h"
#include "sync/negotiation/negotiation_codec.h"
#include "sync/negotiation/negotiator_types.h"

namespace gradex::sync {

// A key every rank announced consistently, with what all ranks agree on for this exchange.
struct ReadyWork {
  WorkId id;
  uint64_t step = 0;                 // the largest exchange counter any rank announced
  bool steps_differed = false;       // some rank announced another counter (restored elsewhere?)
  std::vector<int> nonfinite_ranks;  // ranks whose gradient held NaN/Inf, ascending
};

struct NegotiationFailure {
  WorkId id;
  ErrorCode code;
  std::string message;
};

struct RoundResult {
  std::vector<ReadyWork> ready;  // ordered by (kind, key)
  std::vector<NegotiationFailure> failed;
  bool all_leaving = false;        // every rank asked to leave in this round
  bool anything_happened = false;  // some rank announced something, or a verdict was reached
};

class Negotiator {
 public:
  // At most `cache_capacity` keys are cached (all ranks must pass the same value); further keys
  // keep the full form.
  static constexpr size_t kDefaultCacheCapacity = 1 << 16;
  Negotiator(comm::Communicator& comm, std::chrono::milliseconds timeout,
             size_t cache_capacity = kDefaultCacheCapacity);

  // One collective round (all ranks call it in lockstep). Transport failures propagate as
  // PeerError/TimeoutError; a malformed message from a peer as CorruptPayload.
  RoundResult round(const std::vector<Announcement>& announcements, bool leaving);

  // Keys announced by some ranks but not yet by all.
  size_t outstanding() const { return table_.size(); }
  // Whether some key this rank announced still waits for another rank's announcement (a round
  // another rank starts may complete it).
  bool own_announcement_pending() const;
  // Whether `id` was failed as a mismatch before this rank announced it: its entry stays until
  // every rank has announced (so that a late rank gets the mismatch, not a timeout), and this
  // rank's announcement is what completes it, although the verdict already answered its handle.
  bool awaits_announcement(const WorkId& id) const {
    auto it = table_.find(id);
    return it != table_.end() && it->second.mismatched && it->second.numel[comm_.rank()] < 0;
  }
  // The earliest time at which a round on this rank decides something by its clock alone, with
  // nothing announced: rank 0's abort of a key that waited longer than the timeout, or its stall
  // report. time_point::max() when there is none (every other rank; an empty table). An engine with
  // nothing to announce starts a round then, and otherwise only joins rounds others start.
  std::chrono::steady_clock::time_point next_decision() const;
  // Bytes of control messages this rank sent so far.
  uint64_t control_bytes() const { return control_bytes_; }
  // Keys in the negotiation cache (identical on every rank between rounds).
  size_t cached_keys() const { return cache_.size(); }
  // GRADEX_STALL_WARN_S: rank 0 reports stalled keys after each round (nullptr: off).
  void set_stall_inspector(std::unique_ptr<StallInspector> inspector) {
    stall_ = std::move(inspector);
  }

 private:
  struct Entry {
    std::vector<int64_t> numel;      // per rank, -1 until announced
    std::vector<int> dtype;          // per rank, -1 until announced
    std::vector<uint64_t> step;      // per rank, as announced
    std::vector<uint8_t> nonfinite;  // per rank, as announced
    std::chrono::steady_clock::time_point first_seen;
    // A mismatch was found: ranks announcing later fail at once with the same kind of error (not a
    // timeout); the entry goes once every rank has announced.
    bool mismatched = false;
  };
  void apply(int from_rank, const NegotiationMessage& message, RoundResult& result,
             std::vector<WorkId>& touched);
  // Verdicts on the keys touched this round; `ready` gets what the cache learns from them.
  void decide(const std::vector<WorkId>& touched, RoundResult& result,
              std::vector<CachedKey>& ready);
  void inspect_stalls();
  std::string describe_ranks(const Entry& e, bool announced) const;
  std::string describe_sizes(const Entry& e) const;
  bool anchors_disagree(const Entry& e) const;
  std::string describe_anchors(const Entry& e) const;

  comm::Communicator& comm_;
  std::chrono::milliseconds timeout_;
  std::map<WorkId, Entry> table_;
  std::vector<WorkId> aborted_this_round_;  // rank 0's aborts in the round being applied
  NegotiationCache cache_;
  uint64_t control_bytes_ = 0;
  std::unique_ptr<StallInspector> stall_;
};

}  // namespace gradex::sync
