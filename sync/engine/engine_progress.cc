// The engine's progress loop (sync/engine/engine_progress.h): the thread, its negotiation rounds
// and the coalescing of submissions on a latency-bound link.
#include "sync/engine/engine_progress.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

#include "base/log.h"
#include "sync/engine/engine_executor.h"
#include "sync/timeline/recorder.h"
#include "sync/timeline/traced_communicator.h"

namespace gradex::sync {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

void Engine::ProgressLoop::announce(Announcement a) {
  to_announce_.push_back(std::move(a));
  wake_.signal();
}

void Engine::ProgressLoop::start() {
  thread_ = std::thread([this] { run(); });
}

bool Engine::ProgressLoop::leave() {
  leaving_ = true;
  if (!thread_.joinable()) return false;
  wake_.signal();
  return true;
}

void Engine::ProgressLoop::take_announcements(std::vector<Announcement>& announce, bool& leaving) {
  std::lock_guard<std::mutex> lock(engine_.mutex_);
  if (announce.empty()) {
    announce.swap(to_announce_);
  } else {
    announce.insert(announce.end(), to_announce_.begin(), to_announce_.end());
    to_announce_.clear();
  }
  leaving = leaving_;
}

void Engine::ProgressLoop::run() {
  progress_thread_ = std::this_thread::get_id();
  // The longest single sleep: the thread then re-checks its deadlines (and lets the transport
  // progress) about once a second, which costs nothing measurable.
  constexpr auto kMaxSleep = std::chrono::milliseconds(1000);
  auto leave_deadline = Clock::time_point::max();
  bool announced_leaving = false;
  // GRADEX_TEST_FAIL_ROUND: tests make this rank fail on its own before this round.
  const int64_t fail_round = engine_.config_.get_int("GRADEX_TEST_FAIL_ROUND");
  int64_t rounds = 0;
  try {
    for (;;) {
      wake_.drain();  // before looking at the queue: a later enqueue() signals again
      std::vector<Announcement> announce;
      bool leaving = false;
      take_announcements(announce, leaving);
      finalize_announcements(announce);
      const auto now = Clock::now();
      // Others may still be finishing work that rank 0 aborts only after the timeout: wait longer.
      if (leaving && leave_deadline == Clock::time_point::max())
        leave_deadline = now + 2 * engine_.options_.timeout + std::chrono::seconds(5);
      if (leaving && now > leave_deadline) {
        GX_LOG(kWarn) << "leaving without every rank's agreement after twice GRADEX_TIMEOUT_S";
        break;
      }
      // A round of this rank's own: something to announce, its leaving to announce once (the last
      // rank to leave thereby starts the round in which all leave), or a deadline of rank 0's.
      const auto decide_at = negotiator_->next_decision();
      const bool own_round =
          !announce.empty() || (leaving && !announced_leaving) || now >= decide_at;
      if (!own_round) {
        // Nothing to do: sleep until enqueue()/shutdown() signal, a deadline, or another rank
        // starts the next round (its first message arrives), then join that round.
        check_passive_wait(now);
        const auto until = std::min({decide_at, leave_deadline, now + kMaxSleep});
        const auto max_sleep = std::chrono::ceil<std::chrono::milliseconds>(until - now);
        if (!engine_.comm_->wait_for_next_collective(wake_.fd(), max_sleep)) continue;
        take_announcements(announce, leaving);
        finalize_announcements(announce);
        if (announce.empty() && !leaving) {
          const auto linger_from = Clock::now();
          linger_for_own(announce, leaving);
          trace_wait("linger", linger_from, announce.size());
        }
      }
      if (!announce.empty()) {
        const auto coalesce_from = Clock::now();
        coalesce_submissions(announce, leaving);
        trace_wait("coalesce", coalesce_from, announce.size());
      }
      if (++rounds == fail_round)
        throw InternalError("failure injected before negotiation round " + std::to_string(rounds) +
                            " (GRADEX_TEST_FAIL_ROUND)");
      bool all_left = false;
      passive_since_ = Clock::time_point::max();
      run_round(announce, leaving, all_left);
      announced_leaving = leaving;
      if (all_left) break;
    }
  } catch (const Error& e) {
    // Every failure of this thread ends here: the peers learn it at once (Communicator::abort;
    // nothing is sent when the failure came from a peer or was announced by the transport).
    engine_.comm_->abort(e.code(), e.what());
    engine_.fail_everything(e.code(), e.what());
    return;
  } catch (const std::exception& e) {
    const std::string message = std::string("progress thread: ") + e.what();
    engine_.comm_->abort(ErrorCode::kInternal, message);
    engine_.fail_everything(ErrorCode::kInternal, message);
    return;
  }
  std::lock_guard<std::mutex> lock(engine_.mutex_);
  engine_.cv_.notify_all();
}

void Engine::ProgressLoop::check_passive_wait(Clock::time_point now) {
  bool waiting_on_peers = false;
  {
    std::lock_guard<std::mutex> lock(engine_.mutex_);
    waiting_on_peers = !engine_.table_.in_flight.empty();
  }
  if (!waiting_on_peers) {
    passive_since_ = Clock::time_point::max();
    return;
  }
  if (passive_since_ == Clock::time_point::max()) {
    passive_since_ = now;
    return;
  }
  const comm::Millis timeout = engine_.comm_->options().timeout;
  if (now - passive_since_ < timeout) return;
  const std::vector<int> silent = engine_.comm_->unresponsive_peers();
  if (silent.empty()) {
    passive_since_ = Clock::now();  // every peer answered: slow, not gone
    return;
  }
  std::string detail =
      "no round started for " +
      std::to_string(
          std::chrono::duration_cast<std::chrono::seconds>(now - passive_since_).count()) +
      " s with work in flight; ranks not answering a liveness probe (stopped, "
      "hung or dead):";
  for (int r : silent)
    detail += " " + std::to_string(r);
  throw TimeoutError("waiting for the next negotiation round", silent.front(), detail);
}

void Engine::ProgressLoop::coalesce_submissions(std::vector<Announcement>& announce,
                                                bool& leaving) {
  const LinkModel* model = engine_.executor_->link().model();
  if (model == nullptr || !model->latency_bound()) return;
  auto seconds = [](double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  };
  const auto quiet_limit =
      Clock::now() +
      seconds(std::min(kCoalesceMaxS, model->link().alpha_s * kCoalesceLatencyShare));
  const auto window = seconds(model->link().alpha_s * kCoalesceExpectLatencies);
  size_t seen = announce.size();
  while (!leaving) {
    const auto now = Clock::now();
    bool expecting = false;
    {
      std::lock_guard<std::mutex> lock(engine_.mutex_);
      expecting = timeline_.expects_more(window, now);
    }
    if (!expecting && now >= quiet_limit) break;
    std::this_thread::sleep_for(kCoalesceQuiet);
    take_announcements(announce, leaving);
    const bool grew = announce.size() != seen;
    seen = announce.size();
    if (!grew && !expecting) break;
  }
  finalize_announcements(announce);
}

void Engine::ProgressLoop::trace_wait(const char* name, std::chrono::steady_clock::time_point from,
                                      size_t announced) {
  if (engine_.trace_ && Clock::now() - from > std::chrono::microseconds(20))
    engine_.trace_->span(engine_.trace_row(), name, from, Clock::now(),
                         timeline::Args().add("announced", static_cast<uint64_t>(announced)));
}

void Engine::ProgressLoop::linger_for_own(std::vector<Announcement>& announce, bool& leaving) {
  if (rounds_since_own_ > kLingerRecentRounds || negotiator_->own_announcement_pending()) return;
  const LinkModel* model = engine_.executor_->link().model();
  if (model == nullptr || !model->latency_bound()) return;
  const auto until =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                         std::min(kLingerMaxS, model->link().alpha_s * kLingerLatencies)));
  while (announce.empty() && !leaving) {
    const auto now = Clock::now();
    if (now >= until) break;
    wake_.wait(std::chrono::ceil<std::chrono::milliseconds>(until - now));
    wake_.drain();  // before looking at the queue: a later enqueue() signals again
    take_announcements(announce, leaving);
    finalize_announcements(announce);
  }
}

void Engine::ProgressLoop::finalize_announcements(std::vector<Announcement>& announce) {
  // A submission can be answered before it is announced: rank 0's timeout abort of its key, or a
  // mismatch verdict, completes the handle in the round during which it was queued. An aborted
  // key's entry is gone, and announcing it would leave an entry with no handle behind; a
  // mismatched key's entry waits for every rank's announcement, so it is announced all the same
  // (else the entry stays until rank 0's timeout abort, and every rank's shutdown waits that
  // long). Of a key resubmitted since, the newest announcement is the one that counts.
  std::lock_guard<std::mutex> lock(engine_.mutex_);
  std::map<WorkId, size_t> newest;
  for (size_t i = 0; i < announce.size(); ++i)
    newest[announce[i].id] = i;
  std::vector<Announcement> kept;
  kept.reserve(announce.size());
  for (size_t i = 0; i < announce.size(); ++i) {
    Announcement& a = announce[i];
    if (newest[a.id] != i) continue;
    if (!engine_.table_.in_flight.count(a.id) && !negotiator_->awaits_announcement(a.id)) continue;
    // A parameter average's counter says whether this rank holds a LocalSGD anchor (the first
    // average sends full values, later ones deltas): ranks that differ fail as a mismatch.
    if (a.id.kind == WorkKind::kAverage)
      a.step = engine_.table_.tensors.at(a.id.key).anchor.empty() ? 0 : 1;
    kept.push_back(std::move(a));
  }
  announce.swap(kept);
}

void Engine::ProgressLoop::run_round(std::vector<Announcement>& announce, bool leaving,
                                     bool& all_left) {
  const auto inspected_from = Clock::now();
  engine_.executor_->inspect(announce);
  const auto t0 = Clock::now();
  // The scan for NaN/Inf reads every announced gradient once: on a large model, milliseconds.
  if (engine_.trace_ && !announce.empty())
    engine_.trace_->span(engine_.trace_row(), "inspect", inspected_from, t0,
                         timeline::Args().add("announced", static_cast<uint64_t>(announce.size())));
  RoundResult r = negotiator_->round(announce, leaving);
  rounds_since_own_ = announce.empty() ? rounds_since_own_ + 1 : 0;
  if (engine_.trace_) {
    // Every rank runs every round, in the same order: their numbers match across the ranks' files
    // (what `gradex-bench timeline` aligns the clocks on).
    const timeline::Args args = timeline::Args()
                                    .add("round", trace_rounds_)
                                    .add("announced", static_cast<uint64_t>(announce.size()))
                                    .add("ready", static_cast<uint64_t>(r.ready.size()));
    engine_.trace_->span(engine_.trace_row(), "negotiate", t0, Clock::now(), args);
    engine_.traced_comm_->drain("negotiation", timeline::Args().add("round", trace_rounds_));
    ++trace_rounds_;
  }
  if (!r.ready.empty()) {
    GX_LOG(kDebug) << "negotiation round: " << r.ready.size() << " ready in "
                   << std::chrono::duration<double, std::milli>(Clock::now() - t0).count() << " ms";
  }
  {
    std::lock_guard<std::mutex> lock(engine_.mutex_);
    engine_.steps_.stats.control_bytes = negotiator_->control_bytes();
    for (const auto& f : r.failed)
      engine_.table_.complete(f.id, f.code,
                              f.code == ErrorCode::kMismatch
                                  ? engine_.table_.with_own_size(f, engine_.rank_)
                                  : f.message);
    if (!r.failed.empty()) engine_.cv_.notify_all();
  }
  if (!r.ready.empty()) engine_.executor_->execute(r.ready);
  // Leave only when nothing is pending anywhere: every rank reports leaving in the same round, and
  // leaving ranks submit nothing new, so outstanding keys can only be aborted ones (rank 0 starts
  // the round that aborts them at their deadline).
  all_left = r.all_leaving && negotiator_->outstanding() == 0;
}

}  // namespace gradex::sync
