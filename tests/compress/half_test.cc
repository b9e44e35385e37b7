// Bulk 16-bit casts: bit-identical to the scalar conversions, saturation instead of inf, counts of
// saturated and non-finite inputs, pre-division, the reverse casts.
#include <gtest/gtest.h>

#include <cmath>
#include <iterator>
#include <limits>
#include <random>

#include "compress/compress.h"

namespace gradex::compress {
namespace {

std::vector<float> tricky_values(size_t n, uint64_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i)
    x[i] = bits_float(rng());  // every exponent, NaN and Inf included
  // 65519 rounds down to 65504 (not saturated); 65520 would round to inf (saturated); then a
  // large negative value, Inf, NaN and a value in fp16's subnormal range.
  const float specials[] = {65519.0f,
                            65520.0f,
                            -1e30f,
                            std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            3.0e-8f};
  for (size_t i = 0; i < n && i < std::size(specials); ++i)
    x[i] = specials[i];
  return x;
}

TEST(HalfCast, Fp16MatchesScalarSaturatingConversion) {
  for (size_t n : {size_t{5}, size_t{8}, size_t{1003}, size_t{100000}}) {
    auto x = tricky_values(n, n);
    std::vector<uint16_t> out(n);
    half::CastStats st = half::to_half(x.data(), out.data(), n, DType::kFloat16, 1.0f);
    size_t sat = 0, nf = 0;
    for (size_t i = 0; i < n; ++i) {
      bool s;
      uint16_t want = half::to_half_saturating(x[i], &s);
      sat += s;
      nf += !std::isfinite(x[i]);
      if (std::isnan(x[i])) {
        ASSERT_TRUE(std::isnan(half_to_float(out[i])));
      } else {
        ASSERT_EQ(out[i], want) << x[i];
        if (std::isfinite(x[i])) {
          ASSERT_TRUE(std::isfinite(half_to_float(out[i])));
        }
      }
    }
    EXPECT_EQ(st.saturated, sat);
    EXPECT_EQ(st.nonfinite, nf);
    EXPECT_GT(sat, 0u);
  }
}

TEST(HalfCast, Bf16MatchesScalarSaturatingConversion) {
  auto x = tricky_values(50000, 3);
  x[6] = 3.4e38f;  // rounds past bf16's largest finite value
  std::vector<uint16_t> out(x.size());
  half::CastStats st = half::to_half(x.data(), out.data(), x.size(), DType::kBFloat16, 1.0f);
  size_t sat = 0, nf = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    bool s;
    uint16_t want = half::to_bf16_saturating(x[i], &s);
    sat += s;
    nf += !std::isfinite(x[i]);
    if (std::isnan(x[i])) {
      ASSERT_TRUE(std::isnan(bf16_to_float(out[i])));
    } else {
      ASSERT_EQ(out[i], want) << x[i];
    }
  }
  EXPECT_EQ(st.saturated, sat);
  EXPECT_GE(sat, 1u);
  EXPECT_EQ(st.nonfinite, nf);
}

TEST(HalfCast, PredivisionKeepsSumsInRange) {
  const int world = 8;
  std::vector<float> x(64, 60000.0f);
  std::vector<uint16_t> h(64);
  half::CastStats st = half::to_half_predivided(x.data(), h.data(), 64, DType::kFloat16, world);
  EXPECT_EQ(st.saturated, 0u);
  // The sum over 8 ranks of the pre-divided values is representable.
  std::vector<float> sum(64, 0.0f);
  for (int r = 0; r < world; ++r)
    half::add_from_half(h.data(), sum.data(), 64, DType::kFloat16, 1.0f);
  EXPECT_NEAR(sum[0], 60000.0f, 10.0f);
}

TEST(HalfCast, ReverseCastsAreExactAndScale) {
  std::vector<uint16_t> h(70000);
  for (size_t i = 0; i < h.size(); ++i)
    h[i] = static_cast<uint16_t>(i);
  for (DType t : {DType::kFloat16, DType::kBFloat16}) {
    std::vector<float> f(h.size()), f2(h.size(), 1.0f);
    half::from_half(h.data(), f.data(), h.size(), t, 1.0f);
    half::add_from_half(h.data(), f2.data(), h.size(), t, 2.0f);
    for (size_t i = 0; i < h.size(); ++i) {
      float want = t == DType::kFloat16 ? half_to_float(h[i]) : bf16_to_float(h[i]);
      if (std::isnan(want)) continue;
      ASSERT_EQ(f[i], want);
      ASSERT_EQ(f2[i], 1.0f + 2.0f * want);
    }
  }
  std::vector<float> f(4);
  EXPECT_THROW(half::from_half(h.data(), f.data(), 4, DType::kFloat32, 1.0f), InvalidArgument);
}

TEST(HalfCast, RoundToKeepsResidualExact) {
  std::mt19937 rng(5);
  for (int i = 0; i < 200000; ++i) {
    float x = bits_float(rng() & 0xbfffffffu);  // finite magnitudes up to ~2^64
    if (!std::isfinite(x)) continue;
    for (DType t : {DType::kFloat16, DType::kBFloat16}) {
      bool sat;
      float sent = half::round_to(x, t, &sat);
      float residual = x - sent;
      ASSERT_EQ(sent + residual, x) << x;
    }
  }
}

}  // namespace
}  // namespace gradex::compress
