// DelayLine's lane sets (sync/delay/delay_line.h): when lanes can run, making them, auto's lanes
// connecting ahead of its decision or after it, and their take-over.
#include <algorithm>
#include <chrono>

#include "base/log.h"
#include "sync/delay/delay_line.h"
#include "sync/engine/engine.h"

namespace gradex::sync::delay {

std::string DelayLine::lanes_held() const {
  if (!make_lane_) return "this engine cannot make (no lane factory: a C++ engine)";
  if (reconfigured_) return "the membership changed since the start (the lanes' store is gone)";
  if (has_cuda_) return "takes host tensors only (CUDA tensors are registered)";
  if (settings_.momentum > 0 && engine_.options().clip_norm > 0)
    return "applies gradex's momentum before the engines clip (GRADEX_CLIP_NORM with "
           "GRADEX_MOMENTUM > 0)";
  return "";
}

void DelayLine::make_lanes(int d, bool take_state) {
  lanes_.active =
      std::make_unique<DelayLanes>(make_lane_, engine_, d, lanes_.sets_made++ * kMaxDelay);
  install_lanes(take_state);
}

void DelayLine::start_pending_lanes(int d, uint64_t from) {
  lanes_.pending = std::make_unique<DelayLanes>(
      make_lane_, engine_, d, lanes_.sets_made++ * kMaxDelay, DelayLanes::Start::kBackground);
  lanes_.pending_from = from;
  if (engine_.rank() == 0) {
    GX_LOG(kInfo) << "delay: D=" << d << "'s lanes connect in the background; D=1 until step "
                  << from;
  }
}

namespace {
// The end_step count from which auto's lanes may connect ahead of its decision: the first. The
// link's question waits for the engine to be idle, here for the first exchange (it carries the
// start-up link probe, whose result every rank adopts), which the framework waits for anyway
// before its optimizer step. On a WAN the step's head start counts: at 25 ms one way the lanes
// took 1.5 s, about as long as the steps before the decision, and starting a step later they
// missed it by a step or two.
constexpr uint64_t kEarlyLanesStep = 1;
}  // namespace

void DelayLine::maybe_start_early_lanes() {
  // Asked once per process (the link's question waits for the engine to be idle): at the first
  // end_step, or at the first one of a run resumed later, before the decision. The link test is
  // the decision's own (an unknown link does not hold lanes).
  if (lanes_.early_checked || steps_ended_ < kEarlyLanesStep) return;
  lanes_.early_checked = true;
  if (!may_start_early_lanes() || settings_.test_lanes_late) return;
  if (!settings_.test_lanes && engine_.link_latency_bound() == 0) return;
  start_early_lanes("the agreed link is latency-bound");
}

bool DelayLine::may_start_early_lanes() const {
  return !lanes_.early && !lanes_.pending && !lanes_.active && rule_.may_delay() &&
         lanes_held().empty();
}

void DelayLine::start_early_lanes(const char* because) {
  lanes_.early =
      std::make_unique<DelayLanes>(make_lane_, engine_, kAutoMaxDelay,
                                   lanes_.sets_made++ * kMaxDelay, DelayLanes::Start::kBackground);
  if (engine_.rank() == 0) {
    GX_LOG(kInfo) << "delay: " << because << ": " << kAutoMaxDelay
                  << " lanes connect in the background while auto measures (a decision for "
                     "D >= 2 takes them over)";
  }
}

void DelayLine::maybe_start_lanes_before_probe() {
  // Asked once, at the first registration of the process: its engine is idle, and the round trips
  // of its start (the regions' discovery) are known on every rank. At 25 ms one way the lanes,
  // started after the first exchange, connected about a step after auto's decision, and the
  // agreed estimate then kept D = 1 for 5-7 more steps (15-17 at 75 ms); started here they
  // connect during the first exchanges and the steps auto measures.
  if (lanes_.before_probe_checked) return;
  lanes_.before_probe_checked = true;
  // The link is agreed already where the start probed it (a long path: Engine::connect), else
  // the start's round trips tell.
  const int agreed = engine_.link_latency_bound();
  const bool long_start = engine_.start_latency_bound() == 1 || settings_.test_lanes_long;
  if (long_start && rule_.may_delay()) rule_.measure_early();
  if (!may_start_early_lanes() || settings_.test_lanes_late) return;
  // GRADEX_TEST_DELAY_LANES stands in for a link whose start said latency-bound.
  if (!settings_.test_lanes && !(agreed == 1 || (agreed == -1 && long_start))) return;
  start_early_lanes(agreed == 1
                        ? "the link the start probed is latency-bound"
                        : "the start's round trips say latency-bound, before the link probe");
}

void DelayLine::settle_lanes_at_decision(bool early_lanes_ready) {
  // The step by which lanes started at kEarlyLanesStep have connected, from agreed numbers only:
  // the same on every rank and in a run resumed from a checkpoint (whose lanes may have started
  // later, or only now when it resumed after the early lanes' step: it waits for them there
  // rather than take over at another step). Where the agreed measurement says every rank's have
  // connected already, the next step (across a WAN the estimate left ~20 steps at D = 1 after
  // the lanes had connected, at 25 and 75 ms one way), and they take it at once, with no step at
  // D = 1 between (at 25 ms one way such a step took 0.2 s on the held-out cnn task, 0.1 s on the
  // lanes). Else the lanes have had the undelayed steps since they started (the measured step
  // without delay), and the rest of their estimate runs at D = 1's step (counting it all at D =
  // 1's step took over at step 18 at 25 ms one way, where the lanes had connected by step 11).
  const bool connected = settings_.test_lanes || early_lanes_ready;
  const double had_s = static_cast<double>(steps_ended_ - std::min(steps_ended_, kEarlyLanesStep)) *
                       rule_.undelayed_step_s();
  const uint64_t from = steps_ended_ + 1 +
                        (connected ? 0
                                   : lane_steps_left(kAutoMaxDelay, engine_.link_round_trip_s(),
                                                     had_s, rule_.overlapped_step_s()));
  if (rule_.delay() >= 2) {
    if (lanes_.early) {
      lanes_.pending = std::move(lanes_.early);
      lanes_.pending_from = from;
      if (connected) take_pending_lanes();
    } else {
      start_pending_lanes(rule_.delay(), from);
    }
    return;
  }
  if (lanes_.early) lanes_.early_close_at = from;
}

void DelayLine::close_early_lanes() {
  try {
    lanes_.early->wait_ready();
  } catch (const std::exception& e) {
    // Lanes no step needs: their failure stops nothing (a lost peer stops the delayed engine).
    GX_LOG(kWarn) << "delay: lanes connected ahead of the decision and not needed failed to "
                     "connect: "
                  << e.what();
  }
  lanes_.early.reset();
}

void DelayLine::take_pending_lanes() {
  std::unique_ptr<DelayLanes> lanes = std::move(lanes_.pending);
  lanes_.pending_from = 0;
  const auto waited_from = std::chrono::steady_clock::now();
  lanes->wait_ready();
  lanes->keep_first(rule_.delay());
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - waited_from).count();
  if (engine_.rank() == 0) {
    GX_LOG(kInfo) << "delay: " << lanes->count() << " lanes take over at step " << steps_ended_
                  << " (connected in " << lanes->connect_seconds() * 1e3 << " ms; the step waited "
                  << waited * 1e3 << " ms for them)";
  }
  lanes_.active = std::move(lanes);
  install_lanes(true);
}

void DelayLine::install_lanes(bool take_state) {
  for (auto& [key, l] : lines_) {
    std::lock_guard<std::mutex> line_lock(l->mutex);
    lanes_.active->register_tensor(key, l->numel, l->dtype, l->rows);
    if (!take_state) continue;
    // The momentum continues here: the one of the steps with one exchange in flight (the same
    // recursion as the engine's, which does not mask what DGC sent), or else the undelayed
    // engine's. The residual is gradient not applied yet.
    if (settings_.momentum > 0 && l->momentum.size() != l->numel)
      l->momentum = engine_.momentum_of(key);
    l->carry = engine_.residual_of(key);
  }
}

}  // namespace gradex::sync::delay
