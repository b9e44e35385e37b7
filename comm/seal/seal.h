// The sealed data plane: every message between two ranks authenticated and encrypted with keys of
// that connection alone. This header is the whole interface; the UCX communicator (comm/ucx/) uses
// it, nothing in it knows UCX. All cryptography is OpenSSL's libcrypto (X25519, HKDF-SHA256,
// AES-256-GCM, ChaCha20-Poly1305); nothing cryptographic is written here.
//
// Keys: each pair of ranks exchanges ephemeral X25519 public keys in the hello round, proves the
// job secret over both (the HMAC challenge-response of ucx_hello.cc covers them, so nobody without
// the secret can sit in the middle), and derives one key per direction with HKDF from the X25519
// shared value, salted with an HMAC of the secret over the round's nonces and keys. The private
// keys are forgotten once the keys are derived: a secret learned later opens nothing recorded
// earlier.
//
// A sealed frame (what travels instead of a message of n bytes):
//   [u32 kFrameMagic][u64 sequence][n bytes of ciphertext][16-byte authentication tag]
// little-endian. The nonce is the sequence number (a fresh one per message and direction), the
// additional authenticated data the frame's header and the message's user tag, so a frame moved to
// another tag, cut short, altered or sealed with another key fails its tag check; a frame whose
// sequence number was already accepted (a replay, or a resend of a dropped one) or that arrives
// behind a later frame of the same tag (a reorder) fails the sequence check.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/error.h"

namespace gradex::comm::seal {

enum class Cipher : uint8_t { kAes256Gcm = 1, kChaCha20Poly1305 = 2 };
const char* cipher_name(Cipher cipher);  // "AES-256-GCM", "ChaCha20-Poly1305"

// True when this CPU has AES and carry-less multiply instructions (AES-GCM at several GB/s a core).
bool cpu_has_aes();
// The cipher of a connection: AES-256-GCM when both ends have AES instructions, else
// ChaCha20-Poly1305 (fast everywhere in software). Symmetric, so both ends choose the same.
Cipher pair_cipher(bool a_has_aes, bool b_has_aes);

constexpr uint32_t kFrameMagic = 0x4c535847;  // "GXSL"
constexpr size_t kHeaderBytes = 12;
constexpr size_t kTagBytes = 16;
constexpr size_t kOverheadBytes = kHeaderBytes + kTagBytes;
constexpr size_t kKeyBytes = 32;
constexpr size_t kPublicKeyBytes = 32;
// Frames accepted out of order: a sequence number this far behind the highest one accepted from a
// peer is refused as a replay. Far more than can be in flight between two ranks.
constexpr uint64_t kReplayWindow = uint64_t{1} << 16;

using Key = std::array<uint8_t, kKeyBytes>;
using PublicKey = std::array<uint8_t, kPublicKeyBytes>;

// A frame that failed a check: which check, in words a user can act on. Its code is kCorrupt.
class SealViolation : public Error {
 public:
  enum class Check { kFrame, kAuthentication, kSequence, kOrder };
  SealViolation(Check check, const std::string& what)
      : Error(ErrorCode::kCorrupt, what), check_(check) {}
  Check check() const noexcept { return check_; }

 private:
  Check check_;
};
const char* check_name(SealViolation::Check check);  // "frame", "authentication tag", ...

// An ephemeral X25519 key pair, alive for one handshake.
class EphemeralKey {
 public:
  EphemeralKey();  // TransportError if libcrypto cannot make one
  ~EphemeralKey();
  EphemeralKey(const EphemeralKey&) = delete;
  EphemeralKey& operator=(const EphemeralKey&) = delete;
  const PublicKey& public_key() const { return public_; }
  // The X25519 shared value with `peer`; CorruptPayload for a degenerate peer key.
  Key agree(const PublicKey& peer) const;

 private:
  void* pkey_ = nullptr;  // EVP_PKEY*
  PublicKey public_{};
};

// What both ends of a connection bind their keys to.
struct Handshake {
  std::string secret;  // the job secret
  uint32_t self = 0, peer = 0, world = 0;
  std::array<uint8_t, 32> self_nonce{}, peer_nonce{};
  PublicKey self_public{}, peer_public{};
};
struct DirectionKeys {
  Key send{};     // this rank -> peer
  Key receive{};  // peer -> this rank
};
// HKDF-SHA256 (libcrypto's EVP_KDF): both ends derive the same pair, mirrored.
DirectionKeys derive_keys(const Key& shared, const Handshake& h);

// One direction's AEAD: a cipher context keyed once, reused for every frame.
class Aead {
 public:
  Aead(Cipher cipher, const Key& key, bool encrypt);
  ~Aead();
  Aead(const Aead&) = delete;
  Aead& operator=(const Aead&) = delete;
  Cipher cipher() const { return cipher_; }
  // Encrypts n bytes of `in` into `out` (in == out allowed) and writes the tag.
  void seal(uint64_t sequence, const uint8_t* aad, size_t aad_bytes, const uint8_t* in, size_t n,
            uint8_t* out, uint8_t* tag);
  // Decrypts into `out` (in == out allowed); false when the tag does not verify (`out` then holds
  // unauthenticated bytes the caller must not use).
  bool open(uint64_t sequence, const uint8_t* aad, size_t aad_bytes, const uint8_t* in, size_t n,
            uint8_t* out, const uint8_t* tag);

 private:
  Cipher cipher_;
  void* ctx_ = nullptr;  // EVP_CIPHER_CTX*
};

// Sealing one direction of a connection.
class Sealer {
 public:
  Sealer(Cipher cipher, const Key& key) : aead_(cipher, key, true) {}
  // Writes the frame of `n` bytes of `in` for user tag `tag` into `out` (n + kOverheadBytes
  // bytes). `in` and `out` must not overlap.
  void seal(uint64_t tag, const void* in, size_t n, uint8_t* out);
  uint64_t sealed() const { return next_sequence_; }
  Cipher cipher() const { return aead_.cipher(); }

 private:
  Aead aead_;
  uint64_t next_sequence_ = 0;
};

// Which sequence numbers of a direction were accepted: the highest, and a bitmap of the
// kReplayWindow below it.
class ReplayWindow {
 public:
  ReplayWindow() : bits_(kReplayWindow / 64, 0) {}
  // Throws SealViolation(kSequence) for a number already accepted or older than the window.
  void check(uint64_t sequence, int peer) const;
  void accept(uint64_t sequence);
  // The oldest sequence number still inside the window (0 until the window has filled).
  uint64_t floor() const { return any_ && top_ >= kReplayWindow ? top_ - kReplayWindow + 1 : 0; }

 private:
  bool seen(uint64_t sequence) const;
  bool any_ = false;
  uint64_t top_ = 0;
  std::vector<uint64_t> bits_;
};

// Opening one direction of a connection.
class Opener {
 public:
  Opener(Cipher cipher, const Key& key, int peer) : aead_(cipher, key, false), peer_(peer) {}
  // The payload length of a frame of `frame_bytes` (SealViolation(kFrame) when it is too short).
  size_t payload_bytes(size_t frame_bytes) const;
  // Checks and decrypts a frame received with user tag `tag` into `out` (payload_bytes(frame_bytes)
  // bytes; may be frame + kHeaderBytes). Frames of one tag must be opened in the order they were
  // received. Throws SealViolation naming the peer and the check that failed; `out` must then not
  // be used.
  void open(uint64_t tag, const uint8_t* frame, size_t frame_bytes, uint8_t* out);
  uint64_t opened() const { return opened_; }

 private:
  Aead aead_;
  int peer_;
  ReplayWindow window_;
  // The last sequence number accepted per tag: a frame of that tag must carry a later one. Entries
  // that fall out of the window are pruned (the window then refuses anything older).
  std::unordered_map<uint64_t, uint64_t> last_by_tag_;
  uint64_t opened_ = 0;
};

// Test-only tampering with the frames a rank sends (GRADEX_TEST_SEAL_TAMPER, "KIND:N"): the N-th
// sealed frame (counting from 1, over all peers) is altered as an attacker on the path would:
//   flip      one bit flipped (the position moves with N: header, ciphertext or tag)
//   truncate  its last byte cut off
//   replay    replaced by the previous frame sent to the same peer (a replay of an accepted
//             frame, under this frame's tag; when there is none yet, the next frame is replaced)
//   forge     sealed under a key nobody derived (an injection by someone without the keys)
struct Tamper {
  enum class Kind { kNone, kFlip, kTruncate, kReplay, kForge } kind = Kind::kNone;
  uint64_t at = 0;
};
// Parses "" (none) or "KIND:N"; ConfigError naming GRADEX_TEST_SEAL_TAMPER otherwise.
Tamper parse_tamper(const std::string& text);

}  // namespace gradex::comm::seal
