#include "compress/dct/chunked_dct.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

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

uint64_t checked_rows(size_t numel, uint64_t rows, uint32_t chunk) {
  if (chunk == 0 || chunk > ChunkedDct::kMaxChunk)
    throw InvalidArgument("chunked DCT: chunk must lie in [1, " +
                          std::to_string(ChunkedDct::kMaxChunk) + "], got " +
                          std::to_string(chunk));
  if (rows > 1 && numel % rows != 0)
    throw InvalidArgument("chunked DCT: " + std::to_string(rows) + " rows do not divide " +
                          std::to_string(numel) + " elements");
  return rows > 1 ? rows : 1;
}

// Row-major vectors of `n` floats at src(v) (v < lanes) into lane layout: dst[j * lanes + v].
template <typename Src>
void to_lanes(Src src, uint32_t n, size_t lanes, float* __restrict dst) {
  for (size_t v = 0; v < lanes; ++v) {
    const float* __restrict s = src(v);
    for (uint32_t j = 0; j < n; ++j)
      dst[j * lanes + v] = s[j];
  }
}

// The reverse: src[j * lanes + v] to the vector at dst(v).
template <typename Dst>
void from_lanes(const float* __restrict src, uint32_t n, size_t lanes, Dst dst) {
  for (size_t v = 0; v < lanes; ++v) {
    float* __restrict d = dst(v);
    for (uint32_t j = 0; j < n; ++j)
      d[j] = src[j * lanes + v];
  }
}

}  // namespace

ChunkedDct::ChunkedDct(size_t numel, uint64_t rows, uint32_t chunk)
    : numel_(numel),
      rows_(checked_rows(numel, rows, chunk)),
      cols_(numel / rows_),
      br_(largest_divisor_at_most(rows_, chunk)),
      bc_(largest_divisor_at_most(cols_, chunk)),
      row_dct_(br_),
      col_dct_(bc_) {
  grid_cols_ = bc_ > 0 ? cols_ / bc_ : 0;
  tile_blocks_ = std::max<uint64_t>(1, kTileColumns / bc_);
}

void ChunkedDct::forward(const float* x, float* out) const {
  transform(x, out, false, shared_pool());
}

void ChunkedDct::inverse(const float* coefficients, float* out) const {
  transform(coefficients, out, true, shared_pool());
}

void ChunkedDct::forward(const float* x, float* out, ThreadPool& pool) const {
  transform(x, out, false, pool);
}

void ChunkedDct::inverse(const float* coefficients, float* out, ThreadPool& pool) const {
  transform(coefficients, out, true, pool);
}

size_t ChunkedDct::work_floats() const {
  const size_t strip = static_cast<size_t>(br_) * tile_blocks_ * bc_;
  const size_t packed = 2 * static_cast<size_t>(bc_) * kLanes;
  return strip + packed + std::max(row_dct_.work_floats(kLanes), col_dct_.work_floats(kLanes));
}

void ChunkedDct::transform(const float* in, float* out, bool inverse, ThreadPool& pool) const {
  if (numel_ == 0) return;
  if (identity()) {
    std::copy(in, in + numel_, out);
    return;
  }
  const uint64_t grid_rows = rows_ / br_;
  const uint64_t tiles_per_row = (grid_cols_ + tile_blocks_ - 1) / tile_blocks_;
  const uint64_t tiles = grid_rows * tiles_per_row;
  // Tiles [first, last) of piece `piece` of `pieces`; every tile is computed the same way whatever
  // the piece, so the split changes nothing in the result.
  auto run = [&](int piece, int pieces) {
    // Uninitialised: every float of it is written before it is read.
    const std::unique_ptr<float[]> work(new float[work_floats()]);
    const uint64_t first = tiles * static_cast<uint64_t>(piece) / static_cast<uint64_t>(pieces);
    const uint64_t last = tiles * static_cast<uint64_t>(piece + 1) / static_cast<uint64_t>(pieces);
    for (uint64_t t = first; t < last; ++t) {
      const uint64_t grid_row = t / tiles_per_row;
      const uint64_t b0 = (t % tiles_per_row) * tile_blocks_;
      const uint64_t b1 = std::min(b0 + tile_blocks_, grid_cols_);
      if (inverse)
        inverse_tile(in, out, grid_row, b0, b1, work.get());
      else
        forward_tile(in, out, grid_row, b0, b1, work.get());
    }
  };
  const int threads = pool.threads();
  if (numel_ < kParallelMinElements || threads <= 1 || tiles < 2) {
    run(0, 1);
    return;
  }
  const int pieces =
      static_cast<int>(std::min<uint64_t>(tiles, static_cast<uint64_t>(threads) * 4));
  pool.parallel_for(pieces, [&](int p) { run(p, pieces); });
}

// The work area of a tile (work_floats()): a strip of br rows of the tile's width, the packed
// lanes in and out of the transform along block rows, and the 1-D transforms' work.
struct ChunkedDct::TileWork {
  float *strip, *packed_in, *packed_out, *lane_work;
};

ChunkedDct::TileWork ChunkedDct::tile_work(float* work) const {
  float* packed_in = work + static_cast<size_t>(br_) * tile_blocks_ * bc_;
  float* packed_out = packed_in + static_cast<size_t>(bc_) * kLanes;
  return {work, packed_in, packed_out, packed_out + static_cast<size_t>(bc_) * kLanes};
}

// `vectors` (block b, row i) vectors of bc floats, rows fastest, read at src + b * src_block + i *
// src_row, gathered kLanes at a time into lanes, transformed and scattered to dst + b * dst_block
// + i * dst_row.
void ChunkedDct::along_block_rows(bool inverse, size_t vectors, const float* src, size_t src_block,
                                  size_t src_row, float* dst, size_t dst_block, size_t dst_row,
                                  const TileWork& w) const {
  for (size_t v0 = 0; v0 < vectors; v0 += kLanes) {
    const size_t lanes = std::min(kLanes, vectors - v0);
    to_lanes(
        [&](size_t v) {
          const size_t b = (v0 + v) / br_, i = (v0 + v) % br_;
          return src + b * src_block + i * src_row;
        },
        bc_, lanes, w.packed_in);
    if (inverse)
      col_dct_.inverse(w.packed_in, lanes, w.packed_out, lanes, lanes, w.lane_work);
    else
      col_dct_.forward(w.packed_in, lanes, w.packed_out, lanes, lanes, w.lane_work);
    from_lanes(w.packed_out, bc_, lanes, [&](size_t v) {
      const size_t b = (v0 + v) / br_, i = (v0 + v) % br_;
      return dst + b * dst_block + i * dst_row;
    });
  }
}

// Columns first (the strip's columns are the lanes, no transpose), into the tile's strip; then
// each block row of the strip, transposed into lanes, and its coefficients back to the block.
void ChunkedDct::forward_tile(const float* x, float* out, uint64_t grid_row, uint64_t first,
                              uint64_t last, float* work) const {
  const TileWork w = tile_work(work);
  const size_t width = static_cast<size_t>(last - first) * bc_;
  const float* top = x + grid_row * br_ * cols_ + first * bc_;
  const float* rows_in = top;
  size_t rows_stride = cols_;
  if (br_ > 1) {
    for (size_t c = 0; c < width; c += kLanes)
      row_dct_.forward(top + c, cols_, w.strip + c, width, std::min(kLanes, width - c),
                       w.lane_work);
    rows_in = w.strip;
    rows_stride = width;
  }
  const size_t block_size = static_cast<size_t>(br_) * bc_;
  float* block0 = out + (grid_row * grid_cols_ + first) * block_size;
  along_block_rows(false, static_cast<size_t>(last - first) * br_, rows_in, bc_, rows_stride,
                   block0, block_size, bc_, w);
}

// The forward tile's steps backwards: each block row's inverse into the strip (or, for one-row
// blocks, straight into the tensor), then the strip's columns into the tensor.
void ChunkedDct::inverse_tile(const float* coefficients, float* out, uint64_t grid_row,
                              uint64_t first, uint64_t last, float* work) const {
  const TileWork w = tile_work(work);
  const size_t width = static_cast<size_t>(last - first) * bc_;
  float* top = out + grid_row * br_ * cols_ + first * bc_;
  float* rows_out = br_ > 1 ? w.strip : top;
  const size_t rows_stride = br_ > 1 ? width : cols_;
  const size_t block_size = static_cast<size_t>(br_) * bc_;
  const float* block0 = coefficients + (grid_row * grid_cols_ + first) * block_size;
  along_block_rows(true, static_cast<size_t>(last - first) * br_, block0, block_size, bc_, rows_out,
                   bc_, rows_stride, w);
  if (br_ > 1)
    for (size_t c = 0; c < width; c += kLanes)
      row_dct_.inverse(w.strip + c, width, top + c, cols_, std::min(kLanes, width - c),
                       w.lane_work);
}

}  // namespace gradex::compress::dct
