// Decisions every rank agrees on: DGC's schedule follows the exchange counter carried in
// negotiation (the largest any rank announces), not a per-rank count; and ranks that would sum
// differently packed buffers are refused at start-up (sync/negotiation/agreement.h; every agreed
// variable is covered by engine_abort_test.cc).
#include <gtest/gtest.h>

#include <stdlib.h>

#include "capi/engine_access.h"
#include "process_ranks.h"
#include "rank_checks.h"

using namespace gradex::test;

// P = 2, warm-up of 8 steps: steps 0-1 at sparsity 0.75 go dense (density 1/4 >= 1/(2P)), steps
// 2-3 at 0.9375 go sparse. Rank 1 restores a state saved after step 0 once step 1 is done, so its
// own counter says 1 while rank 0's says 2. Both must run step 2 sparse (a per-rank counter would
// send rank 1 into the dense ring while rank 0 allgathers), and continue in step.
TEST(EngineAgreement, DgcScheduleFollowsTheAgreedStepCounter) {
  const uint64_t n = 20000;
  auto results = run_ranks(
      2,
      {"GRADEX_SPARSITY=0.999", "GRADEX_WARMUP_STEPS=8", "GRADEX_DENSE_THRESHOLD=1000",
       "GRADEX_MOMENTUM=0", "GRADEX_TIMEOUT_S=20"},
      [&](RankContext& ctx) -> std::string {
        RANK_OK(gradex_register_tensor(ctx.engine, "w", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        std::vector<char> saved;
        for (int step = 0; step < 5; ++step) {
          std::vector<float> g = test_vector(17, ctx.rank, step, n);
          gradex_handle_t h;
          RANK_OK(gradex_submit(ctx.engine, "w", g.data(), &h));
          RANK_OK(gradex_wait(ctx.engine, h));
          RANK_OK(gradex_end_step(ctx.engine, nullptr));
          gradex_stats_t s;
          RANK_OK(gradex_get_stats(ctx.engine, 1, &s));
          const bool dense = step < 2;
          RANK_REQUIRE(
              s.dense_fallbacks == (dense ? 1u : 0u) && s.sparse_exchanges == (dense ? 0u : 1u),
              "step " << step << ": fallbacks " << s.dense_fallbacks << ", sparse "
                      << s.sparse_exchanges);
          if (ctx.rank == 1 && step == 0) {
            size_t length = 0;
            RANK_OK(gradex_save_state(ctx.engine, nullptr, 0, &length));
            saved.resize(length);
            RANK_OK(gradex_save_state(ctx.engine, saved.data(), length, &length));
          }
          if (ctx.rank == 1 && step == 1)
            RANK_OK(gradex_load_state(ctx.engine, saved.data(), saved.size()));
        }
        return "";
      });
  EXPECT_EQ(failures(results), "");
}

// Rank 0 would pack every tensor in its own bucket (GRADEX_FUSION_MB=0.01), rank 1 all of them in
// one: keys and sizes agree, so negotiation cannot see it. The start-up agreement does (before the
// ring's length check would have to), on both ranks, naming the variable and both values.
TEST(EngineAgreement, DifferentFusionBucketsAreRefusedAtStartUp) {
  auto results = run_ranks(
      2, {"GRADEX_SPARSITY=0", "GRADEX_FP16=0", "GRADEX_MOMENTUM=0", "GRADEX_TIMEOUT_S=5"},
      [&](RankContext& ctx) -> std::string {
        ::setenv("GRADEX_FUSION_MB", ctx.rank == 0 ? "0.01" : "64", 1);
        std::string error;
        const gradex_status_t st = create_engine(ctx.rank, ctx.world, &ctx.engine, &error);
        RANK_REQUIRE(st == GRADEX_ERR_CONFIG, "status " << st << ": " << error);
        RANK_REQUIRE(error.find("GRADEX_FUSION_MB: '0.01' on ranks [0], '64' on ranks [1]") !=
                         std::string::npos,
                     error);
        return "";
      },
      std::chrono::seconds(120), /*create_engine=*/false);
  EXPECT_EQ(failures(results), "");
}
