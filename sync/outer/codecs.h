// The encodings DiLoCo's exchange moves through comm::encoded_allreduce: plain fp32 (exact, for
// bits = 32) and compress/quant's block quantization with error feedback.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/collectives.h"
#include "compress/quant/quant.h"

namespace gradex::sync::outer {

// Identity: 4 bytes per element, bit-exact.
class Fp32Codec : public comm::ChunkCodec {
 public:
  explicit Fp32Codec(size_t granularity = 1) : granularity_(granularity) {}
  size_t granularity() const override { return granularity_; }
  size_t encoded_size(size_t count) const override { return 4 * count; }
  void encode(const float* values, size_t count, size_t offset, uint8_t* out) override;
  void decode_add(const uint8_t* in, size_t count, float* acc) const override;
  void decode(const uint8_t* in, size_t count, float* out) const override;

 private:
  size_t granularity_;
};

// Block quantization (granularity = block). With error feedback, the codec keeps a residual for
// elements [residual_begin, residual_begin + residual_count) of the buffer (a contribution codec:
// the whole buffer; an owner's result codec: its segment) and encode() must stay inside it.
// Stochastic rounding draws element i of round n at counter n * stride + i, so no draw repeats
// across rounds; set the round with set_round() before each exchange.
class QuantCodec : public comm::ChunkCodec {
 public:
  QuantCodec(const compress::quant::QuantOptions& options, bool error_feedback,
             size_t residual_begin, size_t residual_count, uint64_t stride);
  size_t granularity() const override { return options_.block; }
  size_t encoded_size(size_t count) const override;
  void encode(const float* values, size_t count, size_t offset, uint8_t* out) override;
  void decode_add(const uint8_t* in, size_t count, float* acc) const override;
  void decode(const uint8_t* in, size_t count, float* out) const override;

  void set_round(uint64_t round) { round_ = round; }
  std::vector<float>& residual() { return residual_; }
  size_t residual_begin() const { return residual_begin_; }
  // Non-finite values met by encode() since construction.
  uint64_t nonfinite() const { return nonfinite_; }

 private:
  compress::quant::QuantOptions options_;
  bool error_feedback_;
  size_t residual_begin_;
  std::vector<float> residual_;
  uint64_t stride_;
  uint64_t round_ = 0;
  uint64_t nonfinite_ = 0;
};

}  // namespace gradex::sync::outer
