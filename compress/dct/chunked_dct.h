// DeMo's transform (arXiv 2411.19870): a tensor of `numel` floats viewed as a rows x cols matrix
// (PyTorch's [out, in, ...] layout: rows = the output rows the plugin registers, 0 or 1 when
// unknown: one row) and cut into blocks of block_rows x block_cols, each the largest divisor of
// its dimension that is at most `chunk`; every block gets an orthonormal 2-D DCT-II. Smooth
// structure (neighbouring rows of an embedding or output matrix whose ids are ranked by
// frequency, neighbouring features) gathers into few coefficients of a block, so a top-k of the
// coefficients keeps more of a tensor's energy than a top-k of its elements, and what a kept
// coefficient sends reaches every element of its block.
//
// Coefficient layout: block after block (row-major over the grid of blocks), each block's
// block_rows x block_cols coefficients row-major, frequency (0, 0) first: numel values, so
// sparse payloads index coefficients exactly as they index elements.
//
// Algorithm: separable, each block's columns then its rows (the inverse: rows, then columns), each
// pass a fast 1-D DCT (lane_dct.h: O(log side) per element for power-of-two sides) run on up to
// kLanes vectors at once: the columns of a strip of blocks are the lanes as they lie in memory;
// block rows are transposed into lanes and back. A strip of block_rows rows is cut into tiles of
// whole blocks (about kTileColumns columns), the unit of work that the pool's threads share.
//
// Numerics: fp32 without FMA contraction (the files are compiled with -ffp-contract=off), each
// element's result computed by the same operations whatever the tile, the lane position or the
// thread: every rank, thread count and piece schedule computes the same bits. inverse(forward(x))
// equals x to rounding (orthonormal); forward and inverse are linear.
#pragma once

#include <cstddef>
#include <cstdint>

#include "compress/dct/lane_dct.h"

namespace gradex {
class ThreadPool;
}

namespace gradex::compress::dct {

class ChunkedDct {
 public:
  // InvalidArgument when chunk is 0 or above kMaxChunk, or rows > 1 does not divide numel.
  ChunkedDct(size_t numel, uint64_t rows, uint32_t chunk);

  static constexpr uint32_t kMaxChunk = 256;
  static constexpr size_t kLanes = 32;         // vectors per 1-D transform call
  static constexpr size_t kTileColumns = 256;  // a tile's width, rounded to whole blocks

  size_t numel() const { return numel_; }
  uint64_t rows() const { return rows_; }
  uint64_t cols() const { return cols_; }
  uint32_t block_rows() const { return br_; }
  uint32_t block_cols() const { return bc_; }
  // True when every block is 1 x 1 (a prime-sized 1-D tensor with no divisor <= chunk): the
  // transform is the identity.
  bool identity() const { return br_ == 1 && bc_ == 1; }

  // out = the coefficients of x / the elements of coefficients; out must not alias the input.
  // Tiles are spread over the shared pool (or `pool`) for tensors of at least 2^16 elements; the
  // result is the same bits at any pool size.
  void forward(const float* x, float* out) const;
  void inverse(const float* coefficients, float* out) const;
  void forward(const float* x, float* out, ThreadPool& pool) const;
  void inverse(const float* coefficients, float* out, ThreadPool& pool) const;

 private:
  void transform(const float* in, float* out, bool inverse, ThreadPool& pool) const;
  // One tile: grid row `grid_row`, block columns [first, last). `work`: work_floats() floats.
  void forward_tile(const float* x, float* out, uint64_t grid_row, uint64_t first, uint64_t last,
                    float* work) const;
  void inverse_tile(const float* coefficients, float* out, uint64_t grid_row, uint64_t first,
                    uint64_t last, float* work) const;
  size_t work_floats() const;
  struct TileWork;  // a tile's work area, split (chunked_dct.cc)
  TileWork tile_work(float* work) const;
  // The 1-D transform along block rows, forward or inverse, shared by both tile directions.
  void along_block_rows(bool inverse, size_t vectors, const float* src, size_t src_block,
                        size_t src_row, float* dst, size_t dst_block, size_t dst_row,
                        const TileWork& w) const;

  size_t numel_;
  uint64_t rows_, cols_;
  uint32_t br_, bc_;
  uint64_t grid_cols_ = 1, tile_blocks_ = 1;  // blocks per grid row, per tile
  LaneDct row_dct_, col_dct_;  // of length br (along a block's columns) and bc (along its rows)
};

}  // namespace gradex::compress::dct
