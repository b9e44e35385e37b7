// Little-endian serialization for the engine's control messages and saved state. The reader checks
// every length against what remains and throws CorruptPayload naming `what` instead of reading past
// the end.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "base/error.h"

namespace gradex::sync {

class ByteWriter {
 public:
  template <typename T>
  void put(T value) {
    const auto* p = reinterpret_cast<const uint8_t*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint32_t>(static_cast<uint32_t>(s.size()));
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  void put_bytes(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    bytes_.insert(bytes_.end(), p, p + n);
  }
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size, std::string what)
      : data_(data), size_(size), what_(std::move(what)) {}

  template <typename T>
  T get() {
    need(sizeof(T));
    T value;
    std::memcpy(&value, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }
  std::string get_string() {
    uint32_t n = get<uint32_t>();
    need(n);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }
  const uint8_t* get_bytes(size_t n) {
    need(n);
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }
  size_t remaining() const { return size_ - pos_; }
  void expect_end() const {
    if (pos_ != size_)
      throw CorruptPayload(what_ + ": " + std::to_string(size_ - pos_) +
                           " unexpected trailing bytes");
  }

 private:
  void need(size_t n) const {
    if (n > size_ - pos_)
      throw CorruptPayload(what_ + " is truncated: needs " + std::to_string(n) +
                           " more bytes at offset " + std::to_string(pos_) + ", has " +
                           std::to_string(size_ - pos_));
  }
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  std::string what_;
};

}  // namespace gradex::sync
