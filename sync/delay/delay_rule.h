// GRADEX_DELAY's setting and the auto rule that picks D from what the engine measures.
//
// auto measures, over the steps [kSkipSteps, kSkipSteps + kWindowSteps) run without delay, what the
// framework waited on gradex per step (Stats::exposed_seconds: from a step's last submission to its
// last completion) and the rest of the step (its compute). The measurement is agreed (averaged over
// ranks by one fp32 parameter average, the same bits on every rank) and the decision taken once
// from the agreed numbers, so every rank takes the same one:
//   exposed <= kHiddenShare * compute  -> D = 0: the exchange hides already (results as without
//                                         delay);
//   exposed <= compute                 -> D = 1: one step of compute overlaps it;
//   otherwise                          -> D = 1 + ceil(exposed / compute), at most kAutoMaxDelay:
//                                         D exchanges in flight (lanes, delay_lanes.h), each with
//                                         D steps of compute to hide behind. The exchange of a
//                                         step takes at most exposed + compute, so D steps hide it.
// Where lanes cannot run (lanes_held), or the agreed link is not latency-bound (several exchanges
// in flight overlap round trips, not bytes or CPU; measured on a 1 Gbit/s LAN: D = 3 was 0.9x of
// D = 0's steps per second), D stays 1; there, where the ranks outnumber their host's cores (the
// auto planner's count, averaged over ranks), D stays 0 (sync/delay/delay_line.cc: one exchange in
// flight only moves its CPU work into the compute; D = 1 ran at 0.91-0.94x of D = 0 on that LAN).
// Where kAutoMaxDelay steps do not hide it, the log says so once and names gx.DiLoCo with the
// period that would (sync period >= 1 + exposed / compute steps).
// Under an optimizer that keeps its own moments or builds its own update (GRADEX_OPTIMIZER adam or
// other, agreed), auto keeps D = 0: the correction telescopes through SGD's linear update only
// (measured with AdamW: 2-5 points of held-out accuracy lost at D = 1-2); a fixed D is honoured
// with a warning.
#pragma once

#include <cstdint>
#include <string>

#include "base/config.h"

namespace gradex::sync::delay {

constexpr int kMaxDelay = 8;
// auto's largest D. Staleness costs accuracy on some models more than on others: with D fixed
// from the first step (loopback, SGD momentum 0.9, seed 0; final accuracy, steps to the target;
// DDP in brackets), the held-out cnn task (BatchNorm convolutions) at D = 1, 2, 3, 4: 0.695, 0.693,
// 0.680, 0.662 (0.699), 110, 110, 110, 140 steps (110); tfm 0.631, 0.628, 0.628, 0.623 (0.634),
// 100, 100, 110, 110 (100); while mlp and short were at DDP's accuracy and steps at every D. D = 2
// keeps every task's steps at DDP's and its accuracy within 0.6 points; a larger D is the user's
// to set (GRADEX_DELAY=3..8), where the log names it as what would hide more of the exchange.
constexpr int kAutoMaxDelay = 2;

// Round trips one lane's connection takes (store keys, wire-up, the start-up agreement), with a
// margin: measured 12.8-14.8 for each of 2 lanes at 50 and 150 ms round trips since endpoints
// connect without blocking (29-30 before). A lane that is later than this holds one step until it
// has connected.
constexpr double kLaneStartRoundTrips = 16;
// Steps of `step_s` seconds (D = 1) that auto's `lanes`, connecting in the background for `had_s`
// seconds already, still take to connect, from the agreed round trip (0: not probed): 0 when they
// have had kLaneStartRoundTrips each, at most 500. Agreed inputs only, so every rank and every
// resumed run switches at the same step.
uint64_t lane_steps_left(int lanes, double round_trip_s, double had_s, double step_s);

struct DelaySetting {
  bool automatic = false;
  int fixed = 0;  // GRADEX_DELAY=1..8 (0 under auto until it decides)
};
DelaySetting delay_setting(const config::Config& config);

// ConfigError naming both variables when GRADEX_DELAY=1..8 is set with a schedule it cannot compose
// with: LocalSGD (GRADEX_LOCALSGD_PERIOD > 0), whose local steps exchange no gradient to delay and
// whose parameter averages would mix with averages in flight. auto there stays at 0.
void check_delay_composes(const config::Config& config);
// ConfigError naming GRADEX_DELAY when 1..8 is set for DiLoCo (gradex_outer_create, gx.DiLoCo): its
// inner steps exchange nothing and its outer steps keep their own schedule. auto is ignored there.
void refuse_under_outer(const config::Config& config);

class DelayRule {
 public:
  // Start-up (probe, calibration, the first plan and its refinement at step 4), then the steps
  // measured. Each step before the decision runs undelayed, on a long path at its slowest (about
  // 1.5 s at 150 ms round trips against 0.4 s delayed): ten steps measured ten steps late cost
  // 15 s there, while five steps of the refined plan give the same D on the race's tasks.
  static constexpr uint64_t kSkipSteps = 5;
  static constexpr uint64_t kWindowSteps = 5;
  // The end_step count at which auto decides (the same on every rank).
  static constexpr uint64_t kDecisionStep = kSkipSteps + kWindowSteps;
  // On a path the start measured as long (measure_early): the link was probed during the start,
  // and every step waits at least a round trip, so D = 0 needs a compute twenty times that; the
  // refinement at step 4 kept every tensor's codec in the race's runs at 25 ms one way, and its
  // steps 3-10 ran within 10 % of each other. Two steps from the third are measured there, their
  // agreement travels while the fifth computes (agrees_ahead), and the fifth's end decides: the
  // lanes take over five steps sooner than on the usual window (cnn: 0.2 s a step undelayed
  // against 0.1 delayed), and no step waits for the agreement's round trips.
  static constexpr uint64_t kLongPathSkipSteps = 2;
  static constexpr uint64_t kLongPathWindowSteps = 2;
  static constexpr double kHiddenShare = 0.05;

  explicit DelayRule(const config::Config& config);

  int delay() const { return delay_; }
  bool automatic() const { return automatic_; }
  bool decided() const { return decided_; }
  // Before the first end_step, where the start's round trips say latency-bound (agreed: the same
  // on every rank): the shorter window above.
  void measure_early();
  // The end_step count that closes the measurement window (observe returns true there).
  uint64_t window_end_step() const { return skip_steps_ + window_steps_; }
  // Whether the window's agreement travels while the next step computes, the decision taken at
  // that step's end (measure_early), rather than at the window's end, waited for there.
  bool agrees_ahead() const { return agree_ahead_; }
  // The end_step count at which auto decides.
  uint64_t decision_step() const { return window_end_step() + (agree_ahead_ ? 1 : 0); }
  // Whether the end_step just observed is the decision's and auto has not decided yet.
  bool at_decision() const { return automatic_ && !decided_ && steps_ == decision_step(); }
  // Whether the decision to come may take D >= 1: auto, undecided, and no setting that keeps 0
  // whatever the measurement says (LocalSGD).
  bool may_delay() const {
    return automatic_ && !decided_ && !localsgd_ && optimizer_held_.empty();
  }
  // Each end_step: the engine's exposed seconds so far and the time now (seconds, any epoch).
  // True when this step closes the measurement window: the caller agrees measurement() over the
  // ranks and calls decide() with the agreed values, on every rank at the same step (under
  // agrees_ahead, at the next end_step, decision_step).
  bool observe(double exposed_total_s, double now_s);
  // Per step over the window: {exposed seconds, compute seconds}.
  void measurement(float out[2]) const;
  // The decision from agreed values; `held` (non-empty): why D must stay 0 whatever they say;
  // `lanes_held` (non-empty): why D must stay at most 1.
  void decide(float exposed_s, float compute_s, const std::string& held,
              const std::string& lanes_held = "");
  // The setting and, once decided, the measured numbers behind it.
  std::string why() const;
  // A step's seconds with one exchange in flight, from the agreed measurement: the longer of
  // the compute and the wait (0 before the decision).
  double overlapped_step_s() const;
  // A step's seconds without delay, from the agreed measurement: compute and wait (0 before the
  // decision).
  double undelayed_step_s() const;
  // No D hides the exchange: the DiLoCo period the log names (0 when D hides it).
  uint64_t diloco_period() const { return diloco_period_; }

  // A new membership (the engine's reconfiguration) while auto is undecided: what the window
  // measured, and its agreement in flight (which the reconfiguration aborts), belong to the old
  // one, so the window restarts at the next step, the same on every rank (they reconfigure at the
  // same point).
  void restart_window();

  // The rule's progress for the line's saved state.
  struct Saved {
    uint64_t steps = 0;
    int32_t delay = 0;
    uint8_t decided = 0;
    double exposed_at_start = 0, exposed_at_end = 0, wall_s = 0;
    float exposed = 0, compute = 0;
  };
  Saved saved() const;
  // `window_agreed`: the state holds the closed window's agreed measurement (agrees_ahead). Returns
  // whether the window stays closed for it: the state closed it at this rule's window end, so the
  // next end_step decides from those values (else a window cut by the checkpoint restarts).
  bool restore(const Saved& s, bool window_agreed = false);

 private:
  bool automatic_ = false;
  bool localsgd_ = false;
  // Why auto keeps D = 0 for the optimizer family (GRADEX_OPTIMIZER adam or other), "" for SGD and
  // unknown: the correction telescopes through a linear update only.
  std::string optimizer_held_;
  int delay_ = 0;
  bool decided_ = false;
  uint64_t steps_ = 0;  // end_step calls seen
  uint64_t skip_steps_ = kSkipSteps, window_steps_ = kWindowSteps;
  bool agree_ahead_ = false;
  double exposed_at_start_ = 0, exposed_at_end_ = 0;
  double window_start_s_ = 0, wall_s_ = 0;
  float exposed_ = 0, compute_ = 0;  // agreed, per step
  std::string held_;
  std::string lanes_held_;
  uint64_t diloco_period_ = 0;
};

}  // namespace gradex::sync::delay
