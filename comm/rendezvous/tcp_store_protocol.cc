#include "comm/rendezvous/tcp_store_protocol.h"

#include <cstring>

#include "base/error.h"

namespace gradex::comm::store_wire {
namespace {

void put_le(uint8_t* out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i)
    out[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t get_le(const uint8_t* in, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i)
    v |= static_cast<uint64_t>(in[i]) << (8 * i);
  return v;
}

}  // namespace

void encode_header(const Header& h, uint8_t out[kHeaderBytes]) {
  put_le(out, h.magic, 4);
  put_le(out + 4, h.version, 2);
  put_le(out + 6, static_cast<uint16_t>(h.type), 2);
  put_le(out + 8, h.length, 4);
}

Header decode_header(const uint8_t in[kHeaderBytes]) {
  Header h;
  h.magic = static_cast<uint32_t>(get_le(in, 4));
  h.version = static_cast<uint16_t>(get_le(in + 4, 2));
  h.type = static_cast<Type>(get_le(in + 6, 2));
  h.length = static_cast<uint32_t>(get_le(in + 8, 4));
  return h;
}

std::string check_header(const Header& h) {
  if (h.magic != kMagic) return "it does not speak the gradex store protocol (bad magic)";
  if (h.version != kVersion)
    return "it speaks gradex store protocol version " + std::to_string(h.version) +
           ", this build speaks version " + std::to_string(kVersion);
  if (h.length > kMaxPayload)
    return "it sent a frame of " + std::to_string(h.length) + " bytes (limit " +
           std::to_string(kMaxPayload) + ")";
  return "";
}

void Writer::u32(uint32_t v) {
  size_t at = payload_.size();
  payload_.resize(at + 4);
  put_le(payload_.data() + at, v, 4);
}

void Writer::u64(uint64_t v) {
  size_t at = payload_.size();
  payload_.resize(at + 8);
  put_le(payload_.data() + at, v, 8);
}

void Writer::str(const std::string& s) {
  u32(static_cast<uint32_t>(s.size()));
  payload_.insert(payload_.end(), s.begin(), s.end());
}

void Writer::bytes(const Bytes& b) {
  u32(static_cast<uint32_t>(b.size()));
  payload_.insert(payload_.end(), b.begin(), b.end());
}

Bytes Writer::frame(Type type) const {
  return make_frame(type, payload_);
}

Bytes make_frame(Type type, const Bytes& payload) {
  if (payload.size() > kMaxPayload)
    throw InvalidArgument("gradex store value too large: " + std::to_string(payload.size()) +
                          " bytes (limit " + std::to_string(kMaxPayload) + ")");
  Bytes out(kHeaderBytes + payload.size());
  Header h;
  h.type = type;
  h.length = static_cast<uint32_t>(payload.size());
  encode_header(h, out.data());
  if (!payload.empty()) std::memcpy(out.data() + kHeaderBytes, payload.data(), payload.size());
  return out;
}

const uint8_t* Reader::take(size_t n) {
  if (static_cast<size_t>(end_ - p_) < n) throw CorruptPayload("gradex store frame is truncated");
  const uint8_t* at = p_;
  p_ += n;
  return at;
}

uint32_t Reader::u32() {
  return static_cast<uint32_t>(get_le(take(4), 4));
}
uint64_t Reader::u64() {
  return get_le(take(8), 8);
}
std::string Reader::str() {
  uint32_t n = u32();
  const uint8_t* p = take(n);
  return std::string(reinterpret_cast<const char*>(p), n);
}
Bytes Reader::bytes() {
  uint32_t n = u32();
  const uint8_t* p = take(n);
  return Bytes(p, p + n);
}

}  // namespace gradex::comm::store_wire
