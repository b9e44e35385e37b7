// Checkpointing: restoring saved state gives exactly the steps an uninterrupted run gives;
// restoring on another world size or tensor set is a clear error that leaves the engine usable.
#include <gtest/gtest.h>

#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "process_ranks.h"
#include "rank_checks.h"

using namespace gradex::test;

namespace {

const uint64_t kNumel = 30000;
const std::vector<std::string> kEnv = {"GRADEX_SPARSITY=0.99", "GRADEX_MOMENTUM=0.9",
                                       "GRADEX_WARMUP_STEPS=4", "GRADEX_DENSE_THRESHOLD=1000"};

std::string step(gradex_engine_t* engine, int rank, int s, std::vector<float>& out) {
  out = test_vector(11, rank, s, kNumel);
  gradex_handle_t h;
  RANK_OK(gradex_submit(engine, "w", out.data(), &h));
  RANK_OK(gradex_wait(engine, h));
  RANK_OK(gradex_end_step(engine, nullptr));
  return "";
}

void write_file(const std::string& path, const void* data, size_t size) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
}
std::vector<char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

}  // namespace

TEST(EngineState, RestoredRunMatchesUninterruptedRun) {
  const ScratchDir scratch("state");
  const std::string& dir = scratch.path();
  // Run 1: 3 steps, save, 3 more steps (recorded).
  auto first = run_ranks(2, kEnv, [&](RankContext& ctx) -> std::string {
    RANK_OK(gradex_register_tensor(ctx.engine, "w", kNumel, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
    std::vector<float> out;
    for (int s = 0; s < 3; ++s)
      if (auto e = step(ctx.engine, ctx.rank, s, out); !e.empty()) return e;
    size_t length = 0;
    RANK_OK(gradex_save_state(ctx.engine, nullptr, 0, &length));
    std::vector<char> state(length);
    RANK_OK(gradex_save_state(ctx.engine, state.data(), state.size(), &length));
    write_file(dir + "/state" + std::to_string(ctx.rank), state.data(), length);
    std::vector<float> all;
    for (int s = 3; s < 6; ++s) {
      if (auto e = step(ctx.engine, ctx.rank, s, out); !e.empty()) return e;
      all.insert(all.end(), out.begin(), out.end());
    }
    write_file(dir + "/expected" + std::to_string(ctx.rank), all.data(), all.size() * 4);
    return "";
  });
  ASSERT_EQ(failures(first), "");

  // Run 2: fresh engines restore the state, then the same 3 steps must give identical results.
  auto second = run_ranks(2, kEnv, [&](RankContext& ctx) -> std::string {
    RANK_OK(gradex_register_tensor(ctx.engine, "w", kNumel, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
    std::vector<char> state = read_file(dir + "/state" + std::to_string(ctx.rank));
    // A damaged state is rejected and changes nothing.
    std::vector<char> damaged = state;
    damaged.resize(damaged.size() / 2);
    RANK_REQUIRE(gradex_load_state(ctx.engine, damaged.data(), damaged.size()) != GRADEX_OK,
                 "truncated state accepted");
    RANK_OK(gradex_load_state(ctx.engine, state.data(), state.size()));
    std::vector<char> expected = read_file(dir + "/expected" + std::to_string(ctx.rank));
    std::vector<float> out;
    for (int s = 3; s < 6; ++s) {
      if (auto e = step(ctx.engine, ctx.rank, s, out); !e.empty()) return e;
      RANK_REQUIRE(std::memcmp(out.data(), expected.data() + (s - 3) * kNumel * 4, kNumel * 4) == 0,
                   "step " << s << " differs from the uninterrupted run");
    }
    gradex_stats_t stats;
    RANK_OK(gradex_get_stats(ctx.engine, 0, &stats));
    RANK_REQUIRE(stats.steps == 6, "restored step counter: " << stats.steps);
    return "";
  });
  EXPECT_EQ(failures(second), "");

  // Run 3: another world size, and another tensor set, are refused with clear messages.
  auto third = run_ranks(1, kEnv, [&](RankContext& ctx) -> std::string {
    std::vector<char> state = read_file(dir + "/state0");
    RANK_OK(gradex_register_tensor(ctx.engine, "w", kNumel, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
    RANK_REQUIRE(gradex_load_state(ctx.engine, state.data(), state.size()) == GRADEX_ERR_STATE,
                 "other world size accepted");
    std::string msg = gradex_last_error();
    RANK_REQUIRE(msg.find("world size 2") != std::string::npos, msg);
    return "";
  });
  EXPECT_EQ(failures(third), "");
  auto fourth = run_ranks(2, kEnv, [&](RankContext& ctx) -> std::string {
    std::vector<char> state = read_file(dir + "/state" + std::to_string(ctx.rank));
    RANK_OK(gradex_register_tensor(ctx.engine, "v", kNumel, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
    RANK_REQUIRE(gradex_load_state(ctx.engine, state.data(), state.size()) == GRADEX_ERR_STATE,
                 "other tensor set accepted");
    std::string msg = gradex_last_error();
    RANK_REQUIRE(msg.find("'w'") != std::string::npos, msg);
    return "";
  });
  EXPECT_EQ(failures(fourth), "");
  for (const char* f : {"state0", "state1", "expected0", "expected1"})
    ::unlink((dir + "/" + f).c_str());
  ::rmdir(dir.c_str());
}
