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
// Numerics: fixed loops in fp32 without FMA contraction (the file is compiled with
// -ffp-contract=off): every rank, thread count and piece schedule computes the same bits.
// inverse(forward(x)) equals x to rounding (orthonormal); forward and inverse are linear.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gradex::compress::dct {

class ChunkedDct {
 public:
  // InvalidArgument when chunk is 0 or above kMaxChunk, or rows > 1 does not divide numel.
  ChunkedDct(size_t numel, uint64_t rows, uint32_t chunk);

  static constexpr uint32_t kMaxChunk = 256;

  size_t numel() const { return numel_; }
  uint64_t rows() const { return rows_; }
  uint64_t cols() const { return cols_; }
  uint32_t block_rows() const { return br_; }
  uint32_t block_cols() const { return bc_; }
  // True when every block is 1 x 1 (a prime-sized 1-D tensor with no divisor <= chunk): the
  // transform is the identity.
  bool identity() const { return br_ == 1 && bc_ == 1; }

  // out = the coefficients of x / the elements of coefficients; out must not alias the input.
  // Blocks are spread over the shared pool for large tensors.
  void forward(const float* x, float* out) const;
  void inverse(const float* coefficients, float* out) const;

 private:
  void transform_blocks(const float* in, float* out, bool inverse) const;

  size_t numel_;
  uint64_t rows_, cols_;
  uint32_t br_, bc_;
  std::vector<float> dr_, dc_;  // br x br and bc x bc DCT-II matrices, frequency-major
  std::vector<float> dc_transposed_;
};

}  // namespace gradex::compress::dct
