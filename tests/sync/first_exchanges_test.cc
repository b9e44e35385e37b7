// FirstExchanges: which units hold a tensor's first exchange on its codec (no record of its cost).
#include "sync/engine/first_exchanges.h"

#include <gtest/gtest.h>

#include <deque>

namespace gradex::sync {
namespace {

// A unit of the given (key, step) exchanges.
struct UnitOf {
  std::deque<pipeline::Job> jobs;
  pipeline::Unit unit;
  explicit UnitOf(std::initializer_list<std::pair<const char*, uint64_t>> exchanges) {
    for (const auto& [key, step] : exchanges) {
      jobs.emplace_back();
      jobs.back().id = {WorkKind::kGradient, key};
      jobs.back().step = step;
      unit.jobs.push_back(&jobs.back());
    }
  }
};

TEST(FirstExchanges, AMarkedExchangeIsTakenOnce) {
  FirstExchanges f;
  f.mark("a", 3);
  EXPECT_FALSE(f.take(UnitOf({{"b", 3}}).unit));  // another tensor
  EXPECT_TRUE(f.take(UnitOf({{"b", 3}, {"a", 3}}).unit));
  EXPECT_FALSE(f.take(UnitOf({{"a", 3}}).unit));  // spent
  EXPECT_FALSE(f.take(UnitOf({{"a", 4}}).unit));
}

TEST(FirstExchanges, AMarkWaitsForItsStepAndAStaleOneIsForgotten) {
  FirstExchanges f;
  f.mark("a", 5);
  EXPECT_FALSE(f.take(UnitOf({{"a", 4}}).unit));  // before its step: kept
  EXPECT_TRUE(f.take(UnitOf({{"a", 5}}).unit));
  f.mark("b", 2);  // its unit never observed
  EXPECT_FALSE(f.take(UnitOf({{"b", 7}}).unit));
  EXPECT_FALSE(f.take(UnitOf({{"b", 2}}).unit));  // forgotten, not taken late
  f.mark("c", 1);
  f.mark("c", 9);  // switched again before its unit was observed: the newest mark
  EXPECT_FALSE(f.take(UnitOf({{"c", 1}}).unit));
  EXPECT_TRUE(f.take(UnitOf({{"c", 9}}).unit));
}

TEST(FirstExchanges, MarksAreBounded) {
  FirstExchanges f;
  for (size_t i = 0; i < FirstExchanges::kMaxMarks + 10; ++i)
    f.mark("t" + std::to_string(i), 1);
  EXPECT_TRUE(f.take(UnitOf({{"t0", 1}}).unit));
  const std::string beyond = "t" + std::to_string(FirstExchanges::kMaxMarks + 5);
  EXPECT_FALSE(f.take(UnitOf({{beyond.c_str(), 1}}).unit));
}

}  // namespace
}  // namespace gradex::sync
