// GRADEX_CLIP_NORM: gradients are clipped by the norm of the whole step's gradient on each rank
// (given through gradex_set_gradient_norm), scaled by N^-1/2, on dense and DGC tensors alike and
// before any momentum or residual sees them.
#include <gtest/gtest.h>

#include "capi/engine_access.h"
#include "process_ranks.h"
#include "rank_checks.h"

using namespace gradex::test;

namespace {

const uint64_t kSmall = 1000, kBig = 20000;

double step_norm(int rank, int step) {
  double sum = 0;
  for (uint64_t i = 0; i < kSmall; ++i)
    sum += double(test_value(51, rank, step, i)) * test_value(51, rank, step, i);
  for (uint64_t i = 0; i < kBig; ++i)
    sum += double(test_value(52, rank, step, i)) * test_value(52, rank, step, i);
  return std::sqrt(sum);
}

// The factor the engine must use: min(1, C / sqrt(N) / norm), rounded to float.
float factor(double clip, int world, double norm) {
  const double limit = clip / std::sqrt(double(world));
  return norm > limit ? static_cast<float>(limit / norm) : 1.0f;
}

const std::vector<std::string> kEnv = {
    "GRADEX_CLIP_NORM=2", "GRADEX_SPARSITY=0.99", "GRADEX_DENSE_THRESHOLD=5000",
    "GRADEX_MOMENTUM=0",  "GRADEX_FP16=0",        "GRADEX_SPARSE_VALUES=fp32"};

}  // namespace

TEST(EngineClip, WholeStepNormClipsDenseAndSparseTensorsAlike) {
  const int world = 2;
  auto results = run_ranks(world, kEnv, [&](RankContext& ctx) -> std::string {
    auto& engine = gradex::capi::engine_of(ctx.engine);
    RANK_OK(gradex_register_tensor(ctx.engine, "small", kSmall, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
    RANK_OK(gradex_register_tensor(ctx.engine, "big", kBig, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
    RANK_REQUIRE(gradex_set_gradient_norm(ctx.engine, -1.0) == GRADEX_ERR_INVALID_ARGUMENT,
                 "a negative norm was accepted");
    std::vector<float> small = test_vector(51, ctx.rank, 0, kSmall);
    std::vector<float> big = test_vector(52, ctx.rank, 0, kBig);
    const std::vector<float> big_in = big;
    RANK_OK(gradex_set_gradient_norm(ctx.engine, step_norm(ctx.rank, 0)));
    gradex_handle_t hs, hb;
    RANK_OK(gradex_submit(ctx.engine, "small", small.data(), &hs));
    RANK_OK(gradex_submit(ctx.engine, "big", big.data(), &hb));
    RANK_OK(gradex_wait(ctx.engine, hs));
    RANK_OK(gradex_wait(ctx.engine, hb));
    RANK_OK(gradex_end_step(ctx.engine, nullptr));
    RANK_REQUIRE(engine.step_clip_scale() == -1.0f, "the factor outlived its step");
    // Dense: the average of each rank's clipped gradient.
    std::vector<float> c(world);
    for (int r = 0; r < world; ++r) {
      c[r] = factor(2.0, world, step_norm(r, 0));
      RANK_REQUIRE(c[r] < 0.05f, "the test's gradients should be clipped hard: " << c[r]);
    }
    for (uint64_t i = 0; i < kSmall; ++i) {
      float want = (test_value(51, 0, 0, i) * c[0] + test_value(51, 1, 0, i) * c[1]) / 2.0f;
      RANK_REQUIRE(std::fabs(small[i] - want) <= 1e-7f,
                   "dense element " << i << ": " << small[i] << " vs " << want);
    }
    // DGC: what stays in the residual is the clipped gradient, exactly.
    std::vector<float> v = engine.residual_of("big");
    size_t kept = 0;
    for (uint64_t i = 0; i < kBig; ++i) {
      if (v[i] == 0.0f) continue;
      ++kept;
      RANK_REQUIRE(v[i] == big_in[i] * c[ctx.rank],
                   "residual " << i << ": " << v[i] << " vs " << big_in[i] * c[ctx.rank]);
    }
    RANK_REQUIRE(kept > kBig * 9 / 10, "residual holds " << kept << " elements");
    return "";
  });
  EXPECT_EQ(failures(results), "");
}

// Without a norm for the step, each tensor is clipped by its own norm (the documented fallback).
TEST(EngineClip, WithoutAStepNormEachTensorIsClippedByItsOwnNorm) {
  const int world = 2;
  auto results = run_ranks(world, kEnv, [&](RankContext& ctx) -> std::string {
    RANK_OK(gradex_register_tensor(ctx.engine, "small", kSmall, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
    std::vector<float> small = test_vector(51, ctx.rank, 0, kSmall);
    gradex_handle_t h;
    RANK_OK(gradex_submit(ctx.engine, "small", small.data(), &h));
    RANK_OK(gradex_wait(ctx.engine, h));
    std::vector<float> c(world);
    for (int r = 0; r < world; ++r) {
      double sum = 0;
      for (uint64_t i = 0; i < kSmall; ++i)
        sum += double(test_value(51, r, 0, i)) * test_value(51, r, 0, i);
      c[r] = factor(2.0, world, std::sqrt(sum));
    }
    for (uint64_t i = 0; i < kSmall; ++i) {
      float want = (test_value(51, 0, 0, i) * c[0] + test_value(51, 1, 0, i) * c[1]) / 2.0f;
      // The engine sums squares in fp32 blocks: its norm differs from this double one by ~1e-5
      // (relative to the terms: their sum may cancel).
      const float terms =
          std::fabs(test_value(51, 0, 0, i) * c[0]) + std::fabs(test_value(51, 1, 0, i) * c[1]);
      RANK_REQUIRE(std::fabs(small[i] - want) <= 3e-5f * terms + 1e-10f,
                   "element " << i << ": " << small[i] << " vs " << want);
    }
    return "";
  });
  EXPECT_EQ(failures(results), "");
}
