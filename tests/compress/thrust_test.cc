// The Thrust algorithm (the CUDA kernels' source) on Thrust's OpenMP backend against the CPU
// kernels: bit-identical selections, values and state over many steps, and identical casts.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <tuple>

#include "compress/compress.h"
#include "compress/thrust/dgc_thrust_omp.h"
#include "test_util.h"

namespace gradex::compress {
namespace {

void compare_steps(DgcOptions o, size_t n, int steps, bool constant = false) {
  o.reuse_threshold = false;  // the Thrust step always samples; the CPU step then does the same
  DgcCompressor cpu(n, o);
  std::vector<float> u(n, 0.0f), v(n, 0.0f);
  const size_t cap = thrust_dgc::make_step_params(o, n, 0).cap + n;  // generous for every step
  std::vector<uint32_t> idx(cap);
  std::vector<float> val(cap);
  for (int s = 0; s < steps; ++s) {
    std::vector<float> g =
        constant ? std::vector<float>(n, 0.25f) : test::random_grad(n, 500 + s, 1.0f + s % 4, 13);
    const Selection& want = cpu.step(g.data());
    thrust_dgc::StepParams p = thrust_dgc::make_step_params(o, n, s);
    thrust_dgc::StepResult got = thrust_dgc::omp_step(
        p, g.data(), o.momentum > 0 ? u.data() : nullptr, v.data(), idx.data(), val.data());
    ASSERT_EQ(got.count, want.indices.size()) << "step " << s;
    ASSERT_EQ(got.rounds, want.rounds) << "step " << s;
    ASSERT_EQ(got.exact, want.exact) << "step " << s;
    ASSERT_EQ(got.saturated, want.saturated);
    ASSERT_EQ(got.threshold, want.threshold);
    ASSERT_TRUE(std::equal(want.indices.begin(), want.indices.end(), idx.begin()));
    ASSERT_EQ(0, std::memcmp(want.values.data(), val.data(), got.count * 4));
    ASSERT_EQ(0, std::memcmp(cpu.residual(), v.data(), n * 4)) << "v differs at step " << s;
    if (o.momentum > 0) {
      ASSERT_EQ(0, std::memcmp(cpu.momentum_buffer(), u.data(), n * 4)) << "u, step " << s;
    }
  }
}

class ThrustVsCpu : public ::testing::TestWithParam<std::tuple<float, bool, DType, double, bool>> {
};

TEST_P(ThrustVsCpu, StepsAreBitIdentical) {
  auto [m, nesterov, dtype, sparsity, exact] = GetParam();
  DgcOptions o;
  o.momentum = m;
  o.nesterov = nesterov;
  o.value_dtype = dtype;
  o.sparsity = sparsity;
  o.exact_selection = exact;
  o.warmup_steps = 8;
  compare_steps(o, 40000, 16);
}

INSTANTIATE_TEST_SUITE_P(
    Sweep, ThrustVsCpu,
    ::testing::Values(std::make_tuple(0.9f, false, DType::kFloat32, 0.999, false),
                      std::make_tuple(0.9f, true, DType::kFloat16, 0.99, false),
                      std::make_tuple(0.0f, false, DType::kBFloat16, 0.999, false),
                      std::make_tuple(0.9f, false, DType::kFloat32, 0.99, true),
                      std::make_tuple(0.0f, false, DType::kFloat16, 0.9, true)));

TEST(ThrustVsCpu, TiesAndTheExactFallbackAgree) {
  DgcOptions o;
  o.momentum = 0;
  o.sparsity = 0.99;
  compare_steps(o, 20000, 3, /*constant=*/true);
}

TEST(ThrustVsCpu, CastsAgree) {
  std::mt19937 rng(1);
  std::vector<float> x(100003);
  for (auto& f : x)
    f = bits_float(rng());
  x[0] = 65520.0f;
  x[1] = 3.4e38f;
  for (DType t : {DType::kFloat16, DType::kBFloat16}) {
    std::vector<uint16_t> a(x.size()), b(x.size());
    half::CastStats want = half::to_half(x.data(), a.data(), x.size(), t, 0.5f);
    thrust_dgc::CastCounts got = thrust_dgc::omp_to_half(x.data(), b.data(), x.size(), t, 0.5f);
    EXPECT_EQ(got.saturated, want.saturated);
    EXPECT_EQ(got.nonfinite, want.nonfinite);
    for (size_t i = 0; i < x.size(); ++i) {
      float xi = x[i] * 0.5f;
      if (xi != xi) continue;  // NaN payload bits may differ; both are NaN (checked by counts)
      ASSERT_EQ(a[i], b[i]) << xi;
    }
  }
}

}  // namespace
}  // namespace gradex::compress
