// LocalSGD: synchronous warm-up, local steps that leave gradients alone, averaging every H steps
// that leaves identical parameters on every rank.
#include <gtest/gtest.h>

#include <limits>

#include "process_ranks.h"
#include "rank_checks.h"

using namespace gradex::test;

TEST(EngineLocalSgd, WarmupThenPeriodicAveragingGivesIdenticalParameters) {
  for (const char* fp16 : {"0", "1"}) {
    const int world = 3;
    const uint64_t n = 20000;
    auto results = run_ranks(
        world,
        {"GRADEX_LOCALSGD_PERIOD=4", "GRADEX_LOCALSGD_WARMUP_STEPS=2",
         std::string("GRADEX_FP16=") + fp16, "GRADEX_SPARSITY=0", "GRADEX_MOMENTUM=0"},
        [&](RankContext& ctx) -> std::string {
          RANK_OK(gradex_register_tensor(ctx.engine, "w", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
          std::vector<float> params(n, 0.5f);  // identical start
          int averages = 0;
          for (int step = 0; step < 10; ++step) {
            int exchanges = -1;
            RANK_OK(gradex_exchanges_gradients(ctx.engine, &exchanges));
            RANK_REQUIRE(exchanges == (step < 2 ? 1 : 0),
                         "step " << step << " exchanges " << exchanges);
            std::vector<float> g = test_vector(7, ctx.rank, step, n);
            std::vector<float> original = g;
            gradex_handle_t h;
            RANK_OK(gradex_submit(ctx.engine, "w", g.data(), &h));
            RANK_OK(gradex_wait(ctx.engine, h));
            if (!exchanges)
              RANK_REQUIRE(g == original, "local step " << step << " changed the gradient");
            for (uint64_t i = 0; i < n; ++i)
              params[i] -= 0.1f * g[i];
            int average_now = 0;
            RANK_OK(gradex_end_step(ctx.engine, &average_now));
            // Averaging after steps 6 and 10 (2 warm-up steps, then every 4).
            int completed = step + 1;
            RANK_REQUIRE(average_now == ((completed == 6 || completed == 10) ? 1 : 0),
                         "after step " << completed << " average_now=" << average_now);
            if (average_now) {
              ++averages;
              RANK_OK(gradex_average(ctx.engine, "w", params.data(), &h));
              RANK_OK(gradex_wait(ctx.engine, h));
            }
          }
          RANK_REQUIRE(averages == 2, "averages " << averages);
          // Identical parameters are a fixed point of averaging (the delta to the shared anchor is
          // 0 on every rank); parameters that differ anywhere would move towards their mean.
          std::vector<float> copy = params;
          gradex_handle_t h;
          RANK_OK(gradex_average(ctx.engine, "w", copy.data(), &h));
          RANK_OK(gradex_wait(ctx.engine, h));
          for (uint64_t i = 0; i < n; ++i)
            RANK_REQUIRE(copy[i] == params[i], "parameters differ across ranks at "
                                                   << i << ": " << params[i] << " vs average "
                                                   << copy[i]);
          gradex_stats_t s;
          RANK_OK(gradex_get_stats(ctx.engine, 0, &s));
          RANK_REQUIRE(s.parameter_averages == 3, "parameter averages " << s.parameter_averages);
          return "";
        });
    EXPECT_EQ(failures(results), "") << "GRADEX_FP16=" << fp16;
  }
}

// A buffer holding -inf (a causal attention mask kept as a float buffer) is averaged with the
// parameters: an element equal to its anchor must stay as it is, not become inf - inf = NaN.
TEST(EngineLocalSgd, InfiniteValuesEqualToTheAnchorSurviveAveraging) {
  for (const char* fp16 : {"0", "1"}) {
    const uint64_t n = 64;
    auto results = run_ranks(
        2,
        {"GRADEX_LOCALSGD_PERIOD=1", "GRADEX_LOCALSGD_WARMUP_STEPS=0",
         std::string("GRADEX_FP16=") + fp16, "GRADEX_SPARSITY=0", "GRADEX_MOMENTUM=0"},
        [&](RankContext& ctx) -> std::string {
          RANK_OK(gradex_register_tensor(ctx.engine, "mask", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
          std::vector<float> mask(n);
          for (uint64_t i = 0; i < n; ++i)
            mask[i] = i % 2 ? -std::numeric_limits<float>::infinity() : 0.25f;
          for (int round = 0; round < 3; ++round) {  // the first establishes the anchor
            int average_now = 0;
            RANK_OK(gradex_end_step(ctx.engine, &average_now));
            RANK_REQUIRE(average_now == 1, "round " << round << ": no average asked for");
            std::vector<float> copy = mask;
            gradex_handle_t h;
            RANK_OK(gradex_average(ctx.engine, "mask", copy.data(), &h));
            RANK_OK(gradex_wait(ctx.engine, h));
            for (uint64_t i = 0; i < n; ++i)
              RANK_REQUIRE(copy[i] == mask[i], "round " << round << ", element " << i << ": "
                                                        << mask[i] << " averaged to " << copy[i]);
          }
          return "";
        });
    EXPECT_EQ(failures(results), "") << "GRADEX_FP16=" << fp16;
  }
}

// GRADEX_MOMENTUM > 0 with the optimizer at momentum 0: local steps still get momentum, this rank's
// u continuing from the synchronous steps, for dense-policy tensors and DGC tensors alike (the DGC
// tensor here is in its dense warm-up, so its u is the plain per-rank momentum too).
TEST(EngineLocalSgd, LocalStepsKeepGradexMomentum) {
  for (const char* nesterov : {"0", "1"}) {
    const int world = 2;
    const uint64_t small = 700, big = 20000;
    auto results = run_ranks(
        world,
        {"GRADEX_LOCALSGD_PERIOD=3", "GRADEX_LOCALSGD_WARMUP_STEPS=2", "GRADEX_FP16=0",
         "GRADEX_MOMENTUM=0.9", std::string("GRADEX_NESTEROV=") + nesterov, "GRADEX_SPARSITY=0.999",
         "GRADEX_WARMUP_STEPS=400", "GRADEX_DENSE_THRESHOLD=5000"},
        [&](RankContext& ctx) -> std::string {
          const bool nag = nesterov[0] == '1';
          RANK_OK(
              gradex_register_tensor(ctx.engine, "b", small, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
          RANK_OK(gradex_register_tensor(ctx.engine, "w", big, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
          std::vector<float> ub(small, 0.0f), uw(big, 0.0f);  // this rank's own momentum
          for (int step = 0; step < 6; ++step) {
            std::vector<float> b = test_vector(61, ctx.rank, step, small);
            std::vector<float> w = test_vector(62, ctx.rank, step, big);
            std::vector<float> want_b(small), want_w(big);
            for (uint64_t i = 0; i < small; ++i) {
              ub[i] = 0.9f * ub[i] + b[i];
              want_b[i] = nag ? b[i] + 0.9f * ub[i] : ub[i];
            }
            for (uint64_t i = 0; i < big; ++i) {
              uw[i] = 0.9f * uw[i] + w[i];
              want_w[i] = nag ? w[i] + 0.9f * uw[i] : uw[i];
            }
            gradex_handle_t hb, hw;
            RANK_OK(gradex_submit(ctx.engine, "b", b.data(), &hb));
            RANK_OK(gradex_submit(ctx.engine, "w", w.data(), &hw));
            RANK_OK(gradex_wait(ctx.engine, hb));
            RANK_OK(gradex_wait(ctx.engine, hw));
            RANK_OK(gradex_end_step(ctx.engine, nullptr));
            if (step < 2) continue;  // synchronous: averages (covered by the momentum tests)
            for (uint64_t i = 0; i < small; ++i)
              RANK_REQUIRE(
                  std::fabs(b[i] - want_b[i]) <= 1e-6f * (std::fabs(want_b[i]) + 1),
                  "local step " << step << " b[" << i << "] " << b[i] << " vs " << want_b[i]);
            for (uint64_t i = 0; i < big; ++i)
              RANK_REQUIRE(
                  std::fabs(w[i] - want_w[i]) <= 1e-6f * (std::fabs(want_w[i]) + 1),
                  "local step " << step << " w[" << i << "] " << w[i] << " vs " << want_w[i]);
          }
          return "";
        });
    EXPECT_EQ(failures(results), "") << "GRADEX_NESTEROV=" << nesterov;
  }
}
