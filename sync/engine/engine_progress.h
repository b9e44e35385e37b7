// The engine's progress loop: the background thread that negotiates readiness across ranks
// (sync/negotiation/negotiator.h) and hands what became ready to the executor
// (sync/engine/engine_executor.h). It runs a negotiation round only when this rank has something to
// announce (a submission, its leaving) or to decide (rank 0's deadlines:
// Negotiator::next_decision), and otherwise sleeps until one of those or until another rank starts
// a round, which it then joins (Communicator::wait_for_next_collective): an idle engine costs no
// CPU. Internal to the engine's source files.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "sync/engine/engine.h"
#include "sync/engine/wake_event.h"
#include "sync/negotiation/negotiator.h"
#include "sync/negotiation/submission_timeline.h"

namespace gradex::sync {

class Engine::ProgressLoop {
 public:
  explicit ProgressLoop(Engine& engine) : engine_(engine) {}

  // With the engine's mutex held: `a` goes out in the next round (the thread is woken).
  void announce(Announcement a);
  // With the engine's mutex held: a gradient's submission time (coalescing's timeline).
  void on_submit(const std::string& key, std::chrono::steady_clock::time_point now) {
    timeline_.on_submit(key, now);
  }
  // With the engine's mutex held: drops what was queued for announcement (every handle failed).
  void drop_announcements() { to_announce_.clear(); }

  void start();  // the thread, on the membership's negotiator (set_negotiator)
  // With the engine's mutex held: the thread leaves once every rank has; false when it is not
  // running.
  bool leave();
  bool leaving() const { return leaving_; }
  void wake() { wake_.signal(); }
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  bool running() const { return thread_.joinable(); }
  void set_negotiator(std::unique_ptr<Negotiator> negotiator) {
    negotiator_ = std::move(negotiator);
  }
  std::thread::id thread_id() const { return progress_thread_; }

 private:
  void run();
  // Moves what enqueue() queued into `announce` (appending) and reads leaving_.
  void take_announcements(std::vector<Announcement>& announce, bool& leaving);
  // Removes announcements whose handle was answered before they went out (and all but the newest
  // of a key's), and marks parameter averages with this rank's LocalSGD anchor presence.
  void finalize_announcements(std::vector<Announcement>& announce);
  // On a latency-bound link (the agreed link model) every negotiation round costs a round trip:
  // submissions arriving together (a framework handing over a step's tensors one call after
  // another) join the round of the first, the thread waiting while new ones keep coming (a quiet
  // kCoalesceQuiet ends it), at most kCoalesceLatencyShare of the latency and kCoalesceMaxS.
  // Beyond that it also waits for the groups that the previous step says come soon
  // (SubmissionTimeline: the keys submitted there within kCoalesceExpectLatencies message
  // latencies of the step's first submission), at most that long after this step's first (the
  // auto policy's timeline plans with the same grouping: coalesce_ready_times). Elsewhere a round
  // starts at once.
  void coalesce_submissions(std::vector<Announcement>& announce, bool& leaving);
  static constexpr double kCoalesceMaxS = 2e-3;
  static constexpr double kCoalesceLatencyShare = 0.1;
  static constexpr std::chrono::microseconds kCoalesceQuiet{250};
  // On a latency-bound link a rank that joins another rank's round with nothing to announce sends
  // that round nothing it can use: while this rank has announced nothing that still waits for the
  // others, no key can become ready in it without this rank's announcement. Its own submissions,
  // arriving a little later, then need a round of their own, a latency or two more for every rank
  // (across 4 emulated hosts 25 ms apart the delayed exchange's lanes ran 2.1 rounds a step, the
  // ranks reaching a step's end up to ~100 ms apart). So such a rank, while it takes part in the
  // exchanges (it announced in one of its last kLingerRecentRounds rounds), waits for its own
  // submissions before it joins: at most kLingerLatencies latencies (kLingerMaxS), ending at once
  // when they come or it leaves. What the wait can delay is only a round that readies nothing (a
  // mismatch's or an abort's verdict, by at most that long). A new engine counts as taking part
  // from its first round, which is its first exchange: a lane of the delayed exchange whose rank
  // ended the step 6 ms after the others' first round reached it ran its first exchange in two
  // rounds, ~50 ms more at 25 ms one way, when lanes took over.
  void linger_for_own(std::vector<Announcement>& announce, bool& leaving);
  // The timeline shows a wait of the progress thread's (for more submissions, for its own) as a
  // phase of its row, from `from` to now, when it lasted more than 20 us.
  void trace_wait(const char* name, std::chrono::steady_clock::time_point from, size_t announced);
  static constexpr double kLingerLatencies = 8;
  static constexpr double kLingerMaxS = 0.5;
  static constexpr uint64_t kLingerRecentRounds = 4;
  uint64_t rounds_since_own_ = 0;  // progress thread
  // One round (all ranks in lockstep) and the execution of what became ready; `all_left` when
  // every rank left in this round with nothing outstanding.
  void run_round(std::vector<Announcement>& announce, bool leaving, bool& all_left);
  // Called before each passive wait for another rank's round. While this rank has work in flight
  // (announced, waiting for the others) and no round has started for the communicator's timeout,
  // it probes its peers: a TimeoutError naming those that do not answer (stopped, hung, dead or cut
  // off: the peers that would abort its work cannot reach it, rank 0 among them); when all answer
  // (slow, not silent), it waits another timeout. Without it such a rank waited for ever: nothing
  // of its own was in a collective, so nothing timed out (a host cut off from the others found out
  // only when UCX gave its endpoints up, 20.7 s after a 10 s timeout).
  void check_passive_wait(std::chrono::steady_clock::time_point now);
  std::chrono::steady_clock::time_point passive_since_ =
      std::chrono::steady_clock::time_point::max();  // progress thread

  Engine& engine_;
  std::unique_ptr<Negotiator> negotiator_;  // the membership's (refers to its communicator)
  std::vector<Announcement> to_announce_;   // engine mutex
  SubmissionTimeline timeline_;  // this rank's gradient submissions (coalesce_submissions)
  // Wakes the thread (enqueue, shutdown): it sleeps on this fd and the transport's events.
  WakeEvent wake_;
  bool leaving_ = false;  // engine mutex
  std::thread thread_;
  std::thread::id progress_thread_;  // set by run() before its first round
  uint64_t trace_rounds_ = 0;        // negotiation rounds so far, for the timeline
};

}  // namespace gradex::sync
