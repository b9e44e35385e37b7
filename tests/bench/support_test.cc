// Flags, RESULT lines, statistics and the average check.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "base/error.h"
#include "bench/args.h"
#include "bench/average_check.h"
#include "bench/result_line.h"
#include "bench/stats.h"

namespace gradex::bench {
namespace {

const std::vector<FlagSpec> kFlags = {
    {"steps", "20", "steps"},
    {"size", "64K", "bytes"},
    {"rate", "0.5", "a float"},
    {"verbose", "", "a switch", true},
};

TEST(Args, ParsesBothFormsDefaultsAndSwitches) {
  Args a = Args::parse(kFlags, {"--steps", "7", "--size=2M", "--verbose"});
  EXPECT_EQ(a.get_int("steps", 1, 100), 7);
  EXPECT_EQ(a.get_bytes("size", 1, int64_t{1} << 40), 2 << 20);
  EXPECT_TRUE(a.get_switch("verbose"));
  EXPECT_TRUE(a.given("steps"));
  EXPECT_FALSE(a.given("rate"));
  EXPECT_DOUBLE_EQ(a.get_float("rate", 0, 1), 0.5);
  Args d = Args::parse(kFlags, {});
  EXPECT_EQ(d.get_bytes("size", 1, int64_t{1} << 40), 65536);
  EXPECT_FALSE(d.get_switch("verbose"));
}

TEST(Args, RejectsWhatItDoesNotKnow) {
  EXPECT_THROW(Args::parse(kFlags, {"--stepz", "3"}), InvalidArgument);
  EXPECT_THROW(Args::parse(kFlags, {"--steps"}), InvalidArgument);
  EXPECT_THROW(Args::parse(kFlags, {"steps"}), InvalidArgument);
  EXPECT_THROW(Args::parse(kFlags, {"--steps", "1", "--steps", "2"}), InvalidArgument);
  EXPECT_THROW(Args::parse(kFlags, {"--verbose=1"}), InvalidArgument);
  EXPECT_THROW(Args::parse(kFlags, {"--steps", "x"}).get_int("steps", 1, 9), Error);
  EXPECT_THROW(Args::parse(kFlags, {"--steps", "10"}).get_int("steps", 1, 9), InvalidArgument);
  EXPECT_THROW(Args::parse(kFlags, {"--size", "3Q"}).get_bytes("size", 1, 1 << 30), Error);
  EXPECT_THROW(Args::parse(kFlags, {"--rate", "nan"}).get_float("rate", 0, 1), Error);
  try {
    Args::parse(kFlags, {"--nope"});
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--steps"), std::string::npos) << e.what();
  }
}

TEST(Args, FormatsBytes) {
  EXPECT_EQ(format_bytes(64 << 10), "64 KiB");
  EXPECT_EQ(format_bytes(int64_t{256} << 20), "256 MiB");
  EXPECT_EQ(format_bytes(1000), "1000 B");
}

TEST(ResultLine, WritesCompactKeyValues) {
  ResultLine r;
  r.add("a_ms", 12.5).add("n", int64_t{25557032}).add("model", "resnet50").add("x", 1.0 / 3);
  r.add("big", 1e20).add("neg", -0.0);
  EXPECT_EQ(r.str(), "RESULT a_ms=12.5 n=25557032 model=resnet50 x=0.333333 big=1e+20 neg=0");
  EXPECT_EQ(ResultLine().str(), "RESULT");
  EXPECT_EQ(format_number(std::numeric_limits<double>::quiet_NaN()), "nan");
  auto items = parse_result_line(r.str());
  ASSERT_EQ(items.size(), 6u);
  EXPECT_EQ(items[1].first, "n");
  EXPECT_EQ(items[1].second, "25557032");
}

TEST(ResultLine, RejectsAmbiguousItems) {
  ResultLine r;
  r.add("k", 1);
  EXPECT_THROW(r.add("k", 2), InvalidArgument);
  EXPECT_THROW(r.add("a b", 1), InvalidArgument);
  EXPECT_THROW(r.add("a=b", 1), InvalidArgument);
  EXPECT_THROW(r.add("v", "x y"), InvalidArgument);
  EXPECT_THROW(r.add("v", ""), InvalidArgument);
  EXPECT_THROW(parse_result_line("RESULTS a=1"), InvalidArgument);
  EXPECT_THROW(parse_result_line("RESULT a"), InvalidArgument);
}

TEST(Stats, MedianMeanMinMax) {
  EXPECT_DOUBLE_EQ(median({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_DOUBLE_EQ(mean({1, 2, 6}), 3);
  EXPECT_DOUBLE_EQ(minimum({5, -1, 2}), -1);
  EXPECT_DOUBLE_EQ(maximum({5, -1, 2}), 5);
  EXPECT_THROW(median({}), InvalidArgument);
  double t0 = wall_seconds(), c0 = process_cpu_seconds();
  volatile double sink = 0;
  for (int i = 0; i < 2000000; ++i)
    sink = sink + std::sqrt(double(i));
  EXPECT_GT(wall_seconds(), t0);
  EXPECT_GT(process_cpu_seconds(), c0);
}

// The exact average of 3 ranks, computed the way a correct exchange would deliver it.
std::vector<float> exact_average(const ModelProfile& m, int world, int64_t step) {
  std::vector<double> sum(m.total_numel, 0.0);
  std::vector<float> g(m.total_numel);
  for (int r = 0; r < world; ++r) {
    GradientGenerator(m, r).generate(step, g.data());
    for (size_t i = 0; i < g.size(); ++i)
      sum[i] += g[i];
  }
  std::vector<float> avg(m.total_numel);
  for (size_t i = 0; i < avg.size(); ++i)
    avg[i] = static_cast<float>(sum[i] / world);
  return avg;
}

TEST(AverageChecker, AcceptsTheAverageAndRejectsAnythingElse) {
  ModelProfile m = parse_model_profile("w 300 200\nb 300\nv 5000\nlast 7\n", "m", "m");
  AverageChecker checker(m, 3, GradientOptions{});
  EXPECT_EQ(checker.checked_tensors(), (std::vector<size_t>{0, 2, 3}));
  std::vector<float> avg = exact_average(m, 3, 4);
  Tolerance tight{1e-6, 0};
  EXPECT_LE(checker.check("exact", 4, avg.data(), tight), 1.0);
  EXPECT_THROW(checker.check("exact", 5, avg.data(), tight), InternalError);  // other step

  std::vector<float> wrong = avg;
  wrong[300 * 200 + 300 + 17] *= 1.01f;  // tensor 'v', element 17
  try {
    checker.check("perturbed", 4, wrong.data(), tight);
    FAIL();
  } catch (const InternalError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("perturbed"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'v' element 17"), std::string::npos) << msg;
  }
  EXPECT_LE(checker.check("loose", 4, wrong.data(), Tolerance{0.05, 0}), 1.0);
  wrong = avg;
  wrong[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(checker.check("nan", 4, wrong.data(), Tolerance{1, 1}), InternalError);
}

}  // namespace
}  // namespace gradex::bench
