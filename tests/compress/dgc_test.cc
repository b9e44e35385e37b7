// DgcCompressor: the exact invariant over many random steps, selection bounds, the schedule, the
// identity at sparsity 0, dense steps and clipping.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "compress/compress.h"
#include "compress/dgc/schedule.h"
#include "test_util.h"

namespace gradex::compress {
namespace {

using test::random_grad;

bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, 4) == 0;
}

// Runs `steps` steps and checks, per step and element: sent + v_new == v_old + update exactly,
// u masked at the selection, bounds on the count, and that the selection is a top set of |v|.
void check_invariant(DgcOptions o, size_t n, int steps) {
  DgcCompressor dgc(n, o);
  std::vector<float> u_old(n, 0.0f), v_old(n, 0.0f), expect_v(n), expect_u(n), sent(n);
  const float m = o.momentum;
  for (int s = 0; s < steps; ++s) {
    // Gradients of varying scale, some exact zeros, so thresholds move between steps.
    std::vector<float> g = random_grad(n, 1000 + s, 1.0f + (s % 3), 17);
    for (size_t i = 0; i < n; ++i) {
      float ui = m * u_old[i] + g[i];
      expect_u[i] = m == 0.0f ? 0.0f : ui;
      if (m == 0.0f) {
        expect_v[i] = v_old[i] + g[i];
      } else {
        expect_v[i] = o.nesterov ? v_old[i] + (g[i] + m * ui) : v_old[i] + ui;
      }
    }
    const Selection& sel = dgc.step(g.data());
    const size_t c = sel.indices.size();
    const dgc::CountBounds b = dgc::count_bounds(o, n, sel.sparsity);
    ASSERT_EQ(sel.values.size(), c);
    ASSERT_GE(c, b.low) << "step " << s;
    ASSERT_LE(c, b.high) << "step " << s;
    std::fill(sent.begin(), sent.end(), 0.0f);
    for (size_t j = 0; j < c; ++j) {
      ASSERT_LT(sel.indices[j], n);
      if (j) {
        ASSERT_GT(sel.indices[j], sel.indices[j - 1]);
      }
      sent[sel.indices[j]] = sel.values[j];
    }
    const float* v = dgc.residual();
    const float* u = dgc.momentum_buffer();
    for (size_t i = 0; i < n; ++i)
      ASSERT_TRUE(same_bits(sent[i] + v[i], expect_v[i]))
          << "step " << s << " element " << i << ": " << sent[i] << " + " << v[i]
          << " != " << expect_v[i];
    // The selection is a top set by magnitude of the new v (before masking).
    float min_sel = INFINITY, max_rest = 0;
    std::vector<uint8_t> chosen(n, 0);
    for (uint32_t i : sel.indices) {
      chosen[i] = 1;
      min_sel = std::min(min_sel, std::fabs(expect_v[i]));
    }
    for (size_t i = 0; i < n; ++i)
      if (!chosen[i]) max_rest = std::max(max_rest, std::fabs(expect_v[i]));
    ASSERT_GE(min_sel, max_rest) << "step " << s;
    ASSERT_EQ(sel.threshold, min_sel);
    for (size_t i = 0; i < n; ++i) {
      if (m == 0.0f) {
        ASSERT_EQ(u, nullptr);
        break;
      }
      ASSERT_TRUE(same_bits(u[i], chosen[i] ? 0.0f : expect_u[i])) << "u at " << i;
    }
    std::copy(v, v + n, v_old.begin());
    if (u) std::copy(u, u + n, u_old.begin());
  }
}

class DgcInvariant : public ::testing::TestWithParam<std::tuple<float, bool, DType, double, int>> {
};

TEST_P(DgcInvariant, HoldsExactlyOverManySteps) {
  auto [m, nesterov, dtype, sparsity, threads] = GetParam();
  DgcOptions o;
  o.momentum = m;
  o.nesterov = nesterov;
  o.value_dtype = dtype;
  o.sparsity = sparsity;
  o.threads = threads;
  o.parallel_min_elements = 1024;  // reach the multi-threaded paths on small tensors
  o.seed = 7;
  check_invariant(o, 50000, 40);
}

INSTANTIATE_TEST_SUITE_P(Sweep, DgcInvariant,
                         ::testing::Values(std::make_tuple(0.9f, false, DType::kFloat32, 0.999, 1),
                                           std::make_tuple(0.9f, true, DType::kFloat32, 0.99, 1),
                                           std::make_tuple(0.0f, false, DType::kFloat32, 0.999, 1),
                                           std::make_tuple(0.9f, false, DType::kFloat16, 0.99, 1),
                                           std::make_tuple(0.5f, true, DType::kBFloat16, 0.999, 1),
                                           std::make_tuple(0.9f, false, DType::kFloat32, 0.999, 3),
                                           std::make_tuple(0.0f, false, DType::kFloat16, 0.9, 4)));

TEST(Dgc, InvariantWithWarmupRandomSamplingAndNoHint) {
  DgcOptions o;
  o.warmup_steps = 20;
  o.sample_mode = SampleMode::kRandom;
  o.reuse_threshold = false;
  check_invariant(o, 30000, 30);
}

TEST(Dgc, InvariantWithExactSelection) {
  DgcOptions o;
  o.exact_selection = true;
  o.sparsity = 0.99;
  check_invariant(o, 20000, 10);
}

// How many threads split a tensor never changes a bit of a step: the selection and its sampled
// threshold, the adaptation rounds, the residual, the momentum, the cleared gradient, dense steps,
// DGC's own clipping (a norm over fixed blocks) and the saved state, with 1 to 16 chunks (the
// tensor is large enough for 16 chunks of at least 64Ki elements). Each case reaches another
// selection path: the reused threshold (its candidate buffers overflowing when the gradient's scale
// jumps), the sampled threshold and its rounds (strided and random samples), the exact top-k.
TEST(Dgc, ThreadCountDoesNotChangeAnyBitOfTheState) {
  const size_t n = (size_t{1} << 20) + 4099;
  struct Case {
    const char* name;
    DgcOptions o;
  };
  std::vector<Case> cases(4);
  cases[0].name = "reused threshold, clipping, fp16 values, warm-up";
  cases[0].o.momentum = 0.9f;
  cases[0].o.value_dtype = DType::kFloat16;
  cases[0].o.clip_norm = 40.0f;
  cases[0].o.world_size = 4;
  cases[0].o.warmup_steps = 4;
  cases[1].name = "sampled threshold (strided), Nesterov";
  cases[1].o.reuse_threshold = false;
  cases[1].o.momentum = 0.5f;
  cases[1].o.nesterov = true;
  cases[2].name = "sampled threshold (random), 99%";
  cases[2].o.reuse_threshold = false;
  cases[2].o.sample_mode = SampleMode::kRandom;
  cases[2].o.sparsity = 0.99;
  cases[3].name = "exact selection";
  cases[3].o.exact_selection = true;
  for (Case& c : cases) {
    c.o.parallel_min_elements = 1024;
    c.o.seed = 11;
    std::vector<std::unique_ptr<DgcCompressor>> dgc;
    const std::vector<int> threads = {1, 2, 3, 4, 7, 16};
    for (int t : threads) {
      DgcOptions o = c.o;
      o.threads = t;
      dgc.push_back(std::make_unique<DgcCompressor>(n, o));
    }
    for (int step = 0; step < 9; ++step) {
      // Scale jumps (x1, x8, x1/8) move the threshold far from the last one.
      const float scale = step % 3 == 1 ? 8.0f : step % 3 == 2 ? 0.125f : 1.0f;
      const std::vector<float> g = random_grad(n, 500 + step, scale, 13);
      std::vector<float> cleared0, dense0;
      const Selection* s0 = nullptr;
      for (size_t k = 0; k < dgc.size(); ++k) {
        std::vector<float> cleared = g, dense(n);
        const Selection* s = nullptr;
        if (step == 5)
          dgc[k]->step_dense(g.data(), dense.data(), 0.75f);
        else
          s = &dgc[k]->step_and_clear(cleared.data(), 0.75f);
        const std::string what = std::string(c.name) + ", step " + std::to_string(step) + ", " +
                                 std::to_string(threads[k]) + " threads";
        if (k == 0) {
          s0 = s;
          cleared0 = cleared;
          dense0 = dense;
          continue;
        }
        ASSERT_EQ(0, std::memcmp(cleared.data(), cleared0.data(), n * 4)) << what;
        ASSERT_EQ(0, std::memcmp(dense.data(), dense0.data(), n * 4)) << what;
        if (s != nullptr) {
          ASSERT_EQ(s->indices, s0->indices) << what;
          ASSERT_EQ(0, std::memcmp(s->values.data(), s0->values.data(), s->values.size() * 4))
              << what;
          ASSERT_TRUE(same_bits(s->threshold, s0->threshold)) << what;
          ASSERT_EQ(s->rounds, s0->rounds) << what;
          ASSERT_EQ(s->exact, s0->exact) << what;
          ASSERT_EQ(s->saturated, s0->saturated) << what;
        }
        ASSERT_EQ(dgc[k]->save_state(), dgc[0]->save_state()) << what;
      }
      if (!c.o.reuse_threshold && s0 != nullptr && !c.o.exact_selection) {
        EXPECT_GE(s0->rounds, 1) << c.name << ": the sampled threshold was not used";
      }
    }
  }
}

TEST(Dgc, SparsityZeroIsTheIdentity) {
  DgcOptions o;
  o.sparsity = 0;
  o.momentum = 0;
  const size_t n = 1000;
  DgcCompressor dgc(n, o);
  for (int s = 0; s < 3; ++s) {
    auto g = random_grad(n, s, 1.0f, 0);
    const Selection& sel = dgc.step(g.data());
    ASSERT_EQ(sel.indices.size(), n);
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(sel.values[i], g[i]);
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(dgc.residual()[i], 0.0f);
  }
}

TEST(Dgc, SparsityZeroWithMomentumSendsTheMomentumUpdate) {
  DgcOptions o;
  o.sparsity = 0;
  o.momentum = 0.9f;
  DgcCompressor dgc(100, o);
  auto g = random_grad(100, 1, 1.0f, 0);
  for (int s = 0; s < 3; ++s) {
    const Selection& sel = dgc.step(g.data());
    ASSERT_EQ(sel.indices.size(), 100u);
    // Momentum factor masking zeroes u after every send, so each step sends exactly g.
    for (size_t i = 0; i < 100; ++i)
      ASSERT_EQ(sel.values[i], g[i]);
  }
}

TEST(Dgc, WarmupScheduleRampsToTheTarget) {
  DgcOptions o;
  o.sparsity = 0.999;
  o.warmup_steps = 8;
  const double want[] = {0.75, 0.75, 0.9375, 0.9375, 0.984375, 0.984375, 0.996, 0.996, 0.999};
  for (int s = 0; s < 9; ++s)
    EXPECT_EQ(dgc::sparsity_at(o, s), want[s]) << s;
  o.sparsity = 0.9;  // a low target caps the ramp
  EXPECT_EQ(dgc::sparsity_at(o, 7), 0.9);
  o.schedule = {0.5, 0.6};
  EXPECT_EQ(dgc::sparsity_at(o, 1), 0.6);
  EXPECT_EQ(dgc::sparsity_at(o, 2), 0.9);
  DgcCompressor dgc(1000, o);
  EXPECT_EQ(dgc.sparsity(), 0.5);
  EXPECT_EQ(dgc.target_count(), 500u);
}

TEST(Dgc, ZeroInputSelectsNothingAndOneNonZeroIsAlwaysSent) {
  DgcOptions o;
  o.momentum = 0;
  DgcCompressor dgc(100000, o);
  std::vector<float> g(100000, 0.0f);
  EXPECT_TRUE(dgc.step(g.data()).indices.empty());
  g[4242] = 1e-30f;
  const Selection& sel = dgc.step(g.data());
  ASSERT_EQ(sel.indices.size(), 1u);
  EXPECT_EQ(sel.indices[0], 4242u);
  EXPECT_EQ(sel.values[0], 1e-30f);
}

TEST(Dgc, HardCapBoundsTheCount) {
  DgcOptions o;
  o.sparsity = 0.5;
  o.max_selected = 5;
  DgcCompressor dgc(1000, o);
  auto g = random_grad(1000, 3);
  const Selection& sel = dgc.step(g.data());
  EXPECT_EQ(sel.indices.size(), 5u);
}

TEST(Dgc, ConstantTensorsTieBreakByLowerIndex) {
  DgcOptions o;
  o.sparsity = 0.99;
  o.momentum = 0;
  DgcCompressor dgc(10000, o);
  std::vector<float> g(10000, 0.5f);
  const Selection& sel = dgc.step(g.data());
  ASSERT_EQ(sel.indices.size(), 100u);  // no threshold separates equal values: exact top-k
  EXPECT_TRUE(sel.exact);
  for (uint32_t j = 0; j < 100; ++j)
    ASSERT_EQ(sel.indices[j], j);
}

// A dense step sends all of v and empties it, but keeps u: the momentum goes on.
TEST(Dgc, DenseStepSendsEverythingClearsResidualAndKeepsMomentum) {
  DgcOptions o;
  o.momentum = 0.9f;
  DgcCompressor dgc(5000, o);
  auto g = random_grad(5000, 9);
  dgc.step(g.data());
  std::vector<float> v_old(dgc.residual(), dgc.residual() + 5000);
  std::vector<float> u_old(dgc.momentum_buffer(), dgc.momentum_buffer() + 5000);
  std::vector<float> out(5000);
  dgc.step_dense(g.data(), out.data());
  for (size_t i = 0; i < 5000; ++i) {
    const float u_new = 0.9f * u_old[i] + g[i];
    ASSERT_EQ(out[i], v_old[i] + u_new);
    ASSERT_EQ(dgc.residual()[i], 0.0f);
    ASSERT_EQ(dgc.momentum_buffer()[i], u_new);
  }
  EXPECT_EQ(dgc.steps_done(), 2u);
}

// From an empty state, dense steps are exactly SGD with momentum (and Nesterov): what is sent is
// u (or g + m*u), and a later sparse step starts from the carried u.
TEST(Dgc, DenseStepsAreMomentumSgdAndCarryIntoSparseSteps) {
  for (bool nesterov : {false, true}) {
    DgcOptions o;
    o.momentum = 0.9f;
    o.nesterov = nesterov;
    o.sparsity = 0.99;
    o.value_dtype = DType::kFloat32;
    const size_t n = 4000;
    DgcCompressor dgc(n, o);
    std::vector<float> u(n, 0.0f), out(n);
    for (int s = 0; s < 5; ++s) {
      auto g = random_grad(n, 40 + s);
      dgc.step_dense(g.data(), out.data(), 0.5f);
      for (size_t i = 0; i < n; ++i) {
        const float gi = g[i] * 0.5f;
        u[i] = 0.9f * u[i] + gi;
        const float expected = nesterov ? gi + 0.9f * u[i] : u[i];
        ASSERT_EQ(out[i], expected) << "step " << s << " element " << i;
        ASSERT_EQ(dgc.momentum_buffer()[i], u[i]);
      }
    }
    auto g = random_grad(n, 99);
    const Selection& sel = dgc.step(g.data());
    std::vector<bool> selected(n, false);
    for (uint32_t i : sel.indices)
      selected[i] = true;
    for (size_t i = 0; i < n; ++i) {
      const float u_new = 0.9f * u[i] + g[i];
      const float v_new = nesterov ? g[i] + 0.9f * u_new : u_new;
      ASSERT_EQ(dgc.momentum_buffer()[i], selected[i] ? 0.0f : u_new) << i;
      ASSERT_EQ(dgc.residual()[i], selected[i] ? 0.0f : v_new) << i;
    }
  }
}

TEST(Dgc, SetStepMovesTheSchedule) {
  DgcOptions o;
  o.sparsity = 0.999;
  o.warmup_steps = 8;
  DgcCompressor dgc(1000, o);
  EXPECT_DOUBLE_EQ(dgc.sparsity(), 0.75);
  dgc.set_step(5);
  EXPECT_DOUBLE_EQ(dgc.sparsity(), 0.984375);
  EXPECT_DOUBLE_EQ(dgc.sparsity_at_step(2), 0.9375);
  EXPECT_DOUBLE_EQ(dgc.sparsity_at_step(100), 0.999);
  EXPECT_EQ(dgc.steps_done(), 5u);
}

TEST(Dgc, ClippingScalesTheGradientToTheLocalNorm) {
  DgcOptions o;
  o.momentum = 0;
  o.sparsity = 0;
  o.clip_norm = 2.0f;
  o.world_size = 4;  // local limit 2 / sqrt(4) = 1
  DgcCompressor dgc(1000, o);
  auto g = random_grad(1000, 5, 10.0f, 0);
  const Selection& sel = dgc.step(g.data());
  double norm = 0;
  for (float x : sel.values)
    norm += double(x) * x;
  EXPECT_NEAR(std::sqrt(norm), 1.0, 1e-4);
}

TEST(Dgc, RejectsBadOptionsAndArguments) {
  DgcOptions o;
  o.sparsity = 1.0;
  EXPECT_THROW(DgcCompressor(10, o), InvalidArgument);
  o = DgcOptions();
  o.momentum = -0.1f;
  EXPECT_THROW(DgcCompressor(10, o), InvalidArgument);
  DgcCompressor ok(10, DgcOptions());
  EXPECT_THROW(ok.step(nullptr), InvalidArgument);
}

}  // namespace
}  // namespace gradex::compress
