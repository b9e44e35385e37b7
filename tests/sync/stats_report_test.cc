// StatsReporter: the GRADEX_STATS_EVERY line (rank 0 only, one per N steps, the window's figures)
// and the one-time warnings that name the first saturated / non-finite tensor.
#include "sync/engine/stats_report.h"

#include <gtest/gtest.h>

#include <string>

#include "base/config.h"

using gradex::config::Config;
using gradex::sync::Stats;
using gradex::sync::StatsReporter;

namespace {

Stats after_steps(uint64_t steps) {
  Stats s;
  s.steps = steps;
  s.bytes_sent = steps * 1000000;  // 1 MB per step
  s.dense_bytes = steps * 10000000;
  s.communicate_seconds = 0.002 * static_cast<double>(steps);
  return s;
}

std::string run(int rank, const Config& config, StatsReporter& reporter, uint64_t steps) {
  testing::internal::CaptureStderr();
  reporter.after_step(config, rank, after_steps(steps));
  return testing::internal::GetCapturedStderr();
}

}  // namespace

TEST(StatsReport, EveryNStepsOnRankZeroOnly) {
  Config config;
  config.set("GRADEX_STATS_EVERY", "2");
  StatsReporter rank0, rank1;
  EXPECT_EQ(run(0, config, rank0, 1), "");
  std::string line = run(0, config, rank0, 2);
  EXPECT_NE(line.find("stats steps 1-2: compression 10.0x, 2.00 MB sent (1.000 MB/step), "
                      "exchange 2.0 ms/step, saturated 0, non-finite 0"),
            std::string::npos)
      << line;
  EXPECT_EQ(run(0, config, rank0, 3), "");
  EXPECT_NE(run(0, config, rank0, 4).find("stats steps 3-4:"), std::string::npos);
  for (uint64_t step = 1; step <= 4; ++step)
    EXPECT_EQ(run(1, config, rank1, step), "");
  Config off;  // GRADEX_STATS_EVERY=0: nothing
  StatsReporter quiet;
  EXPECT_EQ(run(0, off, quiet, 2), "");
}

TEST(StatsReport, FirstSaturationAndNonFiniteNamedOnce) {
  Config config;
  StatsReporter reporter;
  Stats s = after_steps(1);
  s.saturated = 3;
  s.first_saturated_tensor = "fc.weight";
  testing::internal::CaptureStderr();
  reporter.after_step(config, 1, s);
  s.saturated = 9;
  s.nonfinite = 1;
  s.first_nonfinite_tensor = "fc.bias";
  reporter.after_step(config, 1, s);
  reporter.after_step(config, 1, s);
  std::string text = testing::internal::GetCapturedStderr();
  EXPECT_NE(text.find("values of tensor 'fc.weight' were clamped"), std::string::npos) << text;
  EXPECT_EQ(text.find("clamped"), text.rfind("clamped")) << text;
  EXPECT_NE(text.find("tensor 'fc.bias' held NaN/Inf"), std::string::npos) << text;
  EXPECT_EQ(text.find("NaN/Inf"), text.rfind("NaN/Inf")) << text;
}
