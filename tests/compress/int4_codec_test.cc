// The dense 4-bit codec (compress/backend/int4_codec.h): sizes, the same bytes as compress/quant at
// 4 bits, exact error feedback, decoding, non-finite and all-zero blocks, validation of received
// pieces, and error feedback over many steps.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "compress/backend/int4_codec.h"
#include "compress/quant/quant.h"

namespace q4 = gradex::compress::backend::int4;
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

quant::QuantOptions quant4() {
  quant::QuantOptions o;
  o.bits = 4;
  o.block = q4::kInt4Block;
  o.scale = quant::ScaleType::kFloat32;
  o.rounding = quant::Rounding::kNearest;
  return o;
}

// The scale of the block holding element i.
float scale_of(const std::vector<uint8_t>& bytes, size_t i) {
  float s;
  std::memcpy(&s, bytes.data() + (i / q4::kInt4Block) * 68, 4);
  return s;
}

// Expects validate() to throw CorruptPayload whose message holds `what` and every one of `parts`.
void expect_corrupt(const std::vector<uint8_t>& bytes, size_t size, size_t n,
                    const std::vector<std::string>& parts) {
  const std::string what = "tensor 'w' from rank 3";
  try {
    q4::validate(bytes.data(), size, n, what);
    ADD_FAILURE() << "accepted (size " << size << ", n " << n << ")";
  } catch (const gradex::CorruptPayload& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(what), std::string::npos) << m;
    for (const std::string& p : parts)
      EXPECT_NE(m.find(p), std::string::npos) << "'" << p << "' not in: " << m;
  }
}

}  // namespace

TEST(Int4Codec, SizeIsHalfABytePerElementPlusScales) {
  EXPECT_EQ(q4::encoded_size(0), 0u);
  EXPECT_EQ(q4::encoded_size(1), 5u);
  EXPECT_EQ(q4::encoded_size(2), 5u);
  EXPECT_EQ(q4::encoded_size(3), 6u);
  EXPECT_EQ(q4::encoded_size(128), 68u);
  EXPECT_EQ(q4::encoded_size(129), 73u);
  EXPECT_EQ(q4::encoded_size(256), 136u);
  EXPECT_EQ(q4::encoded_size(257), 141u);
  const quant::QuantOptions o = quant4();
  for (size_t n : {0u, 1u, 2u, 127u, 128u, 129u, 255u, 1001u, 70001u})
    EXPECT_EQ(q4::encoded_size(n), quant::encoded_size(o, n)) << n;
  EXPECT_NEAR(q4::bytes_per_element(), 68.0 / 128.0, 1e-12);
}

// The fast loops write compress/quant's format: the same bytes and residuals as quant::quantize at
// 4 bits, 128-element blocks, fp32 scales, nearest rounding (with and without a residual), over
// sizes with odd tails and tails shorter than a block; and decode as quant::dequantize(_add) does.
TEST(Int4Codec, SameBytesAsQuant) {
  const quant::QuantOptions o = quant4();
  std::mt19937 rng(5);
  std::vector<size_t> sizes = {1, 2, 3, 7, 127, 128, 129, 255, 256, 257, 1000, 70001};
  for (int k = 0; k < 20; ++k)
    sizes.push_back(std::uniform_int_distribution<size_t>(1, 5000)(rng));
  for (size_t n : sizes) {
    std::vector<float> g = gaussian(n, 21 + static_cast<uint32_t>(n));
    for (size_t i = 0; i < n; i += 5)
      g[i] *= 1e-6f;  // sent as 0, or with an inexact difference
    for (size_t i = 0; i < n; i += 997)
      g[i] = 0.0f;
    for (size_t i = 1; i < n; i += 11)
      g[i] = -g[i - 1];  // equal magnitudes of both signs
    // Block 2 (elements 256..383) all zero, block 3 only denormals whose scale underflows to 0:
    // both send nothing and keep their values in the residual (zeroed there below).
    for (size_t i = 256; i < std::min<size_t>(n, 384); ++i)
      g[i] = 0.0f;
    for (size_t i = 384; i < std::min<size_t>(n, 512); ++i)
      g[i] = i % 2 ? 0x1p-149f : -0x1p-148f;
    for (bool with_residual : {true, false}) {
      std::vector<float> ra = gaussian(n, 22, 0.01f);
      for (size_t i = 256; i < std::min<size_t>(n, 512); ++i)
        ra[i] = 0.0f;
      std::vector<float> rb = ra;
      std::vector<uint8_t> a(q4::encoded_size(n), 0xaa), b(a.size(), 0x55);
      EXPECT_EQ(q4::encode(g.data(), with_residual ? ra.data() : nullptr, n, a.data()), 0u);
      EXPECT_EQ(quant::quantize(o, g.data(), with_residual ? rb.data() : nullptr, n, 0, b.data()),
                0u);
      ASSERT_EQ(a, b) << "n=" << n << " residual=" << with_residual;
      ASSERT_EQ(std::memcmp(ra.data(), rb.data(), 4 * n), 0) << n;
      EXPECT_NO_THROW(q4::validate(a.data(), a.size(), n, "ok"));
      std::vector<float> da(n), db(n);
      q4::decode(a.data(), n, da.data());
      quant::dequantize(o, b.data(), n, db.data());
      ASSERT_EQ(std::memcmp(da.data(), db.data(), 4 * n), 0) << n;
      std::vector<float> aa = gaussian(n, 23), ab = aa;
      q4::decode_add(a.data(), n, aa.data());
      quant::dequantize_add(o, b.data(), n, ab.data());
      ASSERT_EQ(std::memcmp(aa.data(), ab.data(), 4 * n), 0) << n;
    }
  }
}

// Exact ties of x / scale (half-integers) round to even, as quant's nearbyint does.
TEST(Int4Codec, TiesRoundToEvenAsQuant) {
  const size_t n = 16;
  // amax 7 gives scale 1: x / scale is x itself.
  std::vector<float> g = {7.0f,  0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 3.5f,
                          -3.5f, 4.5f, 5.5f, 6.5f, -6.5f, 0.0f,  -0.0f, -7.0f};
  std::vector<uint8_t> a(q4::encoded_size(n)), b(a.size());
  std::vector<float> ra(n, 0.0f), rb(n, 0.0f);
  q4::encode(g.data(), ra.data(), n, a.data());
  quant::quantize(quant4(), g.data(), rb.data(), n, 0, b.data());
  EXPECT_EQ(a, b);
  EXPECT_EQ(std::memcmp(ra.data(), rb.data(), 4 * n), 0);
  std::vector<float> d(n);
  q4::decode(a.data(), n, d.data());
  EXPECT_EQ(d[1], 0.0f);   // 0.5 -> 0
  EXPECT_EQ(d[2], 2.0f);   // 1.5 -> 2
  EXPECT_EQ(d[3], 2.0f);   // 2.5 -> 2
  EXPECT_EQ(d[7], 4.0f);   // 3.5 -> 4
  EXPECT_EQ(d[11], 6.0f);  // 6.5 -> 6
  EXPECT_EQ(d[12], -6.0f);
}

TEST(Int4Codec, ErrorFeedbackIsExact) {
  for (size_t n : {1u, 3u, 127u, 128u, 129u, 5001u}) {
    std::vector<float> residual(n, 0.0f), sent(n);
    std::vector<uint8_t> bytes(q4::encoded_size(n));
    for (uint32_t round = 0; round < 5; ++round) {
      // Mixed magnitudes inside one block: small values round to 0 and stay in the residual.
      std::vector<float> g = gaussian(n, 7 + round);
      for (size_t i = 0; i < n; i += 3)
        g[i] *= 1e-4f;
      const std::vector<float> before = residual;
      ASSERT_EQ(q4::encode(g.data(), residual.data(), n, bytes.data()), 0u);
      q4::validate(bytes.data(), bytes.size(), n, "test");
      q4::decode(bytes.data(), n, sent.data());
      for (size_t i = 0; i < n; ++i) {
        const float input = before[i] + g[i];
        ASSERT_EQ(sent[i] + residual[i], input) << "n=" << n << " i=" << i;
        // Nearest rounding leaves at most half a step (scale / 2) in the residual.
        const float s = scale_of(bytes, i);
        ASSERT_LE(std::fabs(residual[i]), s / 2 * (1 + 1e-6f)) << "n=" << n << " i=" << i;
      }
      std::vector<float> acc(n, 1.0f);
      q4::decode_add(bytes.data(), n, acc.data());
      for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(acc[i], 1.0f + sent[i]);
    }
  }
}

// Without error feedback the decoded value is within half a step of the input.
TEST(Int4Codec, ErrorIsAtMostHalfAStep) {
  const size_t n = 10000;
  std::vector<float> g = gaussian(n, 31, 3.0f), out(n);
  for (size_t i = 0; i < n; i += 7)
    g[i] *= 1e-3f;
  std::vector<uint8_t> bytes(q4::encoded_size(n));
  q4::encode(g.data(), nullptr, n, bytes.data());
  q4::decode(bytes.data(), n, out.data());
  for (size_t i = 0; i < n; ++i) {
    const float s = scale_of(bytes, i);
    ASSERT_GT(s, 0.0f);
    ASSERT_LE(std::fabs(out[i] - g[i]), s / 2 * (1 + 1e-6f)) << i;
    ASSERT_LE(std::fabs(out[i]), 7 * s) << i;
  }
}

TEST(Int4Codec, NonFiniteIsDroppedAndCounted) {
  const size_t n = 301;  // an odd tail
  std::vector<float> g = gaussian(n, 3), residual(n, 0.5f), out(n);
  g[5] = NAN;
  g[200] = INFINITY;
  g[300] = -INFINITY;
  std::vector<float> ref_residual = residual;
  std::vector<uint8_t> bytes(q4::encoded_size(n)), ref(bytes.size());
  EXPECT_EQ(q4::encode(g.data(), residual.data(), n, bytes.data()), 3u);
  EXPECT_EQ(quant::quantize(quant4(), g.data(), ref_residual.data(), n, 0, ref.data()), 3u);
  EXPECT_EQ(bytes, ref);
  EXPECT_EQ(std::memcmp(residual.data(), ref_residual.data(), 4 * n), 0);
  EXPECT_NO_THROW(q4::validate(bytes.data(), bytes.size(), n, "nonfinite"));
  q4::decode(bytes.data(), n, out.data());
  for (size_t i : {5u, 200u, 300u}) {
    EXPECT_EQ(out[i], 0.0f) << i;
    EXPECT_EQ(residual[i], 0.0f) << i;
  }
  // The rest of those blocks is still sent, with exact error feedback.
  for (size_t i = 0; i < n; ++i) {
    if (i == 5 || i == 200 || i == 300) continue;
    ASSERT_TRUE(std::isfinite(out[i])) << i;
    ASSERT_EQ(out[i] + residual[i], 0.5f + g[i]) << i;
  }
  // Without a residual.
  EXPECT_EQ(q4::encode(g.data(), nullptr, n, bytes.data()), 3u);
}

TEST(Int4Codec, AllZeroBlockSendsNothingAndKeepsTheResidual) {
  // A full block of zeros and the smallest denormals (amax / 7 underflows to a zero scale), and a
  // one-element tail of zeros: nothing is sent, every value stays in the residual.
  const size_t n = 129;
  const float tiny = 0x1p-149f;
  std::vector<float> g(n, 0.0f), residual(n, 0.0f);
  residual[3] = tiny;
  g[3] = tiny;
  g[77] = -tiny;
  residual[128] = -0.0f;
  std::vector<uint8_t> bytes(q4::encoded_size(n));
  EXPECT_EQ(q4::encode(g.data(), residual.data(), n, bytes.data()), 0u);
  EXPECT_EQ(scale_of(bytes, 0), 0.0f);
  for (size_t j = 4; j < 68; ++j)
    EXPECT_EQ(bytes[j], 0x88) << j;
  EXPECT_EQ(scale_of(bytes, 128), 0.0f);
  EXPECT_EQ(bytes[72], 0x08);  // q = 0 in the low nibble, the unused high nibble 0
  EXPECT_EQ(residual[3], 2 * tiny);
  EXPECT_EQ(residual[77], -tiny);
  EXPECT_EQ(residual[0], 0.0f);
  EXPECT_NO_THROW(q4::validate(bytes.data(), bytes.size(), n, "zero"));
  std::vector<float> out(n, 5.0f);
  q4::decode(bytes.data(), n, out.data());
  for (float x : out)
    EXPECT_EQ(x, 0.0f);
}

TEST(Int4Codec, ValidateAcceptsEveryEncoding) {
  for (size_t n : {1u, 2u, 3u, 127u, 128u, 129u, 300u, 301u, 4097u}) {
    std::vector<float> g = gaussian(n, 40 + static_cast<uint32_t>(n), 100.0f);
    for (size_t i = 0; i < n; i += 4)
      g[i] = 0.0f;
    std::vector<uint8_t> bytes(q4::encoded_size(n));
    q4::encode(g.data(), nullptr, n, bytes.data());
    EXPECT_NO_THROW(q4::validate(bytes.data(), bytes.size(), n, "ok")) << n;
  }
}

TEST(Int4Codec, ValidateRefusesTruncatedAndCorruptPieces) {
  const size_t n = 301;  // blocks at elements 0, 128 and 256; the last holds 45 (an odd tail)
  std::vector<float> g = gaussian(n, 4);
  std::vector<uint8_t> bytes(q4::encoded_size(n));
  ASSERT_EQ(bytes.size(), 68u + 68u + 4u + 23u);
  q4::encode(g.data(), nullptr, n, bytes.data());
  EXPECT_NO_THROW(q4::validate(bytes.data(), bytes.size(), n, "ok"));

  // Truncated (one byte short), and meant for fewer elements.
  expect_corrupt(bytes, bytes.size() - 1, n,
                 {"4-bit encoding of 301 elements is 163 bytes, got 162"});
  expect_corrupt(bytes, bytes.size(), n - 2,
                 {"4-bit encoding of 299 elements is 162 bytes, got 163"});
  // 301 and 302 elements take the same 163 bytes: the length cannot tell them apart, the nibbles
  // can. Read as 302, the unused nibble is element 301's code 0 (q = -8) ...
  expect_corrupt(bytes, bytes.size(), n + 1, {"element 301 ", "-8"});
  // ... and 302 elements' encoding read as 301 has a non-zero unused high nibble.
  {
    std::vector<float> g2 = gaussian(n + 1, 5);
    std::vector<uint8_t> b2(q4::encoded_size(n + 1));
    ASSERT_EQ(b2.size(), bytes.size());
    q4::encode(g2.data(), nullptr, n + 1, b2.data());
    EXPECT_NO_THROW(q4::validate(b2.data(), b2.size(), n + 1, "ok"));
    expect_corrupt(b2, b2.size(), n, {"unused high nibble", "element 300"});
  }

  // A NaN, an infinite and a negative scale in the second block.
  for (float bad : {NAN, INFINITY, -INFINITY, -1.0f}) {
    std::vector<uint8_t> c = bytes;
    std::memcpy(c.data() + 68, &bad, 4);
    expect_corrupt(c, c.size(), n, {"block at element 128", "scale"});
  }
  // ... and in the last one.
  {
    std::vector<uint8_t> c = bytes;
    const float bad = -0.5f;
    std::memcpy(c.data() + 136, &bad, 4);
    expect_corrupt(c, c.size(), n, {"block at element 256"});
  }

  // Nibble 0 (q = -8): a low nibble (element 2j), a high one (2j + 1), and the odd tail's last
  // used nibble.
  {
    std::vector<uint8_t> c = bytes;
    c[68 + 4 + 10] &= 0xf0;  // element 128 + 20
    expect_corrupt(c, c.size(), n, {"element 148 ", "-8"});
  }
  {
    std::vector<uint8_t> c = bytes;
    c[4 + 3] &= 0x0f;  // element 7
    expect_corrupt(c, c.size(), n, {"element 7 ", "-8"});
  }
  {
    std::vector<uint8_t> c = bytes;
    c[bytes.size() - 1] &= 0xf0;  // element 300, the last
    expect_corrupt(c, c.size(), n, {"element 300 ", "-8"});
  }

  // A non-zero unused high nibble after the odd tail's last element.
  for (uint8_t high : {1, 8, 15}) {
    std::vector<uint8_t> c = bytes;
    c[bytes.size() - 1] = static_cast<uint8_t>((c[bytes.size() - 1] & 0x0f) | (high << 4));
    expect_corrupt(c, c.size(), n, {"unused high nibble", "element 300"});
  }
  // A scaled-down case: one element.
  {
    std::vector<uint8_t> one(q4::encoded_size(1));
    const float x = 3.0f;
    q4::encode(&x, nullptr, 1, one.data());
    EXPECT_NO_THROW(q4::validate(one.data(), one.size(), 1, "one"));
    one[4] |= 0x70;
    expect_corrupt(one, one.size(), 1, {"unused high nibble", "element 0"});
  }
}

// Error feedback over many steps: nothing submitted is lost, only delayed. The sum of every
// decoded send plus the final residual equals the sum of every input, up to the rounding of the
// sums themselves (each step's identity is exact).
TEST(Int4Codec, ErrorFeedbackOverManyStepsLosesNothing) {
  const size_t n = 1001;
  const int steps = 200;
  std::vector<float> residual(n, 0.0f), sent(n);
  std::vector<double> sent_sum(n, 0.0), input_sum(n, 0.0), bound(n, 1e-12);
  std::vector<uint8_t> bytes(q4::encoded_size(n));
  for (int s = 0; s < steps; ++s) {
    std::vector<float> g = gaussian(n, 500 + static_cast<uint32_t>(s));
    for (size_t i = 0; i < n; i += 3)
      g[i] = 0.01f + 1e-3f * g[i];  // far below a step: delivered only once accumulated
    for (size_t i = 0; i < n; ++i) {
      input_sum[i] += g[i];
      // The one rounding of a step: residual + g in fp32, at most half an ulp of the result.
      bound[i] += std::fabs(residual[i] + g[i]) * 0x1p-24;
    }
    ASSERT_EQ(q4::encode(g.data(), residual.data(), n, bytes.data()), 0u);
    q4::decode(bytes.data(), n, sent.data());
    for (size_t i = 0; i < n; ++i)
      sent_sum[i] += sent[i];
  }
  for (size_t i = 0; i < n; ++i)
    ASSERT_NEAR(sent_sum[i] + residual[i], input_sum[i], bound[i]) << i;
  // The small, biased elements (about 2 in total each) were delivered, not left behind: what is
  // still owed is under half a step.
  for (size_t i = 0; i < n; i += 3) {
    ASSERT_GT(input_sum[i], 1.5) << i;
    ASSERT_GT(sent_sum[i], input_sum[i] - 0.5) << i;
  }
}
