#include "comm/rendezvous/store_gather.h"

#include <chrono>

#include "base/error.h"
#include "base/wall_time.h"
#include "comm/rendezvous/tcp_store_protocol.h"

namespace gradex::comm {
namespace {

using Clock = std::chrono::steady_clock;

// Below this world size the combined entry saves no round trip: rank 1 would read one key either
// way.
constexpr int kCombineFrom = 3;

// size entries in the store's own encoding: each a u32 length and its bytes.
Bytes encode(const std::vector<Bytes>& entries) {
  store_wire::Writer w;
  for (const Bytes& e : entries)
    w.bytes(e);
  return w.payload();
}

std::vector<Bytes> decode(const Bytes& in, int size, const std::string& key) {
  store_wire::Reader r(in.data(), in.size());
  std::vector<Bytes> entries;
  try {
    while (static_cast<int>(entries.size()) < size)
      entries.push_back(r.bytes());
  } catch (const CorruptPayload& e) {
    throw CorruptPayload("store entry '" + key + "' ends inside rank " +
                         std::to_string(entries.size()) + "'s entry (" + e.what() + ", " +
                         std::to_string(in.size()) + " bytes)");
  }
  if (!r.done())
    throw CorruptPayload("store entry '" + key + "' holds " + std::to_string(r.remaining()) +
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
