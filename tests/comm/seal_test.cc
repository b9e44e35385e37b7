// The sealed data plane's cryptography (comm/seal/seal.h) without a transport: session keys from
// X25519 + HKDF agree mirrored and differ per connection, frames round-trip bit-exact for both
// ciphers, and every kind of tampering an attacker on the path can do is refused by the check
// named for it (1,000 randomized trials).
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "comm/rendezvous/auth.h"
#include "comm/seal/seal.h"

namespace gradex::test {
namespace {

using namespace comm::seal;
using Check = SealViolation::Check;

struct Pair {
  DirectionKeys a, b;  // rank 0's and rank 1's view of one connection
};

Pair connect(const std::string& secret_a, const std::string& secret_b, uint32_t world = 2) {
  EphemeralKey ka, kb;
  Handshake ha, hb;
  ha.secret = secret_a;
  hb.secret = secret_b;
  ha.self = hb.peer = 0;
  ha.peer = hb.self = 1;
  ha.world = hb.world = world;
  const auto na = comm::auth::random_nonce(), nb = comm::auth::random_nonce();
  ha.self_nonce = hb.peer_nonce = na;
  ha.peer_nonce = hb.self_nonce = nb;
  ha.self_public = hb.peer_public = ka.public_key();
  ha.peer_public = hb.self_public = kb.public_key();
  return {derive_keys(ka.agree(kb.public_key()), ha), derive_keys(kb.agree(ka.public_key()), hb)};
}

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 gen(seed);
  for (auto& x : v)
    x = static_cast<uint8_t>(gen());
  return v;
}

std::vector<uint8_t> sealed(Sealer& s, uint64_t tag, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> frame(payload.size() + kOverheadBytes);
  s.seal(tag, payload.data(), payload.size(), frame.data());
  return frame;
}

// The check that refuses `frame`, or "accepted".
std::string refusal(Opener& o, uint64_t tag, std::vector<uint8_t> frame) {
  std::vector<uint8_t> out(frame.size());
  try {
    o.open(tag, frame.data(), frame.size(), out.data());
  } catch (const SealViolation& v) {
    EXPECT_NE(std::string(v.what()).find("rank 1"), std::string::npos) << v.what();
    EXPECT_EQ(v.code(), ErrorCode::kCorrupt);
    return check_name(v.check());
  }
  return "accepted";
}

TEST(Seal, KeysAreMirroredAndBoundToTheSecretAndTheConnection) {
  Pair p = connect("s3cret", "s3cret");
  EXPECT_EQ(p.a.send, p.b.receive);
  EXPECT_EQ(p.a.receive, p.b.send);
  EXPECT_NE(p.a.send, p.a.receive);
  Pair q = connect("s3cret", "s3cret");  // fresh ephemeral keys: other session keys
  EXPECT_NE(p.a.send, q.a.send);
  Pair wrong = connect("s3cret", "other");
  EXPECT_NE(wrong.a.send, wrong.b.receive);
}

TEST(Seal, FramesRoundTripBitExactWithBothCiphers) {
  for (Cipher c : {Cipher::kAes256Gcm, Cipher::kChaCha20Poly1305}) {
    Pair p = connect("k", "k");
    Sealer s(c, p.a.send);
    Opener o(c, p.b.receive, 0);
    for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{4097}, size_t{1} << 20}) {
      const auto payload = pattern(n, static_cast<uint32_t>(n));
      auto frame = sealed(s, 7, payload);
      ASSERT_EQ(frame.size(), n + kOverheadBytes);
      // Nothing of the payload is left in clear in the frame.
      if (n >= 64) {
        EXPECT_EQ(std::search(frame.begin(), frame.end(), payload.begin(), payload.begin() + 32),
                  frame.end());
      }
      std::vector<uint8_t> out(n);
      ASSERT_EQ(o.payload_bytes(frame.size()), n);
      o.open(7, frame.data(), frame.size(), out.data());
      EXPECT_EQ(out, payload) << cipher_name(c) << " " << n;
    }
    // In place: the payload opened over the frame's own bytes.
    const auto payload = pattern(1000, 3);
    auto frame = sealed(s, 9, payload);
    o.open(9, frame.data(), frame.size(), frame.data() + kHeaderBytes);
    EXPECT_TRUE(std::equal(payload.begin(), payload.end(), frame.begin() + kHeaderBytes));
  }
}

TEST(Seal, EachKindOfTamperingIsRefusedByItsCheck) {
  Pair p = connect("k", "k");
  Sealer s(Cipher::kAes256Gcm, p.a.send);
  auto open_with = [&] { return Opener(Cipher::kAes256Gcm, p.b.receive, 1); };
  {
    Opener o = open_with();
    auto f1 = sealed(s, 5, pattern(100, 1));
    EXPECT_EQ(refusal(o, 5, f1), "accepted");
    EXPECT_EQ(refusal(o, 5, f1), "sequence");  // replayed
    EXPECT_EQ(refusal(o, 6, f1), "sequence");  // replayed under another tag
  }
  {
    Opener o = open_with();
    auto f2 = sealed(s, 5, pattern(100, 2));
    auto f3 = sealed(s, 5, pattern(100, 3));
    EXPECT_EQ(refusal(o, 5, f3), "accepted");
    EXPECT_EQ(refusal(o, 5, f2), "order");  // same tag, behind a later frame: reordered
  }
  {
    Opener o = open_with();
    auto f = sealed(s, 5, pattern(100, 4));
    EXPECT_EQ(refusal(o, 6, f), "authentication tag");  // moved to another tag
    auto cut = f;
    cut.pop_back();
    EXPECT_EQ(refusal(o, 5, cut), "authentication tag");  // truncated
    std::vector<uint8_t> tiny(kOverheadBytes - 1, 0);
    EXPECT_EQ(refusal(o, 5, tiny), "frame");
    auto plain = pattern(200, 5);
    EXPECT_EQ(refusal(o, 5, plain), "frame");  // sent in clear
    EXPECT_EQ(refusal(o, 5, f), "accepted");   // the genuine frame still opens after all that
  }
  {
    // Sealed under another key (someone without the session keys): refused even with the
    // genuine sequence number.
    Opener o = open_with();
    Pair stranger = connect("k", "k");
    Sealer forger(Cipher::kAes256Gcm, stranger.a.send);
    auto forged = sealed(forger, 5, pattern(100, 6));
    EXPECT_EQ(refusal(o, 5, forged), "authentication tag");
  }
}

TEST(Seal, OutOfOrderAcrossTagsIsAcceptedWithinTheWindowAndReplaysBeyondItAreNot) {
  Pair p = connect("k", "k");
  Sealer s(Cipher::kChaCha20Poly1305, p.a.send);
  Opener o(Cipher::kChaCha20Poly1305, p.b.receive, 1);
  std::vector<std::vector<uint8_t>> frames;
  for (int i = 0; i < 64; ++i)
    frames.push_back(
        sealed(s, 1000 + static_cast<uint64_t>(i), pattern(8, static_cast<uint32_t>(i))));
  // Different tags complete in any order (receives of different collectives, stripes).
  for (int i = 63; i >= 0; --i)
    EXPECT_EQ(refusal(o, 1000 + static_cast<uint64_t>(i), frames[static_cast<size_t>(i)]),
              "accepted");
  // Push the window past the first frames: kReplayWindow later frames of one tag.
  auto old = frames[0];
  std::vector<uint8_t> out(8);
  for (uint64_t i = 0; i < kReplayWindow; ++i) {
    auto f = sealed(s, 1, pattern(8, 9));
    o.open(1, f.data(), f.size(), out.data());
  }
  EXPECT_EQ(refusal(o, 1000, old), "sequence");
}

// 1,000 randomized attacks on a stream of frames of random sizes and tags, both ciphers: every one
// refused, every genuine frame between them opened bit-exact.
TEST(Seal, ThousandRandomAttacksAreAllRefused) {
  std::mt19937_64 gen(20261201);
  int refused = 0, genuine = 0;
  const Pair p = connect("k", "k");
  for (int trial = 0; trial < 1000; ++trial) {
    const Cipher c = trial % 2 ? Cipher::kAes256Gcm : Cipher::kChaCha20Poly1305;
    Sealer s(c, p.a.send);
    Opener o(c, p.b.receive, 1);
    std::vector<std::vector<uint8_t>> sent;
    const int before = 1 + static_cast<int>(gen() % 4);
    for (int i = 0; i < before; ++i) {
      const auto payload = pattern(gen() % 3000, static_cast<uint32_t>(gen()));
      const uint64_t tag = gen() % 8;
      auto f = sealed(s, tag, payload);
      std::vector<uint8_t> out(payload.size());
      o.open(tag, f.data(), f.size(), out.data());
      ASSERT_EQ(out, payload);
      sent.push_back(f);
      ++genuine;
    }
    const uint64_t tag = 100 + gen() % 8;
    auto f = sealed(s, tag, pattern(1 + gen() % 3000, static_cast<uint32_t>(gen())));
    std::string got;
    switch (trial % 5) {
      case 0: {  // one bit anywhere
        const size_t bit = gen() % (f.size() * 8);
        f[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
        got = refusal(o, tag, f);
        break;
      }
      case 1:  // cut short
        f.resize(gen() % f.size());
        got = refusal(o, tag, f);
        break;
      case 2:  // an accepted frame again
        got = refusal(o, tag, sent[gen() % sent.size()]);
        break;
      case 3:  // the genuine frame under another tag
        got = refusal(o, tag + 1 + gen() % 50, f);
        break;
      case 4: {  // a stranger's frame with the genuine header
        Pair other = connect("k", "k");
        Sealer forger(c, other.a.send);
        auto forged = sealed(forger, tag, pattern(f.size() - kOverheadBytes, 1));
        std::memcpy(forged.data(), f.data(), kHeaderBytes);
        got = refusal(o, tag, forged);
        break;
      }
    }
    EXPECT_NE(got, "accepted") << "trial " << trial;
    refused += got != "accepted";
  }
  EXPECT_EQ(refused, 1000);
  EXPECT_GT(genuine, 1000);
}

TEST(Seal, TamperSettingIsParsedStrictly) {
  EXPECT_EQ(parse_tamper("").kind, Tamper::Kind::kNone);
  EXPECT_EQ(parse_tamper("flip:3").kind, Tamper::Kind::kFlip);
  EXPECT_EQ(parse_tamper("forge:12").at, 12u);
  for (const char* bad : {"flip", "flip:0", "flip:x", "bend:2", ":4"}) {
    try {
      parse_tamper(bad);
      ADD_FAILURE() << bad;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("GRADEX_TEST_SEAL_TAMPER"), std::string::npos);
    }
  }
}

TEST(Seal, CipherOfAConnectionNeedsAesOnBothEnds) {
  EXPECT_EQ(pair_cipher(true, true), Cipher::kAes256Gcm);
  EXPECT_EQ(pair_cipher(true, false), Cipher::kChaCha20Poly1305);
  EXPECT_EQ(pair_cipher(false, true), Cipher::kChaCha20Poly1305);
}

}  // namespace
}  // namespace gradex::test
