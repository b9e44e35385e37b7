// The dense 8-bit codec (compress/backend/int8_codec.h): sizes, exact error feedback, validation of
// received pieces, and the rounding choice (nearest vs stochastic) on an error-feedback quadratic.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/error.h"
#include "compress/backend/int8_codec.h"
#include "compress/quant/quant.h"

namespace q8 = gradex::compress::backend::int8;
namespace quant = gradex::compress::quant;

namespace {

std::vector<float> gaussian(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v)
    x = d(rng);
  return v;
}

}  // namespace

TEST(Int8Codec, SizeIsOneBytePerElementPlusScales) {
  EXPECT_EQ(q8::encoded_size(0), 0u);
  EXPECT_EQ(q8::encoded_size(1), 5u);
  EXPECT_EQ(q8::encoded_size(128), 132u);
  EXPECT_EQ(q8::encoded_size(129), 137u);
  EXPECT_NEAR(q8::bytes_per_element(), 132.0 / 128.0, 1e-12);
}

TEST(Int8Codec, ErrorFeedbackIsExact) {
  for (size_t n : {1u, 127u, 128u, 129u, 5000u}) {
    std::vector<float> residual(n, 0.0f), sent(n);
    std::vector<uint8_t> bytes(q8::encoded_size(n));
    for (uint32_t round = 0; round < 5; ++round) {
      // Mixed magnitudes inside one block: small values round to 0 and stay in the residual.
      std::vector<float> g = gaussian(n, 7 + round);
      for (size_t i = 0; i < n; i += 3)
        g[i] *= 1e-4f;
      const std::vector<float> before = residual;
      ASSERT_EQ(q8::encode(g.data(), residual.data(), n, bytes.data()), 0u);
      q8::validate(bytes.data(), bytes.size(), n, "test");
      q8::decode(bytes.data(), n, sent.data());
      for (size_t i = 0; i < n; ++i) {
        const float input = before[i] + g[i];
        ASSERT_EQ(sent[i] + residual[i], input) << "n=" << n << " i=" << i;
        // A step is at most amax / 127 of its block: the residual stays within one step.
        ASSERT_LE(std::fabs(residual[i]), 6.0f / 127.0f + 1e-6f);
      }
      std::vector<float> acc(n, 1.0f);
      q8::decode_add(bytes.data(), n, acc.data());
      for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(acc[i], 1.0f + sent[i]);
    }
  }
}

// The fast loops write compress/quant's format: the same bytes and residuals as quant::quantize at
// 8 bits, 128-element blocks, fp32 scales, nearest rounding; and decode as quant::dequantize does.
TEST(Int8Codec, SameBytesAsQuant) {
  quant::QuantOptions o;
  o.bits = 8;
  o.block = q8::kInt8Block;
  for (size_t n : {1u, 128u, 1000u, 70001u}) {
    std::vector<float> g = gaussian(n, 21);
    for (size_t i = 0; i < n; i += 5)
      g[i] *= 1e-6f;  // sent as 0 or with an inexact difference
    for (size_t i = 0; i < n; i += 997)
      g[i] = 0.0f;
    for (size_t i = 200; i < std::min<size_t>(n, 328); ++i)
      g[i] = 0.0f;  // a whole zero block
    std::vector<float> ra = gaussian(n, 22, 0.01f), rb = ra;
    std::vector<uint8_t> a(q8::encoded_size(n)), b(a.size());
    q8::encode(g.data(), ra.data(), n, a.data());
    quant::quantize(o, g.data(), rb.data(), n, 0, b.data());
    ASSERT_EQ(a, b) << n;
    ASSERT_EQ(std::memcmp(ra.data(), rb.data(), 4 * n), 0) << n;
    std::vector<float> da(n), db(n);
    q8::decode(a.data(), n, da.data());
    quant::dequantize(o, b.data(), n, db.data());
    ASSERT_EQ(std::memcmp(da.data(), db.data(), 4 * n), 0) << n;
  }
}

TEST(Int8Codec, NonFiniteIsDroppedAndCounted) {
  std::vector<float> g = gaussian(300, 3), residual(300, 0.5f), out(300);
  g[5] = NAN;
  g[200] = INFINITY;
  std::vector<uint8_t> bytes(q8::encoded_size(300));
  EXPECT_EQ(q8::encode(g.data(), residual.data(), 300, bytes.data()), 2u);
  q8::decode(bytes.data(), 300, out.data());
  EXPECT_EQ(out[5], 0.0f);
  EXPECT_EQ(residual[5], 0.0f);
  EXPECT_EQ(out[200], 0.0f);
  EXPECT_TRUE(std::isfinite(out[6]));
}

TEST(Int8Codec, ValidateRefusesTruncatedAndCorruptPieces) {
  const size_t n = 300;
  std::vector<float> g = gaussian(n, 4);
  std::vector<uint8_t> bytes(q8::encoded_size(n));
  q8::encode(g.data(), nullptr, n, bytes.data());
  EXPECT_NO_THROW(q8::validate(bytes.data(), bytes.size(), n, "ok"));
  // Truncated (one byte short) and overlong.
  EXPECT_THROW(q8::validate(bytes.data(), bytes.size() - 1, n, "short"), gradex::CorruptPayload);
  EXPECT_THROW(q8::validate(bytes.data(), bytes.size(), n - 1, "long"), gradex::CorruptPayload);
  // A NaN, an infinite and a negative scale in the second block.
  for (float bad : {NAN, INFINITY, -1.0f}) {
    std::vector<uint8_t> c = bytes;
    std::memcpy(c.data() + 132, &bad, 4);
    try {
      q8::validate(c.data(), c.size(), n, "tensor 'w' from rank 2");
      ADD_FAILURE() << "scale " << bad << " accepted";
    } catch (const gradex::CorruptPayload& e) {
      EXPECT_NE(std::string(e.what()).find("tensor 'w' from rank 2"), std::string::npos);
      EXPECT_NE(std::string(e.what()).find("element 128"), std::string::npos) << e.what();
    }
  }
  // Code -128 (outside the symmetric code range) in the last block.
  std::vector<uint8_t> c = bytes;
  c[264 + 4 + 10] = 0x80;
  EXPECT_THROW(q8::validate(c.data(), c.size(), n, "code"), gradex::CorruptPayload);
}

// The rounding choice. Error-feedback SGD on f(x) = 0.5 * sum a_i x_i^2 with noisy gradients,
// 8-bit vs the same run in fp32: nearest rounding must track fp32 at least as closely as
// stochastic rounding (which adds variance that error feedback then has to carry).
TEST(Int8Codec, NearestRoundingTracksFp32OnAQuadratic) {
  const size_t n = 4096;
  const int steps = 300;
  const float lr = 0.05f;
  std::vector<float> a = gaussian(n, 11);
  for (float& x : a)
    x = 0.5f + std::fabs(x);
  auto run = [&](int mode) {  // 0: fp32, 1: nearest, 2: stochastic
    std::vector<float> x(n, 1.0f), residual(n, 0.0f), g(n), sent(n);
    std::vector<uint8_t> bytes(q8::encoded_size(n));
    quant::QuantOptions o;
    o.bits = 8;
    o.block = q8::kInt8Block;
    o.rounding = quant::Rounding::kStochastic;
    o.seed = 99;
    for (int s = 0; s < steps; ++s) {
      std::vector<float> noise = gaussian(n, 1000 + static_cast<uint32_t>(s), 0.1f);
      for (size_t i = 0; i < n; ++i)
        g[i] = a[i] * x[i] + noise[i];
      if (mode == 1) {
        q8::encode(g.data(), residual.data(), n, bytes.data());
        q8::decode(bytes.data(), n, sent.data());
      } else if (mode == 2) {
        quant::quantize(o, g.data(), residual.data(), n, static_cast<uint64_t>(s) * n,
                        bytes.data());
        quant::dequantize(o, bytes.data(), n, sent.data());
      } else {
        sent = g;
      }
      for (size_t i = 0; i < n; ++i)
        x[i] -= lr * sent[i];
    }
    return x;
  };
  const std::vector<float> ref = run(0), nearest = run(1), stochastic = run(2);
  auto distance = [&](const std::vector<float>& x) {
    double d = 0, norm = 0;
    for (size_t i = 0; i < n; ++i) {
      d += (x[i] - ref[i]) * (x[i] - ref[i]);
      norm += ref[i] * ref[i];
    }
    return std::sqrt(d / norm);
  };
  const double dn = distance(nearest), ds = distance(stochastic);
  std::printf("relative distance to the fp32 run after %d steps: nearest %.3e, stochastic %.3e\n",
              steps, dn, ds);
  EXPECT_LT(dn, 0.05);
  EXPECT_LE(dn, ds);
}
