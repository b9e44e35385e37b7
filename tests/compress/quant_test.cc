// Block quantization: the error-feedback invariant (sent + new residual == old residual + delta,
// bit for bit), round-trip error bounds, 4-bit packing edge cases, non-finite inputs, stochastic
// rounding's reproducibility and unbiasedness, and chunked decoding at block boundaries.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "base/error.h"
#include "compress/quant/quant.h"
#include "tests/compress/test_util.h"

namespace gradex::compress::quant {
namespace {

using test::random_grad;

std::vector<QuantOptions> all_options() {
  std::vector<QuantOptions> out;
  for (int bits : {8, 4})
    for (size_t block : {size_t{2}, size_t{6}, size_t{64}})
      for (ScaleType st : {ScaleType::kFloat32, ScaleType::kFloat16})
        for (Rounding r : {Rounding::kNearest, Rounding::kStochastic}) {
          QuantOptions o;
          o.bits = bits;
          o.block = block;
          o.scale = st;
          o.rounding = r;
          o.seed = 11;
          out.push_back(o);
        }
  return out;
}

std::string name(const QuantOptions& o) {
  return std::to_string(o.bits) + "-bit block " + std::to_string(o.block) +
         (o.scale == ScaleType::kFloat16 ? " fp16" : " fp32") +
         (o.rounding == Rounding::kStochastic ? " stochastic" : " nearest");
}

bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

TEST(Quant, ErrorFeedbackInvariantIsExact) {
  // Values spanning many magnitudes, including ones far below their block's scale (the case where
  // v - deq could round) and exact zeros.
  for (const auto& o : all_options()) {
    for (size_t n : {size_t{1}, size_t{7}, size_t{129}, size_t{1000}}) {
      std::vector<float> residual = random_grad(n, 3, 1e-3f);
      for (int round = 0; round < 5; ++round) {
        std::vector<float> delta = random_grad(n, 100 + round, 1.0f, 5);
        for (size_t i = 0; i < n; i += 3)
          delta[i] *= std::ldexp(1.0f, -static_cast<int>(i % 60));
        std::vector<float> before = residual;
        std::vector<uint8_t> enc(encoded_size(o, n));
        size_t bad = quantize(o, delta.data(), residual.data(), n, round * n, enc.data());
        EXPECT_EQ(bad, 0u);
        std::vector<float> sent(n);
        dequantize(o, enc.data(), n, sent.data());
        for (size_t i = 0; i < n; ++i) {
          float want = before[i] + delta[i];
          float got = sent[i] + residual[i];
          ASSERT_TRUE(same_bits(got, want)) << name(o) << " n=" << n << " i=" << i << ": "
                                            << sent[i] << " + " << residual[i] << " != " << want;
        }
      }
    }
  }
}

TEST(Quant, RoundTripErrorWithinHalfAStepForNearest) {
  for (const auto& o : all_options()) {
    if (o.rounding != Rounding::kNearest) continue;
    const size_t n = 1001;
    std::vector<float> x = random_grad(n, 5, 2.0f);
    std::vector<uint8_t> enc(encoded_size(o, n));
    quantize(o, x.data(), nullptr, n, 0, enc.data());
    std::vector<float> y(n);
    dequantize(o, enc.data(), n, y.data());
    for (size_t b = 0; b < n; b += o.block) {
      size_t e = std::min(n, b + o.block);
      float amax = 0;
      for (size_t i = b; i < e; ++i)
        amax = std::max(amax, std::fabs(x[i]));
      // fp16 scales carry a relative error of 2^-11: allow it on top of half a step.
      float step = amax / max_code(o.bits) * (1.0f + 1.0f / 1024);
      for (size_t i = b; i < e; ++i)
        ASSERT_LE(std::fabs(y[i] - x[i]), 0.5f * step + 1e-30f) << name(o) << " i=" << i;
    }
  }
}

TEST(Quant, EncodedSizesAndPacking) {
  QuantOptions o;
  o.bits = 4;
  o.block = 4;
  EXPECT_EQ(encoded_size(o, 0), 0u);
  EXPECT_EQ(encoded_size(o, 1), 4u + 1u);
  EXPECT_EQ(encoded_size(o, 4), 4u + 2u);
  EXPECT_EQ(encoded_size(o, 5), 6u + 5u);
  EXPECT_EQ(encoded_size(o, 7), 6u + 6u);
  // Exact codes: scale 1 (amax 7), values -7..7 land on their codes, odd tail nibble is zero.
  std::vector<float> x = {-7, 3, 0, 7, -1, 2, 5};
  std::vector<uint8_t> enc(encoded_size(o, x.size()));
  quantize(o, x.data(), nullptr, x.size(), 0, enc.data());
  EXPECT_EQ(enc[4], static_cast<uint8_t>((-7 + 8) | ((3 + 8) << 4)));
  EXPECT_EQ(enc[5], static_cast<uint8_t>((0 + 8) | ((7 + 8) << 4)));
  EXPECT_EQ(enc[11] >> 4, 0) << "odd tail: high nibble of the last byte must be 0";
  std::vector<float> y(x.size());
  dequantize(o, enc.data(), x.size(), y.data());
  for (size_t i = 0; i < 4; ++i)
    EXPECT_EQ(y[i], x[i]);
  // Second block: amax 5 -> scale 5/7; codes round(-7/5), round(14/5), 7.
  float s = 5.0f / 7.0f;
  EXPECT_EQ(y[4], -1.0f * s);
  EXPECT_EQ(y[5], 3.0f * s);
  EXPECT_EQ(y[6], 7.0f * s);
}

TEST(Quant, AllZeroBlocksAndHugeValues) {
  for (const auto& o : all_options()) {
    const size_t n = 3 * o.block + 1;
    std::vector<float> x(n, 0.0f);
    x[o.block] = 3.0e38f;       // block 1: near FLT_MAX
    x[2 * o.block] = -1.0e30f;  // block 2: far beyond the fp16 scale range
    std::vector<float> r(n, 0.0f);
    std::vector<uint8_t> enc(encoded_size(o, n));
    EXPECT_EQ(quantize(o, x.data(), r.data(), n, 0, enc.data()), 0u);
    std::vector<float> y(n);
    dequantize(o, enc.data(), n, y.data());
    for (size_t i = 0; i < o.block; ++i)
      EXPECT_EQ(y[i], 0.0f) << name(o);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_TRUE(std::isfinite(y[i]) && std::isfinite(r[i])) << name(o) << " i=" << i;
      ASSERT_TRUE(same_bits(y[i] + r[i], x[i])) << name(o) << " i=" << i;
    }
    if (o.scale == ScaleType::kFloat32) {
      EXPECT_GT(y[o.block], 1.0e38f) << name(o);
    }
  }
}

TEST(Quant, NonFiniteValuesAreDroppedAndCounted) {
  QuantOptions o;
  o.block = 4;
  std::vector<float> x = {1.0f, std::numeric_limits<float>::quiet_NaN(), -2.0f,
                          std::numeric_limits<float>::infinity(), 0.5f};
  std::vector<float> r = {0.0f, 5.0f, 0.0f, 0.0f, 0.0f};
  std::vector<uint8_t> enc(encoded_size(o, x.size()));
  EXPECT_EQ(quantize(o, x.data(), r.data(), x.size(), 0, enc.data()), 2u);
  std::vector<float> y(x.size());
  dequantize(o, enc.data(), x.size(), y.data());
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[3], 0.0f);
  EXPECT_EQ(r[1], 0.0f);
  EXPECT_EQ(r[3], 0.0f);
  EXPECT_EQ(y[2], -2.0f);  // the scale ignores the non-finite values: amax 2
  EXPECT_EQ(y[0] + r[0], 1.0f);
}

TEST(Quant, StochasticRoundingIsReproducibleAndUnbiased) {
  QuantOptions o;
  o.bits = 4;
  o.block = 2;
  o.rounding = Rounding::kStochastic;
  o.seed = 42;
  // Block {0.3, 7}: scale 1, so 0.3 rounds up with probability 0.3.
  const int trials = 20000;
  double sum = 0;
  for (int t = 0; t < trials; ++t) {
    float x[2] = {0.3f, 7.0f};
    uint8_t a[8], b[8];
    quantize(o, x, nullptr, 2, 2 * static_cast<uint64_t>(t), a);
    quantize(o, x, nullptr, 2, 2 * static_cast<uint64_t>(t), b);
    ASSERT_EQ(std::memcmp(a, b, encoded_size(o, 2)), 0);
    float y[2];
    dequantize(o, a, 2, y);
    sum += y[0];
  }
  EXPECT_NEAR(sum / trials, 0.3, 0.015);
  QuantOptions other = o;
  other.seed = 43;
  int differ = 0;
  for (uint64_t c = 0; c < 256; ++c)
    differ += uniform(o.seed, c) != uniform(other.seed, c);
  EXPECT_GT(differ, 250);
}

TEST(Quant, ChunksAtBlockBoundariesDecodeIndependently) {
  for (const auto& o : all_options()) {
    const size_t n = 5 * o.block + 3;
    std::vector<float> x = random_grad(n, 9);
    std::vector<uint8_t> whole(encoded_size(o, n));
    quantize(o, x.data(), nullptr, n, 0, whole.data());
    std::vector<float> acc(n, 1.0f), want(n);
    dequantize(o, whole.data(), n, want.data());
    for (size_t a = 0; a < n; a += 2 * o.block) {
      size_t b = std::min(n, a + 2 * o.block);
      dequantize_add(o, whole.data() + encoded_size(o, a), b - a, acc.data() + a);
    }
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(acc[i], 1.0f + want[i]) << name(o);
  }
}

TEST(Quant, BadOptionsAreRejectedByName) {
  QuantOptions o;
  o.bits = 6;
  EXPECT_THROW(validate(o), InvalidArgument);
  o.bits = 8;
  o.block = 3;
  try {
    validate(o);
    FAIL() << "odd block accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("block"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gradex::compress::quant
