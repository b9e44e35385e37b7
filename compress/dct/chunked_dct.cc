#include "compress/dct/chunked_dct.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "base/error.h"
#include "base/thread_pool.h"

namespace gradex::compress::dct {
namespace {

// Below this many elements the pool's hand-off costs more than it saves.
constexpr size_t kParallelMinElements = size_t{1} << 16;

uint32_t largest_divisor_at_most(uint64_t size, uint32_t limit) {
  for (uint32_t c = static_cast<uint32_t>(std::min<uint64_t>(size, limit)); c > 1; --c)
    if (size % c == 0) return c;
  return 1;
}

// Row f, column j: sqrt(2/n) * cos(pi * (2j + 1) * f / (2n)), row 0 scaled by 1/sqrt(2). Computed
// in double and rounded once, so every rank builds the same matrix.
std::vector<float> dct_matrix(uint32_t n) {
  std::vector<float> d(static_cast<size_t>(n) * n);
  const double pi = std::acos(-1.0);
  for (uint32_t f = 0; f < n; ++f)
    for (uint32_t j = 0; j < n; ++j) {
      double v = std::sqrt(2.0 / n) * std::cos(pi * (2.0 * j + 1.0) * f / (2.0 * n));
      if (f == 0) v /= std::sqrt(2.0);
      d[static_cast<size_t>(f) * n + j] = static_cast<float>(v);
    }
  return d;
}

}  // namespace

ChunkedDct::ChunkedDct(size_t numel, uint64_t rows, uint32_t chunk) : numel_(numel) {
  if (chunk == 0 || chunk > kMaxChunk)
    throw InvalidArgument("chunked DCT: chunk must lie in [1, " + std::to_string(kMaxChunk) +
                          "], got " + std::to_string(chunk));
  if (rows > 1 && numel % rows != 0)
    throw InvalidArgument("chunked DCT: " + std::to_string(rows) + " rows do not divide " +
                          std::to_string(numel) + " elements");
  rows_ = rows > 1 ? rows : 1;
  cols_ = numel / rows_;
  br_ = largest_divisor_at_most(rows_, chunk);
  bc_ = largest_divisor_at_most(cols_, chunk);
  dr_ = dct_matrix(br_);
  dc_ = dct_matrix(bc_);
  dc_transposed_.resize(dc_.size());
  for (uint32_t f = 0; f < bc_; ++f)
    for (uint32_t j = 0; j < bc_; ++j)
      dc_transposed_[static_cast<size_t>(j) * bc_ + f] = dc_[static_cast<size_t>(f) * bc_ + j];
}

void ChunkedDct::forward(const float* x, float* out) const {
  transform_blocks(x, out, false);
}

void ChunkedDct::inverse(const float* coefficients, float* out) const {
  transform_blocks(coefficients, out, true);
}

void ChunkedDct::transform_blocks(const float* in, float* out, bool inverse) const {
  if (numel_ == 0) return;
  if (identity()) {
    std::copy(in, in + numel_, out);
    return;
  }
  const uint64_t grid_cols = cols_ / bc_;
  const uint64_t blocks = (rows_ / br_) * grid_cols;
  const size_t block_size = static_cast<size_t>(br_) * bc_;
  // Forward, block X (br x bc): C = Dr X Dc^T. Inverse: X = Dr^T C Dc. Both as two passes through
  // a scratch block T: the left factor first, then the right one.
  auto run = [&](int piece, int pieces) {
    std::vector<float> t(block_size), src(block_size);
    const uint64_t first = blocks * static_cast<uint64_t>(piece) / static_cast<uint64_t>(pieces);
    const uint64_t last = blocks * static_cast<uint64_t>(piece + 1) / static_cast<uint64_t>(pieces);
    for (uint64_t b = first; b < last; ++b) {
      const uint64_t gr = b / grid_cols, gc = b % grid_cols;
      float* dst = nullptr;
      if (!inverse) {  // gather the block from the matrix
        for (uint32_t i = 0; i < br_; ++i) {
          const float* row = in + (gr * br_ + i) * cols_ + gc * bc_;
          std::copy(row, row + bc_, src.data() + static_cast<size_t>(i) * bc_);
        }
        dst = out + b * block_size;
      } else {
        std::copy(in + b * block_size, in + (b + 1) * block_size, src.data());
      }
      // T = L src, L = Dr (forward) or Dr^T (inverse): T[f][j] = sum_i L[f][i] src[i][j].
      for (uint32_t f = 0; f < br_; ++f) {
        float* trow = t.data() + static_cast<size_t>(f) * bc_;
        std::fill(trow, trow + bc_, 0.0f);
        for (uint32_t i = 0; i < br_; ++i) {
          const float l = inverse ? dr_[static_cast<size_t>(i) * br_ + f]
                                  : dr_[static_cast<size_t>(f) * br_ + i];
          const float* srow = src.data() + static_cast<size_t>(i) * bc_;
          for (uint32_t j = 0; j < bc_; ++j)
            trow[j] += l * srow[j];
        }
      }
      // R = T Rt, Rt = Dc^T (forward) or Dc (inverse): R[f][g] = sum_j T[f][j] Rt[j][g].
      for (uint32_t f = 0; f < br_; ++f) {
        const float* trow = t.data() + static_cast<size_t>(f) * bc_;
        float* rrow =
            inverse ? out + (gr * br_ + f) * cols_ + gc * bc_ : dst + static_cast<size_t>(f) * bc_;
        std::fill(rrow, rrow + bc_, 0.0f);
        const std::vector<float>& right = inverse ? dc_ : dc_transposed_;
        for (uint32_t j = 0; j < bc_; ++j) {
          const float tv = trow[j];
          const float* rt = right.data() + static_cast<size_t>(j) * bc_;
          for (uint32_t g = 0; g < bc_; ++g)
            rrow[g] += tv * rt[g];
        }
      }
    }
  };
  const int pool = shared_pool().threads();
  if (numel_ < kParallelMinElements || pool <= 1 || blocks < 2) {
    run(0, 1);
    return;
  }
  const int pieces = static_cast<int>(std::min<uint64_t>(blocks, static_cast<uint64_t>(pool) * 4));
  shared_pool().parallel_for(pieces, [&](int p) { run(p, pieces); });
}

}  // namespace gradex::compress::dct
