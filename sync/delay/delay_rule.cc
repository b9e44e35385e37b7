#include "sync/delay/delay_rule.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <sstream>

#include "base/error.h"
#include "base/log.h"

namespace gradex::sync::delay {

DelaySetting delay_setting(const config::Config& config) {
  const std::string& text = config.get_string("GRADEX_DELAY");
  DelaySetting s;
  if (text == "auto")
    s.automatic = true;
  else
    s.fixed = static_cast<int>(config::parse_int_strict(text, "GRADEX_DELAY"));
  return s;
}

void check_delay_composes(const config::Config& config) {
  const DelaySetting s = delay_setting(config);
  if (s.fixed > 0 && config.get_int("GRADEX_LOCALSGD_PERIOD") > 0)
    throw ConfigError("GRADEX_DELAY=" + std::to_string(s.fixed) +
                      " does not compose with LocalSGD (GRADEX_LOCALSGD_PERIOD=" +
                      std::to_string(config.get_int("GRADEX_LOCALSGD_PERIOD")) +
                      "): its local steps exchange no gradient to delay and its parameter averages "
                      "would mix with averages still in flight; set GRADEX_DELAY=0 or auto");
  if (s.fixed >= 2 && config.get_float("GRADEX_MOMENTUM") > 0 &&
      config.get_float("GRADEX_CLIP_NORM") > 0)
    throw ConfigError(
        "GRADEX_DELAY=" + std::to_string(s.fixed) +
        " applies gradex's momentum (GRADEX_MOMENTUM=" + config.canonical_text("GRADEX_MOMENTUM") +
        ") before its lanes exchange, so the engines cannot clip the gradient first "
        "(GRADEX_CLIP_NORM=" +
        config.canonical_text("GRADEX_CLIP_NORM") + "); set GRADEX_DELAY=1 or auto");
}

void refuse_under_outer(const config::Config& config) {
  const DelaySetting s = delay_setting(config);
  if (s.fixed > 0)
    throw ConfigError("GRADEX_DELAY=" + std::to_string(s.fixed) +
                      " does not compose with DiLoCo (gx.DiLoCo, gradex_outer_create): its inner "
                      "steps exchange no gradient and its outer synchronizations keep their own "
                      "period (GRADEX_OUTER_PERIOD); set GRADEX_DELAY=0 or auto");
}

uint64_t lane_steps_left(int lanes, double round_trip_s, double had_s, double step_s) {
  constexpr uint64_t kMost = 500;
  const double left_s = lanes * kLaneStartRoundTrips * round_trip_s - had_s;
  if (!(left_s > 0)) return 0;
  if (step_s <= 0) return kMost;
  const double steps = std::ceil(left_s / step_s);
  return steps < static_cast<double>(kMost) ? static_cast<uint64_t>(steps) : kMost;
}

namespace {

// Why auto keeps D = 0 for the agreed optimizer family (DelayRule::optimizer_held_).
std::string nonlinear_optimizer(const config::Config& config) {
  const std::string& family = config.get_string("GRADEX_OPTIMIZER");
  if (family == "adam")
    return "the optimizer keeps its own moments (GRADEX_OPTIMIZER=adam): the correction "
           "g_t + avg_{t-D} - g_{t-D} does not carry through its per-coordinate scaling, so the "
           "ranks' models drift apart (AdamW on loopback, D=1 from the first step: held-out cnn "
           "0.642 against DDP's 0.689, tfm 0.605 against 0.626)";
  if (family == "other")
    return "the optimizer builds its own update (GRADEX_OPTIMIZER=other: Muon's orthogonalised "
           "momentum, a preconditioner, Adagrad's scaling): the correction g_t + avg_{t-D} - "
           "g_{t-D} carries through SGD's linear update only, so the ranks' models would drift "
           "apart";
  return "";
}

}  // namespace

DelayRule::DelayRule(const config::Config& config) {
  const DelaySetting s = delay_setting(config);
  automatic_ = s.automatic;
  delay_ = s.fixed;
  decided_ = !s.automatic;
  localsgd_ = config.get_int("GRADEX_LOCALSGD_PERIOD") > 0;
  optimizer_held_ = nonlinear_optimizer(config);
  if (!automatic_ && delay_ > 0 && !optimizer_held_.empty()) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      GX_LOG(kWarn) << "GRADEX_DELAY=" << delay_ << " as set, though " << optimizer_held_
                    << "; GRADEX_DELAY=auto keeps 0 for it, and gx.DiLoCo hides the exchange "
                       "with the optimizer inside";
    }
  }
}

void DelayRule::measure_early() {
  if (steps_ != 0) return;
  skip_steps_ = kLongPathSkipSteps;
  window_steps_ = kLongPathWindowSteps;
  agree_ahead_ = true;
}

bool DelayRule::observe(double exposed_total_s, double now_s) {
  ++steps_;
  if (decided_) return false;
  if (steps_ == skip_steps_) {
    exposed_at_start_ = exposed_total_s;
    window_start_s_ = now_s;
  }
  if (steps_ != window_end_step()) return false;
  exposed_at_end_ = exposed_total_s;
  wall_s_ = now_s - window_start_s_;
  return true;
}

void DelayRule::restart_window() {
  if (!automatic_ || decided_) return;
  if (steps_ >= skip_steps_) steps_ = skip_steps_ - 1;
}

void DelayRule::measurement(float out[2]) const {
  const double n = static_cast<double>(window_steps_);
  const double exposed = (exposed_at_end_ - exposed_at_start_) / n;
  out[0] = static_cast<float>(exposed);
  out[1] = static_cast<float>(std::max(0.0, wall_s_ / n - exposed));
}

namespace {

// The D that hides `exposed` seconds of exchange behind `compute` seconds a step, uncapped.
int hiding_delay(double exposed_s, double compute_s) {
  if (exposed_s <= compute_s) return 1;
  if (compute_s <= 0) return kMaxDelay + 1;
  return 1 + static_cast<int>(std::min<double>(kMaxDelay, std::ceil(exposed_s / compute_s)));
}

}  // namespace

void DelayRule::decide(float exposed_s, float compute_s, const std::string& held,
                       const std::string& lanes_held) {
  decided_ = true;
  exposed_ = exposed_s;
  compute_ = compute_s;
  held_ = localsgd_                  ? "LocalSGD exchanges no gradient in its local phase"
          : !optimizer_held_.empty() ? optimizer_held_
                                     : held;
  lanes_held_ = lanes_held;
  const bool hidden = exposed_s <= kHiddenShare * compute_s;
  const int needed = hiding_delay(exposed_s, compute_s);
  if (hidden || !held_.empty())
    delay_ = 0;
  else
    delay_ = lanes_held_.empty() ? std::min(needed, kAutoMaxDelay) : 1;
  diloco_period_ = 0;
  if (delay_ > 0 && needed > delay_) {
    diloco_period_ = static_cast<uint64_t>(std::ceil((exposed_s + compute_s) / compute_s));
    GX_LOG(kWarn) << "GRADEX_DELAY=auto: the exchange (>= " << exposed_s * 1e3
                  << " ms a step) needs D=" << needed << " to hide behind " << compute_s * 1e3
                  << " ms of compute a step; D=" << delay_ << " overlaps part of it ("
                  << (lanes_held_.empty()
                          ? "auto's largest D: more staleness costs some models accuracy; "
                            "GRADEX_DELAY=" +
                                std::to_string(std::min(needed, kMaxDelay)) + " would set it"
                          : "one exchange in flight: several " + lanes_held_)
                  << "). gx.DiLoCo with GRADEX_OUTER_PERIOD >= " << diloco_period_
                  << " would hide it; the optimizer is left as it is";
  }
  GX_LOG(kInfo) << why();
}

double DelayRule::overlapped_step_s() const {
  return decided_ ? std::max(static_cast<double>(exposed_), static_cast<double>(compute_)) : 0.0;
}

double DelayRule::undelayed_step_s() const {
  return decided_ ? static_cast<double>(exposed_) + static_cast<double>(compute_) : 0.0;
}

std::string DelayRule::why() const {
  std::ostringstream o;
  o << "delay: D=" << delay_;
  if (!automatic_) {
    o << " (GRADEX_DELAY=" << delay_ << ")";
    return o.str();
  }
  if (!decided_) {
    o << " (GRADEX_DELAY=auto: measuring steps " << skip_steps_ << ".." << window_end_step();
    if (agree_ahead_) o << ", deciding at step " << decision_step();
    o << ", none delayed until then)";
    return o.str();
  }
  o.setf(std::ios::fixed);
  o.precision(1);
  o << " (GRADEX_DELAY=auto: the framework waited " << exposed_ * 1e3 << " ms a step on "
    << compute_ * 1e3 << " ms of compute, agreed over ranks; ";
  if (!held_.empty())
    o << "kept at 0: " << held_ << ")";
  else if (delay_ == 0)
    o << "it hides (<= " << static_cast<int>(kHiddenShare * 100) << "% exposed))";
  else if (diloco_period_ > 0)
    o << "D=" << delay_ << " overlaps " << delay_ << " step(s), not all of it"
      << (lanes_held_.empty() ? "" : " (several exchanges in flight " + lanes_held_ + ")")
      << ": gx.DiLoCo with GRADEX_OUTER_PERIOD >= " << diloco_period_ << " would hide it)";
  else if (delay_ == 1)
    o << "D=1 overlaps it with the next step)";
  else
    o << "D=" << delay_ << " exchanges in flight, each overlapping " << delay_ << " steps)";
  return o.str();
}

DelayRule::Saved DelayRule::saved() const {
  Saved s;
  s.steps = steps_;
  s.delay = delay_;
  s.decided = decided_ ? 1 : 0;
  s.exposed_at_start = exposed_at_start_;
  s.exposed_at_end = exposed_at_end_;
  s.wall_s = wall_s_;
  s.exposed = exposed_;
  s.compute = compute_;
  return s;
}

bool DelayRule::restore(const Saved& s, bool window_agreed) {
  steps_ = s.steps;
  if (!automatic_) return false;  // a fixed setting is the configuration's, not the checkpoint's
  delay_ = s.delay;
  decided_ = s.decided != 0;
  // A window cut by the checkpoint measured another process's clock: it restarts at the next step,
  // the same one on every rank (their step counts agree). One that closed, its measurement agreed
  // (agrees_ahead), stays closed: the next step decides from the agreed values.
  const bool closed = window_agreed && !decided_ && agree_ahead_ && steps_ == window_end_step();
  if (!decided_ && steps_ >= skip_steps_ && !closed) steps_ = skip_steps_ - 1;
  exposed_at_start_ = s.exposed_at_start;
  exposed_at_end_ = s.exposed_at_end;
  wall_s_ = s.wall_s;
  exposed_ = s.exposed;
  compute_ = s.compute;
  if (decided_ && delay_ > 0 && hiding_delay(exposed_, compute_) > delay_)
    diloco_period_ = static_cast<uint64_t>(std::ceil((exposed_ + compute_) / compute_));
  return closed;
}

}  // namespace gradex::sync::delay
