// An engine with nothing to do sleeps: no negotiation rounds while idle, none while a key waits for
// a late rank (the late rank's own round wakes the others), and ranks that leave at different
// times still all leave together, promptly.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "process_ranks.h"
#include "rank_checks.h"

using namespace gradex::test;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

uint64_t control_bytes(gradex_engine_t* engine) {
  gradex_stats_t s{};
  if (gradex_get_stats(engine, 0, &s) != GRADEX_OK) return ~uint64_t{0};
  return s.control_bytes;
}

// One exact exchange of 'w' (the rank values 0..P-1 average to (P-1)/2).
std::string exchange(gradex_engine_t* engine, int rank, int world) {
  std::vector<float> g(64, static_cast<float>(rank));
  gradex_handle_t h;
  RANK_OK(gradex_submit(engine, "w", g.data(), &h));
  RANK_OK(gradex_wait(engine, h));
  const float expected = static_cast<float>(world - 1) / 2.0f;
  RANK_REQUIRE(g[0] == expected && g[63] == expected, "average " << g[0] << ", not " << expected);
  return "";
}

// A barrier of the forked ranks outside the engine (so that it adds no rounds): each rank creates
// a file and waits for the others' (false after 60 s).
bool file_barrier(const std::string& name, int rank, int world) {
  auto path = [&](int r) {
    return ::testing::TempDir() + "gradex_idle_" + std::to_string(getppid()) + "_" + name + "_" +
           std::to_string(r);
  };
  std::ofstream(path(rank)).put('1');
  auto deadline = Clock::now() + std::chrono::seconds(60);
  for (int r = 0; r < world; ++r) {
    while (!std::ifstream(path(r)).good()) {
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  return true;
}

void remove_barrier_files(const std::string& name, int world) {
  for (int r = 0; r < world; ++r)
    std::remove((::testing::TempDir() + "gradex_idle_" + std::to_string(getpid()) + "_" + name +
                 "_" + std::to_string(r))
                    .c_str());
}

const std::vector<std::string> kEnv = {"GRADEX_FP16=0", "GRADEX_SPARSITY=0", "GRADEX_MOMENTUM=0",
                                       "GRADEX_TIMEOUT_S=20"};

// After an exchange, 1.5 s with nothing submitted: not one negotiation round (the control bytes
// stay where they were; a polling engine would run one every 2 ms) and next to no CPU.
TEST(EngineIdle, AnIdleEngineRunsNoRounds) {
  auto results = run_ranks(3, kEnv, [&](RankContext& ctx) -> std::string {
    RANK_OK(gradex_register_tensor(ctx.engine, "w", 64, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
    std::string e = exchange(ctx.engine, ctx.rank, ctx.world);
    if (!e.empty()) return e;
    RANK_REQUIRE(file_barrier("idle_start", ctx.rank, ctx.world), "barrier");
    const uint64_t before = control_bytes(ctx.engine);
    const double cpu0 = process_cpu_seconds();
    auto t0 = Clock::now();
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    const double cpu_pct = (process_cpu_seconds() - cpu0) / seconds_since(t0) * 100;
    const uint64_t after = control_bytes(ctx.engine);
    RANK_REQUIRE(after == before,
                 "idle rounds: control bytes went from " << before << " to " << after);
    RANK_REQUIRE(cpu_pct < 3.0, "the idle engine used " << cpu_pct << "% of a core");
    // And it is still awake to work (once every rank has measured: a submission starts a round).
    RANK_REQUIRE(file_barrier("idle_end", ctx.rank, ctx.world), "barrier");
    return exchange(ctx.engine, ctx.rank, ctx.world);
  });
  remove_barrier_files("idle_start", 3);
  remove_barrier_files("idle_end", 3);
  EXPECT_EQ(failures(results), "");
}

// Rank 2 submits 2 s after the others: everyone gets the exact average soon after rank 2
// submits, and the ranks that waited ran a handful of rounds meanwhile, not one every few ms.
TEST(EngineIdle, ALateRankCompletesWithoutRoundsWhileOthersWait) {
  auto results = run_ranks(3, kEnv, [&](RankContext& ctx) -> std::string {
    RANK_OK(gradex_register_tensor(ctx.engine, "w", 64, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
    std::string e = exchange(ctx.engine, ctx.rank, ctx.world);  // every engine is up and running
    if (!e.empty()) return e;
    const uint64_t before = control_bytes(ctx.engine);
    if (ctx.rank == 2) std::this_thread::sleep_for(std::chrono::milliseconds(2000));
    auto t0 = Clock::now();
    e = exchange(ctx.engine, ctx.rank, ctx.world);
    if (!e.empty()) return e;
    const double waited = seconds_since(t0);
    if (ctx.rank == 2) RANK_REQUIRE(waited < 10, "the late rank waited " << waited << " s");
    if (ctx.rank != 2) RANK_REQUIRE(waited >= 1.9, "completed after " << waited << " s");
    // An empty round costs 2 x 10 bytes per rank here, an announcement round 2 x 34: a round
    // every 2 ms for 2 s (a polling engine) is far above this bound, a few rounds far below.
    const uint64_t spent = control_bytes(ctx.engine) - before;
    RANK_REQUIRE(spent < 1000, "control bytes while waiting for rank 2: " << spent);
    return "";
  });
  EXPECT_EQ(failures(results), "");
}

// Ranks leave 0.7 s apart; the first ones sleep until the last one's leaving round, then all
// leave in it: every destroy succeeds, none waits anywhere near the 20 s timeout.
TEST(EngineIdle, RanksLeavingAtDifferentTimesLeaveTogether) {
  auto results = run_ranks(
      3, kEnv,
      [&](RankContext& ctx) -> std::string {
        std::string error;
        gradex_engine_t* engine = nullptr;
        if (create_engine(ctx.rank, ctx.world, &engine, &error) != GRADEX_OK) return error;
        RANK_OK(gradex_register_tensor(engine, "w", 64, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        std::string e = exchange(engine, ctx.rank, ctx.world);
        if (!e.empty()) return e;
        std::this_thread::sleep_for(std::chrono::milliseconds(700 * ctx.rank));
        auto t0 = Clock::now();
        RANK_OK(gradex_engine_destroy(engine));
        const double took = seconds_since(t0);
        RANK_REQUIRE(took < 10, "leaving took " << took << " s");
        if (ctx.rank == 0) RANK_REQUIRE(took >= 1.2, "rank 0 left after " << took << " s alone");
        return "";
      },
      std::chrono::seconds(120), /*create_engine=*/false);
  EXPECT_EQ(failures(results), "");
}

}  // namespace
