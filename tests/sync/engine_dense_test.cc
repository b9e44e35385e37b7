// Dense path, order-independent matching, mismatches and missing tensors, across forked ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "process_ranks.h"
#include "rank_checks.h"

using namespace gradex::test;

namespace {

// Integer-valued inputs: their sums are exact in any order, so the fp32 average must equal
// float(sum) / P bit for bit.
float integer_value(int rank, int step, uint64_t i) {
  return static_cast<float>(
      static_cast<int>((i * 7 + static_cast<uint64_t>(rank) * 13 + step) % 2001) - 1000);
}

}  // namespace

TEST(EngineDense, Fp32AverageIsExactAndOrderIndependent) {
  const int world = 3;
  const std::vector<uint64_t> sizes = {1, 7, 100, 5000, 0, 40000};
  auto results = run_ranks(
      world, {"GRADEX_FP16=0", "GRADEX_SPARSITY=0", "GRADEX_FUSION_MB=0.01", "GRADEX_MOMENTUM=0"},
      [&](RankContext& ctx) -> std::string {
        std::vector<std::vector<float>> data(sizes.size());
        for (size_t t = 0; t < sizes.size(); ++t)
          RANK_OK(gradex_register_tensor(ctx.engine, ("t" + std::to_string(t)).c_str(), sizes[t],
                                         GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        for (int step = 0; step < 3; ++step) {
          // Each rank submits in its own order.
          std::vector<size_t> order(sizes.size());
          for (size_t i = 0; i < order.size(); ++i)
            order[i] = i;
          std::rotate(order.begin(), order.begin() + (ctx.rank + step) % order.size(), order.end());
          if (ctx.rank == 1) std::reverse(order.begin(), order.end());
          std::vector<gradex_handle_t> handles(sizes.size());
          for (size_t t : order) {
            data[t].resize(sizes[t]);
            for (uint64_t i = 0; i < sizes[t]; ++i)
              data[t][i] = integer_value(ctx.rank, step, i + t);
            RANK_OK(gradex_submit(ctx.engine, ("t" + std::to_string(t)).c_str(), data[t].data(),
                                  &handles[t]));
          }
          for (size_t t : order)
            RANK_OK(gradex_wait(ctx.engine, handles[t]));
          for (size_t t = 0; t < sizes.size(); ++t)
            for (uint64_t i = 0; i < sizes[t]; ++i) {
              float sum = 0;
              for (int r = 0; r < world; ++r)
                sum += integer_value(r, step, i + t);
              float expected = sum / static_cast<float>(world);
              RANK_REQUIRE(data[t][i] == expected, "tensor t" << t << "[" << i << "] step " << step
                                                              << ": " << data[t][i]
                                                              << " != " << expected);
            }
          RANK_OK(gradex_end_step(ctx.engine, nullptr));
        }
        gradex_stats_t s;
        RANK_OK(gradex_get_stats(ctx.engine, 0, &s));
        RANK_REQUIRE(s.tensors == 3 * sizes.size(), "tensors exchanged: " << s.tensors);
        RANK_REQUIRE(s.sparse_exchanges == 0, "no tensor should go sparse");
        RANK_REQUIRE(s.bytes_sent > 0 && s.dense_bytes > 0, "byte counters must move");
        return "";
      });
  EXPECT_EQ(failures(results), "");
}

TEST(EngineDense, HalfPrecisionWireIsWithinRounding) {
  for (const char* half : {"fp16", "bf16"}) {
    const int world = 4;
    const uint64_t n = 30000;
    auto results = run_ranks(
        world, {"GRADEX_FP16=1", std::string("GRADEX_HALF_TYPE=") + half, "GRADEX_SPARSITY=0"},
        [&](RankContext& ctx) -> std::string {
          RANK_OK(gradex_register_tensor(ctx.engine, "w", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
          std::vector<float> g = test_vector(1, ctx.rank, 0, n);
          gradex_handle_t h;
          RANK_OK(gradex_submit(ctx.engine, "w", g.data(), &h));
          RANK_OK(gradex_wait(ctx.engine, h));
          // Relative precision: 2^-11 (fp16) or 2^-8 (bf16) per rounding; P casts + P-1 hops.
          const double eps = std::string(half) == "fp16" ? 1.0 / 2048 : 1.0 / 256;
          for (uint64_t i = 0; i < n; ++i) {
            double expected = 0;
            for (int r = 0; r < world; ++r)
              expected += test_value(1, r, 0, i);
            expected /= world;
            double tol = eps * 2 * world * 0.5 + 1e-6;
            RANK_REQUIRE(std::fabs(g[i] - expected) <= tol,
                         half << " element " << i << ": " << g[i] << " vs " << expected);
          }
          return "";
        });
    EXPECT_EQ(failures(results), "") << half;
  }
}

TEST(EngineDense, SizeMismatchIsAnErrorNamingKeyAndRanks) {
  auto results = run_ranks(3, {"GRADEX_TIMEOUT_S=20"}, [&](RankContext& ctx) -> std::string {
    uint64_t n = ctx.rank == 1 ? 101 : 100;
    RANK_OK(
        gradex_register_tensor(ctx.engine, "layer.weight", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
    std::vector<float> g(n, 1.0f);
    gradex_handle_t h;
    RANK_OK(gradex_submit(ctx.engine, "layer.weight", g.data(), &h));
    gradex_status_t s = gradex_wait(ctx.engine, h);
    std::string msg = gradex_last_error();
    RANK_REQUIRE(s == GRADEX_ERR_MISMATCH, "status " << s << ": " << msg);
    RANK_REQUIRE(msg.find("layer.weight") != std::string::npos, msg);
    RANK_REQUIRE(msg.find("rank 1: 101") != std::string::npos, msg);
    // Each rank's message names its own size too (ranks that announced before others may not see
    // every rank's size; the late-announcer test below covers that order).
    RANK_REQUIRE(msg.find("rank " + std::to_string(ctx.rank) + ": " + std::to_string(n)) !=
                     std::string::npos,
                 msg);
    // The engine stays usable after a mismatch.
    RANK_OK(gradex_register_tensor(ctx.engine, "ok", 10, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
    std::vector<float> v(10, static_cast<float>(ctx.rank));
    RANK_OK(gradex_submit(ctx.engine, "ok", v.data(), &h));
    RANK_OK(gradex_wait(ctx.engine, h));
    RANK_REQUIRE(std::fabs(v[0] - 1.0f) < 1e-3, "average after mismatch: " << v[0]);
    return "";
  });
  EXPECT_EQ(failures(results), "");
}

// Ranks 1 and 2 disagree before rank 0 submits at all: rank 0 must still get the mismatch as soon
// as it submits, not a timeout (a regression seen under load).
TEST(EngineDense, LateRankGetsTheMismatchNotATimeout) {
  auto results = run_ranks(3, {"GRADEX_TIMEOUT_S=20"}, [&](RankContext& ctx) -> std::string {
    uint64_t n = ctx.rank == 1 ? 101 : 100;
    RANK_OK(gradex_register_tensor(ctx.engine, "w", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
    if (ctx.rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    std::vector<float> g(n, 1.0f);
    gradex_handle_t h;
    auto t0 = std::chrono::steady_clock::now();
    RANK_OK(gradex_submit(ctx.engine, "w", g.data(), &h));
    gradex_status_t s = gradex_wait(ctx.engine, h);
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string msg = gradex_last_error();
    RANK_REQUIRE(s == GRADEX_ERR_MISMATCH, "status " << s << ": " << msg);
    RANK_REQUIRE(msg.find("rank 1: 101") != std::string::npos, msg);
    RANK_REQUIRE(waited < 10, "waited " << waited << " s for the mismatch");
    return "";
  });
  EXPECT_EQ(failures(results), "");
}

TEST(EngineDense, TensorMissingOnOneRankTimesOutNamingIt) {
  auto results = run_ranks(3, {"GRADEX_TIMEOUT_S=2"}, [&](RankContext& ctx) -> std::string {
    RANK_OK(gradex_register_tensor(ctx.engine, "extra", 64, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
    if (ctx.rank == 2) return "";  // never submits
    std::vector<float> g(64, 1.0f);
    gradex_handle_t h;
    RANK_OK(gradex_submit(ctx.engine, "extra", g.data(), &h));
    auto t0 = std::chrono::steady_clock::now();
    gradex_status_t s = gradex_wait(ctx.engine, h);
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string msg = gradex_last_error();
    RANK_REQUIRE(s == GRADEX_ERR_TIMEOUT, "status " << s << ": " << msg);
    RANK_REQUIRE(msg.find("'extra'") != std::string::npos, msg);
    RANK_REQUIRE(msg.find("not by ranks [2]") != std::string::npos, msg);
    RANK_REQUIRE(waited < 10, "waited " << waited << " s");
    return "";
  });
  EXPECT_EQ(failures(results), "");
}

TEST(EngineDense, DoubleSubmitAndUnknownKeyAreRejected) {
  auto results = run_ranks(1, {}, [&](RankContext& ctx) -> std::string {
    std::vector<float> g(8, 1.0f);
    gradex_handle_t h;
    RANK_REQUIRE(gradex_submit(ctx.engine, "nope", g.data(), &h) == GRADEX_ERR_INVALID_ARGUMENT,
                 "unknown key accepted");
    RANK_REQUIRE(std::string(gradex_last_error()).find("never registered") != std::string::npos,
                 gradex_last_error());
    RANK_OK(gradex_register_tensor(ctx.engine, "g", 8, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
    RANK_REQUIRE(gradex_register_tensor(ctx.engine, "g", 9, GRADEX_FLOAT32, GRADEX_DEVICE_CPU) ==
                     GRADEX_ERR_INVALID_ARGUMENT,
                 "re-registration with another size accepted");
    RANK_OK(gradex_submit(ctx.engine, "g", g.data(), &h));
    gradex_handle_t h2;
    gradex_status_t again = gradex_submit(ctx.engine, "g", g.data(), &h2);
    RANK_OK(gradex_wait(ctx.engine, h));
    RANK_REQUIRE(again == GRADEX_ERR_INVALID_ARGUMENT || again == GRADEX_OK, "status " << again);
    if (again == GRADEX_OK) RANK_OK(gradex_wait(ctx.engine, h2));  // raced: first one had finished
    RANK_REQUIRE(gradex_wait(ctx.engine, h) == GRADEX_ERR_INVALID_ARGUMENT,
                 "released handle waited");
    return "";
  });
  EXPECT_EQ(failures(results), "");
}
