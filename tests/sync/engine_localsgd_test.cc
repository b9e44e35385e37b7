// LocalSGD: synchronous warm-up, local steps that leave gradients alone, averaging every H steps
// that leaves identical parameters on every rank.
#include <gtest/gtest.h>

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
         std::string("GRADEX_FP16=") + fp16, "GRADEX_SPARSITY=0"},
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
