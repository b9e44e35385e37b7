// GRADEX_DELAY=auto's rule (sync/delay/delay_rule.h) as pure functions: the D it takes from an
// agreed measurement, and the steps its lanes get to connect in the background.
#include "sync/delay/delay_rule.h"

#include <gtest/gtest.h>

#include <vector>

#include "base/config.h"

namespace gradex::sync::delay {
namespace {

using config::Config;
using config::Source;

DelayRule auto_rule() {
  return DelayRule(Config::from_strings({"GRADEX_DELAY=auto"}, Source::kEnvironment));
}

TEST(DelayRule, TakesTheLeastDelayThatHidesTheWaitWithinItsCap) {
  DelayRule hidden = auto_rule();
  hidden.decide(0.001f, 0.1f, "");
  EXPECT_EQ(hidden.delay(), 0);  // 1% exposed: hidden already
  DelayRule one = auto_rule();
  one.decide(0.08f, 0.1f, "");
  EXPECT_EQ(one.delay(), 1);
  DelayRule beyond = auto_rule();
  beyond.decide(0.15f, 0.1f, "");
  EXPECT_EQ(kAutoMaxDelay, 2);
  EXPECT_EQ(beyond.delay(), 2);           // 1 + ceil(1.5) = 3 would hide it; auto stops at 2
  EXPECT_EQ(beyond.diloco_period(), 3u);  // (0.15 + 0.1) / 0.1 steps, rounded up
  DelayRule capped = auto_rule();
  capped.decide(0.9f, 0.1f, "");
  EXPECT_EQ(capped.delay(), kAutoMaxDelay);
  EXPECT_EQ(capped.diloco_period(), 10u);  // (0.9 + 0.1) / 0.1 steps
  EXPECT_NE(capped.why().find("gx.DiLoCo"), std::string::npos) << capped.why();
}

// The window auto measures: steps 5..10 by default, decided where it closes; on a path the start
// measured as long, steps 2..4, chosen before the first step ends (later it changes nothing), their
// agreement travelling during step 5, whose end decides. The measurement is the window's own: its
// exposed seconds and the rest of its wall time, per step.
TEST(DelayRule, OnALongPathTheWindowIsShorterAndEarlier) {
  auto decides_at = [](DelayRule& rule, std::vector<float>* measured) {
    for (uint64_t step = 1; step <= 20; ++step) {
      // 0.1 s exposed and 0.3 s of wall time a step: 0.2 s of compute.
      const double t = 0.3 * static_cast<double>(step);
      if (rule.observe(0.1 * static_cast<double>(step), t)) {
        float m[2];
        rule.measurement(m);
        measured->assign(m, m + 2);
        return step;
      }
    }
    return uint64_t{0};
  };
  std::vector<float> m;
  DelayRule usual = auto_rule();
  EXPECT_EQ(usual.decision_step(), DelayRule::kDecisionStep);
  EXPECT_FALSE(usual.agrees_ahead());
  EXPECT_EQ(decides_at(usual, &m), 10u);
  EXPECT_TRUE(usual.at_decision());
  EXPECT_NEAR(m[0], 0.1, 1e-6);
  EXPECT_NEAR(m[1], 0.2, 1e-6);
  DelayRule long_path = auto_rule();
  long_path.measure_early();
  EXPECT_TRUE(long_path.agrees_ahead());
  EXPECT_EQ(long_path.window_end_step(), 4u);
  EXPECT_EQ(long_path.decision_step(), 5u);
  EXPECT_NE(long_path.why().find("measuring steps 2..4, deciding at step 5"), std::string::npos)
      << long_path.why();
  EXPECT_EQ(decides_at(long_path, &m), 4u);
  EXPECT_FALSE(long_path.at_decision());
  long_path.observe(0.5, 1.5);
  EXPECT_TRUE(long_path.at_decision());
  EXPECT_NEAR(m[0], 0.1, 1e-6);
  EXPECT_NEAR(m[1], 0.2, 1e-6);
  DelayRule late = auto_rule();
  late.observe(0.1, 0.3);
  late.measure_early();  // after a step: the usual window stays (every rank calls it alike)
  EXPECT_EQ(late.decision_step(), DelayRule::kDecisionStep);
}

TEST(DelayRule, HeldLanesKeepOneExchangeInFlightAndHeldDelayKeepsNone) {
  DelayRule lanes_held = auto_rule();
  lanes_held.decide(0.5f, 0.1f, "", "overlap round trips, not bytes or CPU");
  EXPECT_EQ(lanes_held.delay(), 1);
  EXPECT_NE(lanes_held.why().find("overlap round trips"), std::string::npos) << lanes_held.why();
  DelayRule held = auto_rule();
  held.decide(0.5f, 0.1f, "CUDA tensors");
  EXPECT_EQ(held.delay(), 0);
}

TEST(DelayRule, AnOptimizerWithItsOwnMomentsKeepsZeroAndAFixedDelayIsHonoured) {
  // The correction telescopes through SGD's linear update only: under an Adam-family or an
  // own-update optimizer auto keeps 0 whatever the measurement, and starts no early lanes.
  for (const char* family : {"adam", "other"}) {
    DelayRule rule(Config::from_strings(
        {"GRADEX_DELAY=auto", std::string("GRADEX_OPTIMIZER=") + family}, Source::kEnvironment));
    EXPECT_FALSE(rule.may_delay()) << family;
    rule.decide(0.5f, 0.1f, "");
    EXPECT_EQ(rule.delay(), 0) << family;
    EXPECT_NE(rule.why().find(std::string("GRADEX_OPTIMIZER=") + family), std::string::npos)
        << rule.why();
  }
  for (const char* family : {"sgd", "unknown"}) {
    DelayRule rule(Config::from_strings(
        {"GRADEX_DELAY=auto", std::string("GRADEX_OPTIMIZER=") + family}, Source::kEnvironment));
    EXPECT_TRUE(rule.may_delay()) << family;
    rule.decide(0.5f, 0.1f, "");
    EXPECT_EQ(rule.delay(), kAutoMaxDelay) << family;
  }
  const DelayRule fixed(
      Config::from_strings({"GRADEX_DELAY=2", "GRADEX_OPTIMIZER=adam"}, Source::kEnvironment));
  EXPECT_EQ(fixed.delay(), 2);  // the user's setting, with a warning
}

TEST(DelayRule, OverlappedStepIsTheLongerOfWaitAndCompute) {
  DelayRule rule = auto_rule();
  EXPECT_EQ(rule.overlapped_step_s(), 0.0);
  rule.decide(0.3f, 0.05f, "");
  EXPECT_NEAR(rule.overlapped_step_s(), 0.3, 1e-6);
}

TEST(DelayRule, LanesConnectOverTheStepsTheirRoundTripsTake) {
  // 4 lanes x 16 round trips x 50 ms = 3.2 s over 0.3 s steps: 11 steps (10.7 rounded up).
  EXPECT_EQ(lane_steps_left(4, 0.05, 0.0, 0.3), 11u);
  // After 2.1 s of undelayed steps, 1.1 s are left: 4 steps (3.7 rounded up).
  EXPECT_EQ(lane_steps_left(4, 0.05, 2.1, 0.3), 4u);
  // 25 ms one way, 2 lanes (1.6 s), 8 undelayed steps of 151 ms had (1.208 s): 0.392 s left at
  // 101.7 ms a step, 4 steps (the race's tfm task, where counting every step at D = 1's pace gave
  // 16 after the early lanes' step).
  EXPECT_EQ(lane_steps_left(2, 0.05, 8 * 0.151, 0.1017), 4u);
  // Had their estimate already, or a round trip not probed: none left.
  EXPECT_EQ(lane_steps_left(2, 0.05, 1.6, 0.3), 0u);
  EXPECT_EQ(lane_steps_left(4, 0.0, 0.0, 0.3), 0u);
  // Time left but no step time (nothing measured), or a huge ratio: the most.
  EXPECT_EQ(lane_steps_left(4, 0.05, 0.0, 0.0), 500u);
  EXPECT_EQ(lane_steps_left(8, 1.0, 0.0, 1e-6), 500u);
}

}  // namespace
}  // namespace gradex::sync::delay
