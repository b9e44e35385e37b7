#include "sync/engine/first_exchanges.h"

namespace gradex::sync {

void FirstExchanges::mark(const std::string& key, uint64_t step) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (marks_.size() < kMaxMarks || marks_.count(key) > 0) marks_[key] = step;
}

bool FirstExchanges::take(const pipeline::Unit& unit) {
  std::lock_guard<std::mutex> lock(mutex_);
  bool first = false;
  for (const pipeline::Job* job : unit.jobs) {
    auto it = marks_.find(job->id.key);
    if (it == marks_.end() || it->second > job->step) continue;
    first = first || it->second == job->step;
    marks_.erase(it);
  }
  return first;
}

}  // namespace gradex::sync
