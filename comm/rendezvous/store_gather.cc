#include "comm/rendezvous/store_gather.h"

#include <chrono>
#include <cstring>

#include "base/error.h"
#include "base/wall_time.h"

namespace gradex::comm {
namespace {

using Clock = std::chrono::steady_clock;

// Below this world size the combined entry saves no round trip: rank 1 would read one key either
// way.
constexpr int kCombineFrom = 3;

// size entries, each an 8-byte little-endian length and its bytes.
Bytes encode(const std::vector<Bytes>& entries) {
  Bytes out;
  for (const Bytes& e : entries) {
    const uint64_t n = e.size();
    for (int i = 0; i < 8; ++i)
      out.push_back(static_cast<uint8_t>(n >> (8 * i)));
    out.insert(out.end(), e.begin(), e.end());
  }
  return out;
}

std::vector<Bytes> decode(const Bytes& in, int size, const std::string& key) {
  std::vector<Bytes> entries;
  size_t at = 0;
  for (int r = 0; r < size; ++r) {
    if (in.size() - at < 8)
      throw CorruptPayload("store entry '" + key + "' ends inside rank " + std::to_string(r) +
                           "'s length (" + std::to_string(in.size()) + " bytes)");
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i)
      n |= static_cast<uint64_t>(in[at + static_cast<size_t>(i)]) << (8 * i);
    at += 8;
    if (n > in.size() - at)
      throw CorruptPayload("store entry '" + key + "' gives rank " + std::to_string(r) + " " +
                           std::to_string(n) + " bytes, more than its " +
                           std::to_string(in.size() - at) + " left");
    entries.emplace_back(in.begin() + static_cast<std::ptrdiff_t>(at),
                         in.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
  }
  if (at != in.size())
    throw CorruptPayload("store entry '" + key + "' holds " + std::to_string(in.size() - at) +
                         " bytes after the entries of its " + std::to_string(size) + " ranks");
  return entries;
}

}  // namespace

std::vector<Bytes> gather_store_entries(Store& store, const std::function<std::string(int)>& key_of,
                                        const std::string& combined_key, int rank, int size,
                                        Bytes own, Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  std::vector<Bytes> entries(static_cast<size_t>(size));
  if (size < kCombineFrom || rank == 0) {
    // Start with the next rank so that ranks do not all wait for rank 0's key first.
    for (int i = 1; i < size; ++i) {
      const int p = (rank + i) % size;
      entries[static_cast<size_t>(p)] = store.get(key_of(p), millis_until(deadline));
    }
    entries[static_cast<size_t>(rank)] = std::move(own);
    if (size >= kCombineFrom) store.set(combined_key, encode(entries));
    return entries;
  }
  Bytes combined;
  try {
    combined = store.get(combined_key, millis_until(deadline));
  } catch (const TimeoutError&) {
    // Name the rank that never set its entry where the store can tell; else rank 0 is the one.
    std::vector<std::string> keys;
    for (int p = 0; p < size; ++p)
      if (p != rank) keys.push_back(key_of(p));
    store.wait(keys, Millis(1));
    throw;
  }
  entries = decode(combined, size, combined_key);
  entries[static_cast<size_t>(rank)] = std::move(own);
  return entries;
}

}  // namespace gradex::comm
