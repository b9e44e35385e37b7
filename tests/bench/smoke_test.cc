// End to end: the built gradex-bench and gradex-config, run as a user would (2 local ranks).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "bench/result_line.h"
#include "bench/spawn.h"

namespace gradex::bench {
namespace {

struct Outcome {
  int status = -1;
  std::string out;  // stdout and stderr
};

Outcome run(const std::string& command) {
  Outcome r;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0)
    r.out.append(buf, n);
  int raw = pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  return r;
}

// The key=value pairs of the last RESULT line; fails the test when there is none.
std::map<std::string, std::string> result_of(const Outcome& r) {
  size_t at = r.out.rfind("RESULT ");
  EXPECT_NE(at, std::string::npos) << r.out;
  if (at == std::string::npos) return {};
  std::string line = r.out.substr(at, r.out.find('\n', at) - at);
  std::map<std::string, std::string> items;
  for (auto& [k, v] : parse_result_line(line))
    items[k] = v;
  return items;
}

double number(std::map<std::string, std::string>& result, const std::string& key) {
  EXPECT_TRUE(result.count(key)) << key;
  return result.count(key) ? std::strtod(result[key].c_str(), nullptr) : -1;
}

const std::string kBench = GRADEX_BENCH_EXE;

TEST(BenchSmoke, ExchangeOnTwoRanksReportsEveryMode) {
  Outcome r = run(kBench + " exchange --steps 2 --warmup 1 --ranks 2 --deadline-s 300");
  ASSERT_EQ(r.status, 0) << r.out;
  auto result = result_of(r);
  EXPECT_EQ(result["model"], "resnet50");
  EXPECT_EQ(result["params"], "25557032");
  EXPECT_EQ(result["ranks"], "2");
  EXPECT_GT(number(result, "dense_fp32_step_ms"), 0);
  EXPECT_GT(number(result, "dense_fp16_step_ms"), 0);
  EXPECT_GT(number(result, "dense_fp16_cpu_ms"), 0);
  // fp32 ring: 2(P-1)/P x 4 bytes per parameter; fp16 halves it.
  EXPECT_NEAR(number(result, "dense_fp32_ratio"), 1.0, 0.05);
  EXPECT_NEAR(number(result, "dense_fp16_ratio"), 2.0, 0.1);
  EXPECT_NEAR(number(result, "dense_fp32_wire_bytes"), 25557032.0 * 4, 25557032.0 * 0.2);
  // Idle CPU: a share of one core, the engine's and the engine-less floor side by side.
  EXPECT_GE(number(result, "idle_cpu_pct"), 0);
  EXPECT_LE(number(result, "idle_cpu_pct"), 100.0 * 64);
  EXPECT_GE(number(result, "idle_cpu_pct_no_engine"), 0);
}

TEST(BenchSmoke, AllgatherReportsRingAndDirect) {
  Outcome r = run(kBench + " allgather --ranks 3 --min-bytes 1K --max-bytes 4K --iters 2");
  ASSERT_EQ(r.status, 0) << r.out;
  auto result = result_of(r);
  EXPECT_GT(number(result, "direct_1KiB_ms"), 0);
  EXPECT_GT(number(result, "ring_4KiB_ms"), 0);
  EXPECT_GT(number(result, "direct_over_ring_min_bytes"), 0);
  EXPECT_EQ(result["ranks"], "3");
}

TEST(BenchSmoke, AllgatherOnlyAllAddsTheOneRoundCollective) {
  Outcome r = run("GRADEX_ALLGATHER_INLINE_KB=2 " + kBench +
                  " allgather --ranks 3 --min-bytes 1K --max-bytes 4K --iters 2 --only all");
  ASSERT_EQ(r.status, 0) << r.out;
  auto result = result_of(r);
  EXPECT_GT(number(result, "inline_1KiB_ms"), 0);  // one round trip
  EXPECT_GT(number(result, "inline_4KiB_ms"), 0);  // above the 2 KiB maximum: two rounds
  EXPECT_GT(number(result, "direct_over_inline_1KiB"), 0);
  EXPECT_GT(number(result, "ring_4KiB_ms"), 0);
}

TEST(BenchSmoke, ExchangeInterleavesNamedComparisonModes) {
  Outcome r = run(kBench +
                  " exchange --steps 2 --warmup 1 --ranks 2 --idle-s 0 --interleave --modes "
                  "dgc999,dgc999_2round,dgc999_2round_ring --deadline-s 300");
  ASSERT_EQ(r.status, 0) << r.out;
  auto result = result_of(r);
  for (const char* mode : {"dgc999", "dgc999_2round", "dgc999_2round_ring"})
    EXPECT_GT(number(result, std::string(mode) + "_step_ms"), 0) << mode;
  // The same payloads whichever way they travel (sizes and headers aside).
  const double one_round = number(result, "dgc999_wire_bytes");
  EXPECT_NEAR(number(result, "dgc999_2round_wire_bytes"), one_round, one_round * 0.05);
  EXPECT_NEAR(number(result, "dgc999_2round_ring_wire_bytes"), one_round, one_round * 0.05);
}

TEST(BenchSmoke, AllreduceReportsTheBusBandwidthRatio) {
  Outcome r = run(kBench + " allreduce --ranks 2 --min-bytes 16M --max-bytes 64M --iters 2");
  ASSERT_EQ(r.status, 0) << r.out;
  auto result = result_of(r);
  EXPECT_GT(number(result, "busbw_ratio_64MiB"), 0);
  EXPECT_GT(number(result, "busbw_64MiB_GBps"), 0);
  EXPECT_GT(number(result, "p2p_64MiB_GBps"), 0);
}

TEST(BenchSmoke, PlanPrintsEachTensorsChoice) {
  Outcome r = run("GRADEX_POLICY_INTERVAL=2 " + kBench +
                  " plan --steps 5 --ranks 2 --backward-ms 20 --deadline-s 300");
  ASSERT_EQ(r.status, 0) << r.out;
  auto result = result_of(r);
  EXPECT_EQ(result["ranks"], "2");
  EXPECT_GT(number(result, "step_ms"), 0);
  EXPECT_NE(r.out.find("3 plan(s) made"), std::string::npos) << r.out;  // steps 0, 2, 4
  EXPECT_NE(r.out.find("meas_ms"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fc.weight"), std::string::npos) << r.out;
}

TEST(BenchSmoke, UsageErrorsAreClearAndFailFast) {
  Outcome unknown = run(kBench + " exchnage");
  EXPECT_EQ(unknown.status, 2);
  EXPECT_NE(unknown.out.find("unknown command 'exchnage'"), std::string::npos) << unknown.out;
  Outcome flag = run(kBench + " exchange --stpes 3");
  EXPECT_EQ(flag.status, 2);
  EXPECT_NE(flag.out.find("unknown flag '--stpes'"), std::string::npos) << flag.out;
  Outcome model = run(kBench + " exchange --model resnet51");
  EXPECT_EQ(model.status, 2);
  EXPECT_NE(model.out.find("gpt2_small"), std::string::npos) << model.out;
  Outcome help = run(kBench + " --help");
  EXPECT_EQ(help.status, 0);
  EXPECT_NE(help.out.find("allreduce"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("exchange"), std::string::npos) << help.out;
}

TEST(BenchSmoke, ARankThatFailsFailsTheRun) {
  // One process claiming to be a whole world of 1: exchange refuses, with the rank in the message.
  Outcome alone =
      run("RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
          std::to_string(pick_free_port("127.0.0.1")) + " " + kBench + " exchange --steps 1");
  EXPECT_EQ(alone.status, 1) << alone.out;
  EXPECT_NE(alone.out.find("rank 0: exchange needs at least 2 ranks"), std::string::npos)
      << alone.out;
  // An invalid GRADEX_* value fails every spawned rank; the parent relays the failure.
  Outcome bad = run("GRADEX_TIMEOUT_S=-1 " + kBench + " exchange --steps 1 --ranks 2");
  EXPECT_EQ(bad.status, 1) << bad.out;
  EXPECT_NE(bad.out.find("GRADEX_TIMEOUT_S"), std::string::npos) << bad.out;
}

TEST(BenchSmoke, PrintConfigAndGradexConfigAgree) {
  Outcome a = run("GRADEX_RING_CHUNK_KB=64 " + kBench + " exchange --print-config");
  Outcome b = run(std::string("GRADEX_RING_CHUNK_KB=64 ") + GRADEX_CONFIG_EXE);
  EXPECT_EQ(a.status, 0);
  EXPECT_EQ(b.status, 0);
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out.find("GRADEX_RING_CHUNK_KB=64"), std::string::npos) << a.out;
}

}  // namespace
}  // namespace gradex::bench
