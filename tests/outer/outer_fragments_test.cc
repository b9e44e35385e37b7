// Streaming DiLoCo's fragment split and schedule, and GRADEX_OUTER_* cross-checks, without ranks.
#include <gtest/gtest.h>

#include "base/config.h"
#include "base/error.h"
#include "outer/outer.h"

namespace gradex::outer {
namespace {

TEST(OuterFragments, ContiguousBalancedNonEmpty) {
  EXPECT_EQ(split_fragments({10, 10, 10, 10}, 2), (std::vector<size_t>{0, 2, 4}));
  EXPECT_EQ(split_fragments({100, 1, 1, 1}, 2), (std::vector<size_t>{0, 1, 4}));
  // A huge first tensor cannot starve later fragments: each keeps at least one tensor.
  EXPECT_EQ(split_fragments({1000, 1, 1}, 3), (std::vector<size_t>{0, 1, 2, 3}));
  EXPECT_EQ(split_fragments({1, 1, 1, 1000}, 2), (std::vector<size_t>{0, 3, 4}));
  EXPECT_EQ(split_fragments({5}, 1), (std::vector<size_t>{0, 1}));
  for (int64_t F = 1; F <= 7; ++F) {
    auto cuts = split_fragments(std::vector<uint64_t>(7, 3), F);
    ASSERT_EQ(cuts.size(), static_cast<size_t>(F) + 1);
    for (size_t i = 1; i < cuts.size(); ++i)
      EXPECT_LT(cuts[i - 1], cuts[i]) << "F=" << F;
  }
  try {
    split_fragments({1, 2}, 3);
    FAIL() << "3 fragments of 2 tensors accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("GRADEX_OUTER_FRAGMENTS"), std::string::npos);
  }
}

TEST(OuterFragments, StaggeredSchedule) {
  // H = 8, F = 4: offsets 0, 2, 4, 6; fragment 0 at 8, 16, ...; never at step 0.
  for (int64_t f = 0; f < 4; ++f)
    EXPECT_EQ(fragment_offset(f, 4, 8), 2 * f);
  std::vector<int> count(4, 0);
  for (uint64_t t = 1; t <= 32; ++t) {
    auto due = fragments_due(t, 4, 8);
    EXPECT_LE(due.size(), 1u) << "t=" << t;
    for (int64_t f : due) {
      EXPECT_EQ(static_cast<int64_t>(t % 8), 2 * f);
      ++count[static_cast<size_t>(f)];
    }
  }
  EXPECT_EQ(count, (std::vector<int>{4, 4, 4, 4}));
  // F > H: several fragments share a step, every fragment still syncs once per period.
  std::vector<int> seen(5, 0);
  for (uint64_t t = 1; t <= 3; ++t)
    for (int64_t f : fragments_due(t, 5, 3))
      ++seen[static_cast<size_t>(f)];
  EXPECT_EQ(seen, (std::vector<int>{1, 1, 1, 1, 1}));
}

TEST(OuterOptions, DelayMustBeBelowPeriod) {
  auto c = config::Config::from_strings({"GRADEX_OUTER_PERIOD=4", "GRADEX_OUTER_DELAY=3"},
                                        config::Source::kApi);
  EXPECT_EQ(outer_options_from_config(c).delay, 3);
  // 4-bit codes by default: they lost nothing against 8 bits on the LM race
  // (docs/benchmark_details.md).
  EXPECT_EQ(outer_options_from_config(c).bits, 4);
  EXPECT_FALSE(outer_options_from_config(c).topk);
  auto bad = config::Config::from_strings({"GRADEX_OUTER_PERIOD=4", "GRADEX_OUTER_DELAY=4"},
                                          config::Source::kApi);
  EXPECT_THROW(outer_options_from_config(bad), ConfigError);
  auto bits = config::Config::from_strings({"GRADEX_OUTER_BITS=4", "GRADEX_OUTER_SCALE=fp16"},
                                           config::Source::kApi);
  auto o = outer_options_from_config(bits);
  EXPECT_EQ(o.quant.bits, 4);
  EXPECT_EQ(o.quant.scale, compress::quant::ScaleType::kFloat16);
}

}  // namespace
}  // namespace gradex::outer
