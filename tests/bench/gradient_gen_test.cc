#include "bench/gradient_gen.h"

#include <gtest/gtest.h>

#include <cmath>

#include "base/error.h"

namespace gradex::bench {
namespace {

ModelProfile small_model() {
  return parse_model_profile("conv.weight 64 32 3 3\nconv.bias 64\nfc.weight 10 3000000\n", "small",
                             "small");
}

struct Moments {
  double mean = 0, std = 0, kurtosis = 0;
};

Moments moments(const std::vector<float>& v) {
  Moments m;
  for (float x : v)
    m.mean += x;
  m.mean /= v.size();
  double m2 = 0, m4 = 0;
  for (float x : v) {
    double d = x - m.mean;
    m2 += d * d;
    m4 += d * d * d * d;
  }
  m2 /= v.size();
  m4 /= v.size();
  m.std = std::sqrt(m2);
  m.kurtosis = m4 / (m2 * m2);
  return m;
}

std::vector<float> tensor(const GradientGenerator& g, int64_t step, size_t t) {
  std::vector<float> out(g.model().tensors[t].numel);
  g.generate_tensor(step, t, out.data());
  return out;
}

TEST(GradientGenerator, DeterministicPerSeedRankStepTensor) {
  ModelProfile m = small_model();
  GradientGenerator a(m, 1), b(m, 1);
  std::vector<float> fa(m.total_numel), fb(m.total_numel);
  a.generate(3, fa.data());
  b.generate(3, fb.data());
  EXPECT_EQ(fa, fb);
  EXPECT_NE(tensor(a, 3, 0), tensor(a, 4, 0));                        // step
  EXPECT_NE(tensor(a, 3, 0), tensor(GradientGenerator(m, 2), 3, 0));  // rank
  GradientGenerator other_seed(m, 1, GradientOptions{7, 0.3});
  EXPECT_NE(tensor(a, 3, 0), tensor(other_seed, 3, 0));  // seed
}

TEST(GradientGenerator, FlatBufferIsTheConcatenationOfTensorsAndRanges) {
  ModelProfile m = small_model();
  GradientGenerator g(m, 0);
  std::vector<float> flat(m.total_numel);
  g.generate(5, flat.data());
  for (size_t t = 0; t < m.tensors.size(); ++t) {
    std::vector<float> one = tensor(g, 5, t);
    EXPECT_TRUE(std::equal(one.begin(), one.end(), flat.begin() + g.offset(t))) << t;
  }
  // A range that starts past a pool wrap equals the same slice of the whole tensor.
  std::vector<float> whole = tensor(g, 5, 2), part(1500000);
  g.generate_range(5, 2, 1234567, part.size(), part.data());
  EXPECT_TRUE(std::equal(part.begin(), part.end(), whole.begin() + 1234567));
  EXPECT_THROW(g.generate_range(5, 2, 29999999, 2, part.data()), InvalidArgument);
}

TEST(GradientGenerator, RealisticMagnitudesAndHeavyTails) {
  ModelProfile m = small_model();
  GradientGenerator g(m, 0);
  for (int64_t step : {0, 1, 9}) {
    for (size_t t = 0; t < m.tensors.size(); ++t) {
      std::vector<float> v = tensor(g, step, t);
      Moments mo = moments(v);
      EXPECT_GT(mo.std, 0.7 * g.scale(t)) << t;  // not zeros, not constant
      EXPECT_LT(mo.std, 1.4 * g.scale(t)) << t;
      if (v.size() > 10000) {
        EXPECT_GT(mo.kurtosis, 3.5) << t;  // heavier than a gaussian's 3
      }
    }
  }
  EXPECT_NEAR(g.scale(0), 1.0 / std::sqrt(32 * 9), 1e-12);  // 1/sqrt(fan_in)
  EXPECT_LT(g.scale(1), g.scale(0));                        // bias smaller than weights
}

TEST(GradientGenerator, RanksAreCorrelatedByTheSharedFraction) {
  ModelProfile m = small_model();
  for (double shared : {0.0, 0.3, 0.8}) {
    GradientOptions o{1, shared};
    std::vector<float> a = tensor(GradientGenerator(m, 0, o), 2, 2);
    std::vector<float> b = tensor(GradientGenerator(m, 1, o), 2, 2);
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      ab += double(a[i]) * b[i];
      aa += double(a[i]) * a[i];
      bb += double(b[i]) * b[i];
    }
    double correlation = ab / std::sqrt(aa * bb);
    // The per-rank scale jitter (0.8 to 1.25 on each part) moves it a little from `shared`.
    EXPECT_NEAR(correlation, shared, 0.2) << shared;
  }
}

TEST(GradientGenerator, RejectsBadOptions) {
  ModelProfile m = small_model();
  EXPECT_THROW(GradientGenerator(m, -1), InvalidArgument);
  EXPECT_THROW(GradientGenerator(m, 0, GradientOptions{1, 1.5}), InvalidArgument);
}

}  // namespace
}  // namespace gradex::bench
