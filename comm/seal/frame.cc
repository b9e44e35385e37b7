// Sealed frames (seal.h): sealing one direction, opening the other with its replay window and
// per-tag order, and the test-only tampering settings.
#include <cstring>

#include "comm/seal/seal.h"

namespace gradex::comm::seal {
namespace {

void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}

// Additional authenticated data: the frame's header and the message's user tag.
constexpr size_t kAadBytes = kHeaderBytes + 8;
void make_aad(const uint8_t* header, uint64_t tag, uint8_t* aad) {
  std::memcpy(aad, header, kHeaderBytes);
  put_u64(aad + kHeaderBytes, tag);
}

std::string from(int peer) {
  return "a sealed message from rank " + std::to_string(peer);
}

}  // namespace

const char* check_name(SealViolation::Check check) {
  switch (check) {
    case SealViolation::Check::kFrame:
      return "frame";
    case SealViolation::Check::kAuthentication:
      return "authentication tag";
    case SealViolation::Check::kSequence:
      return "sequence";
    case SealViolation::Check::kOrder:
      return "order";
  }
  return "?";
}

void Sealer::seal(uint64_t tag, const void* in, size_t n, uint8_t* out) {
  const uint64_t sequence = next_sequence_++;
  put_u32(out, kFrameMagic);
  put_u64(out + 4, sequence);
  uint8_t aad[kAadBytes];
  make_aad(out, tag, aad);
  aead_.seal(sequence, aad, sizeof(aad), static_cast<const uint8_t*>(in), n, out + kHeaderBytes,
             out + kHeaderBytes + n);
}

bool ReplayWindow::seen(uint64_t sequence) const {
  if (!any_ || sequence > top_) return false;
  const uint64_t i = sequence % kReplayWindow;
  return (bits_[i / 64] >> (i % 64)) & 1u;
}

void ReplayWindow::check(uint64_t sequence, int peer) const {
  if (any_ && sequence + kReplayWindow <= top_)
    throw SealViolation(SealViolation::Check::kSequence,
                        from(peer) + " carries sequence number " + std::to_string(sequence) +
                            ", more than " + std::to_string(kReplayWindow) +
                            " behind the latest accepted (" + std::to_string(top_) +
                            "): a replayed or resent message");
  if (seen(sequence))
    throw SealViolation(SealViolation::Check::kSequence,
                        from(peer) + " carries sequence number " + std::to_string(sequence) +
                            ", which was already accepted: a replayed or resent message");
}

void ReplayWindow::accept(uint64_t sequence) {
  auto clear = [&](uint64_t s) {
    const uint64_t i = s % kReplayWindow;
    bits_[i / 64] &= ~(uint64_t{1} << (i % 64));
  };
  if (!any_ || sequence >= top_ + kReplayWindow) {
    std::fill(bits_.begin(), bits_.end(), 0);
    top_ = sequence;
    any_ = true;
  } else if (sequence > top_) {
    for (uint64_t s = top_ + 1; s <= sequence; ++s)
      clear(s);
    top_ = sequence;
  }
  const uint64_t i = sequence % kReplayWindow;
  bits_[i / 64] |= uint64_t{1} << (i % 64);
}

size_t Opener::payload_bytes(size_t frame_bytes) const {
  if (frame_bytes < kOverheadBytes)
    throw SealViolation(SealViolation::Check::kFrame,
                        from(peer_) + " is " + std::to_string(frame_bytes) +
                            " bytes long, shorter than a sealed frame's " +
                            std::to_string(kOverheadBytes) + " bytes of header and tag");
  return frame_bytes - kOverheadBytes;
}

void Opener::open(uint64_t tag, const uint8_t* frame, size_t frame_bytes, uint8_t* out) {
  const size_t n = payload_bytes(frame_bytes);
  if (get_u32(frame) != kFrameMagic)
    throw SealViolation(SealViolation::Check::kFrame,
                        from(peer_) +
                            " does not start with a sealed frame's header (it was "
                            "sent in clear, or its header was altered)");
  const uint64_t sequence = get_u64(frame + 4);
  // Refused before authentication: the number is untrusted, but a frame is refused either way and
  // a replay is named as one.
  window_.check(sequence, peer_);
  uint8_t aad[kAadBytes];
  make_aad(frame, tag, aad);
  if (!aead_.open(sequence, aad, sizeof(aad), frame + kHeaderBytes, n, out,
                  frame + kHeaderBytes + n))
    throw SealViolation(SealViolation::Check::kAuthentication,
                        from(peer_) + " (tag " + std::to_string(tag) + ", " + std::to_string(n) +
                            " bytes) failed its " + cipher_name(aead_.cipher()) +
                            " authentication tag check: it was altered or cut on the way, moved "
                            "to another tag, or not sealed with this connection's key (an "
                            "injected message)");
  auto last = last_by_tag_.find(tag);
  if (last != last_by_tag_.end() && sequence <= last->second)
    throw SealViolation(SealViolation::Check::kOrder,
                        from(peer_) + " with sequence number " + std::to_string(sequence) +
                            " arrived after sequence number " + std::to_string(last->second) +
                            " of the same tag: a reordered message");
  window_.accept(sequence);
  last_by_tag_[tag] = sequence;
  if (last_by_tag_.size() > 4096) {
    const uint64_t floor = window_.floor();
    for (auto it = last_by_tag_.begin(); it != last_by_tag_.end();)
      it = it->second < floor ? last_by_tag_.erase(it) : std::next(it);
  }
  ++opened_;
}

Tamper parse_tamper(const std::string& text) {
  Tamper t;
  if (text.empty()) return t;
  const size_t colon = text.find(':');
  const std::string kind = text.substr(0, colon);
  const std::string at = colon == std::string::npos ? "" : text.substr(colon + 1);
  bool ok =
      !at.empty() && at.find_first_not_of("0123456789") == std::string::npos && at.size() < 12;
  if (ok) t.at = std::stoull(at);
  if (kind == "flip") {
    t.kind = Tamper::Kind::kFlip;
  } else if (kind == "truncate") {
    t.kind = Tamper::Kind::kTruncate;
  } else if (kind == "replay") {
    t.kind = Tamper::Kind::kReplay;
  } else if (kind == "forge") {
    t.kind = Tamper::Kind::kForge;
  } else {
    ok = false;
  }
  if (!ok || t.at == 0)
    throw ConfigError("GRADEX_TEST_SEAL_TAMPER: '" + text +
                      "' is not KIND:N with KIND one of flip|truncate|replay|forge and N >= 1");
  return t;
}

}  // namespace gradex::comm::seal
