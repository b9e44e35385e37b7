#include "compress/wire/index_coding.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "base/check.h"
#include "base/error.h"
#include "compress/wire/bytes.h"

namespace gradex::compress::wire {
namespace {

[[noreturn]] void corrupt(const std::string& what) {
  throw CorruptPayload("payload index section: " + what);
}

inline uint32_t gap_at(const uint32_t* idx, size_t j) {
  return j == 0 ? idx[0] : idx[j] - idx[j - 1] - 1;
}

uint64_t rice_bits(const uint32_t* idx, size_t count, unsigned r) {
  uint64_t bits = static_cast<uint64_t>(count) * (r + 1);
  for (size_t j = 0; j < count; ++j)
    bits += gap_at(idx, j) >> r;
  return bits;
}

// LSB-first bit packing into a byte vector.
class BitWriter {
 public:
  explicit BitWriter(std::vector<uint8_t>& out) : out_(out) {}
  void bits(uint64_t value, unsigned n) {  // n <= 32
    acc_ |= value << fill_;
    fill_ += n;
    flush(false);
  }
  void ones(uint64_t n) {
    while (n >= 32) {
      bits(0xffffffffu, 32);
      n -= 32;
    }
    bits((uint64_t{1} << n) - 1, static_cast<unsigned>(n));
  }
  void finish() { flush(true); }

 private:
  void flush(bool all) {
    while (fill_ >= 8 || (all && fill_ > 0)) {
      out_.push_back(static_cast<uint8_t>(acc_));
      acc_ >>= 8;
      fill_ = fill_ >= 8 ? fill_ - 8 : 0;
    }
  }
  std::vector<uint8_t>& out_;
  uint64_t acc_ = 0;
  unsigned fill_ = 0;
};

// Reads bits LSB first; every read is bounds-checked against the section's bit length.
class BitReader {
 public:
  BitReader(const uint8_t* data, size_t size)
      : data_(data), size_(size), nbits_(uint64_t{size} * 8) {}
  // The next up to 57 bits (zeros past the end).
  uint64_t peek() const {
    size_t byte = pos_ >> 3;
    uint64_t w = 0;
    if (byte < size_) std::memcpy(&w, data_ + byte, std::min<size_t>(8, size_ - byte));
    return w >> (pos_ & 7);
  }
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return nbits_ - pos_; }
  void skip(uint64_t n) { pos_ += n; }

 private:
  const uint8_t* data_;
  size_t size_;
  uint64_t nbits_;
  uint64_t pos_ = 0;
};

void check_next(uint64_t next, uint64_t numel, size_t j, int64_t prev) {
  if (next >= numel)
    corrupt("index " + std::to_string(next) + " at position " + std::to_string(j) +
            " is out of range (element count " + std::to_string(numel) + ", previous index " +
            std::to_string(prev) + ")");
}

void decode_varint(const uint8_t* p, size_t size, size_t count, uint64_t numel, uint32_t* out) {
  size_t at = 0;
  int64_t prev = -1;
  for (size_t j = 0; j < count; ++j) {
    uint64_t gap = 0;
    for (int shift = 0;; shift += 7) {
      if (at >= size) corrupt("varint section truncated at index position " + std::to_string(j));
      if (shift > 28) corrupt("varint at index position " + std::to_string(j) + " is too long");
      uint8_t b = p[at++];
      gap |= static_cast<uint64_t>(b & 0x7fu) << shift;
      if (!(b & 0x80u)) break;
    }
    uint64_t next = static_cast<uint64_t>(prev + 1) + gap;
    check_next(next, numel, j, prev);
    out[j] = static_cast<uint32_t>(next);
    prev = static_cast<int64_t>(next);
  }
  if (at != size)
    corrupt(std::to_string(size - at) + " trailing bytes after " + std::to_string(count) +
            " varint indices");
}

void decode_rice(const uint8_t* p, size_t size, unsigned r, size_t count, uint64_t numel,
                 uint32_t* out) {
  if (r > 31) corrupt("rice parameter " + std::to_string(r) + " exceeds 31");
  BitReader in(p, size);
  int64_t prev = -1;
  for (size_t j = 0; j < count; ++j) {
    uint64_t q = 0;
    for (;;) {
      // At most 56 ones per look: bit 56 is always forced to terminate the count (peek holds 57
      // valid bits; past the end of the section it reads zeros).
      const uint64_t w = in.peek();
      const unsigned ones = static_cast<unsigned>(__builtin_ctzll(~w | (uint64_t{1} << 56)));
      if (ones >= in.remaining())
        corrupt("rice section truncated at index position " + std::to_string(j));
      q += ones;
      if (q > numel)
        corrupt("rice quotient at index position " + std::to_string(j) + " is out of range");
      in.skip(ones);
      if (ones < 56) break;
    }
    in.skip(1);  // the terminating zero
    if (in.remaining() < r)
      corrupt("rice section truncated at index position " + std::to_string(j));
    uint64_t low = r ? in.peek() & ((uint64_t{1} << r) - 1) : 0;
    in.skip(r);
    uint64_t next = static_cast<uint64_t>(prev + 1) + ((q << r) | low);
    check_next(next, numel, j, prev);
    out[j] = static_cast<uint32_t>(next);
    prev = static_cast<int64_t>(next);
  }
  if ((in.pos() + 7) / 8 != size)
    corrupt(std::to_string(size - (in.pos() + 7) / 8) + " trailing bytes after " +
            std::to_string(count) + " rice-coded indices");
  if (in.pos() % 8 != 0 && (p[size - 1] >> (in.pos() % 8)) != 0)
    corrupt("non-zero padding bits after the rice-coded indices");
}

void decode_bitmap(const uint8_t* p, size_t size, size_t count, uint64_t numel, uint32_t* out) {
  if (size != bitmap_bytes(numel))
    corrupt("bitmap has " + std::to_string(size) + " bytes, expected " +
            std::to_string(bitmap_bytes(numel)) + " for " + std::to_string(numel) + " elements");
  if (numel % 8 != 0 && (p[size - 1] >> (numel % 8)) != 0)
    corrupt("bitmap has bits set past the element count " + std::to_string(numel));
  size_t j = 0;
  for (size_t byte = 0; byte < size; ++byte) {
    unsigned bits = p[byte];
    while (bits) {
      if (j >= count)
        corrupt("bitmap holds more than the declared " + std::to_string(count) + " indices");
      out[j++] = static_cast<uint32_t>(byte * 8 + __builtin_ctz(bits));
      bits &= bits - 1;
    }
  }
  if (j != count)
    corrupt("bitmap holds " + std::to_string(j) + " indices, the header declares " +
            std::to_string(count));
}

}  // namespace

uint64_t varint_bytes(const uint32_t* idx, size_t count) {
  uint64_t bytes = 0;
  for (size_t j = 0; j < count; ++j)
    bytes += varint_size(gap_at(idx, j));
  return bytes;
}

IndexPlan rice_plan(const uint32_t* idx, size_t count) {
  IndexPlan best{IndexCoding::kRice, 0, 0};
  if (count == 0) return best;
  uint64_t span = static_cast<uint64_t>(idx[count - 1]) + 1 - count;  // sum of gaps
  double mean = static_cast<double>(span) / count;
  int guess = mean > 1 ? static_cast<int>(std::log2(mean * 0.6931)) : 0;
  uint64_t best_bits = ~uint64_t{0};
  for (int r = std::max(0, guess - 2); r <= std::min(31, guess + 2); ++r) {
    uint64_t bits = rice_bits(idx, count, static_cast<unsigned>(r));
    if (bits < best_bits) {
      best_bits = bits;
      best.rice_param = static_cast<uint8_t>(r);
    }
  }
  best.bytes = (best_bits + 7) / 8;
  return best;
}

uint64_t bitmap_bytes(uint64_t numel) {
  return (numel + 7) / 8;
}

IndexPlan best_plan(IndexCoding requested, const uint32_t* idx, size_t count, uint64_t numel) {
  switch (requested) {
    case IndexCoding::kVarint:
      return {IndexCoding::kVarint, 0, varint_bytes(idx, count)};
    case IndexCoding::kRice:
      return rice_plan(idx, count);
    case IndexCoding::kBitmap:
      return {IndexCoding::kBitmap, 0, bitmap_bytes(numel)};
    case IndexCoding::kAuto:
      break;
  }
  IndexPlan best = rice_plan(idx, count);
  uint64_t bitmap = bitmap_bytes(numel);
  // Rice at r = 0 costs exactly the bitmap's bits; on a tie the bitmap wins (it decodes faster).
  if (bitmap <= best.bytes) best = {IndexCoding::kBitmap, 0, bitmap};
  uint64_t varint = varint_bytes(idx, count);
  if (varint < best.bytes) best = {IndexCoding::kVarint, 0, varint};
  return best;
}

void encode_indices(const IndexPlan& plan, const uint32_t* idx, size_t count, uint64_t numel,
                    std::vector<uint8_t>& out) {
  const size_t start = out.size();
  switch (plan.coding) {
    case IndexCoding::kVarint: {
      out.resize(start + plan.bytes);
      uint8_t* p = out.data() + start;
      for (size_t j = 0; j < count; ++j)
        p = put_varint(p, gap_at(idx, j));
      break;
    }
    case IndexCoding::kRice: {
      BitWriter w(out);
      const unsigned r = plan.rice_param;
      for (size_t j = 0; j < count; ++j) {
        uint32_t gap = gap_at(idx, j);
        w.ones(gap >> r);
        w.bits(0, 1);
        if (r) w.bits(gap & ((uint64_t{1} << r) - 1), r);
      }
      w.finish();
      break;
    }
    case IndexCoding::kBitmap: {
      out.resize(start + plan.bytes, 0);
      uint8_t* p = out.data() + start;
      for (size_t j = 0; j < count; ++j)
        p[idx[j] >> 3] |= static_cast<uint8_t>(1u << (idx[j] & 7));
      break;
    }
    case IndexCoding::kAuto:
      GX_CHECK(!"encode_indices needs a concrete coding");
  }
  GX_CHECK_EQ(out.size() - start, plan.bytes);
}

void decode_indices(IndexCoding coding, uint8_t rice_param, const uint8_t* data, size_t size,
                    size_t count, uint64_t numel, uint32_t* out) {
  switch (coding) {
    case IndexCoding::kVarint:
      return decode_varint(data, size, count, numel, out);
    case IndexCoding::kRice:
      return decode_rice(data, size, rice_param, count, numel, out);
    case IndexCoding::kBitmap:
      return decode_bitmap(data, size, count, numel, out);
    case IndexCoding::kAuto:
      break;
  }
  corrupt("unknown index coding " + std::to_string(static_cast<int>(coding)));
}

uint64_t max_index_bytes(IndexCoding coding, uint8_t rice_param, uint64_t numel, uint64_t count) {
  switch (coding) {
    case IndexCoding::kVarint:
      return 5 * count;
    case IndexCoding::kRice:  // the quotients sum to at most numel >> r
      return (count * (rice_param + 1u) + (numel >> std::min<unsigned>(rice_param, 63)) + 7) / 8;
    case IndexCoding::kBitmap:
      return bitmap_bytes(numel);
    case IndexCoding::kAuto:
      break;
  }
  return 0;
}

}  // namespace gradex::compress::wire
