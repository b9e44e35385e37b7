// compress/dct/chunked_dct.h and compress/backend/dct_adam_codec.h on the CPU backend: the
// transform's geometry, orthonormality and inverse; each codec step keeps the Adam codec's
// invariant in the coefficient domain exactly (sent + m_new == fl(b * m_old) + fl(s * C(g))); the
// average every rank writes is C^-1 of the summed coefficients, bit-identical on every rank; a
// smooth gradient arrives almost whole from a few coefficients; a checkpoint continues bit for
// bit and is refused by a codec of another domain or chunk; damaged payloads are refused naming
// the tensor and the rank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "base/error.h"
#include "compress/backend/adam_codec.h"
#include "compress/backend/cpu_backend.h"
#include "compress/backend/dct_adam_codec.h"
#include "compress/dct/chunked_dct.h"
#include "compress/wire/codec.h"
#include "tests/compress/damaged_payloads.h"
#include "tests/compress/test_util.h"

namespace gradex::compress {
namespace {

DgcOptions options(uint32_t chunk = 16) {
  DgcOptions o;
  o.sparsity = 0.99;
  o.momentum = 0;
  o.residual_dct_chunk = chunk;
  return o;
}

std::vector<float> residual(backend::DgcCodec& c) {
  const float* m = c.state().residual();  // host backends: host memory
  return std::vector<float>(m, m + c.state().numel());
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
  return worst;
}

TEST(ChunkedDct, GeometryFollowsRowsAndChunk) {
  dct::ChunkedDct out_proj(16384 * 128, 16384, 64);
  EXPECT_EQ(out_proj.rows(), 16384u);
  EXPECT_EQ(out_proj.cols(), 128u);
  EXPECT_EQ(out_proj.block_rows(), 64u);
  EXPECT_EQ(out_proj.block_cols(), 64u);
  dct::ChunkedDct odd(384 * 100, 384, 64);  // largest divisors <= 64: 64 and 50
  EXPECT_EQ(odd.block_rows(), 64u);
  EXPECT_EQ(odd.block_cols(), 50u);
  dct::ChunkedDct flat(30000, 0, 64);  // rows unknown: one row; 30000 = 60 x 500
  EXPECT_EQ(flat.rows(), 1u);
  EXPECT_EQ(flat.block_rows(), 1u);
  EXPECT_EQ(flat.block_cols(), 60u);
  dct::ChunkedDct prime(65521, 0, 64);
  EXPECT_TRUE(prime.identity());
  EXPECT_THROW(dct::ChunkedDct(1000, 0, 0), InvalidArgument);
  EXPECT_THROW(dct::ChunkedDct(1000, 0, 257), InvalidArgument);
  EXPECT_THROW(dct::ChunkedDct(1000, 7, 64), InvalidArgument);
}

TEST(ChunkedDct, OrthonormalWithAnExactEnoughInverse) {
  const size_t rows = 512, cols = 384, n = rows * cols;  // above the pool's parallel threshold
  dct::ChunkedDct t(n, rows, 64);
  const std::vector<float> x = test::random_grad(n, 3);
  std::vector<float> c(n), back(n), again(n);
  t.forward(x.data(), c.data());
  t.forward(x.data(), again.data());
  EXPECT_EQ(std::memcmp(c.data(), again.data(), n * 4), 0) << "the transform is deterministic";
  double ex = 0, ec = 0;
  for (size_t i = 0; i < n; ++i) {
    ex += static_cast<double>(x[i]) * x[i];
    ec += static_cast<double>(c[i]) * c[i];
  }
  EXPECT_NEAR(ec / ex, 1.0, 1e-5) << "energy is kept";
  t.inverse(c.data(), back.data());
  EXPECT_LT(max_abs_diff(back, x), 1e-5);
}

TEST(ChunkedDct, AConstantBlockIsItsFirstCoefficient) {
  const size_t rows = 32, cols = 32, n = rows * cols;
  dct::ChunkedDct t(n, rows, 16);  // four 16 x 16 blocks
  std::vector<float> x(n), c(n);
  for (size_t r = 0; r < rows; ++r)
    for (size_t j = 0; j < cols; ++j)
      x[r * cols + j] = static_cast<float>(1 + (r / 16) * 2 + j / 16);  // block (R, C): 1 + 2R + C
  t.forward(x.data(), c.data());
  for (size_t b = 0; b < 4; ++b) {
    EXPECT_NEAR(c[b * 256], 16.0f * static_cast<float>(1 + b), 1e-4) << "block " << b;
    for (size_t k = 1; k < 256; ++k)
      ASSERT_NEAR(c[b * 256 + k], 0.0f, 1e-5) << "block " << b << " coefficient " << k;
  }
}

TEST(DctAdamCodec, EveryStepKeepsTheInvariantInTheCoefficientDomain) {
  const size_t rows = 600, cols = 500, n = rows * cols;
  const float decay = 0.9f, scale = 0.5f;
  backend::BackendPtr be = backend::make_cpu_backend();
  backend::StreamPtr stream = be->create_stream();
  backend::DctAdamCodec codec(*be, "w", n, rows, options(64), WireOptions(), decay);
  const dct::ChunkedDct& t = codec.transform();
  EXPECT_EQ(t.block_rows(), 60u);
  EXPECT_EQ(t.block_cols(), 50u);
  for (int step = 0; step < 4; ++step) {
    const std::vector<float> m_old = residual(codec);
    std::vector<float> g = test::random_grad(n, 10 + step), cg(n);
    t.forward(g.data(), cg.data());
    std::vector<uint8_t> payload;
    codec.encode_step(g.data(), scale, *stream, payload);
    for (float x : g)
      ASSERT_EQ(x, 0.0f) << "the gradient buffer is left all zeros";
    const std::vector<float> m_new = residual(codec);
    std::vector<float> sent(n, 0.0f);
    wire::accumulate(wire::decode(payload.data(), payload.size()), sent.data(), n, 1.0f);
    size_t count = 0;
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(sent[i] + m_new[i], decay * m_old[i] + scale * cg[i])
          << "step " << step << " coefficient " << i;
      if (sent[i] != 0.0f) {
        ++count;
        ASSERT_EQ(m_new[i], 0.0f);
      }
    }
    EXPECT_GE(count, n / 200);
    EXPECT_LE(count, n * 13 / 1000);
  }
}

TEST(DctAdamCodec, RanksWriteTheSameInverseOfTheSummedCoefficients) {
  const size_t rows = 256, cols = 300, n = rows * cols;
  backend::BackendPtr be = backend::make_cpu_backend();
  backend::StreamPtr stream = be->create_stream();
  backend::DctAdamCodec r0(*be, "w", n, rows, options(32), WireOptions(), 0.9f);
  backend::DctAdamCodec r1(*be, "w", n, rows, options(32), WireOptions(), 0.9f);
  for (int step = 0; step < 3; ++step) {
    std::vector<float> g0 = test::random_grad(n, 2 * step), g1 = test::random_grad(n, 2 * step + 1);
    std::vector<uint8_t> p0, p1;
    r0.encode_step(g0.data(), 1.0f, *stream, p0);
    r1.encode_step(g1.data(), 1.0f, *stream, p1);
    const std::vector<wire::PayloadSpan> both = {{p0.data(), p0.size()}, {p1.data(), p1.size()}};
    r0.sum_payloads(both, 0.5f, g0.data(), *stream);
    r1.sum_payloads(both, 0.5f, g1.data(), *stream);
    ASSERT_EQ(std::memcmp(g0.data(), g1.data(), n * 4), 0) << "step " << step;
    std::vector<float> coef(n, 0.0f), want(n);
    wire::accumulate(wire::decode(p0.data(), p0.size()), coef.data(), n, 0.5f);
    wire::accumulate(wire::decode(p1.data(), p1.size()), coef.data(), n, 0.5f);
    r0.transform().inverse(coef.data(), want.data());
    ASSERT_EQ(std::memcmp(g0.data(), want.data(), n * 4), 0) << "step " << step;
  }
}

TEST(DctAdamCodec, ASmoothGradientArrivesFromAFewCoefficients) {
  // Rows ranked like a vocabulary (slowly varying) times a feature pattern: 1% of the
  // coefficients carry it almost whole, where 1% of its elements would carry 1% of it.
  const size_t rows = 1024, cols = 64, n = rows * cols;
  std::vector<float> g(n);
  for (size_t r = 0; r < rows; ++r)
    for (size_t j = 0; j < cols; ++j)
      g[r * cols + j] = static_cast<float>(std::exp(-static_cast<double>(r) / 300.0) *
                                           std::cos(0.1 * static_cast<double>(j)));
  backend::BackendPtr be = backend::make_cpu_backend();
  backend::StreamPtr stream = be->create_stream();
  backend::DctAdamCodec codec(*be, "w", n, rows, options(64), WireOptions(), 0.9f);
  std::vector<float> x = g;
  std::vector<uint8_t> payload;
  codec.encode_step(x.data(), 1.0f, *stream, payload);
  codec.sum_payloads({{payload.data(), payload.size()}}, 1.0f, x.data(), *stream);
  double err = 0, energy = 0;
  for (size_t i = 0; i < n; ++i) {
    err += (static_cast<double>(x[i]) - g[i]) * (static_cast<double>(x[i]) - g[i]);
    energy += static_cast<double>(g[i]) * g[i];
  }
  EXPECT_LT(err / energy, 0.05) << "relative squared error of what arrived";
}

TEST(DctAdamCodec, DenseStepSendsTheInverseOfTheDecayedBufferPlusGradient) {
  const size_t rows = 100, cols = 200, n = rows * cols;
  const float decay = 0.8f;
  backend::BackendPtr be = backend::make_cpu_backend();
  backend::StreamPtr stream = be->create_stream();
  backend::DctAdamCodec codec(*be, "w", n, rows, options(20), WireOptions(), decay);
  std::vector<float> g = test::random_grad(n, 1);
  std::vector<uint8_t> payload;
  codec.encode_step(g.data(), 1.0f, *stream, payload);
  const std::vector<float> m = residual(codec);
  std::vector<float> g2 = test::random_grad(n, 2), c2(n), sum(n), want(n);
  codec.transform().forward(g2.data(), c2.data());
  for (size_t i = 0; i < n; ++i)
    sum[i] = decay * m[i] + c2[i];
  codec.transform().inverse(sum.data(), want.data());
  codec.dense_step(g2.data(), 1.0f, *stream);
  EXPECT_EQ(std::memcmp(g2.data(), want.data(), n * 4), 0);
  for (float x : residual(codec))
    ASSERT_EQ(x, 0.0f);
}

TEST(DctAdamCodec, CheckpointContinuesBitForBitAndStaysInItsDomain) {
  const size_t rows = 200, cols = 400, n = rows * cols;
  backend::BackendPtr cpu = backend::make_cpu_backend();
  backend::StreamPtr stream = cpu->create_stream();
  backend::DctAdamCodec running(*cpu, "w", n, rows, options(64), WireOptions(), 0.9f);
  for (int step = 0; step < 3; ++step) {
    std::vector<float> g = test::random_grad(n, step);
    std::vector<uint8_t> p;
    running.encode_step(g.data(), 1.0f, *stream, p);
  }
  const std::vector<uint8_t> blob = running.state().save_state(*cpu, *stream);
  backend::DctAdamCodec restored(*cpu, "w", n, rows, options(64), WireOptions(), 0.9f);
  restored.state().load_state(blob.data(), blob.size(), *cpu, *stream);
  EXPECT_EQ(restored.state().steps_done(), 3u);
  for (int step = 3; step < 6; ++step) {
    std::vector<float> a = test::random_grad(n, step), b = a;
    std::vector<uint8_t> pa, pb;
    running.encode_step(a.data(), 1.0f, *stream, pa);
    restored.encode_step(b.data(), 1.0f, *stream, pb);
    ASSERT_EQ(pa, pb) << "step " << step;
  }
  // Another domain or chunk refuses the blob and keeps its own state.
  backend::AdamCodec elements(*cpu, "w", n, options(0), WireOptions(), 0.9f);
  EXPECT_THROW(elements.state().load_state(blob.data(), blob.size(), *cpu, *stream), StateError);
  EXPECT_EQ(elements.state().steps_done(), 0u);
  backend::DctAdamCodec other_chunk(*cpu, "w", n, rows, options(32), WireOptions(), 0.9f);
  EXPECT_THROW(other_chunk.state().load_state(blob.data(), blob.size(), *cpu, *stream), StateError);
  const std::vector<uint8_t> element_blob = elements.state().save_state(*cpu, *stream);
  EXPECT_THROW(restored.state().load_state(element_blob.data(), element_blob.size(), *cpu, *stream),
               StateError);
  std::vector<uint8_t> damaged = blob;
  damaged[blob.size() / 2] ^= 0x10;
  EXPECT_THROW(restored.state().load_state(damaged.data(), damaged.size(), *cpu, *stream),
               CorruptPayload);
  std::vector<uint8_t> truncated(blob.begin(), blob.begin() + blob.size() / 2);
  EXPECT_ANY_THROW(restored.state().load_state(truncated.data(), truncated.size(), *cpu, *stream));
}

TEST(DctAdamCodec, RefusesAMissingChunk) {
  backend::BackendPtr cpu = backend::make_cpu_backend();
  EXPECT_THROW(backend::DctAdamCodec(*cpu, "w", 1000, 10, options(0), WireOptions(), 0.9f),
               InvalidArgument);
}

TEST(DctAdamCodec, DamagedOrTruncatedPayloadIsRefusedNamingTensorAndRank) {
  const size_t rows = 200, cols = 200, n = rows * cols;
  backend::BackendPtr cpu = backend::make_cpu_backend();
  backend::StreamPtr stream = cpu->create_stream();
  backend::DctAdamCodec r0(*cpu, "embed", n, rows, options(), WireOptions(), 0.9f);
  backend::DctAdamCodec r1(*cpu, "embed", n, rows, options(), WireOptions(), 0.9f);
  test::expect_damaged_payloads_refused(r0, r1, n, "embed", *stream);
}

}  // namespace
}  // namespace gradex::compress
