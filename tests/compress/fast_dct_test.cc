// The fast DCT (compress/dct/lane_fft.h, lane_dct.h) and the chunked DCT built on it
// (chunked_dct.h) against a direct O(n^2) evaluation of the definitions in double precision: the
// 1-D DCT-II and DCT-III at every length from 1 to 40 and at the sizes blocks take (powers of two
// up to 256, sizes with 3, 5 and large prime factors, primes), the 2-D blocks of tensors of many
// shapes, round trips; a lane's bits do not depend on the lanes beside it, and the chunked DCT's
// bits do not depend on the pool's size or the pieces it cuts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "compress/dct/chunked_dct.h"
#include "compress/dct/lane_dct.h"
#include "tests/compress/test_util.h"

namespace gradex::compress {
namespace {

// The orthonormal DCT-II (inverse: DCT-III) of one vector, directly, in double.
std::vector<double> direct_dct(const std::vector<double>& x, bool inverse) {
  const size_t n = x.size();
  static std::map<size_t, std::vector<double>> matrices;  // n -> [f * n + j]
  std::vector<double>& m = matrices[n];
  if (m.empty()) {
    const double pi = std::acos(-1.0);
    m.resize(n * n);
    for (size_t f = 0; f < n; ++f)
      for (size_t j = 0; j < n; ++j)
        m[f * n + j] = (f == 0 ? std::sqrt(1.0 / n) : std::sqrt(2.0 / n)) *
                       std::cos(pi * (2.0 * j + 1.0) * f / (2.0 * n));
  }
  std::vector<double> y(n, 0.0);
  for (size_t f = 0; f < n; ++f)
    for (size_t j = 0; j < n; ++j) {
      const double c = m[f * n + j];
      if (inverse)
        y[j] += c * x[f];
      else
        y[f] += c * x[j];
    }
  return y;
}

// The chunked 2-D transform of a rows x cols matrix in the documented coefficient layout, directly.
std::vector<double> direct_chunked(const std::vector<float>& x, size_t rows, size_t cols, size_t br,
                                   size_t bc) {
  std::vector<double> out(x.size());
  size_t b = 0;
  for (size_t gr = 0; gr < rows / br; ++gr)
    for (size_t gc = 0; gc < cols / bc; ++gc, ++b) {
      std::vector<std::vector<double>> block(br, std::vector<double>(bc));
      for (size_t i = 0; i < br; ++i)
        for (size_t j = 0; j < bc; ++j)
          block[i][j] = x[(gr * br + i) * cols + gc * bc + j];
      for (size_t i = 0; i < br; ++i)
        block[i] = direct_dct(block[i], false);
      for (size_t j = 0; j < bc; ++j) {
        std::vector<double> col(br);
        for (size_t i = 0; i < br; ++i)
          col[i] = block[i][j];
        col = direct_dct(col, false);
        for (size_t i = 0; i < br; ++i)
          out[b * br * bc + i * bc + j] = col[i];
      }
    }
  return out;
}

double rms(const std::vector<double>& v) {
  double s = 0;
  for (double x : v)
    s += x * x;
  return std::sqrt(s / static_cast<double>(std::max<size_t>(v.size(), 1)));
}

// Runs the lane transform on `lanes` random vectors of length n (row stride `stride` > lanes, to
// show that strides are honoured) and checks each lane against the direct evaluation.
void check_lengths(uint32_t n, size_t lanes, bool inverse) {
  dct::LaneDct t(n);
  const size_t stride = lanes + 3;
  const std::vector<float> x = test::random_grad(n * stride, 100 + n + lanes);
  std::vector<float> y(n * stride, -7.0f), work(t.work_floats(lanes));
  if (inverse)
    t.inverse(x.data(), stride, y.data(), stride, lanes, work.data());
  else
    t.forward(x.data(), stride, y.data(), stride, lanes, work.data());
  for (size_t w = 0; w < lanes; ++w) {
    std::vector<double> xv(n);
    for (uint32_t j = 0; j < n; ++j)
      xv[j] = x[j * stride + w];
    const std::vector<double> want = direct_dct(xv, inverse);
    const double scale = rms(want);
    for (uint32_t f = 0; f < n; ++f)
      ASSERT_LT(std::fabs(y[f * stride + w] - want[f]), 1e-6 * scale * std::log2(2.0 * n))
          << (inverse ? "DCT-III" : "DCT-II") << " n " << n << " lane " << w << " index " << f;
  }
  for (uint32_t f = 0; f < n; ++f)
    for (size_t w = lanes; w < stride; ++w)
      ASSERT_EQ(y[f * stride + w], -7.0f) << "wrote outside its lanes";
}

const std::vector<uint32_t> kBlockSides = {48,  50,  60,  64,  96,  100, 121, 125, 127,
                                           128, 192, 200, 250, 251, 254, 255, 256};

TEST(LaneDct, MatchesTheDirectDefinitionAtEveryLength) {
  for (uint32_t n = 1; n <= 40; ++n)
    for (size_t lanes : {1, 5, 32})
      for (bool inverse : {false, true})
        check_lengths(n, lanes, inverse);
  for (uint32_t n : kBlockSides)
    for (bool inverse : {false, true})
      check_lengths(n, 9, inverse);
}

TEST(LaneDct, InverseUndoesForward) {
  for (uint32_t n : {2u, 7u, 16u, 63u, 64u, 100u, 256u}) {
    dct::LaneDct t(n);
    const size_t lanes = 12;
    const std::vector<float> x = test::random_grad(n * lanes, n);
    std::vector<float> c(x.size()), back(x.size()), work(t.work_floats(lanes));
    t.forward(x.data(), lanes, c.data(), lanes, lanes, work.data());
    t.inverse(c.data(), lanes, back.data(), lanes, lanes, work.data());
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_NEAR(back[i], x[i], 1e-5) << "n " << n << " element " << i;
  }
}

// The chunked DCT relies on this for bits that do not depend on tiles or threads.
TEST(LaneDct, ALaneGivesTheSameBitsAloneOrBesideOthers) {
  for (uint32_t n : {3u, 8u, 50u, 64u, 127u}) {
    dct::LaneDct t(n);
    const size_t lanes = 37;  // a vector body and a scalar tail
    const std::vector<float> x = test::random_grad(n * lanes, 9 * n);
    std::vector<float> all(x.size()), work(t.work_floats(lanes));
    for (bool inverse : {false, true}) {
      if (inverse)
        t.inverse(x.data(), lanes, all.data(), lanes, lanes, work.data());
      else
        t.forward(x.data(), lanes, all.data(), lanes, lanes, work.data());
      for (size_t w : {size_t{0}, size_t{17}, lanes - 1}) {
        std::vector<float> one(n);
        if (inverse)
          t.inverse(x.data() + w, lanes, one.data(), 1, 1, work.data());
        else
          t.forward(x.data() + w, lanes, one.data(), 1, 1, work.data());
        for (uint32_t f = 0; f < n; ++f)
          ASSERT_EQ(std::memcmp(&one[f], &all[f * lanes + w], 4), 0)
              << "n " << n << " lane " << w << " index " << f;
      }
    }
  }
}

struct Shape {
  size_t rows, cols;
  uint32_t chunk;
};

TEST(ChunkedDct, MatchesTheDirectBlockTransformAndInvertsIt) {
  const std::vector<Shape> shapes = {{256, 384, 64},  // 64 x 64 blocks, several tiles per strip
                                     {300, 200, 64},  // 60 x 50
                                     {96, 1000, 64},  // 48 x 50
                                     {1, 30000, 64},  // one row: 1 x 60 blocks
                                     {131, 64, 64},   // a prime row count: 1 x 64 blocks
                                     {64, 131, 64},   // a prime column count: 64 x 1 blocks
                                     {512, 512, 256}, {250, 255, 256}, {24, 36, 8}};
  for (const Shape& s : shapes) {
    const size_t n = s.rows * s.cols;
    dct::ChunkedDct t(n, s.rows, s.chunk);
    const std::vector<float> x = test::random_grad(n, n + s.chunk);
    std::vector<float> c(n), back(n);
    t.forward(x.data(), c.data());
    const std::vector<double> want =
        direct_chunked(x, t.rows(), t.cols(), t.block_rows(), t.block_cols());
    const double tol = 1e-6 * std::log2(2.0 * t.block_rows() * t.block_cols());
    for (size_t i = 0; i < n; ++i)
      ASSERT_LT(std::fabs(c[i] - want[i]), tol)
          << s.rows << " x " << s.cols << " chunk " << s.chunk << " coefficient " << i;
    t.inverse(c.data(), back.data());
    for (size_t i = 0; i < n; ++i)
      ASSERT_LT(std::fabs(back[i] - x[i]), tol)
          << s.rows << " x " << s.cols << " chunk " << s.chunk << " element " << i;
  }
}

// Pools of 1, 2, 3 and 7 threads (1 + 4 pieces per thread, tiles of unequal count per piece)
// compute the same bits, forward and inverse, for block shapes that take every path.
TEST(ChunkedDct, TheSameBitsAtAnyPoolSize) {
  const std::vector<Shape> shapes = {
      {1024, 640, 64}, {600, 500, 64}, {1, 300000, 64}, {131, 1024, 64}, {2048, 131, 64}};
  ThreadPool one(1), two(2), three(3), seven(7);
  for (const Shape& s : shapes) {
    const size_t n = s.rows * s.cols;
    ASSERT_GE(n, size_t{1} << 16) << "below the pool's threshold";
    dct::ChunkedDct t(n, s.rows, s.chunk);
    const std::vector<float> x = test::random_grad(n, s.rows);
    std::vector<float> c1(n), x1(n);
    t.forward(x.data(), c1.data(), one);
    t.inverse(c1.data(), x1.data(), one);
    for (ThreadPool* pool : {&two, &three, &seven}) {
      std::vector<float> c(n), back(n);
      t.forward(x.data(), c.data(), *pool);
      t.inverse(c1.data(), back.data(), *pool);
      ASSERT_EQ(std::memcmp(c.data(), c1.data(), n * 4), 0)
          << s.rows << " x " << s.cols << ", " << pool->threads() << " threads, forward";
      ASSERT_EQ(std::memcmp(back.data(), x1.data(), n * 4), 0)
          << s.rows << " x " << s.cols << ", " << pool->threads() << " threads, inverse";
    }
  }
}

}  // namespace
}  // namespace gradex::compress
