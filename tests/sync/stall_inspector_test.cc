// The stall inspector: which ranks are late and which keys they miss, logged by rank 0 well before
// the timeout; unit tests on synthetic tables and one job of forked ranks where a rank never
// submits.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "base/config.h"
#include "base/error.h"
#include "process_ranks.h"
#include "rank_checks.h"
#include "sync/engine/stall_inspector.h"

using namespace gradex;
using namespace gradex::test;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

namespace {

TEST(StallInspector, NamesLateRanksAndTheirKeys) {
  sync::StallInspector s(milliseconds(10000), milliseconds(300000));
  auto t0 = Clock::now();
  std::vector<sync::StallKey> pending = {
      {"tensor 'a'", {true, true, false, true}, t0},
      {"tensor 'b'", {true, true, false, true}, t0 + milliseconds(2000)},
      {"parameter 'c'", {true, false, false, false}, t0},
      {"tensor 'fresh'", {true, false, true, true}, t0 + milliseconds(9000)},
  };
  EXPECT_FALSE(s.due(t0, t0 + milliseconds(9999)));
  EXPECT_EQ(s.inspect(pending, t0 + milliseconds(9999)), "");
  auto now = t0 + milliseconds(12000);
  EXPECT_TRUE(s.due(t0, now));
  ::testing::internal::CaptureStderr();
  std::string report = s.inspect(pending, now);
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(report,
            "stall: ranks [1, 2, 3] are late: they have not submitted 1 key(s) that ranks [0] "
            "submitted up to 12.0 s ago: parameter 'c'; ranks [2] are late: they have not "
            "submitted 2 key(s) that ranks [0, 1, 3] submitted up to 12.0 s ago: tensor 'a', "
            "tensor 'b' (GRADEX_STALL_WARN_S; the job fails after GRADEX_TIMEOUT_S = 300.0 s)");
  EXPECT_NE(log.find(report), std::string::npos) << log;
  // Not repeated every round: the next report comes one interval later.
  EXPECT_FALSE(s.due(t0, now + milliseconds(5000)));
  EXPECT_EQ(s.inspect(pending, now + milliseconds(5000)), "");
  EXPECT_NE(s.inspect(pending, now + milliseconds(10000)), "");
}

TEST(StallInspector, LongListsAreCounted) {
  sync::StallInspector s(milliseconds(1), milliseconds(1000));
  auto t0 = Clock::now();
  std::vector<sync::StallKey> pending;
  for (int i = 0; i < 8; ++i)
    pending.push_back({"tensor 'k" + std::to_string(i) + "'", {false, true}, t0});
  std::string r = s.inspect(pending, t0 + milliseconds(5));
  EXPECT_NE(r.find("tensor 'k4' and 3 more"), std::string::npos) << r;
  EXPECT_NE(r.find("ranks [0] are late: they have not submitted 8 key(s)"), std::string::npos) << r;
}

TEST(StallInspector, FromConfig) {
  auto off = config::Config::from_strings({"GRADEX_STALL_WARN_S=0"}, config::Source::kEnvironment);
  EXPECT_EQ(sync::make_stall_inspector(off, milliseconds(1000)), nullptr);
  EXPECT_NE(sync::make_stall_inspector(config::Config(), milliseconds(1000)), nullptr);  // 60 s
  EXPECT_THROW(
      config::Config::from_strings({"GRADEX_STALL_WARN_S=-1"}, config::Source::kEnvironment),
      ConfigError);
}

// Rank 2 never submits 'late_key': rank 0 logs the stall after ~1 s, long before the 8 s timeout.
TEST(StallInspector, RankZeroReportsALateRankBeforeTheTimeout) {
  std::string log_path = ::testing::TempDir() + "gradex_stall_rank0.log";
  auto results = run_ranks(
      3, {"GRADEX_TIMEOUT_S=8", "GRADEX_STALL_WARN_S=1"}, [&](RankContext& ctx) -> std::string {
        if (ctx.rank == 0) {
          int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
          dup2(fd, 2);
          close(fd);
        }
        RANK_OK(
            gradex_register_tensor(ctx.engine, "late_key", 64, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        if (ctx.rank == 2) return "";  // never submits
        std::vector<float> g(64, 1.0f);
        gradex_handle_t h;
        RANK_OK(gradex_submit(ctx.engine, "late_key", g.data(), &h));
        gradex_status_t s = gradex_wait(ctx.engine, h);
        RANK_REQUIRE(s == GRADEX_ERR_TIMEOUT, "status " << s << ": " << gradex_last_error());
        return "";
      });
  EXPECT_EQ(failures(results), "");
  std::ifstream in(log_path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string log = text.str();
  EXPECT_NE(log.find("stall: ranks [2] are late: they have not submitted 1 key(s) that ranks "
                     "[0, 1] submitted up to "),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("tensor 'late_key'"), std::string::npos) << log;
  // Reminded about once per second while stalled, not every round.
  size_t count = 0;
  for (size_t at = log.find("stall:"); at != std::string::npos; at = log.find("stall:", at + 1))
    ++count;
  EXPECT_GE(count, 3u) << log;
  EXPECT_LE(count, 10u) << log;
}

}  // namespace
