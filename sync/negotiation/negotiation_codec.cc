#include "sync/negotiation/negotiation_codec.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "base/error.h"
#include "sync/data/byte_io.h"

namespace gradex::sync {
namespace {

constexpr uint8_t kFlagLeaving = 1;
constexpr uint8_t kFlagNonFiniteBits = 2;  // a non-finite bit vector follows the announced bits
constexpr uint8_t kItemNonFinite = 1;

void put_varint(ByteWriter& w, uint64_t v) {
  while (v >= 0x80) {
    w.put<uint8_t>(static_cast<uint8_t>(v) | 0x80);
    v >>= 7;
  }
  w.put<uint8_t>(static_cast<uint8_t>(v));
}

struct Reader {
  ByteReader r;
  std::string who;  // "negotiation message from rank N"

  [[noreturn]] void fail(const std::string& what) const { throw CorruptPayload(who + " " + what); }

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const uint8_t b = r.get<uint8_t>();
      if (shift == 63 && b > 1) fail("has a variable-length integer over 64 bits");
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return v;
    }
    fail("has a variable-length integer over 64 bits");
  }
  WorkKind kind() {
    const uint8_t k = r.get<uint8_t>();
    if (k != static_cast<uint8_t>(WorkKind::kGradient) &&
        k != static_cast<uint8_t>(WorkKind::kAverage))
      fail("has an unknown work kind");
    return static_cast<WorkKind>(k);
  }
};

bool bit(const uint8_t* bits, uint64_t i) {
  return (bits[i / 8] >> (i % 8)) & 1;
}

}  // namespace

std::vector<uint8_t> encode_negotiation(const std::vector<Announcement>& announcements,
                                        bool leaving, const std::vector<WorkId>& aborts,
                                        const NegotiationCache& cache) {
  std::vector<const Announcement*> full;
  std::vector<std::pair<uint32_t, const Announcement*>> cached;  // by cache id
  for (const Announcement& a : announcements) {
    std::optional<uint32_t> id = cache.find(a.id);
    const CachedKey* k = id ? cache.at(*id) : nullptr;
    if (k && k->numel == a.numel && k->dtype == a.dtype)
      cached.emplace_back(*id, &a);
    else
      full.push_back(&a);
  }
  std::stable_sort(cached.begin(), cached.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  // A key announced twice in one message (the engine never does): the later copies in full form.
  for (size_t i = 1; i < cached.size();) {
    if (cached[i].first == cached[i - 1].first) {
      full.push_back(cached[i].second);
      cached.erase(cached.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  const bool any_nonfinite =
      std::any_of(cached.begin(), cached.end(), [](const auto& c) { return c.second->nonfinite; });

  ByteWriter w;
  w.put<uint8_t>(kNegotiationVersion);
  w.put<uint8_t>(static_cast<uint8_t>((leaving ? kFlagLeaving : 0) |
                                      (any_nonfinite ? kFlagNonFiniteBits : 0)));
  put_varint(w, full.size());
  for (const Announcement* a : full) {
    w.put<uint8_t>(static_cast<uint8_t>(a->id.kind));
    w.put<uint8_t>(static_cast<uint8_t>(a->dtype));
    w.put<uint8_t>(a->nonfinite ? kItemNonFinite : 0);
    w.put<uint64_t>(a->numel);
    w.put<uint64_t>(a->step);
    w.put_string(a->id.key);
  }
  const uint64_t lo = cached.empty() ? 0 : cached.front().first;
  const uint64_t count = cached.empty() ? 0 : cached.back().first - lo + 1;
  put_varint(w, count);
  if (count > 0) {
    w.put<uint32_t>(cache.fingerprint());
    put_varint(w, lo);
    std::vector<uint8_t> announced((count + 7) / 8), nonfinite((count + 7) / 8);
    for (const auto& [id, a] : cached) {
      announced[(id - lo) / 8] |= static_cast<uint8_t>(1u << ((id - lo) % 8));
      if (a->nonfinite) nonfinite[(id - lo) / 8] |= static_cast<uint8_t>(1u << ((id - lo) % 8));
    }
    w.put_bytes(announced.data(), announced.size());
    if (any_nonfinite) w.put_bytes(nonfinite.data(), nonfinite.size());
  }
  std::vector<std::pair<uint32_t, uint64_t>> exceptions;
  for (const auto& [id, a] : cached)
    if (a->step != cache.expected_step(*cache.at(id))) exceptions.emplace_back(id, a->step);
  put_varint(w, exceptions.size());
  for (const auto& [id, step] : exceptions) {
    put_varint(w, id);
    put_varint(w, step);
  }
  put_varint(w, aborts.size());
  for (const WorkId& id : aborts) {
    w.put<uint8_t>(static_cast<uint8_t>(id.kind));
    w.put_string(id.key);
  }
  return std::move(w.bytes());
}

NegotiationMessage decode_negotiation(int from, const uint8_t* data, size_t size,
                                      const NegotiationCache& cache) {
  const std::string who = "negotiation message from rank " + std::to_string(from);
  Reader in{ByteReader(data, size, who), who};
  ByteReader& r = in.r;
  const uint8_t version = r.get<uint8_t>();
  if (version != kNegotiationVersion)
    in.fail("has version " + std::to_string(version) + ", expected " +
            std::to_string(kNegotiationVersion) + " (mixed gradex versions?)");
  const uint8_t flags = r.get<uint8_t>();
  if ((flags & ~(kFlagLeaving | kFlagNonFiniteBits)) != 0)
    in.fail("has unknown flags " + std::to_string(flags));
  NegotiationMessage m;
  m.leaving = (flags & kFlagLeaving) != 0;

  const uint64_t full = in.varint();
  for (uint64_t i = 0; i < full; ++i) {
    Announcement a;
    a.id.kind = in.kind();
    const uint8_t dtype = r.get<uint8_t>();
    const uint8_t item_flags = r.get<uint8_t>();
    a.numel = r.get<uint64_t>();
    a.step = r.get<uint64_t>();
    a.id.key = r.get_string();
    if ((item_flags & ~kItemNonFinite) != 0)
      in.fail("has unknown announcement flags " + std::to_string(item_flags));
    if (!dtype_valid(dtype)) in.fail("has an unknown dtype " + std::to_string(dtype));
    a.dtype = static_cast<DType>(dtype);
    a.nonfinite = (item_flags & kItemNonFinite) != 0;
    m.announcements.push_back(std::move(a));
  }

  // Cached keys: ids [lo, lo + count) as bits, then (when flagged) their non-finite bits.
  const uint64_t count = in.varint();
  if (count > 0) {
    const uint32_t theirs = r.get<uint32_t>();
    if (theirs != cache.fingerprint())
      in.fail("refers to a negotiation cache with fingerprint " + std::to_string(theirs) +
              ", this rank's is " + std::to_string(cache.fingerprint()) +
              " (the ranks' negotiation caches differ)");
  }
  const uint64_t lo = count > 0 ? in.varint() : 0;
  if ((flags & kFlagNonFiniteBits) && count == 0)
    in.fail("flags non-finite bits but announces no cached key");
  const uint64_t space = cache.id_space();
  if (lo > space || count > space - lo)
    in.fail("announces cache ids up to " + std::to_string(lo + count - 1) + " but only " +
            std::to_string(space) + " are in use here (the ranks' negotiation caches differ)");
  const uint8_t* announced = r.get_bytes((count + 7) / 8);
  const uint8_t* nonfinite = (flags & kFlagNonFiniteBits) ? r.get_bytes((count + 7) / 8) : nullptr;
  std::vector<size_t> position(count, SIZE_MAX);  // offset -> index in m.announcements
  for (uint64_t i = 0; i < (count + 7) / 8 * 8; ++i) {
    const bool on = bit(announced, i);
    const bool bad = nonfinite != nullptr && bit(nonfinite, i);
    if (i >= count) {
      if (on || bad) in.fail("has bits set past its " + std::to_string(count) + " cache ids");
      continue;
    }
    if (bad && !on)
      in.fail("flags cache id " + std::to_string(lo + i) + " non-finite without announcing it");
    if (!on) continue;
    const CachedKey* k = cache.at(lo + i);
    if (k == nullptr)
      in.fail("announces cache id " + std::to_string(lo + i) +
              ", which is not in use here (the ranks' negotiation caches differ)");
    position[i] = m.announcements.size();
    m.announcements.push_back({k->id, k->numel, k->dtype, cache.expected_step(*k), bad});
  }

  // Counters other than the expected one.
  const uint64_t exceptions = in.varint();
  std::vector<bool> seen(count, false);
  for (uint64_t i = 0; i < exceptions; ++i) {
    const uint64_t id = in.varint();
    const uint64_t step = in.varint();
    if (id < lo || id - lo >= count || position[id - lo] == SIZE_MAX)
      in.fail("gives a counter for cache id " + std::to_string(id) +
              ", which it does not announce");
    if (seen[id - lo]) in.fail("gives two counters for cache id " + std::to_string(id));
    seen[id - lo] = true;
    m.announcements[position[id - lo]].step = step;
  }

  const uint64_t aborts = in.varint();
  if (aborts > 0 && from != 0) in.fail("carries aborts; only rank 0 may send them");
  for (uint64_t i = 0; i < aborts; ++i) {
    WorkId id;
    id.kind = in.kind();
    id.key = r.get_string();
    m.aborts.push_back(std::move(id));
  }
  r.expect_end();
  return m;
}

}  // namespace gradex::sync
