// Little-endian field access and LEB128 varints for the wire format and state blobs. Readers
// never touch memory outside [data, data + size): callers check lengths first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gradex's wire format code assumes a little-endian host"
#endif

namespace gradex::compress::wire {

template <typename T>
inline void put(uint8_t* at, T value) {
  std::memcpy(at, &value, sizeof(T));
}
template <typename T>
inline T get(const uint8_t* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
}
template <typename T>
inline void append(std::vector<uint8_t>& out, T value) {
  size_t at = out.size();
  out.resize(at + sizeof(T));
  put(out.data() + at, value);
}

// Bytes of the LEB128 encoding of v (1..5 for uint32).
inline size_t varint_size(uint32_t v) {
  return v < (1u << 7) ? 1 : v < (1u << 14) ? 2 : v < (1u << 21) ? 3 : v < (1u << 28) ? 4 : 5;
}
inline uint8_t* put_varint(uint8_t* p, uint32_t v) {
  while (v >= 0x80u) {
    *p++ = static_cast<uint8_t>(v | 0x80u);
    v >>= 7;
  }
  *p++ = static_cast<uint8_t>(v);
  return p;
}

}  // namespace gradex::compress::wire
