#include "compress/wire/message.h"

#include <cstring>

#include "base/error.h"

namespace gradex::compress::wire {
namespace {

template <typename T>
void put_le(std::vector<uint8_t>& out, T value) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &value, sizeof(T));
}

class Reader {
 public:
  Reader(const uint8_t* data, size_t size, const std::string& what)
      : data_(data), size_(size), what_(what) {}
  const uint8_t* take(size_t n) {
    if (n > size_ - pos_)
      throw CorruptPayload(what_ + " is truncated: needs " + std::to_string(n) +
                           " more bytes at offset " + std::to_string(pos_) + ", has " +
                           std::to_string(size_ - pos_));
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }
  template <typename T>
  T get() {
    T v;
    std::memcpy(&v, take(sizeof(T)), sizeof(T));
    return v;
  }
  void expect_end() const {
    if (pos_ != size_)
      throw CorruptPayload(what_ + ": " + std::to_string(size_ - pos_) +
                           " unexpected trailing bytes");
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& what_;
};

}  // namespace

void begin_message(std::vector<uint8_t>& message, uint32_t count) {
  message.clear();
  put_le<uint32_t>(message, count);
}

size_t begin_payload(std::vector<uint8_t>& message) {
  const size_t at = message.size();
  put_le<uint64_t>(message, 0);
  return at;
}

void end_payload(std::vector<uint8_t>& message, size_t at) {
  const uint64_t length = message.size() - at - sizeof(uint64_t);
  std::memcpy(message.data() + at, &length, sizeof length);
}

uint32_t message_count(const uint8_t* data, size_t size, const std::string& what) {
  return Reader(data, size, what).get<uint32_t>();
}

void split_message(const uint8_t* data, size_t size, size_t expected, const std::string& what,
                   std::vector<PayloadSpan>& payloads) {
  Reader reader(data, size, what);
  const uint32_t count = reader.get<uint32_t>();
  if (count != expected)
    throw CorruptPayload(what + " holds " + std::to_string(count) + " payload(s), expected " +
                         std::to_string(expected));
  payloads.clear();
  for (size_t j = 0; j < expected; ++j) {
    const uint64_t length = reader.get<uint64_t>();
    payloads.push_back({reader.take(length), static_cast<size_t>(length)});
  }
  reader.expect_end();
}

}  // namespace gradex::compress::wire
