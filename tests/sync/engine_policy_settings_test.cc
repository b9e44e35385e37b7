// The precedence between GRADEX_POLICY and the settings of one policy
// (sync/policy/policy_settings.h): what a user writes is honoured exactly or rejected at start-up
// naming both settings.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "base/config.h"
#include "base/error.h"
#include "process_ranks.h"
#include "rank_checks.h"
#include "sync/policy/policy_settings.h"

using namespace gradex::test;
using gradex::config::Config;
using gradex::config::Source;
using gradex::sync::resolve_policy;

namespace {

Config env_config(const std::vector<std::string>& env, const std::vector<std::string>& api = {}) {
  Config c = Config::from_strings(env, Source::kEnvironment);
  for (const std::string& a : api) {
    const size_t eq = a.find('=');
    c.set(a.substr(0, eq), a.substr(eq + 1), Source::kApi);
  }
  return c;
}

// The ConfigError's message, or "" when `config` resolves.
std::string resolution_error(const Config& config) {
  try {
    resolve_policy(config);
  } catch (const gradex::ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(PolicySettings, TheDefaultIsAutoUntilAFixedSettingIsGiven) {
  EXPECT_EQ(resolve_policy(env_config({})).policy, "auto");
  EXPECT_EQ(
      resolve_policy(env_config({"GRADEX_FP16=0", "GRADEX_MOMENTUM=0.9",
                                 "GRADEX_POLICY_LADDER=0.99", "GRADEX_SPARSITY_OVERRIDES=x:dense"}))
          .policy,
      "auto");  // settings auto reads too, or auto's own, keep auto
  for (const char* fixed_setting :
       {"GRADEX_SPARSITY=0.99", "GRADEX_WARMUP_STEPS=50", "GRADEX_DENSE_THRESHOLD=4096"}) {
    const auto r = resolve_policy(env_config({fixed_setting}));
    EXPECT_EQ(r.policy, "fixed") << fixed_setting;
    EXPECT_NE(r.reason.find(std::string(fixed_setting) + " (environment)"), std::string::npos)
        << r.reason;
  }
  // Through the API (a plugin's config=) as through the environment.
  EXPECT_EQ(resolve_policy(env_config({}, {"GRADEX_SPARSITY=0"})).policy, "fixed");
  // The value equal to the default still counts: the user wrote it.
  EXPECT_EQ(resolve_policy(env_config({"GRADEX_SPARSITY=0.999"})).policy, "fixed");
  // The horizon describes the training and never decides the policy.
  EXPECT_EQ(resolve_policy(env_config({"GRADEX_POLICY_HORIZON_STEPS=100"})).policy, "auto");
  EXPECT_EQ(
      resolve_policy(env_config({"GRADEX_SPARSITY=0.99", "GRADEX_POLICY_HORIZON_STEPS=9"})).policy,
      "fixed");
}

TEST(PolicySettings, ContradictionsNameBothSettings) {
  std::string e = resolution_error(env_config({"GRADEX_POLICY=auto", "GRADEX_SPARSITY=0.99"}));
  EXPECT_NE(e.find("GRADEX_SPARSITY=0.99 (environment)"), std::string::npos) << e;
  EXPECT_NE(e.find("GRADEX_POLICY=auto (environment)"), std::string::npos) << e;
  e = resolution_error(env_config({"GRADEX_POLICY=fixed", "GRADEX_POLICY_RAMP_STEPS=10"}));
  EXPECT_NE(e.find("GRADEX_POLICY_RAMP_STEPS=10 (environment)"), std::string::npos) << e;
  EXPECT_NE(e.find("GRADEX_POLICY=fixed (environment)"), std::string::npos) << e;
  e = resolution_error(env_config({"GRADEX_WARMUP_STEPS=5", "GRADEX_POLICY_LADDER=0.9"}));
  EXPECT_NE(e.find("GRADEX_WARMUP_STEPS=5 (environment)"), std::string::npos) << e;
  EXPECT_NE(e.find("GRADEX_POLICY_LADDER=0.9 (environment)"), std::string::npos) << e;
  // A program's config= against the user's environment is a contradiction too.
  e = resolution_error(env_config({"GRADEX_POLICY=auto"}, {"GRADEX_DENSE_THRESHOLD=10"}));
  EXPECT_NE(e.find("GRADEX_DENSE_THRESHOLD=10 (api)"), std::string::npos) << e;
  // Consistent settings resolve.
  EXPECT_EQ(resolution_error(env_config({"GRADEX_POLICY=fixed", "GRADEX_SPARSITY=0.9"})), "");
  EXPECT_EQ(resolution_error(env_config({"GRADEX_POLICY=auto", "GRADEX_POLICY_LADDER=0.9"})), "");
}

TEST(PolicySettings, APolicyTheProgramSetsMasksTheEnvironmentsOtherPolicy) {
  // A plugin's exact collectives engine (config= GRADEX_POLICY=fixed, GRADEX_SPARSITY=0) beside
  // a user environment tuned for auto: that engine runs fixed, the environment is for the others.
  const Config c = env_config({"GRADEX_POLICY=auto", "GRADEX_POLICY_LADDER=0.99"},
                              {"GRADEX_POLICY=fixed", "GRADEX_SPARSITY=0"});
  EXPECT_EQ(resolution_error(c), "");
  EXPECT_EQ(resolve_policy(c).policy, "fixed");
  // ... but not a contradiction the program wrote itself.
  EXPECT_NE(resolution_error(env_config({}, {"GRADEX_POLICY=fixed", "GRADEX_POLICY_INT8=1"})), "");
}

// Every rung switch of the auto ladder is a setting only auto reads: under fixed it would do
// nothing, so it is refused rather than ignored.
TEST(PolicySettings, TheLaddersRungSwitchesContradictFixed) {
  for (const char* rung :
       {"GRADEX_POLICY_INT8=1", "GRADEX_POLICY_INT4=0", "GRADEX_POLICY_FIDELITY_INT8=0"}) {
    const std::string e = resolution_error(env_config({"GRADEX_POLICY=fixed", rung}));
    EXPECT_NE(e.find(std::string(rung) + " (environment)"), std::string::npos) << e;
    EXPECT_NE(resolution_error(env_config({"GRADEX_SPARSITY=0.99", rung})), "") << rung;
  }
}

TEST(PolicySettings, ResolvedPolicyIsWrittenIntoTheConfiguration) {
  const Config c = gradex::sync::with_resolved_policy(env_config({"GRADEX_SPARSITY=0.5"}), false);
  EXPECT_EQ(c.get_string("GRADEX_POLICY"), "fixed");
  EXPECT_EQ(gradex::sync::with_resolved_policy(env_config({}), false).get_string("GRADEX_POLICY"),
            "auto");
}

// The settings earlier docs told users to write, under the shipped default (GRADEX_POLICY unset):
// the explicit sparsity gives its ratio after the warm-up, on the fixed policy's thresholds.
TEST(EnginePolicySettings, ExplicitSparsityGivesItsRatioUnderTheShippedDefault) {
  auto results = run_ranks(
      4,
      {"GRADEX_POLICY", "GRADEX_SPARSITY=0.99", "GRADEX_WARMUP_STEPS=4",
       "GRADEX_DENSE_THRESHOLD=4096"},
      [](RankContext& ctx) -> std::string {
        const size_t big = 200000, small = 1000;
        RANK_OK(gradex_register_tensor(ctx.engine, "fc.weight", big, GRADEX_FLOAT32,
                                       GRADEX_DEVICE_CPU));
        RANK_OK(gradex_register_tensor(ctx.engine, "fc.bias", small, GRADEX_FLOAT32,
                                       GRADEX_DEVICE_CPU));
        for (int step = 0; step < 8; ++step) {
          std::vector<float> w = test_vector(7, ctx.rank, step, big);
          std::vector<float> b = test_vector(8, ctx.rank, step, small);
          gradex_handle_t hw, hb;
          RANK_OK(gradex_submit(ctx.engine, "fc.weight", w.data(), &hw));
          RANK_OK(gradex_submit(ctx.engine, "fc.bias", b.data(), &hb));
          RANK_OK(gradex_wait(ctx.engine, hw));
          RANK_OK(gradex_wait(ctx.engine, hb));
          RANK_OK(gradex_end_step(ctx.engine, nullptr));
        }
        gradex_stats_t s;
        RANK_OK(gradex_get_stats(ctx.engine, 1, &s));
        // DGC at 99% on 200,000 of 201,000 elements: about 1/50 of the fp32 ring's bytes.
        RANK_REQUIRE(s.compression_ratio >= 20, "last step's ratio " << s.compression_ratio);
        const std::string plan = explain_text(ctx.engine);
        RANK_REQUIRE(plan.rfind("GRADEX_POLICY=fixed", 0) == 0, plan.substr(0, 200));
        return "";
      });
  EXPECT_EQ(failures(results), "");
}

// "Everything dense fp32, momentum in gradex" under the shipped default is momentum SGD on the
// dense average, bit for bit: each rank's u = m u + g, then the average of the u (two ranks: one
// exact sum and an exact halving).
TEST(EnginePolicySettings, ExplicitDenseFp32WithMomentumIsMomentumSgdBitForBit) {
  auto results = run_ranks(
      2, {"GRADEX_POLICY", "GRADEX_SPARSITY=0", "GRADEX_FP16=0", "GRADEX_MOMENTUM=0.9"},
      [](RankContext& ctx) -> std::string {
        const size_t n = 50000;
        const float m = 0.9f;
        RANK_OK(gradex_register_tensor(ctx.engine, "w", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        std::vector<std::vector<float>> u(2, std::vector<float>(n, 0.0f));
        for (int step = 0; step < 6; ++step) {
          std::vector<float> g = test_vector(11, ctx.rank, step, n);
          gradex_handle_t h;
          RANK_OK(gradex_submit(ctx.engine, "w", g.data(), &h));
          RANK_OK(gradex_wait(ctx.engine, h));
          RANK_OK(gradex_end_step(ctx.engine, nullptr));
          for (int r = 0; r < 2; ++r) {
            const std::vector<float> gr = test_vector(11, r, step, n);
            for (size_t i = 0; i < n; ++i) {
              volatile float scaled = m * u[r][i];  // no fused multiply-add: as the engine rounds
              u[r][i] = scaled + gr[i];
            }
          }
          for (size_t i = 0; i < n; ++i) {
            const float want = (u[0][i] + u[1][i]) * 0.5f;
            RANK_REQUIRE(g[i] == want, "step " << step << " element " << i << ": " << g[i]
                                               << " vs momentum SGD " << want);
          }
        }
        const std::string plan = explain_text(ctx.engine);
        RANK_REQUIRE(plan.rfind("GRADEX_POLICY=fixed", 0) == 0, plan.substr(0, 200));
        return "";
      });
  EXPECT_EQ(failures(results), "");
}

TEST(EnginePolicySettings, ContradictionFailsEngineCreationOnEveryRank) {
  auto results = run_ranks(
      2, {"GRADEX_POLICY=auto", "GRADEX_SPARSITY=0.99"},
      [](RankContext& ctx) -> std::string {
        gradex_engine_t* engine = nullptr;
        std::string error;
        RANK_REQUIRE(create_engine(ctx.rank, ctx.world, &engine, &error) == GRADEX_ERR_CONFIG,
                     "engine created: " << error);
        RANK_REQUIRE(error.find("GRADEX_SPARSITY=0.99") != std::string::npos &&
                         error.find("GRADEX_POLICY=auto") != std::string::npos,
                     error);
        return "";
      },
      std::chrono::seconds(60), /*create_engine=*/false);
  EXPECT_EQ(failures(results), "");
}

// The resolved policy is agreed: a rank whose environment gives a fixed-policy setting (even at
// its default value) and one whose environment does not cannot silently run different policies.
TEST(EnginePolicySettings, RanksResolvingDifferentPoliciesFailTheAgreement) {
  auto results = run_ranks(
      2, {"GRADEX_POLICY", "GRADEX_TIMEOUT_S=20"},
      [](RankContext& ctx) -> std::string {
        if (ctx.rank == 0) ::setenv("GRADEX_SPARSITY", "0.999", 1);
        gradex_engine_t* engine = nullptr;
        std::string error;
        RANK_REQUIRE(create_engine(ctx.rank, ctx.world, &engine, &error) != GRADEX_OK,
                     "engine created with different policies");
        RANK_REQUIRE(error.find("GRADEX_POLICY") != std::string::npos, error);
        return "";
      },
      std::chrono::seconds(90), /*create_engine=*/false);
  EXPECT_EQ(failures(results), "");
}
