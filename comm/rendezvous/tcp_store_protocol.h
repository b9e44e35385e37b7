// Wire format of the TCP store. Every frame, in both directions, is a 12-byte header
//   u32 magic 'GXST' | u16 version | u16 type | u32 payload length
// followed by the payload; integers are little-endian. A peer that is not a gradex store (or an
// incompatible version) is recognised from the first header and reported clearly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/rendezvous/store.h"

namespace gradex::comm::store_wire {

constexpr uint32_t kMagic = 0x54535847;  // "GXST" in little-endian byte order
constexpr uint16_t kVersion = 1;
constexpr size_t kHeaderBytes = 12;
constexpr uint32_t kMaxPayload = 64u << 20;  // bootstrap values are small; refuse garbage lengths

enum class Type : uint16_t {
  // requests
  // empty (no job secret): answered with kOk so the client knows it reached a gradex store;
  // 32-byte client nonce + 32-byte X25519 key (job secret): answered with kChallenge
  kHello = 1,
  kSet = 2,   // str key, bytes value
  kGet = 3,   // u64 timeout ms, str key -> kOk(value) | kTimeout(key)
  kWait = 4,  // u64 timeout ms, u32 n, n x str key -> kOk | kTimeout(first missing key)
  kAdd = 5,   // i64 delta, str key -> kOk(i64 new value) | kError
  kAuth = 6,  // 32-byte client proof -> kOk | kError (comm/rendezvous/tcp_store_core.h)
  // either direction, with a job secret, after kAuth: a whole frame sealed (store_seal.h)
  kSealed = 7,
  // responses
  kOk = 100,
  kTimeout = 101,
  kError = 102,
  kChallenge = 103,  // 32-byte server nonce, 32-byte server X25519 key, 32-byte server proof
};

struct Header {
  uint32_t magic = kMagic;
  uint16_t version = kVersion;
  Type type = Type::kOk;
  uint32_t length = 0;
};

void encode_header(const Header& h, uint8_t out[kHeaderBytes]);
Header decode_header(const uint8_t in[kHeaderBytes]);
// Empty when the header is acceptable, else why not (wrong magic, version, oversized).
std::string check_header(const Header& h);

// Header + payload.
Bytes make_frame(Type type, const Bytes& payload);

class Writer {
 public:
  void u32(uint32_t v);
  void u64(uint64_t v);
  void str(const std::string& s);  // u32 length + bytes
  void bytes(const Bytes& b);      // u32 length + bytes
  // Header + payload, ready to send.
  Bytes frame(Type type) const;
  // The payload alone (a value kept in the store in this encoding: store_gather.h).
  const Bytes& payload() const { return payload_; }

 private:
  Bytes payload_;
};

// Reads a payload; throws CorruptPayload when it is shorter than what is read.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  uint32_t u32();
  uint64_t u64();
  std::string str();
  Bytes bytes();
  bool done() const { return p_ == end_; }
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }
  // The next `n` bytes, unparsed.
  const uint8_t* raw(size_t n) { return take(n); }

 private:
  const uint8_t* take(size_t n);
  const uint8_t* p_;
  const uint8_t* end_;
};

}  // namespace gradex::comm::store_wire
