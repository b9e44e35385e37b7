// gradex owns momentum on every path (GRADEX_MOMENTUM = m > 0, optimizer momentum 0): dense-policy
// tensors and DGC's dense warm-up steps train exactly like SGD with momentum on the plain average,
// and DGC's sparse steps start from the momentum the dense steps built.
#include <gtest/gtest.h>

#include "capi/engine_access.h"
#include "process_ranks.h"
#include "rank_checks.h"

using namespace gradex::test;

namespace {

// The reference: torch.optim.SGD(momentum=m[, nesterov]) on the plain fp32 average of the ranks'
// gradients: buf = m*buf + avg; step = buf (Nesterov: avg + m*buf). Returns the step's update.
struct ReferenceSgd {
  float m;
  bool nesterov;
  std::vector<float> buf;
  std::vector<float> update(int world, uint64_t seed, int step, size_t n) {
    if (buf.empty()) buf.assign(n, 0.0f);
    std::vector<float> out(n);
    for (size_t i = 0; i < n; ++i) {
      float sum = 0;
      for (int r = 0; r < world; ++r)
        sum += test_value(seed, r, step, i);
      const float avg = sum / static_cast<float>(world);
      buf[i] = m * buf[i] + avg;
      out[i] = nesterov ? avg + m * buf[i] : buf[i];
    }
    return out;
  }
};

// Runs `steps` exchanges of one tensor and compares every step's result with the reference to fp32
// rounding; the parameters (p -= lr * result) too. `expect_fallbacks` checks the DGC dense path.
std::string check_against_sgd(RankContext& ctx, const char* key, size_t n, int steps, float m,
                              bool nesterov, uint64_t seed, int64_t expect_fallbacks) {
  RANK_OK(gradex_register_tensor(ctx.engine, key, n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
  ReferenceSgd ref{m, nesterov, {}};
  std::vector<float> params(n, 0.0f), ref_params(n, 0.0f);
  double worst = 0;
  for (int step = 0; step < steps; ++step) {
    std::vector<float> g = test_vector(seed, ctx.rank, step, n);
    gradex_handle_t h;
    RANK_OK(gradex_submit(ctx.engine, key, g.data(), &h));
    RANK_OK(gradex_wait(ctx.engine, h));
    RANK_OK(gradex_end_step(ctx.engine, nullptr));
    std::vector<float> want = ref.update(ctx.world, seed, step, n);
    for (size_t i = 0; i < n; ++i) {
      // |buf| <= 1 / (1 - m); each step adds a few fp32 roundings of that size.
      const double tol = 2e-6 * (step + 1) / (1.0 - m) + 1e-7;
      const double err = std::fabs(double(g[i]) - want[i]);
      worst = std::max(worst, err);
      RANK_REQUIRE(err <= tol, key << " step " << step << " element " << i << ": " << g[i]
                                   << " vs SGD momentum " << want[i]);
      params[i] -= 0.1f * g[i];
      ref_params[i] -= 0.1f * want[i];
    }
  }
  for (size_t i = 0; i < n; ++i)
    RANK_REQUIRE(std::fabs(params[i] - ref_params[i]) <= 1e-4,
                 key << " parameter " << i << ": " << params[i] << " vs " << ref_params[i]);
  if (expect_fallbacks >= 0) {
    gradex_stats_t s;
    RANK_OK(gradex_get_stats(ctx.engine, 0, &s));
    RANK_REQUIRE(
        static_cast<int64_t>(s.dense_fallbacks) == expect_fallbacks && s.sparse_exchanges == 0,
        "fallbacks " << s.dense_fallbacks << ", sparse " << s.sparse_exchanges);
  }
  return "";
}

}  // namespace

TEST(EngineMomentum, DensePolicyMatchesSgdWithMomentum) {
  for (const char* nesterov : {"0", "1"}) {
    auto results = run_ranks(3,
                             {"GRADEX_SPARSITY=0", "GRADEX_FP16=0", "GRADEX_MOMENTUM=0.9",
                              std::string("GRADEX_NESTEROV=") + nesterov},
                             [&](RankContext& ctx) -> std::string {
                               return check_against_sgd(ctx, "fc.weight", 5000, 50, 0.9f,
                                                        nesterov[0] == '1', 31, -1);
                             });
    EXPECT_EQ(failures(results), "") << "GRADEX_NESTEROV=" << nesterov;
  }
}

// fp16 on the wire: momentum is computed in fp32 before the cast, so the result stays within
// 16-bit rounding of the reference (it would be off by ~10x the gradient without momentum).
TEST(EngineMomentum, DensePolicyWithHalfWireStaysWithinRounding) {
  const size_t n = 3000;
  auto results = run_ranks(
      2, {"GRADEX_SPARSITY=0", "GRADEX_FP16=1", "GRADEX_MOMENTUM=0.9"},
      [&](RankContext& ctx) -> std::string {
        RANK_OK(gradex_register_tensor(ctx.engine, "b", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        ReferenceSgd ref{0.9f, false, {}};
        for (int step = 0; step < 20; ++step) {
          std::vector<float> g = test_vector(5, ctx.rank, step, n);
          gradex_handle_t h;
          RANK_OK(gradex_submit(ctx.engine, "b", g.data(), &h));
          RANK_OK(gradex_wait(ctx.engine, h));
          std::vector<float> want = ref.update(ctx.world, 5, step, n);
          for (size_t i = 0; i < n; ++i)
            RANK_REQUIRE(std::fabs(g[i] - want[i]) <= 4e-3 * (std::fabs(want[i]) + 1),
                         "step " << step << " element " << i << ": " << g[i] << " vs " << want[i]);
        }
        return "";
      });
  EXPECT_EQ(failures(results), "");
}

// A DGC tensor in its warm-up's first stage (density 0.25 >= 1/(2P) with P = 4) goes dense: those
// steps are SGD with momentum too, not plain SGD.
TEST(EngineMomentum, DgcDenseWarmupStepsMatchSgdWithMomentum) {
  for (const char* nesterov : {"0", "1"}) {
    auto results =
        run_ranks(4,
                  {"GRADEX_SPARSITY=0.999", "GRADEX_WARMUP_STEPS=400", "GRADEX_FP16=0",
                   "GRADEX_DENSE_THRESHOLD=1000", "GRADEX_MOMENTUM=0.9",
                   std::string("GRADEX_NESTEROV=") + nesterov},
                  [&](RankContext& ctx) -> std::string {
                    return check_against_sgd(ctx, "w", 20000, 50, 0.9f, nesterov[0] == '1', 77, 50);
                  });
    EXPECT_EQ(failures(results), "") << "GRADEX_NESTEROV=" << nesterov;
  }
}

// Dense warm-up steps, then the first sparse step: that step's momentum starts from the u the dense
// steps built (u carried), and factor masking then zeroes exactly the sent elements.
TEST(EngineMomentum, DenseToSparseTransitionCarriesMomentum) {
  const size_t n = 20000;
  auto results = run_ranks(
      4,
      {"GRADEX_SPARSITY=0.999", "GRADEX_WARMUP_STEPS=8", "GRADEX_FP16=0",
       "GRADEX_DENSE_THRESHOLD=1000", "GRADEX_MOMENTUM=0.9", "GRADEX_SPARSE_VALUES=fp32"},
      [&](RankContext& ctx) -> std::string {
        auto& engine = gradex::capi::engine_of(ctx.engine);
        RANK_OK(gradex_register_tensor(ctx.engine, "w", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        std::vector<float> u(n, 0.0f);  // this rank's own momentum, computed like the engine
        for (int step = 0; step < 3; ++step) {
          std::vector<float> g = test_vector(13, ctx.rank, step, n);
          std::vector<float> u_new(n);
          for (size_t i = 0; i < n; ++i)
            u_new[i] = 0.9f * u[i] + g[i];
          gradex_handle_t h;
          RANK_OK(gradex_submit(ctx.engine, "w", g.data(), &h));
          RANK_OK(gradex_wait(ctx.engine, h));
          RANK_OK(gradex_end_step(ctx.engine, nullptr));
          gradex_stats_t s;
          RANK_OK(gradex_get_stats(ctx.engine, 1, &s));
          std::vector<float> got_u = engine.momentum_of("w");
          std::vector<float> residual = engine.residual_of("w");
          RANK_REQUIRE(got_u.size() == n && residual.size() == n, "state sizes");
          if (step < 2) {  // dense: u kept whole, residual empty
            RANK_REQUIRE(s.dense_fallbacks == 1, "step " << step << " should be dense");
            for (size_t i = 0; i < n; ++i) {
              RANK_REQUIRE(got_u[i] == u_new[i],
                           "step " << step << " u[" << i << "] " << got_u[i] << " vs " << u_new[i]);
              RANK_REQUIRE(residual[i] == 0.0f, "dense step left a residual");
            }
          } else {  // sparse: unsent elements keep u_new (in u and v), sent ones are masked
            RANK_REQUIRE(s.sparse_exchanges == 1, "step 2 should be sparse");
            size_t masked = 0, carried = 0;
            for (size_t i = 0; i < n; ++i) {
              if (got_u[i] == 0.0f && residual[i] == 0.0f) {
                ++masked;
                continue;
              }
              RANK_REQUIRE(got_u[i] == u_new[i] && residual[i] == u_new[i],
                           "element " << i << ": u " << got_u[i] << ", v " << residual[i]
                                      << ", expected the carried momentum " << u_new[i]);
              carried += u[i] != 0.0f;
            }
            // k = 0.0625 * n at stage 2, accepted within [0.8k, 1.3k].
            RANK_REQUIRE(masked >= n / 16 * 8 / 10 && masked <= n / 16 * 13 / 10 + 1,
                         masked << " elements masked");
            RANK_REQUIRE(carried > n / 2, "momentum was not carried over");
          }
          u = u_new;
        }
        return "";
      });
  EXPECT_EQ(failures(results), "");
}

// GRADEX_MOMENTUM=0: dense results are the plain average, bit for bit (nothing changes from
// before).
TEST(EngineMomentum, ZeroMomentumKeepsThePlainAverage) {
  auto results = run_ranks(
      2, {"GRADEX_SPARSITY=0", "GRADEX_FP16=0", "GRADEX_MOMENTUM=0"},
      [&](RankContext& ctx) -> std::string {
        RANK_OK(gradex_register_tensor(ctx.engine, "b", 999, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        for (int step = 0; step < 5; ++step) {
          std::vector<float> g = test_vector(3, ctx.rank, step, 999);
          gradex_handle_t h;
          RANK_OK(gradex_submit(ctx.engine, "b", g.data(), &h));
          RANK_OK(gradex_wait(ctx.engine, h));
          for (size_t i = 0; i < 999; ++i) {
            float want = (test_value(3, 0, step, i) + test_value(3, 1, step, i)) / 2.0f;
            RANK_REQUIRE(g[i] == want, "element " << i);
          }
        }
        RANK_REQUIRE(gradex::capi::engine_of(ctx.engine).momentum_of("b").empty(),
                     "a momentum buffer exists with GRADEX_MOMENTUM=0");
        return "";
      });
  EXPECT_EQ(failures(results), "");
}
