// Kernels on the shared worker pool give the bytes a serial pass gives: the large-buffer casts
// (split over the pool) against the same casts done in small serial pieces, the non-finite count
// against a plain loop, and parallel_chunks against its documented chunking.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>

#include "base/thread_pool.h"
#include "compress/dgc/parallel.h"
#include "compress/half/cast.h"

namespace gradex::compress {
namespace {

// Values with every exponent (NaN, Inf, subnormals, values beyond the 16-bit range).
std::vector<float> random_bits(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> x(n);
  for (auto& v : x)
    v = bits_float(rng());
  return x;
}

// Below the parallel threshold; a multiple of 8 like the pool's 64-aligned chunks, so that every
// element takes the same (vector or scalar-tail) path both ways: NaN payloads differ between them.
constexpr size_t kSerialPiece = 4104;

TEST(PoolCasts, LargeCastsMatchSerialPiecesBitForBit) {
  ASSERT_GE(shared_pool().threads(), 1);
  const size_t n = (size_t{1} << 20) + 77;
  auto x = random_bits(n, 7);
  for (DType t : {DType::kFloat16, DType::kBFloat16}) {
    for (float scale : {1.0f, 0.25f}) {
      std::vector<uint16_t> par(n), ser(n);
      half::CastStats ps = half::to_half(x.data(), par.data(), n, t, scale);
      half::CastStats ss;
      for (size_t b = 0; b < n; b += kSerialPiece) {
        const size_t m = std::min(kSerialPiece, n - b);
        half::CastStats s = half::to_half(x.data() + b, ser.data() + b, m, t, scale);
        ss.saturated += s.saturated;
        ss.nonfinite += s.nonfinite;
      }
      ASSERT_EQ(0, std::memcmp(par.data(), ser.data(), n * 2)) << dtype_name(t);
      EXPECT_EQ(ps.saturated, ss.saturated);
      EXPECT_EQ(ps.nonfinite, ss.nonfinite);
      EXPECT_GT(ps.nonfinite, 0u);

      std::vector<float> back_par(n), back_ser(n);
      half::from_half(par.data(), back_par.data(), n, t, scale);
      for (size_t b = 0; b < n; b += kSerialPiece)
        half::from_half(par.data() + b, back_ser.data() + b, std::min(kSerialPiece, n - b), t,
                        scale);
      ASSERT_EQ(0, std::memcmp(back_par.data(), back_ser.data(), n * 4));

      std::vector<float> acc_par = random_bits(n, 9), acc_ser = acc_par;
      half::add_from_half(par.data(), acc_par.data(), n, t, scale);
      for (size_t b = 0; b < n; b += kSerialPiece)
        half::add_from_half(par.data() + b, acc_ser.data() + b, std::min(kSerialPiece, n - b), t,
                            scale);
      ASSERT_EQ(0, std::memcmp(acc_par.data(), acc_ser.data(), n * 4));
    }
  }
}

TEST(PoolCasts, CountNonfiniteMatchesAPlainLoop) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{4097}, (size_t{1} << 20) + 3}) {
    auto x = random_bits(n, static_cast<uint32_t>(n) + 1);
    if (n > 2) {
      x[0] = std::numeric_limits<float>::infinity();
      x[n - 1] = -std::numeric_limits<float>::quiet_NaN();
    }
    size_t want = 0;
    for (float v : x)
      want += !std::isfinite(v);
    EXPECT_EQ(half::count_nonfinite(x.data(), n), want) << n;
  }
}

TEST(PoolChunks, ChunksCoverTheRangeInOrderWithTheirDocumentedBounds) {
  const size_t n = 1000003;
  for (int threads : {1, 2, 3, 8, 13}) {
    std::vector<std::atomic<int>> seen(n);
    std::vector<std::pair<size_t, size_t>> bounds(static_cast<size_t>(threads));
    dgc::parallel_chunks(n, threads, [&](int c, size_t b, size_t e) {
      bounds[static_cast<size_t>(c)] = {b, e};
      for (size_t i = b; i < e; ++i)
        seen[i].fetch_add(1, std::memory_order_relaxed);
    });
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(seen[i].load(), 1) << i;
    for (int c = 0; c < threads; ++c) {
      size_t b, e;
      dgc::chunk_bounds(n, threads, c, &b, &e);
      if (threads == 1) b = 0, e = n;
      EXPECT_EQ(bounds[static_cast<size_t>(c)], std::make_pair(b, e)) << threads << " " << c;
    }
  }
}

TEST(PoolChunks, WorkerExceptionReachesTheCaller) {
  EXPECT_THROW(dgc::parallel_chunks(1 << 20, 4,
                                    [](int c, size_t, size_t) {
                                      if (c == 2) throw std::out_of_range("chunk 2");
                                    }),
               std::out_of_range);
}

}  // namespace
}  // namespace gradex::compress
