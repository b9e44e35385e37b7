#include "comm/collectives/group_communicator.h"

#include <algorithm>

#include "base/check.h"

namespace gradex::comm {

GroupCommunicator::GroupCommunicator(Communicator& parent, std::vector<int> ranks,
                                     std::vector<uint64_t> tags)
    : parent_(parent), ranks_(std::move(ranks)), tags_(std::move(tags)) {
  auto it = std::find(ranks_.begin(), ranks_.end(), parent_.rank());
  GX_CHECK(it != ranks_.end());
  rank_ = static_cast<int>(it - ranks_.begin());
}

int GroupCommunicator::parent_rank(int peer) const {
  GX_CHECK(peer >= 0 && peer < size());
  return ranks_[static_cast<size_t>(peer)];
}

RequestPtr GroupCommunicator::isend(int peer, uint64_t tag, const void* data, size_t bytes) {
  return parent_.isend(parent_rank(peer), tag, data, bytes);
}

RequestPtr GroupCommunicator::irecv(int peer, uint64_t tag, void* data, size_t bytes) {
  return parent_.irecv(parent_rank(peer), tag, data, bytes);
}

uint64_t GroupCommunicator::next_collective_tag() {
  GX_CHECK_LT(next_tag_, tags_.size());
  return tags_[next_tag_++];
}

}  // namespace gradex::comm
