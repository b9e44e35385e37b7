#include "sync/negotiation/submission_timeline.h"

#include <algorithm>

namespace gradex::sync {

void SubmissionTimeline::on_submit(const std::string& key, Clock::time_point at) {
  Seen& seen = keys_[key];
  if (step_ == 0 || seen.step == step_) {  // the first submission, or a key's second: a new step
    ++step_;
    step_start_ = at;
  }
  seen.step = step_;
  seen.offset = at - step_start_;
}

bool SubmissionTimeline::expects_more(Clock::duration window, Clock::time_point now) const {
  if (step_ < 2 || now - step_start_ >= window) return false;
  for (const auto& [key, seen] : keys_)
    if (seen.step + 1 == step_ && seen.offset <= window) return true;
  return false;
}

void coalesce_ready_times(std::vector<double>& ready_s, double window_s) {
  if (ready_s.empty() || !(window_s > 0)) return;
  const double first = *std::min_element(ready_s.begin(), ready_s.end());
  double last = first;
  for (double r : ready_s)
    if (r - first <= window_s) last = std::max(last, r);
  for (double& r : ready_s)
    if (r - first <= window_s) r = last;
}

}  // namespace gradex::sync
