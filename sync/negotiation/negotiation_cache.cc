#include "sync/negotiation/negotiation_cache.h"

namespace gradex::sync {
namespace {

// FNV-1a over an entry's identity and its id.
uint64_t entry_hash(const CachedKey& k, uint32_t slot) {
  uint64_t h = 14695981039346656037ull;
  auto mix = [&h](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      h ^= static_cast<const uint8_t*>(p)[i];
      h *= 1099511628211ull;
    }
  };
  const uint8_t kind = static_cast<uint8_t>(k.id.kind), dtype = static_cast<uint8_t>(k.dtype);
  mix(&slot, sizeof(slot));
  mix(&kind, 1);
  mix(&dtype, 1);
  mix(&k.numel, sizeof(k.numel));
  mix(k.id.key.data(), k.id.key.size());
  return h;
}

}  // namespace

std::optional<uint32_t> NegotiationCache::find(const WorkId& id) const {
  auto it = index_.find(id);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

void NegotiationCache::ready(const WorkId& id, uint64_t numel, DType dtype, uint64_t step) {
  auto it = index_.find(id);
  if (it != index_.end()) {
    slots_[it->second]->last_step = step;
    return;
  }
  if (index_.size() >= capacity_) return;
  uint32_t slot;
  if (!free_.empty()) {
    slot = *free_.begin();
    free_.erase(free_.begin());
  } else {
    slot = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
  }
  slots_[slot] = CachedKey{id, numel, dtype, step};
  index_.emplace(id, slot);
  digest_ ^= entry_hash(*slots_[slot], slot);
}

void NegotiationCache::evict(const WorkId& id) {
  auto it = index_.find(id);
  if (it == index_.end()) return;
  digest_ ^= entry_hash(*slots_[it->second], it->second);
  slots_[it->second].reset();
  free_.insert(it->second);
  index_.erase(it);
  // Keep id_space() tight: trailing free ids are dropped, so bit vectors stay short.
  while (!slots_.empty() && !slots_.back()) {
    free_.erase(static_cast<uint32_t>(slots_.size() - 1));
    slots_.pop_back();
  }
}

}  // namespace gradex::sync
