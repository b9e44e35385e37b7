// OuterOptimizer::synchronize_all: the end of training without dropping local progress. A plain
// synchronize() installs the global copies, so each fragment loses the inner steps taken since its
// last exchange started (with 4 fragments on a period H, up to H - H/4 + delay steps): at the LM
// race's H = 32 that cost about 2 points of held-out loss (docs/benchmarks.md). Here every such
// step reaches the global copy through one more outer step.
#include <cstring>

#include "outer/fragment_exchange.h"
#include "outer/outer_job.h"
#include "outer/outer_optimizer.h"

namespace gradex::outer {

int OuterOptimizer::synchronize_all() {
  require_started("synchronize_all()");
  check_failed();
  const size_t F = fragments_.size();
  // Per fragment, this rank's contribution to the final exchange; empty: no inner steps to merge.
  std::vector<std::vector<float>> contribution(F);
  std::vector<bool> handled(F, false);
  // 1. Exchanges in flight: their global copies are installed, but the tensors keep this rank's
  // inner steps since the launch, which the final exchange carries (rebased onto the new global
  // copy). A buffer average that travelled with one is superseded by the final average below.
  while (!pending_.empty()) {
    auto job = pending_.front();
    pending_.pop_front();
    wait_for(job);
    if (job->fragment < 0) continue;
    const auto f = static_cast<size_t>(job->fragment);
    fragments_[f]->commit();
    last_merge_[f] = step_;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++stats_.syncs;
    }
    handled[f] = true;
    if (job->launch_step < step_)
      contribution[f] = fragments_[f]->rebased_contribution(local_of(job->fragment), job->local);
  }
  // 2. The other fragments: inner steps since their last merge, unless it replaced the local copy
  // at this very step (mixing 0). Every rank decides alike (same step counts and schedule).
  for (size_t f = 0; f < F; ++f) {
    if (handled[f]) continue;
    if (last_merge_[f] == step_ && options_.mixing == 0.0) continue;
    contribution[f] = fragments_[f]->contribution(local_of(static_cast<int64_t>(f)));
  }
  // 3. One outer step per such fragment, all queued at once, in fragment order on every rank.
  std::vector<std::shared_ptr<Job>> jobs;
  for (size_t f = 0; f < F; ++f) {
    if (contribution[f].empty()) continue;
    auto job = std::make_shared<Job>();
    job->fragment = static_cast<int64_t>(f);
    job->launch_step = job->merge_step = step_;
    job->values = std::move(contribution[f]);
    jobs.push_back(job);
  }
  if (buffer_numel_ > 0) {
    auto job = std::make_shared<Job>();
    job->launch_step = job->merge_step = step_;
    job->buffers.resize(buffer_numel_);
    for (const Tensor* t : buffers_)
      if (t->numel) std::memcpy(job->buffers.data() + t->offset, t->data, 4 * t->numel);
    jobs.push_back(job);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& job : jobs)
      queue_.push_back(job);
  }
  cv_.notify_all();
  // Launched and not merged, like any other exchange (a failure's rollback waits for them).
  pending_.assign(jobs.begin(), jobs.end());
  int exchanged = 0;
  while (!pending_.empty()) {
    auto job = pending_.front();
    pending_.pop_front();
    wait_for(job);
    if (job->fragment >= 0) {
      const auto f = static_cast<size_t>(job->fragment);
      fragments_[f]->commit();
      last_merge_[f] = step_;
      ++exchanged;
      std::lock_guard<std::mutex> lock(mutex_);
      ++stats_.syncs;
    }
    for (Tensor* t : buffers_)
      if (!job->buffers.empty() && t->numel)
        std::memcpy(t->data, job->buffers.data() + t->offset, 4 * t->numel);
  }
  // 4. Every rank holds the global model.
  for (auto& t : tensors_) {
    if (t.is_buffer || t.numel == 0) continue;
    const auto& g = fragments_[static_cast<size_t>(t.fragment)]->global();
    std::memcpy(t.data, g.data() + t.offset, 4 * t.numel);
  }
  return exchanged;
}

}  // namespace gradex::outer
