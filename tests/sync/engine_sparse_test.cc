// DGC through the engine: mass conservation, the warm-up schedule with its automatic dense
// fallback, per-tensor overrides and non-finite gradients.
#include <gtest/gtest.h>

#include <limits>

#include "base/half.h"

#include "capi/engine_access.h"
#include "process_ranks.h"
#include "rank_checks.h"

using namespace gradex::test;

// Summed over ranks and steps, what the averages delivered plus what stays in the residuals equals
// what was submitted (error feedback loses nothing).
TEST(EngineSparse, GradientMassIsConserved) {
  const int world = 3;
  const uint64_t n = 50000;
  const int steps = 6;
  auto results = run_ranks(
      world,
      {"GRADEX_SPARSITY=0.99", "GRADEX_MOMENTUM=0", "GRADEX_FP16=0", "GRADEX_DENSE_THRESHOLD=1000",
       "GRADEX_SPARSITY_OVERRIDES=check:dense"},
      [&](RankContext& ctx) -> std::string {
        RANK_OK(gradex_register_tensor(ctx.engine, "w", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        std::vector<double> submitted(n, 0), delivered(n, 0);
        for (int step = 0; step < steps; ++step) {
          std::vector<float> g = test_vector(3, ctx.rank, step, n);
          for (uint64_t i = 0; i < n; ++i)
            submitted[i] += g[i];
          gradex_handle_t h;
          RANK_OK(gradex_submit(ctx.engine, "w", g.data(), &h));
          RANK_OK(gradex_wait(ctx.engine, h));
          uint64_t nonzero = 0;
          for (uint64_t i = 0; i < n; ++i) {
            delivered[i] += g[i];
            nonzero += g[i] != 0;
          }
          // ~1% per rank, at most 3 ranks' worth of distinct elements.
          RANK_REQUIRE(nonzero >= n / 200 && nonzero <= 3 * n * 13 / 1000,
                       "step " << step << ": " << nonzero << " non-zero elements in the average");
          RANK_OK(gradex_end_step(ctx.engine, nullptr));
        }
        gradex_stats_t s;
        RANK_OK(gradex_get_stats(ctx.engine, 0, &s));
        RANK_REQUIRE(s.sparse_exchanges == steps && s.dense_fallbacks == 0,
                     "sparse " << s.sparse_exchanges << " fallbacks " << s.dense_fallbacks);
        RANK_REQUIRE(s.compression_ratio > 20, "compression ratio " << s.compression_ratio);
        // What this rank sent = submitted - residual. Averaged over ranks (a dense fp32 exchange),
        // it must equal the sum of the delivered averages.
        std::vector<float> residual = gradex::capi::engine_of(ctx.engine).residual_of("w");
        RANK_REQUIRE(residual.size() == n, "residual size " << residual.size());
        std::vector<float> sent(n);
        for (uint64_t i = 0; i < n; ++i)
          sent[i] = static_cast<float>(submitted[i] - residual[i]);
        RANK_OK(gradex_register_tensor(ctx.engine, "check", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        gradex_handle_t h;
        RANK_OK(gradex_submit(ctx.engine, "check", sent.data(), &h));
        RANK_OK(gradex_wait(ctx.engine, h));
        double worst = 0;
        for (uint64_t i = 0; i < n; ++i)
          worst = std::max(worst, std::fabs(sent[i] - delivered[i]));
        RANK_REQUIRE(worst < 1e-5, "delivered + residuals != submitted: worst error " << worst);
        return "";
      });
  EXPECT_EQ(failures(results), "");
}

// P = 4: the warm-up stages 0.75 (density 0.25 >= 1/8: dense is cheaper) then 0.9375, 0.984375,
// 0.996 and 0.999 (sparse), two steps each.
TEST(EngineSparse, WarmupStartsDenseThenGoesSparse) {
  const int world = 4;
  const uint64_t n = 40000;
  auto results = run_ranks(
      world,
      {"GRADEX_SPARSITY=0.999", "GRADEX_WARMUP_STEPS=8", "GRADEX_MOMENTUM=0", "GRADEX_FP16=0"},
      [&](RankContext& ctx) -> std::string {
        RANK_OK(
            gradex_register_tensor(ctx.engine, "fc.weight", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        const double stage_sparsity[] = {0.75,     0.75,  0.9375, 0.9375, 0.984375,
                                         0.984375, 0.996, 0.996,  0.999,  0.999};
        for (int step = 0; step < 10; ++step) {
          std::vector<float> g = test_vector(5, ctx.rank, step, n);
          gradex_handle_t h;
          RANK_OK(gradex_submit(ctx.engine, "fc.weight", g.data(), &h));
          RANK_OK(gradex_wait(ctx.engine, h));
          RANK_OK(gradex_end_step(ctx.engine, nullptr));
          gradex_stats_t s;
          RANK_OK(gradex_get_stats(ctx.engine, 1, &s));
          bool dense = step < 2;
          RANK_REQUIRE(
              s.dense_fallbacks == (dense ? 1u : 0u) && s.sparse_exchanges == (dense ? 0u : 1u),
              "step " << step << ": fallbacks " << s.dense_fallbacks << ", sparse "
                      << s.sparse_exchanges);
          uint64_t nonzero = 0;
          for (float x : g)
            nonzero += x != 0;
          // Dense steps may fill everything; sparse ones at most 1.3 k per rank (the selection's
          // cap).
          double k = std::ceil((1 - stage_sparsity[step]) * n);
          uint64_t max_nonzero = dense ? n : static_cast<uint64_t>(world * 1.3 * k + world);
          RANK_REQUIRE(nonzero <= max_nonzero && nonzero >= k / 2,
                       "step " << step << ": " << nonzero << " non-zero");
          if (step ==
              0) {  // a dense step of error feedback with an empty residual is the plain average
            for (uint64_t i = 0; i < n; ++i) {
              float sum = 0;
              for (int r = 0; r < world; ++r)
                sum += test_value(5, r, 0, i);
              RANK_REQUIRE(std::fabs(g[i] - sum / world) < 1e-6, "dense step element " << i);
            }
          }
        }
        return "";
      });
  EXPECT_EQ(failures(results), "");
}

TEST(EngineSparse, NonFiniteGradientsPropagateWithoutPoisoningState) {
  const uint64_t n = 30000;
  auto results = run_ranks(
      2, {"GRADEX_SPARSITY=0.99", "GRADEX_MOMENTUM=0"}, [&](RankContext& ctx) -> std::string {
        RANK_OK(gradex_register_tensor(ctx.engine, "w", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        for (int step = 0; step < 3; ++step) {
          std::vector<float> g = test_vector(9, ctx.rank, step, n);
          if (step == 1 && ctx.rank == 1) g[17] = std::numeric_limits<float>::infinity();
          gradex_handle_t h;
          RANK_OK(gradex_submit(ctx.engine, "w", g.data(), &h));
          RANK_OK(gradex_wait(ctx.engine, h));
          bool any_nan = false;
          for (float x : g)
            any_nan |= std::isnan(x);
          RANK_REQUIRE(any_nan == (step == 1), "step " << step << " NaN in average: " << any_nan);
        }
        std::vector<float> residual = gradex::capi::engine_of(ctx.engine).residual_of("w");
        for (float x : residual)
          RANK_REQUIRE(std::isfinite(x), "residual poisoned");
        gradex_stats_t s;
        RANK_OK(gradex_get_stats(ctx.engine, 0, &s));
        RANK_REQUIRE(s.nonfinite == (ctx.rank == 1 ? 1u : 0u), "nonfinite count " << s.nonfinite);
        return "";
      });
  EXPECT_EQ(failures(results), "");
}

TEST(EngineSparse, OverridesChooseThePolicyByName) {
  auto results = run_ranks(
      1, {"GRADEX_SPARSITY_OVERRIDES=bn:dense,embed*:0.9", "GRADEX_DENSE_THRESHOLD=100"},
      [&](RankContext& ctx) -> std::string {
        auto& engine = gradex::capi::engine_of(ctx.engine);
        RANK_OK(gradex_register_tensor(ctx.engine, "layer1.bn.weight", 5000, GRADEX_FLOAT32,
                                       GRADEX_DEVICE_CPU));
        RANK_OK(gradex_register_tensor(ctx.engine, "embeddings.word", 5000, GRADEX_FLOAT32,
                                       GRADEX_DEVICE_CPU));
        RANK_OK(gradex_register_tensor(ctx.engine, "fc.weight", 5000, GRADEX_FLOAT32,
                                       GRADEX_DEVICE_CPU));
        RANK_OK(
            gradex_register_tensor(ctx.engine, "fc.bias", 10, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        using gradex::sync::Codec;
        using gradex::sync::Rung;
        const Rung dense = gradex::sync::default_dense_rung(engine.options());
        RANK_REQUIRE(engine.applied_policy("layer1.bn.weight").rung == dense, "bn");
        RANK_REQUIRE(engine.applied_policy("embeddings.word").rung == (Rung{Codec::kDgc, 0.9}),
                     "embed");
        RANK_REQUIRE(engine.applied_policy("fc.weight").rung == (Rung{Codec::kDgc, 0.999}), "fc");
        RANK_REQUIRE(engine.applied_policy("fc.bias").rung == dense, "bias");
        return "";
      });
  EXPECT_EQ(failures(results), "");
}

// 16-bit tensors go through fp32 scratch buffers on both paths; results stay within 16-bit rounding
// of the fp32 computation, and DGC's residual keeps what was not sent.
TEST(EngineSparse, HalfPrecisionTensorsOnBothPaths) {
  const uint64_t big = 30000, small = 500;
  auto results = run_ranks(
      2, {"GRADEX_SPARSITY=0.99", "GRADEX_MOMENTUM=0", "GRADEX_FP16=0"},
      [&](RankContext& ctx) -> std::string {
        for (gradex_dtype_t t : {GRADEX_FLOAT16, GRADEX_BFLOAT16}) {
          const bool fp16 = t == GRADEX_FLOAT16;
          const std::string suffix = fp16 ? ".fp16" : ".bf16";
          RANK_OK(gradex_register_tensor(ctx.engine, ("big" + suffix).c_str(), big, t,
                                         GRADEX_DEVICE_CPU));
          RANK_OK(gradex_register_tensor(ctx.engine, ("small" + suffix).c_str(), small, t,
                                         GRADEX_DEVICE_CPU));
          auto to16 = [&](float x) {
            return fp16 ? gradex::float_to_half(x) : gradex::float_to_bf16(x);
          };
          auto from16 = [&](uint16_t h) {
            return fp16 ? gradex::half_to_float(h) : gradex::bf16_to_float(h);
          };
          std::vector<uint16_t> b(big), s(small);
          for (uint64_t i = 0; i < big; ++i)
            b[i] = to16(test_value(21, ctx.rank, 0, i));
          for (uint64_t i = 0; i < small; ++i)
            s[i] = to16(test_value(22, ctx.rank, 0, i));
          gradex_handle_t hb, hs;
          RANK_OK(gradex_submit(ctx.engine, ("big" + suffix).c_str(), b.data(), &hb));
          RANK_OK(gradex_submit(ctx.engine, ("small" + suffix).c_str(), s.data(), &hs));
          RANK_OK(gradex_wait(ctx.engine, hb));
          RANK_OK(gradex_wait(ctx.engine, hs));
          const double eps = fp16 ? 1.0 / 1024 : 1.0 / 128;
          for (uint64_t i = 0; i < small; ++i) {
            double expected = 0.5 * (from16(to16(test_value(22, 0, 0, i))) +
                                     from16(to16(test_value(22, 1, 0, i))));
            RANK_REQUIRE(
                std::fabs(from16(s[i]) - expected) <= eps * std::fabs(expected) + 1e-7,
                suffix << " dense element " << i << ": " << from16(s[i]) << " vs " << expected);
          }
          uint64_t nonzero = 0;
          for (uint16_t h : b) {
            float x = from16(h);
            RANK_REQUIRE(std::isfinite(x), suffix << " non-finite sparse result");
            nonzero += x != 0;
          }
          RANK_REQUIRE(nonzero >= big / 200 && nonzero <= 2 * big * 13 / 1000,
                       suffix << ": " << nonzero << " non-zero elements");
        }
        return "";
      });
  EXPECT_EQ(failures(results), "");
}
