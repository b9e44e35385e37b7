// Negotiation messages, format 3 (sync/negotiation/negotiation_codec.h), without a network: what
// the encoder writes decodes to the announcements it was given, in the documented layout; malformed
// messages are refused with a CorruptPayload that names the sending rank and what was wrong.
#include <gtest/gtest.h>

#include <algorithm>

#include "base/error.h"
#include "sync/negotiation/negotiation_codec.h"

namespace gradex::sync {
namespace {

using Bytes = std::vector<uint8_t>;

// Ids 0..4: g0..g3 (gradients, last agreed step 10) and the average "p" (step 0).
NegotiationCache make_cache() {
  NegotiationCache c(16);
  for (int i = 0; i < 4; ++i)
    c.ready({WorkKind::kGradient, "g" + std::to_string(i)}, 100 + i, DType::kFloat32, 10);
  c.ready({WorkKind::kAverage, "p"}, 7, DType::kBFloat16, 0);
  return c;
}

Announcement grad(int i, uint64_t step = 11, bool nonfinite = false) {
  return {
      {WorkKind::kGradient, "g" + std::to_string(i)}, 100u + i, DType::kFloat32, step, nonfinite};
}

std::string refusal(const Bytes& m, const NegotiationCache& c, int from = 2) {
  try {
    decode_negotiation(from, m.data(), m.size(), c);
  } catch (const CorruptPayload& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(NegotiationCodec, CachedKeysTravelAsBitsAndDecodeToFullAnnouncements) {
  NegotiationCache c = make_cache();
  std::vector<Announcement> in = {grad(3), grad(1, 11, true), grad(2, 4)};
  in.push_back({{WorkKind::kAverage, "p"}, 7, DType::kBFloat16, 0});
  in.push_back({{WorkKind::kGradient, "new"}, 5, DType::kFloat16, 0});
  Bytes m = encode_negotiation(in, true, {}, c);
  // version, flags (leaving | non-finite bits), 1 full announcement (3 + 8 + 8 + 4 + 3 bytes), 4
  // bits, the cache's fingerprint, from id 1, their bytes, non-finite byte, one exception (id 2,
  // step 4), no aborts.
  const uint32_t fp = c.fingerprint();
  const Bytes tail = {4,
                      uint8_t(fp),
                      uint8_t(fp >> 8),
                      uint8_t(fp >> 16),
                      uint8_t(fp >> 24),
                      1,
                      0b1111,
                      0b0001,
                      1,
                      2,
                      4,
                      0};
  ASSERT_EQ(m.size(), 2u + 1u + 26u + tail.size());
  EXPECT_EQ(m[0], 3);
  EXPECT_EQ(m[1], 3);
  EXPECT_EQ(Bytes(m.end() - static_cast<long>(tail.size()), m.end()), tail);

  NegotiationMessage d = decode_negotiation(1, m.data(), m.size(), c);
  EXPECT_TRUE(d.leaving);
  ASSERT_EQ(d.announcements.size(), 5u);
  EXPECT_EQ(d.announcements[0].id.key, "new");  // full form first, then by cache id
  const char* order[] = {"new", "g1", "g2", "g3", "p"};
  for (size_t i = 0; i < 5; ++i) {
    const Announcement& a = d.announcements[i];
    EXPECT_EQ(a.id.key, order[i]);
    const Announcement& orig =
        *std::find_if(in.begin(), in.end(), [&](const Announcement& x) { return x.id == a.id; });
    EXPECT_TRUE(a.numel == orig.numel && a.dtype == orig.dtype && a.step == orig.step &&
                a.nonfinite == orig.nonfinite)
        << a.id.key;
  }
}

TEST(NegotiationCodec, ChangedSizeOrDtypeAndRepeatsGoInFullForm) {
  NegotiationCache c = make_cache();
  Announcement bigger = grad(0);
  bigger.numel = 1 << 20;
  Announcement half = grad(1);
  half.dtype = DType::kFloat16;
  std::vector<Announcement> in = {bigger, half, grad(2), grad(2, 12)};
  Bytes m = encode_negotiation(in, false, {}, c);
  EXPECT_EQ(m[2], 3);  // bigger, half and the repeat in full form
  NegotiationMessage d = decode_negotiation(0, m.data(), m.size(), c);
  ASSERT_EQ(d.announcements.size(), 4u);
  EXPECT_EQ(d.announcements[0].numel, uint64_t{1} << 20);
  EXPECT_EQ(d.announcements[1].dtype, DType::kFloat16);
  EXPECT_TRUE(d.announcements[2].id.key == "g2" && d.announcements[2].step == 12);
  EXPECT_TRUE(d.announcements[3].id.key == "g2" && d.announcements[3].step == 11);
}

TEST(NegotiationCodec, EmptyMessageIsSixBytes) {
  NegotiationCache c = make_cache();
  Bytes m = encode_negotiation({}, false, {}, c);
  EXPECT_EQ(m, (Bytes{3, 0, 0, 0, 0, 0}));
  NegotiationMessage d = decode_negotiation(0, m.data(), m.size(), c);
  EXPECT_TRUE(d.announcements.empty() && d.aborts.empty() && !d.leaving);
}

TEST(NegotiationCodec, MalformedMessagesAreRefusedNamingTheRank) {
  NegotiationCache c = make_cache();
  auto has = [&](const Bytes& m, const std::string& text) {
    const std::string e = refusal(m, c);
    EXPECT_NE(e.find("negotiation message from rank 2"), std::string::npos) << e;
    EXPECT_NE(e.find(text), std::string::npos) << e;
  };
  has({2, 0, 0, 0, 0, 0, 0, 0, 0, 0}, "has version 2, expected 3");
  has({3, 4, 0, 0, 0, 0}, "unknown flags 4");
  // [version 3][flags][no full announcements][B][this cache's fingerprint] + rest
  auto cached = [&](uint8_t flags, uint8_t bits, Bytes rest) {
    const uint32_t fp = c.fingerprint();
    Bytes m = {
        3, flags, 0, bits, uint8_t(fp), uint8_t(fp >> 8), uint8_t(fp >> 16), uint8_t(fp >> 24)};
    m.insert(m.end(), rest.begin(), rest.end());
    return m;
  };
  has(cached(0, 1, {7, 1, 0, 0}), "cache ids up to 7 but only 5 are in use");
  has(cached(0, 2, {4, 0b11, 0, 0}), "cache ids up to 5 but only 5 are in use");
  has(cached(0, 3, {0, 0b1001, 0, 0}), "bits set past its 3 cache ids");
  has(cached(2, 2, {0, 0b01, 0b10, 0, 0}), "flags cache id 1 non-finite without announcing it");
  has({3, 2, 0, 0, 0, 0}, "flags non-finite bits but announces no cached key");
  has(cached(0, 1, {0, 1, 1, 1, 9, 0}), "counter for cache id 1, which it does not announce");
  has(cached(0, 1, {0, 1, 2, 0, 9, 0, 9, 0}), "two counters for cache id 0");
  Bytes other = cached(0, 1, {0, 1, 0, 0});
  other[4] ^= 1;  // encoded against a cache that differs from this one
  has(other, "the ranks' negotiation caches differ");
  has({3, 0, 0, 0, 0, 1, 0, 1, 'x'}, "carries aborts; only rank 0 may send them");
  has({3, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0}, "over 64 bits");
  has({3, 0, 1, 9, 0, 0}, "unknown work kind");
  Bytes bad_dtype = {3, 0, 1, 0, 7, 0};
  bad_dtype.resize(bad_dtype.size() + 8 + 8 + 4, 0);
  bad_dtype.insert(bad_dtype.end(), {0, 0, 0, 0});
  has(bad_dtype, "unknown dtype 7");
  has({3, 0, 0, 0, 0, 0, 0}, "1 unexpected trailing bytes");
  has({3, 0, 0, 0, 0}, "truncated");
  // An unused id inside the id space (evicted): the caches of the ranks would differ.
  c.evict({WorkKind::kGradient, "g1"});
  has(cached(0, 1, {1, 0b1, 0, 0}), "cache id 1, which is not in use");
  // Rank 0 may abort, by kind and key.
  Bytes abort = {3, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 'p'};
  NegotiationMessage d = decode_negotiation(0, abort.data(), abort.size(), c);
  ASSERT_EQ(d.aborts.size(), 1u);
  EXPECT_TRUE(d.aborts[0] == (WorkId{WorkKind::kAverage, "p"}));
}

TEST(NegotiationCodec, FingerprintDependsOnWhichKeyHoldsWhichId) {
  NegotiationCache a(4), b(4);
  a.ready({WorkKind::kGradient, "x"}, 1, DType::kFloat32, 0);
  a.ready({WorkKind::kGradient, "y"}, 1, DType::kFloat32, 0);
  b.ready({WorkKind::kGradient, "y"}, 1, DType::kFloat32, 0);
  b.ready({WorkKind::kGradient, "x"}, 1, DType::kFloat32, 0);
  EXPECT_NE(a.fingerprint(), b.fingerprint());  // same keys, other ids
  b.evict({WorkKind::kGradient, "y"});
  b.evict({WorkKind::kGradient, "x"});
  b.ready({WorkKind::kGradient, "x"}, 1, DType::kFloat32, 0);
  b.ready({WorkKind::kGradient, "y"}, 1, DType::kFloat32, 0);
  EXPECT_EQ(a.fingerprint(), b.fingerprint());
  const uint32_t before = b.fingerprint();
  b.ready({WorkKind::kGradient, "y"}, 1, DType::kFloat32, 9);  // agreed steps are not part of it
  EXPECT_EQ(b.fingerprint(), before);
  Bytes m = encode_negotiation({{{WorkKind::kGradient, "x"}, 1, DType::kFloat32, 1}}, false, {}, a);
  EXPECT_EQ(decode_negotiation(0, m.data(), m.size(), b).announcements.at(0).step, 1u);
  b.ready({WorkKind::kGradient, "z"}, 1, DType::kFloat32, 0);
  EXPECT_NE(refusal(m, b).find("caches differ"), std::string::npos);
}

TEST(NegotiationCodec, CacheReusesTheSmallestFreeIdAndStaysBounded) {
  NegotiationCache c(3);
  c.ready({WorkKind::kGradient, "a"}, 1, DType::kFloat32, 0);
  c.ready({WorkKind::kGradient, "b"}, 1, DType::kFloat32, 0);
  c.ready({WorkKind::kGradient, "c"}, 1, DType::kFloat32, 0);
  c.ready({WorkKind::kGradient, "d"}, 1, DType::kFloat32, 0);  // full: stays uncached
  EXPECT_EQ(c.size(), 3u);
  EXPECT_FALSE(c.find({WorkKind::kGradient, "d"}));
  c.evict({WorkKind::kGradient, "a"});
  EXPECT_EQ(c.id_space(), 3u);
  c.ready({WorkKind::kGradient, "d"}, 1, DType::kFloat32, 5);
  EXPECT_EQ(c.find({WorkKind::kGradient, "d"}), std::optional<uint32_t>(0));
  EXPECT_EQ(c.expected_step(*c.at(0)), 6u);
  c.evict({WorkKind::kGradient, "c"});
  c.evict({WorkKind::kGradient, "b"});
  EXPECT_EQ(c.id_space(), 1u);           // trailing free ids are dropped
  c.evict({WorkKind::kGradient, "zz"});  // not cached: nothing happens
  EXPECT_EQ(c.size(), 1u);
}

}  // namespace
}  // namespace gradex::sync
