// Decisions every rank agrees on: DGC's schedule follows the exchange counter carried in
// negotiation (the largest any rank announces), not a per-rank count; and ranks that would sum
// differently packed buffers are stopped by the ring's length check with a message naming the
// tensors and the ranks.
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

// Rank 0 packs every tensor in its own bucket (GRADEX_FUSION_MB=0.01), rank 1 all of them in one:
// the engine's own checks cannot see that (keys and sizes agree), the ring's length check does.
TEST(EngineAgreement, DifferentFusionBucketsAreCaughtByTheLengthCheck) {
  auto results = run_ranks(
      2, {"GRADEX_SPARSITY=0", "GRADEX_FP16=0", "GRADEX_MOMENTUM=0", "GRADEX_TIMEOUT_S=5"},
      [&](RankContext& ctx) -> std::string {
        ::setenv("GRADEX_FUSION_MB", ctx.rank == 0 ? "0.01" : "64", 1);
        std::string error;
        if (create_engine(ctx.rank, ctx.world, &ctx.engine, &error) != GRADEX_OK) return error;
        std::vector<std::vector<float>> data(4, std::vector<float>(2000, 1.0f));
        std::vector<gradex_handle_t> h(4);
        for (int t = 0; t < 4; ++t)
          RANK_OK(gradex_register_tensor(ctx.engine, ("layer" + std::to_string(t)).c_str(), 2000,
                                         GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        for (int t = 0; t < 4; ++t)
          RANK_OK(gradex_submit(ctx.engine, ("layer" + std::to_string(t)).c_str(), data[t].data(),
                                &h[t]));
        std::string first;
        gradex_status_t first_status = GRADEX_OK;
        for (int t = 0; t < 4; ++t) {
          gradex_status_t st = gradex_wait(ctx.engine, h[t]);
          if (st != GRADEX_OK && first.empty()) {
            first = gradex_last_error();
            first_status = st;
          }
        }
        RANK_REQUIRE(first_status != GRADEX_OK, "a disagreeing exchange succeeded");
        // Both ranks see the mismatch in the first ring step of the first bucket the two ranks
        // pack differently (each receives a chunk of the other's length), with its tensors named.
        // Which bucket that is depends on how many tensors each round finds ready (a slow round
        // may exchange layer0 alone, identically on both ranks).
        RANK_REQUIRE(first_status == GRADEX_ERR_MISMATCH,
                     "status " << first_status << ": " << first);
        RANK_REQUIRE(first.find("allreduce: rank " + std::to_string(ctx.rank) + " received") !=
                             std::string::npos &&
                         first.find("tensor(s) ['layer") != std::string::npos &&
                         first.find("disagree") != std::string::npos,
                     first);
        return "";
      },
      std::chrono::seconds(120), /*create_engine=*/false);
  EXPECT_EQ(failures(results), "");
}
