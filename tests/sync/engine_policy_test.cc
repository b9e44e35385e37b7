// GRADEX_POLICY=auto in the engine (sync/policy/codec_planner.h), real ranks over real UCX: policy
// switches at agreed steps keep error feedback exact and every rank bit-identical; the model's own
// plan on loopback agrees across ranks; fixed is today's policy.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "capi/engine_access.h"
#include "compress/backend/backend.h"
#include "process_ranks.h"
#include "rank_checks.h"
#include "sync/engine/pipeline.h"
#include "sync/policy/codec_planner.h"
#include "sync/policy/policy.h"

namespace gradex::sync {
struct EngineTestAccess {
  static void choice_hook(Engine& e, CodecPlanner::ChoiceHook hook) {
    dynamic_cast<AutoPolicySource&>(*e.policy_).planner().set_choice_hook(std::move(hook));
  }
};
}  // namespace gradex::sync

using namespace gradex::test;
using gradex::sync::cost::Codec;
using gradex::sync::cost::Rung;

namespace {

// A forced schedule of rungs per key and epoch: fp32 in epoch 0 (the first plan, at step 0), then
// the listed rungs from epoch 1 on.
gradex::sync::CodecPlanner::ChoiceHook schedule(std::map<std::string, std::vector<Rung>> rungs) {
  return [rungs](const std::string& key, uint64_t epoch) -> std::optional<Rung> {
    auto it = rungs.find(key);
    if (it == rungs.end() || epoch > it->second.size()) return std::nullopt;
    if (epoch == 0) return Rung{Codec::kFp32, 0};
    return it->second[epoch - 1];
  };
}

uint64_t fnv(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i)
    h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::string hex(uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "hash=%016llx", static_cast<unsigned long long>(v));
  return b;
}

std::string same_hash(const std::vector<std::string>& results) {
  std::vector<std::string> hashes;
  for (const std::string& r : results) {
    const size_t at = r.find("hash=");
    if (at == std::string::npos) return failures(results);
    hashes.push_back(r.substr(at));
  }
  for (const std::string& h : hashes)
    if (h != hashes[0]) return "ranks differ: " + failures(results);
  return "";
}

}  // namespace

// dense -> DGC 99% -> DGC 90% -> dense (residual flushed) -> DGC 99.9%: over ranks and steps,
// what the averages delivered plus what stays in the residuals equals what was submitted.
TEST(EnginePolicy, ErrorFeedbackStaysExactAcrossSwitches) {
  const int world = 3;
  const uint64_t n = 50000;
  const int steps = 10;
  auto results = run_ranks(
      world,
      {"GRADEX_POLICY=auto", "GRADEX_POLICY_INTERVAL=2", "GRADEX_MOMENTUM=0", "GRADEX_FP16=0",
       "GRADEX_SPARSITY_OVERRIDES=check:dense"},
      [&](RankContext& ctx) -> std::string {
        auto& engine = gradex::capi::engine_of(ctx.engine);
        gradex::sync::EngineTestAccess::choice_hook(engine, schedule({{"w",
                                                                       {{Codec::kDgc, 0.99},
                                                                        {Codec::kDgc, 0.9},
                                                                        {Codec::kFp32, 0},
                                                                        {Codec::kDgc, 0.999}}}}));
        RANK_OK(gradex_register_tensor(ctx.engine, "w", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        std::vector<double> submitted(n, 0), delivered(n, 0);
        double residual_after_flush = -1;
        for (int step = 0; step < steps; ++step) {
          std::vector<float> g = test_vector(5, ctx.rank, step, n);
          for (uint64_t i = 0; i < n; ++i)
            submitted[i] += g[i];
          gradex_handle_t h;
          RANK_OK(gradex_submit(ctx.engine, "w", g.data(), &h));
          RANK_OK(gradex_wait(ctx.engine, h));
          for (uint64_t i = 0; i < n; ++i)
            delivered[i] += g[i];
          RANK_OK(gradex_end_step(ctx.engine, nullptr));
          if (step == 6) {  // the first dense step after DGC sent the residual
            double m = 0;
            for (float v : engine.residual_of("w"))
              m = std::max(m, std::fabs(static_cast<double>(v)));
            residual_after_flush = m;
          }
        }
        RANK_REQUIRE(residual_after_flush == 0,
                     "residual after the dense step: " << residual_after_flush);
        const gradex::sync::AppliedPolicy p = engine.applied_policy("w");
        RANK_REQUIRE(p.rung == (gradex::sync::Rung{gradex::sync::Codec::kDgc, 0.999}),
                     "final policy " << p.reason);
        gradex_stats_t s;
        RANK_OK(gradex_get_stats(ctx.engine, 0, &s));
        RANK_REQUIRE(s.sparse_exchanges == 6, "sparse exchanges " << s.sparse_exchanges);
        std::vector<float> residual = engine.residual_of("w");
        RANK_REQUIRE(residual.size() == n, "residual size " << residual.size());
        std::vector<float> sent(n);
        for (uint64_t i = 0; i < n; ++i)
          sent[i] = static_cast<float>(submitted[i] - residual[i]);
        RANK_OK(gradex_register_tensor(ctx.engine, "check", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        gradex_handle_t h;
        RANK_OK(gradex_submit(ctx.engine, "check", sent.data(), &h));
        RANK_OK(gradex_wait(ctx.engine, h));
        double worst = 0;
        for (uint64_t i = 0; i < n; ++i) {
          const double err = std::fabs(sent[i] - delivered[i]);
          worst = std::max(worst, err / (1e-5 * (std::fabs(delivered[i]) + steps)));
        }
        RANK_REQUIRE(worst <= 1.0,
                     "sent + residual vs delivered: worst error / tolerance " << worst);
        return "";
      });
  EXPECT_EQ(failures(results), "");
}

// gradex's momentum (m = 0.9) across dense -> DGC 99% -> DGC 90% -> fp32 -> DGC 99.9%, checked at
// each switch against the state read just before it. Both ranks submit the same gradients, so
// every average is exactly this rank's own contribution. DGC masks u and v where it selects
// (momentum factor masking; v keeps the wire type's rounding error), so per element either the
// value was delivered and u is 0, or u and v carry on and nothing was. A switch that restarted u or
// dropped v fails here.
// `backend`: GRADEX_BACKEND (the switches go through compress/backend/backend.h only, so they must
// hold on the CUDA backend's Thrust code as on the CPU backend).
static void momentum_moves_with_every_switch(const std::string& backend) {
  const int world = 2;
  const uint64_t n = 20000;
  const float m = 0.9f;
  auto results = run_ranks(
      world,
      {"GRADEX_POLICY=auto", "GRADEX_POLICY_INTERVAL=2", "GRADEX_MOMENTUM=0.9", "GRADEX_FP16=0",
       "GRADEX_BACKEND=" + backend},
      [&](RankContext& ctx) -> std::string {
        auto& engine = gradex::capi::engine_of(ctx.engine);
        gradex::sync::EngineTestAccess::choice_hook(engine, schedule({{"w",
                                                                       {{Codec::kDgc, 0.99},
                                                                        {Codec::kDgc, 0.9},
                                                                        {Codec::kFp32, 0},
                                                                        {Codec::kDgc, 0.999}}}}));
        RANK_OK(gradex_register_tensor(ctx.engine, "w", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        auto close = [](double a, double b) {
          return std::fabs(a - b) <= 1e-5 * (std::fabs(a) + std::fabs(b)) + 1e-6;
        };
        std::vector<float> u_before, v_before;
        for (int step = 0; step < 10; ++step) {
          std::vector<float> g = test_vector(7, 0, step, n);  // the same on both ranks
          const std::vector<float> g_in = g;
          gradex_handle_t h;
          RANK_OK(gradex_submit(ctx.engine, "w", g.data(), &h));
          RANK_OK(gradex_wait(ctx.engine, h));
          RANK_OK(gradex_end_step(ctx.engine, nullptr));
          const std::vector<float> u = engine.momentum_of("w");
          const std::vector<float> v = engine.residual_of("w");
          RANK_REQUIRE(u.size() == n, "step " << step << ": momentum size " << u.size());
          if (step == 1) {  // dense: the average is u
            for (uint64_t i = 0; i < n; ++i)
              RANK_REQUIRE(g[i] == u[i], "dense step: average " << g[i] << " vs u " << u[i]);
          }
          if (step == 2 || step == 4 || step == 8) {  // a switch into DGC (from dense or DGC)
            size_t selected = 0;
            for (uint64_t i = 0; i < n; ++i) {
              const double eu = m * u_before[i] + g_in[i];
              const double ev = (v_before.empty() ? 0.0 : v_before[i]) + eu;
              if (u[i] == 0 && g[i] != 0) {
                // Selected: sent in the wire's value type, its rounding error kept in v.
                ++selected;
                RANK_REQUIRE(close(g[i] + v[i], ev) && std::fabs(v[i]) <= 1e-3 * std::fabs(ev),
                             "step " << step << " element " << i << ": sent " << g[i] << " + v "
                                     << v[i] << ", expected " << ev);
              } else {
                RANK_REQUIRE(g[i] == 0 && close(u[i], eu) && close(v[i], ev),
                             "step " << step << " element " << i << ": u " << u[i] << " (" << eu
                                     << "), v " << v[i] << " (" << ev << "), sent " << g[i]);
              }
            }
            RANK_REQUIRE(selected > 0, "step " << step << ": nothing selected");
          }
          if (step == 6) {  // DGC -> fp32: the dense step sends u + v, empties v, keeps u
            for (uint64_t i = 0; i < n; ++i) {
              const double eu = m * u_before[i] + g_in[i];
              RANK_REQUIRE(v[i] == 0 && close(u[i], eu) && close(g[i], v_before[i] + eu),
                           "step 6 element " << i << ": u " << u[i] << " (" << eu << "), v " << v[i]
                                             << ", sent " << g[i]);
            }
          }
          u_before = u;
          v_before = v;
        }
        gradex_stats_t s;
        RANK_OK(gradex_get_stats(ctx.engine, 0, &s));
        RANK_REQUIRE(s.sparse_exchanges == 6, "sparse exchanges " << s.sparse_exchanges);
        return "";
      });
  EXPECT_EQ(failures(results), "");
}

TEST(EnginePolicy, MomentumMovesWithEverySwitch) {
  momentum_moves_with_every_switch("cpu");
}

TEST(EnginePolicy, MomentumMovesWithEverySwitchOnThrust) {
  if (!gradex::compress::backend::backend_available(
          gradex::compress::backend::DeviceType::kThrustOmp))
    GTEST_SKIP() << "this build has no thrust-omp backend";
  momentum_moves_with_every_switch("thrust-omp");
}

// A checkpoint with DGC state (GRADEX_POLICY=fixed) restores into an auto engine, whose tensors
// start dense and whose plan (forced here: the model's own choice depends on measured times) keeps
// this one dense: the state is adopted (residual and u as saved) and the first dense step flushes
// it, sending v + m*u + g and keeping u. Both ranks submit the same gradients (average = own).
TEST(EnginePolicy, CheckpointWithDgcStateRestoresIntoAuto) {
  const int world = 2;
  const uint64_t n = 50000;
  const std::string dir = ::testing::TempDir() + "gradex_policy_ckpt_" + std::to_string(::getpid());
  auto path_of = [&](int rank) { return dir + "." + std::to_string(rank); };
  auto saved = run_ranks(
      world, {"GRADEX_POLICY=fixed", "GRADEX_MOMENTUM=0.9", "GRADEX_FP16=0"},
      [&](RankContext& ctx) -> std::string {
        RANK_OK(gradex_register_tensor(ctx.engine, "w", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        for (int step = 0; step < 3; ++step) {
          std::vector<float> g = test_vector(9, 0, step, n);
          gradex_handle_t h;
          RANK_OK(gradex_submit(ctx.engine, "w", g.data(), &h));
          RANK_OK(gradex_wait(ctx.engine, h));
          RANK_OK(gradex_end_step(ctx.engine, nullptr));
        }
        const std::vector<uint8_t> blob = gradex::capi::engine_of(ctx.engine).save_state();
        FILE* f = std::fopen(path_of(ctx.rank).c_str(), "wb");
        RANK_REQUIRE(f && std::fwrite(blob.data(), 1, blob.size(), f) == blob.size(),
                     "cannot write " << path_of(ctx.rank));
        std::fclose(f);
        return "";
      });
  ASSERT_EQ(failures(saved), "");
  auto results = run_ranks(
      world, {"GRADEX_POLICY=auto", "GRADEX_MOMENTUM=0.9", "GRADEX_FP16=0"},
      [&](RankContext& ctx) -> std::string {
        auto& engine = gradex::capi::engine_of(ctx.engine);
        gradex::sync::EngineTestAccess::choice_hook(
            engine, [](const std::string&, uint64_t) { return std::optional<Rung>(Rung{}); });
        RANK_OK(gradex_register_tensor(ctx.engine, "w", n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        std::vector<uint8_t> blob;
        FILE* f = std::fopen(path_of(ctx.rank).c_str(), "rb");
        RANK_REQUIRE(f != nullptr, "cannot read " << path_of(ctx.rank));
        uint8_t buf[65536];
        for (size_t got; (got = std::fread(buf, 1, sizeof buf, f)) > 0;)
          blob.insert(blob.end(), buf, buf + got);
        std::fclose(f);
        RANK_REQUIRE(!gradex::sync::is_sparse(engine.applied_policy("w").rung.codec),
                     "auto starts dense: " << engine.applied_policy("w").reason);
        engine.load_state(blob.data(), blob.size());
        const std::vector<float> v = engine.residual_of("w");
        const std::vector<float> u = engine.momentum_of("w");
        RANK_REQUIRE(v.size() == n && u.size() == n,
                     "adopted state: v " << v.size() << ", u " << u.size());
        double largest = 0;
        for (float x : v)
          largest = std::max(largest, std::fabs(static_cast<double>(x)));
        RANK_REQUIRE(largest > 0, "the saved residual is empty");
        std::vector<float> g = test_vector(9, 0, 3, n);
        const std::vector<float> g_in = g;
        gradex_handle_t h;
        RANK_OK(gradex_submit(ctx.engine, "w", g.data(), &h));
        RANK_OK(gradex_wait(ctx.engine, h));
        const std::vector<float> v_after = engine.residual_of("w");
        const std::vector<float> u_after = engine.momentum_of("w");
        for (uint64_t i = 0; i < n; ++i) {
          const double eu = 0.9f * u[i] + g_in[i];
          const double tol = 1e-5 * (std::fabs(eu) + std::fabs(v[i])) + 1e-6;
          RANK_REQUIRE(v_after[i] == 0 && std::fabs(u_after[i] - eu) <= tol &&
                           std::fabs(g[i] - (v[i] + eu)) <= tol,
                       "element " << i << ": v " << v_after[i] << ", u " << u_after[i] << " (" << eu
                                  << "), sent " << g[i] << " (" << v[i] + eu << ")");
        }
        return "";
      });
  EXPECT_EQ(failures(results), "");
  for (int r = 0; r < world; ++r)
    std::remove(path_of(r).c_str());
}

// Momentum on, 16-bit wire, several tensors switching between every rung at agreed steps (and
// two left to the model): every rank ends with the same bits.
TEST(EnginePolicy, RanksStayBitIdenticalAcrossSwitches) {
  const int world = 3;
  const std::vector<std::pair<std::string, uint64_t>> tensors{
      {"a", 60000}, {"b", 40000}, {"c", 500}, {"d", 20000}};
  const int steps = 10;
  auto results = run_ranks(
      world, {"GRADEX_POLICY=auto", "GRADEX_POLICY_INTERVAL=2", "GRADEX_MOMENTUM=0.9"},
      [&](RankContext& ctx) -> std::string {
        auto& engine = gradex::capi::engine_of(ctx.engine);
        gradex::sync::EngineTestAccess::choice_hook(
            engine,
            schedule(
                {{"a",
                  {{Codec::kDgc, 0.99}, {Codec::kFp32, 0}, {Codec::kHalf, 0}, {Codec::kDgc, 0.9}}},
                 {"b",
                  {{Codec::kFp32, 0},
                   {Codec::kDgc, 0.999},
                   {Codec::kDgc, 0.99},
                   {Codec::kHalf, 0}}}}));
        for (const auto& [key, n] : tensors)
          RANK_OK(gradex_register_tensor(ctx.engine, key.c_str(), n, GRADEX_FLOAT32,
                                         GRADEX_DEVICE_CPU));
        uint64_t h = 1469598103934665603ull;
        for (int step = 0; step < steps; ++step) {
          std::vector<std::vector<float>> g;
          std::vector<gradex_handle_t> handles;
          for (size_t k = 0; k < tensors.size(); ++k) {
            g.push_back(test_vector(10 + k, ctx.rank, step, tensors[k].second));
            gradex_handle_t handle;
            RANK_OK(gradex_submit(ctx.engine, tensors[k].first.c_str(), g.back().data(), &handle));
            handles.push_back(handle);
          }
          for (size_t k = 0; k < tensors.size(); ++k) {
            RANK_OK(gradex_wait(ctx.engine, handles[k]));
            h = fnv(h, g[k].data(), g[k].size() * sizeof(float));
          }
          RANK_OK(gradex_end_step(ctx.engine, nullptr));
        }
        gradex_stats_t s;
        RANK_OK(gradex_get_stats(ctx.engine, 0, &s));
        // a: DGC at steps 2-3 and 8-9; b: 4-7.
        RANK_REQUIRE(s.sparse_exchanges >= 8, "sparse exchanges " << s.sparse_exchanges);
        const std::string text = explain_text(ctx.engine);
        RANK_REQUIRE(text.find("test hook") != std::string::npos &&
                         text.find("5 plan(s) made") != std::string::npos,
                     "explain:\n"
                         << text);
        return hex(h);
      });
  EXPECT_EQ(same_hash(results), "");
}

// The model's own choices (loopback, probe on, nothing forced): ranks agree bit for bit, and
// gradex_explain shows the plan with predicted and measured times.
TEST(EnginePolicy, ModelPlansAgreeOnLoopback) {
  const int world = 2;
  auto results =
      run_ranks(world, {"GRADEX_POLICY=auto", "GRADEX_POLICY_INTERVAL=3"},
                [&](RankContext& ctx) -> std::string {
                  const uint64_t sizes[] = {300000, 20480, 100};
                  const char* keys[] = {"big", "fc.weight", "bias"};
                  RANK_OK(gradex_register_tensor(ctx.engine, keys[0], sizes[0], GRADEX_FLOAT32,
                                                 GRADEX_DEVICE_CPU));
                  RANK_OK(gradex_register_tensor_rows(ctx.engine, keys[1], sizes[1], GRADEX_FLOAT32,
                                                      GRADEX_DEVICE_CPU, 10));
                  RANK_OK(gradex_register_tensor(ctx.engine, keys[2], sizes[2], GRADEX_FLOAT32,
                                                 GRADEX_DEVICE_CPU));
                  RANK_REQUIRE(gradex_register_tensor_rows(ctx.engine, "odd", 10, GRADEX_FLOAT32,
                                                           GRADEX_DEVICE_CPU,
                                                           3) == GRADEX_ERR_INVALID_ARGUMENT,
                               "3 rows of 10 elements accepted");
                  uint64_t h = 1469598103934665603ull;
                  for (int step = 0; step < 10; ++step) {
                    std::vector<std::vector<float>> g;
                    std::vector<gradex_handle_t> handles(3);
                    for (int k = 0; k < 3; ++k) {
                      g.push_back(test_vector(20 + k, ctx.rank, step, sizes[k]));
                      RANK_OK(gradex_submit(ctx.engine, keys[k], g.back().data(), &handles[k]));
                    }
                    for (int k = 0; k < 3; ++k) {
                      RANK_OK(gradex_wait(ctx.engine, handles[k]));
                      h = fnv(h, g[k].data(), g[k].size() * sizeof(float));
                    }
                    RANK_OK(gradex_end_step(ctx.engine, nullptr));
                  }
                  std::string text = gradex::capi::engine_of(ctx.engine).explain();
                  RANK_REQUIRE(text.find("4 plan(s) made") != std::string::npos &&
                                   text.find("meas_ms") != std::string::npos &&
                                   text.find("fc.weight") != std::string::npos,
                               "explain:\n"
                                   << text);
                  return hex(h);
                });
  EXPECT_EQ(same_hash(results), "");
}

// The auto policy agrees its link in the engine's start, on a short path as on a long one: a
// plugin that starts the engine before the first backward pass hides the probe (~1 s of streams
// on a 1 Gbit/s LAN) behind its set-up instead of the first step. Two emulated hosts: right after
// creation, before any exchange, the link is agreed (loopback: not latency-bound); the fixed
// policy, which never plans, never probes.
TEST(EnginePolicy, AutoAgreesTheLinkInItsStart) {
  const int world = 2;
  const char* hosts[] = {"probe-host-a", "probe-host-b"};
  for (const char* policy : {"GRADEX_POLICY=auto", "GRADEX_POLICY=fixed"}) {
    const bool automatic = std::strcmp(policy, "GRADEX_POLICY=auto") == 0;
    auto results = run_ranks(
        world, {policy, "GRADEX_SHM=0"},
        [&](RankContext& ctx) -> std::string {
          ::setenv("GRADEX_HOST_ID", hosts[ctx.rank], 1);
          std::string error;
          if (create_engine(ctx.rank, ctx.world, &ctx.engine, &error) != GRADEX_OK) return error;
          const int agreed = gradex::capi::engine_of(ctx.engine).link_latency_bound();
          RANK_REQUIRE(agreed == (automatic ? 0 : -1),
                       policy << ": the link after the start is " << agreed
                              << " (1 latency-bound, 0 not, -1 not agreed)");
          return "";
        },
        std::chrono::seconds(120), /*create_engine=*/false);
    EXPECT_EQ(failures(results), "") << policy;
  }
}

// The fidelity ramp's quarters are agreed re-plans: with GRADEX_POLICY_RAMP_STEPS=16 and an
// interval beyond the run, plans come at steps 0, 4 (the refinement and the first quarter), 8
// and 12, and the ranks stay bit-identical through them.
TEST(EnginePolicy, RampQuartersAreAgreedPlans) {
  const int world = 2;
  auto results = run_ranks(
      world, {"GRADEX_POLICY=auto", "GRADEX_POLICY_INTERVAL=50", "GRADEX_POLICY_RAMP_STEPS=16"},
      [&](RankContext& ctx) -> std::string {
        const uint64_t sizes[] = {300000, 100};
        const char* keys[] = {"big", "bias"};
        for (int k = 0; k < 2; ++k)
          RANK_OK(gradex_register_tensor(ctx.engine, keys[k], sizes[k], GRADEX_FLOAT32,
                                         GRADEX_DEVICE_CPU));
        uint64_t h = 1469598103934665603ull;
        for (int step = 0; step < 14; ++step) {
          std::vector<std::vector<float>> g;
          std::vector<gradex_handle_t> handles(2);
          for (int k = 0; k < 2; ++k) {
            g.push_back(test_vector(40 + k, ctx.rank, step, sizes[k]));
            RANK_OK(gradex_submit(ctx.engine, keys[k], g.back().data(), &handles[k]));
          }
          for (int k = 0; k < 2; ++k) {
            RANK_OK(gradex_wait(ctx.engine, handles[k]));
            h = fnv(h, g[k].data(), g[k].size() * sizeof(float));
          }
          RANK_OK(gradex_end_step(ctx.engine, nullptr));
        }
        const std::string text = gradex::capi::engine_of(ctx.engine).explain();
        RANK_REQUIRE(text.find("4 plan(s) made") != std::string::npos, "explain:\n" << text);
        return hex(h);
      });
  EXPECT_EQ(same_hash(results), "");
}

// A plan one step after another (here the ramp's second quarter, at step 5, after the plan at step
// 4) has no step of its own measured: it keeps the calibration the plan before it measured, where
// it had restarted from 1 and lost the measured floor with it.
TEST(EnginePolicy, APlanWithNoStepMeasuredSinceTheLastKeepsItsCalibration) {
  auto results = run_ranks(
      2, {"GRADEX_POLICY=auto", "GRADEX_POLICY_INTERVAL=50", "GRADEX_POLICY_RAMP_STEPS=20"},
      [&](RankContext& ctx) -> std::string {
        const uint64_t size = 2000000;
        RANK_OK(gradex_register_tensor(ctx.engine, "w", size, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        std::vector<std::string> calibration;
        for (int step = 0; step < 6; ++step) {
          std::vector<float> g = test_vector(7, ctx.rank, step, size);
          gradex_handle_t h;
          RANK_OK(gradex_submit(ctx.engine, "w", g.data(), &h));
          RANK_OK(gradex_wait(ctx.engine, h));
          usleep(40000);  // a tail far beyond what the loopback exchange predicts
          RANK_OK(gradex_end_step(ctx.engine, nullptr));
          const std::string text = gradex::capi::engine_of(ctx.engine).explain();
          const size_t at = text.find("calibration ");
          calibration.push_back(at == std::string::npos ? "" : text.substr(at, 16));
        }
        RANK_REQUIRE(calibration[4] != "calibration 1.00", calibration[4]);
        RANK_REQUIRE(calibration[5] == calibration[4],
                     calibration[4] << " then " << calibration[5]);
        return "";
      });
  EXPECT_EQ(failures(results), "");
}

// GRADEX_POLICY_LEARN_LINK=0 (what the delayed exchange's lanes set): the plans keep the start-up
// probe's link, however the collectives' timings read it (here a large tensor's exchanges, whose
// refit moves the numbers of the plan at step 4 when learning is on).
TEST(EnginePolicy, WithoutLearningThePlansKeepTheProbedLink) {
  auto results = run_ranks(
      2,
      {"GRADEX_POLICY=auto", "GRADEX_POLICY_INTERVAL=50", "GRADEX_POLICY_RAMP_STEPS=20",
       "GRADEX_POLICY_LEARN_LINK=0"},
      [&](RankContext& ctx) -> std::string {
        const uint64_t size = 2000000;
        RANK_OK(gradex_register_tensor(ctx.engine, "w", size, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        std::vector<std::string> links, factors;
        for (int step = 0; step < 7; ++step) {
          std::vector<float> g = test_vector(9, ctx.rank, step, size);
          gradex_handle_t h;
          RANK_OK(gradex_submit(ctx.engine, "w", g.data(), &h));
          RANK_OK(gradex_wait(ctx.engine, h));
          RANK_OK(gradex_end_step(ctx.engine, nullptr));
          const std::string text = gradex::capi::engine_of(ctx.engine).explain();
          const size_t at = text.find("link alpha ");
          const size_t end = text.find(';', at);
          links.push_back(at == std::string::npos ? "" : text.substr(at, end - at));
          // Nor the step's calibration and the codecs' measured-over-predicted factors.
          const size_t from = text.find("calibration ");
          factors.push_back(
              from == std::string::npos ? "" : text.substr(from, text.find('\n', from) - from));
        }
        RANK_REQUIRE(!links.front().empty(), "no link in the plan");
        RANK_REQUIRE(links.back() == links.front(), links.front() << " then " << links.back());
        RANK_REQUIRE(factors.back().rfind("calibration 1.00;", 0) == 0, factors.back());
        RANK_REQUIRE(factors.back().find("fp32 1.00, 16-bit 1.00, dgc 1.00") != std::string::npos,
                     factors.back());
        return "";
      });
  EXPECT_EQ(failures(results), "");
}

// GRADEX_POLICY=fixed is today's chain: overrides, then the dense threshold, then GRADEX_SPARSITY.
TEST(EnginePolicy, FixedIsTodaysPolicy) {
  auto results = run_ranks(
      1, {"GRADEX_POLICY=fixed", "GRADEX_SPARSITY_OVERRIDES=emb:0.99,norm:dense"},
      [&](RankContext& ctx) -> std::string {
        auto& engine = gradex::capi::engine_of(ctx.engine);
        const std::pair<const char*, uint64_t> cases[] = {
            {"small", 100}, {"big", 1000000}, {"emb.weight", 500000}, {"norm.weight", 900000}};
        for (const auto& [key, n] : cases) {
          RANK_OK(gradex_register_tensor(ctx.engine, key, n, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
          const gradex::sync::AppliedPolicy want =
              gradex::sync::choose_policy(engine.options(), key, n);
          const gradex::sync::AppliedPolicy got = engine.applied_policy(key);
          RANK_REQUIRE(got.rung == want.rung && got.reason == want.reason &&
                           !gradex::sync::own_fp32_buckets(got.rung, engine.options().half_on_wire),
                       key << ": " << got.reason << " vs " << want.reason);
        }
        RANK_REQUIRE(engine.explain().find("GRADEX_POLICY=fixed") != std::string::npos,
                     engine.explain());
        return "";
      });
  EXPECT_EQ(failures(results), "");
}

// The auto policy's fp32 rung on a 16-bit wire: those dense jobs travel in fp32 buckets of their
// own, after the 16-bit ones, packed at 4 bytes per element; without such jobs the plan is
// today's.
TEST(EnginePolicy, Fp32JobsTravelInBucketsOfTheirOwn) {
  using gradex::sync::pipeline::Job;
  using gradex::sync::pipeline::PlanOptions;
  using gradex::sync::route::Path;
  std::vector<gradex::sync::TensorState> tensors(4);
  const uint64_t sizes[] = {100, 100, 100, 100};
  const bool fp32[] = {false, true, false, true};
  std::vector<Job> jobs(4);
  for (size_t i = 0; i < 4; ++i) {
    tensors[i].key = std::string(1, static_cast<char>('a' + i));
    tensors[i].numel = sizes[i];
    jobs[i].id = {gradex::sync::WorkKind::kGradient, tensors[i].key};
    jobs[i].tensor = &tensors[i];
    jobs[i].path = fp32[i] ? Path::kDenseFp32 : Path::kDense;
  }
  PlanOptions o;
  o.fusion_bytes = 400;  // two 16-bit tensors (200 bytes each), one fp32 tensor (400 bytes)
  o.dense_wire = gradex::DType::kFloat16;
  auto keys = [](const std::deque<gradex::sync::pipeline::Unit>& units) {
    std::vector<std::vector<std::string>> out;
    for (const auto& u : units) {
      out.emplace_back();
      for (const Job* j : u.jobs)
        out.back().push_back(j->id.key);
    }
    return out;
  };
  using K = std::vector<std::vector<std::string>>;
  auto units = gradex::sync::pipeline::plan(jobs, o);
  EXPECT_EQ(keys(units), (K{{"a", "c"}, {"b"}, {"d"}}));
  for (Job& j : jobs)
    j.path = Path::kDense;
  units = gradex::sync::pipeline::plan(jobs, o);
  EXPECT_EQ(keys(units), (K{{"a", "b"}, {"c", "d"}}));
}

// GRADEX_OPTIMIZER=adam under GRADEX_POLICY=auto: the plan's sparse rung is the Adam codec at
// GRADEX_ADAM_SPARSITY ("adam 98%"), measured at start-up, not DGC at GRADEX_POLICY_LADDER's
// sparsities. Forced onto that rung from the first plan, an auto run delivers bit for bit what
// the fixed Adam path delivers (the same codec, the same state), every rank the same bits; a
// switch to dense and back keeps the ranks identical; explain names the rung and its numbers.
namespace {

const uint64_t kAdamNumel = 60000, kAdamRows = 300;

// Every rank's hash of its averages, or "ERROR ..."; `explained`: what rank 0's explain must hold.
std::string adam_run(const std::vector<std::string>& env, int world, int steps,
                     gradex::sync::CodecPlanner::ChoiceHook hook, uint64_t sparse_exchanges,
                     const std::vector<std::string>& explained) {
  auto results = run_ranks(world, env, [&](RankContext& ctx) -> std::string {
    auto& engine = gradex::capi::engine_of(ctx.engine);
    if (hook) gradex::sync::EngineTestAccess::choice_hook(engine, hook);
    RANK_OK(gradex_register_tensor_rows(ctx.engine, "w", kAdamNumel, GRADEX_FLOAT32,
                                        GRADEX_DEVICE_CPU, kAdamRows));
    uint64_t h = 1469598103934665603ull;
    for (int step = 0; step < steps; ++step) {
      std::vector<float> g = test_vector(70, ctx.rank, step, kAdamNumel);
      gradex_handle_t handle;
      RANK_OK(gradex_submit(ctx.engine, "w", g.data(), &handle));
      RANK_OK(gradex_wait(ctx.engine, handle));
      h = fnv(h, g.data(), g.size() * sizeof(float));
      RANK_OK(gradex_end_step(ctx.engine, nullptr));
    }
    gradex_stats_t s;
    RANK_OK(gradex_get_stats(ctx.engine, 0, &s));
    RANK_REQUIRE(s.sparse_exchanges == sparse_exchanges, "sparse exchanges " << s.sparse_exchanges);
    const std::string text = engine.explain();
    for (const std::string& want : explained)
      RANK_REQUIRE(text.find(want) != std::string::npos, "no '" << want << "' in:\n" << text);
    RANK_REQUIRE(text.find("dgc 9") == std::string::npos, "a DGC rung in:\n" << text);
    return hex(h);
  });
  const std::string differ = same_hash(results);
  if (!differ.empty()) return "ERROR " + differ;
  return results[0].substr(results[0].find("hash="));
}

}  // namespace

TEST(EnginePolicy, AutoWithAdamRunsTheAdamRung) {
  const int world = 3, steps = 6;
  const std::vector<std::string> adam = {"GRADEX_OPTIMIZER=adam", "GRADEX_ADAM_SPARSITY=0.98",
                                         "GRADEX_MOMENTUM=0", "GRADEX_FP16=0"};
  std::vector<std::string> fixed = adam, automatic = adam;
  fixed.push_back("GRADEX_POLICY=fixed");
  automatic.push_back("GRADEX_POLICY=auto");
  automatic.push_back("GRADEX_POLICY_INTERVAL=2");
  const std::string reference = adam_run(fixed, world, steps, nullptr, steps, {});
  ASSERT_EQ(reference.rfind("hash=", 0), 0u) << reference;
  const std::string forced = adam_run(automatic, world, steps,
                                      [](const std::string&, uint64_t) -> std::optional<Rung> {
                                        return Rung{Codec::kAdam, 0.98};
                                      },
                                      steps, {"adam 98%", "adam encode", "3 plan(s) made"});
  EXPECT_EQ(forced, reference);
  // fp32 at steps 0-1, the Adam rung at 2-3, fp32 at 4-5 (m flushed), ranks identical.
  const std::string switched =
      adam_run(automatic, world, steps,
               schedule({{"w", {{Codec::kAdam, 0.98}, {Codec::kFp32, 0}}}}), 2, {"fp32"});
  EXPECT_EQ(switched.rfind("hash=", 0), 0u) << switched;
  EXPECT_NE(switched, reference);
}
