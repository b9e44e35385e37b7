// The encodings DiLoCo's exchange moves: through comm::encoded_allreduce, plain fp32 (exact, for
// bits = 32) and compress/quant's block quantization with error feedback; through an allgather of
// variable-length payloads, DGC-style top-k of the pseudo-gradient (compress/dgc's exact selection,
// compress/wire's sparse format) with error feedback.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/collectives.h"
#include "compress/options.h"
#include "compress/quant/quant.h"
#include "compress/wire/codec.h"

namespace gradex::outer {

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

// Top-k with error feedback over one fragment of `numel` elements: encode() adds delta to the
// residual r (v = r + delta, in fp32), sends the k = ceil(density * numel) entries of largest |v|
// (compress/dgc::exact_top_k: ties by lower index, zeros never sent) as exact fp32 values in
// compress/wire's sparse format, and keeps the rest as the new residual, so sent + r' == r + delta
// element by element, exactly. Non-finite entries of v are counted, dropped (not sent) and their
// residual reset to 0. decode_add() adds a payload's values to an accumulator (one fp32 addition
// per sent element; untouched elements add nothing), so summing every rank's payload in rank order
// gives the same bits on every rank, and with density 1 the same bits as a dense fp32 sum of the
// same deltas in the same order.
class TopkCodec {
 public:
  // key: tags payloads (the fragment index); a payload with another key or size is rejected.
  TopkCodec(double density, uint64_t numel, uint64_t key, const compress::WireOptions& wire);
  size_t k() const { return k_; }
  // Returns the non-finite values met; `out` is replaced by the payload.
  uint64_t encode(const float* delta, std::vector<uint8_t>& out);
  // acc (numel floats) += the payload's values. CorruptPayload / MismatchError on a bad payload.
  void decode_add(const uint8_t* in, size_t size, float* acc);
  std::vector<float>& residual() { return residual_; }
  const std::vector<float>& residual() const { return residual_; }

 private:
  uint64_t key_;
  size_t k_;
  compress::WireOptions wire_;
  std::vector<float> residual_;
  std::vector<uint32_t> indices_;
  std::vector<float> values_;
  std::vector<float> scratch_;
  compress::wire::DecodedPayload decoded_;
};

}  // namespace gradex::outer
