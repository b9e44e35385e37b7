// The dense quantized route's allreduce (contract in int8_exchange.h): comm's encoded allreduce
// (comm/collectives.h, multi-buffer form) with compress/backend/int8_codec.h's (or int4_codec.h's)
// block encoding on both phases (compress/backend/block_codec.h: the width's table). The
// contribution codec of a tensor carries its residual, the result codec its owner residual; comm/
// moves, validates and sums, in the same fused messages and rank order for every caller of the
// collective.
#include "sync/data/int8_exchange.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "base/wall_time.h"
#include "comm/hierarchical.h"
#include "compress/backend/block_codec.h"

namespace gradex::sync {
namespace {

using compress::backend::BlockCodec;
using Clock = std::chrono::steady_clock;

// Blocks of one width with error feedback into `residual` (indexed by the buffer's element offset;
// null: none kept). Counts the non-finite inputs and the codec's time: encoding and the owner's
// sums as encode time, the decoding of averages as decode time.
class QuantizedCodec : public comm::ChunkCodec {
 public:
  QuantizedCodec(const BlockCodec& format, float* residual, Int8Counters& counters)
      : format_(format), residual_(residual), counters_(counters) {}
  size_t granularity() const override { return format_.block; }
  size_t encoded_size(size_t count) const override { return format_.encoded_size(count); }
  void encode(const float* values, size_t count, size_t offset, uint8_t* out) override {
    const auto t0 = Clock::now();
    counters_.nonfinite +=
        format_.encode(values, residual_ ? residual_ + offset : nullptr, count, out);
    counters_.encode_seconds += seconds_since(t0);
  }
  void decode_add(const uint8_t* in, size_t count, float* acc) const override {
    const auto t0 = Clock::now();
    format_.decode_add(in, count, acc);
    counters_.encode_seconds += seconds_since(t0);
  }
  void decode(const uint8_t* in, size_t count, float* out) const override {
    const auto t0 = Clock::now();
    format_.decode(in, count, out);
    counters_.decode_seconds += seconds_since(t0);
  }
  void validate(const uint8_t* in, size_t bytes, size_t count,
                const std::string& what) const override {
    format_.validate(in, bytes, count, what);
  }

 private:
  const BlockCodec& format_;
  float* residual_;
  Int8Counters& counters_;
};

}  // namespace

comm::Segment int8_segment(size_t numel, int world, int k) {
  return comm::encoded_segment(numel, compress::backend::block_codec(8).block, world, k);
}

void int8_fold_residuals(float* values, float* residual, float* owner_residual, size_t numel,
                         int world) {
  const float P = static_cast<float>(world);
  for (size_t i = 0; i < numel; ++i) {
    values[i] += residual[i] + P * owner_residual[i];
    residual[i] = 0.0f;
    owner_residual[i] = 0.0f;
  }
}

uint64_t int8_encoded_bytes(size_t numel, int bits) {
  return compress::backend::block_codec(bits).encoded_size(numel);
}

void int8_allreduce(comm::Communicator& comm, std::vector<Int8Item>& items, int bits,
                    Int8Counters& counters, bool one_hop, const comm::HostTopology* hierarchy) {
  if (items.empty()) return;
  const BlockCodec& format = compress::backend::block_codec(bits);
  const auto t0 = Clock::now();
  const double codec_before = counters.encode_seconds + counters.decode_seconds;
  std::vector<QuantizedCodec> contribution, owner;
  contribution.reserve(items.size());
  owner.reserve(items.size());
  std::vector<comm::EncodedBuffer> buffers(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    Int8Item& it = items[i];
    contribution.emplace_back(format, it.residual, counters);
    owner.emplace_back(format, it.owner_residual, counters);
    buffers[i] = {&contribution.back(),
                  &owner.back(),
                  it.values,
                  it.values,
                  it.numel,
                  "tensor '" + (it.key ? *it.key : std::string("?")) + "'"};
  }
  comm::EncodedAllreduceOptions options;
  options.name = bits == 4 ? "4-bit" : "8-bit";
  options.one_hop = one_hop;
  const float divisor = static_cast<float>(comm.size());
  options.transform = [divisor](size_t, float* values, size_t count, size_t) {
    for (size_t i = 0; i < count; ++i)
      values[i] = values[i] / divisor;
  };
  if (hierarchy != nullptr)
    comm::hierarchical_encoded_allreduce(comm, *hierarchy, buffers, options);
  else
    comm::encoded_allreduce(comm, buffers, options);
  const double codec = counters.encode_seconds + counters.decode_seconds - codec_before;
  counters.communicate_seconds += std::max(0.0, seconds_since(t0) - codec);
}

}  // namespace gradex::sync
