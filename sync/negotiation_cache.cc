#include "sync/negotiation_cache.h"

namespace gradex::sync {

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
}

void NegotiationCache::evict(const WorkId& id) {
  auto it = index_.find(id);
  if (it == index_.end()) return;
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
