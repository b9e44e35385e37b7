// SubmissionTimeline (sync/negotiation/submission_timeline.h): what a latency-bound negotiation
// round waits for.
#include "sync/negotiation/submission_timeline.h"

#include <gtest/gtest.h>

namespace gradex::sync {
namespace {

using Clock = SubmissionTimeline::Clock;
using std::chrono::milliseconds;

// Two groups a step, the second 3 ms after the first: from the second step on, the first group's
// round expects the second within a 25 ms window, and no longer once it came or the window passed.
TEST(SubmissionTimeline, ExpectsTheGroupsThatCameWithinTheWindowLastStep) {
  SubmissionTimeline t;
  const auto t0 = Clock::now();
  const auto window = milliseconds(25);
  t.on_submit("a", t0);
  t.on_submit("b", t0);
  EXPECT_FALSE(t.expects_more(window, t0));  // the first step: nothing to go by
  t.on_submit("c", t0 + milliseconds(3));
  const auto t1 = t0 + milliseconds(100);
  t.on_submit("a", t1);  // a key submitted again: the second step begins
  t.on_submit("b", t1);
  EXPECT_EQ(t.steps(), 2u);
  EXPECT_TRUE(t.expects_more(window, t1 + milliseconds(1)));
  EXPECT_FALSE(t.expects_more(window, t1 + milliseconds(25)));  // past the window
  t.on_submit("c", t1 + milliseconds(4));
  EXPECT_FALSE(t.expects_more(window, t1 + milliseconds(5)));  // every group is in
}

// A group that came later than the window last step (a long backward pass) is not waited for, nor
// one that never came again; one step whose groups came together expects nothing next.
TEST(SubmissionTimeline, LateOrAbsentGroupsAreNotWaitedFor) {
  SubmissionTimeline t;
  const auto t0 = Clock::now();
  const auto window = milliseconds(25);
  t.on_submit("a", t0);
  t.on_submit("late", t0 + milliseconds(40));
  const auto t1 = t0 + milliseconds(200);
  t.on_submit("a", t1);
  EXPECT_FALSE(t.expects_more(window, t1));  // "late" came 40 ms after the step's first
  t.on_submit("late", t1 + milliseconds(40));
  t.on_submit("once", t1 + milliseconds(41));  // a key of this step only
  const auto t2 = t1 + milliseconds(200);
  t.on_submit("a", t2);
  // "once" came 41 ms in, beyond the window: not expected, whether or not it comes again.
  EXPECT_FALSE(t.expects_more(window, t2));
  t.on_submit("b", t2 + milliseconds(1));  // arrives with "a": next step expects it
  const auto t3 = t2 + milliseconds(200);
  t.on_submit("a", t3);
  EXPECT_TRUE(t.expects_more(window, t3));
  t.on_submit("b", t3 + milliseconds(1));
  EXPECT_FALSE(t.expects_more(window, t3 + milliseconds(1)));
}

// What the auto policy's timeline plans with: the submissions within the window of the earliest
// become ready at the last of them; later ones keep their times.
TEST(CoalesceReadyTimes, TheFirstWindowBecomesReadyTogether) {
  std::vector<double> ready{0.015, 0.0003, 0.0150, 0.040, 0.0149};
  coalesce_ready_times(ready, 0.025);
  EXPECT_EQ(ready, (std::vector<double>{0.015, 0.015, 0.015, 0.040, 0.015}));
  std::vector<double> none{0.001, 0.002};
  coalesce_ready_times(none, 0);  // no window: as measured
  EXPECT_EQ(none, (std::vector<double>{0.001, 0.002}));
  std::vector<double> empty;
  coalesce_ready_times(empty, 0.025);
  EXPECT_TRUE(empty.empty());
}

}  // namespace
}  // namespace gradex::sync
