// When this rank's gradient submissions of a step arrive, so that a negotiation round on a
// latency-bound link can wait for the rest of a step it expects
// (Engine::ProgressLoop::coalesce_submissions).
//
// A framework hands a step's gradients over in groups (DDP's buckets, each after the part of the
// backward pass that produced it). Where every negotiation round and every unit costs a message
// latency of 5 ms or more, a group that starts its own round costs the step one more round trip
// (its negotiation, then its unit's latencies) than waiting for it would. A step begins with the
// submission of a key already submitted in the current one (as cost::CostModel::on_submit
// counts steps); each key remembers its offset from its step's first submission. What the rank
// expects is what came early in the previous step: the keys submitted there within the window
// of that step's first submission and not yet submitted in this one. Keys that came later, or
// never, are not waited for, and nothing is waited for past the window, so a round waits at most
// one window per step, and only while the previous step says the rest is near.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace gradex::sync {

// The window, in message latencies of the agreed link: a round waits for what the previous step
// submitted within this much of its first submission. A group left to a round of its own holds
// the link for its negotiation and its unit, at least two latencies, so the next group's round
// starts no sooner than that: waiting for a group that comes within two latencies never ends
// the step later.
constexpr double kCoalesceExpectLatencies = 2.0;

// The ready times the cost model's timeline should plan a latency-bound step with
// (sync/policy/codec_choice.h): the submissions within `window_s` of the earliest travel in its
// negotiation round and unit (Engine::ProgressLoop::coalesce_submissions), so they become ready
// together, at the last of them; later ones keep their times. Relative order is kept for the rest.
void coalesce_ready_times(std::vector<double>& ready_s, double window_s);

class SubmissionTimeline {
 public:
  using Clock = std::chrono::steady_clock;

  // A gradient submission of `key` at `at` (non-decreasing over calls).
  void on_submit(const std::string& key, Clock::time_point at);
  // Whether `now` lies within `window` of this step's first submission and some key submitted
  // in the previous step within `window` of its first submission has not been submitted in this
  // one yet.
  bool expects_more(Clock::duration window, Clock::time_point now) const;
  // Steps begun so far (0 before the first submission).
  uint64_t steps() const { return step_; }

 private:
  struct Seen {
    uint64_t step = 0;         // the step of its last submission
    Clock::duration offset{};  // from that step's first submission
  };
  std::unordered_map<std::string, Seen> keys_;
  uint64_t step_ = 0;
  Clock::time_point step_start_{};
};

}  // namespace gradex::sync
