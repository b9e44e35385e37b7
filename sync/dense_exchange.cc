#include "sync/dense_exchange.h"

#include <chrono>
#include <cmath>
#include <cstring>

#include <memory>

#include "base/check.h"
#include "base/error.h"
#include "base/thread_buffer.h"
#include "comm/collectives.h"
#include "compress/half/cast.h"

namespace gradex::sync {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The fusion bucket (base/thread_buffer.h): every byte of a bucket is packed before the ring
// reads it.
struct FusionBucketTag {};
uint8_t* bucket_buffer(size_t bytes) {
  return thread_buffer<FusionBucketTag>(bytes);
}

void pack(const DenseItem& item, DType wire, float scale, const DenseExchangeOptions& options,
          uint8_t* out, DenseCounters& counters) {
  const bool zero = options.nonfinite == NonFinitePolicy::kZero;
  compress::half::CastStats stats;
  if (item.dtype == DType::kFloat32 && wire != DType::kFloat32) {
    // The common case (fp32 gradients, 16-bit wire): the vectorized saturating cast.
    const auto* in = static_cast<const float*>(item.data);
    auto* half_out = reinterpret_cast<uint16_t*>(out);
    stats = compress::half::to_half(in, half_out, item.numel, wire, scale);
    if (stats.nonfinite > 0 && zero)
      for (uint64_t i = 0; i < item.numel; ++i)
        if (!std::isfinite(in[i])) half_out[i] = 0;
  } else {
    stats = compress::half::convert_saturating(item.data, item.dtype, out, wire, item.numel, scale,
                                               zero);
  }
  counters.saturated += stats.saturated;
  if (stats.saturated > 0 && counters.first_saturated == nullptr)
    counters.first_saturated = item.key;
  counters.nonfinite += stats.nonfinite;
}

void unpack(DenseItem& item, DType wire, int world, const uint8_t* in) {
  if (item.dtype == DType::kFloat32 && wire != DType::kFloat32) {
    // Widening is exact: a result is non-finite exactly where the 16-bit sum is, which is
    // counted on the (half as large) 16-bit bucket.
    const auto* sums = reinterpret_cast<const uint16_t*>(in);
    compress::half::from_half(sums, static_cast<float*>(item.data), item.numel, wire, 1.0f);
    item.nonfinite_result = compress::half::count_nonfinite(sums, item.numel, wire) > 0;
    return;
  }
  // fp32 sums are divided here; 16-bit values were divided before the cast.
  const float divisor = wire == DType::kFloat32 ? static_cast<float>(world) : 1.0f;
  item.nonfinite_result =
      compress::half::convert_divided(in, wire, item.data, item.dtype, item.numel, divisor) > 0;
}

}  // namespace

void dense_average(comm::Communicator& comm, std::vector<DenseItem>& items,
                   const DenseExchangeOptions& options, DenseCounters& counters) {
  const int world = comm.size();
  const DType wire = options.half_on_wire ? options.half_type : DType::kFloat32;
  const size_t elem = dtype_size(wire);
  // 16-bit: divide before the cast so the ring's partial sums stay in range.
  const float scale = wire == DType::kFloat32 ? 1.0f : 1.0f / static_cast<float>(world);
  const size_t bucket_limit = fusion_limit(options.fusion_bytes, elem);

  size_t begin = 0;
  while (begin < items.size()) {
    size_t bytes = 0;
    const size_t end = fusion_bucket_end(items, begin, elem, bucket_limit, bytes);
    uint8_t* bucket = bucket_buffer(bytes);
    auto t0 = Clock::now();
    size_t offset = 0;
    for (size_t i = begin; i < end; ++i) {
      pack(items[i], wire, scale, options, bucket + offset, counters);
      offset += items[i].numel * elem;
    }
    counters.cast_seconds += seconds_since(t0);

    auto t1 = Clock::now();
    uint64_t sent_before = comm.bytes_sent();
    try {
      comm::allreduce_sum(comm, bucket, bytes / elem, wire);
    } catch (const Error& e) {
      std::string keys;
      for (size_t i = begin; i < end && i < begin + 8; ++i)
        keys += (keys.empty() ? "'" : ", '") + (items[i].key ? *items[i].key : "?") + "'";
      if (end - begin > 8) keys += ", ...";
      throw Error(e.code(), "dense bucket of " + std::to_string(end - begin) + " tensor(s) [" +
                                keys + "], " + std::to_string(bytes / elem) + " x " +
                                dtype_name(wire) + ": " + e.what());
    }
    counters.wire_bytes += comm.bytes_sent() - sent_before;
    counters.communicate_seconds += seconds_since(t1);

    auto t2 = Clock::now();
    offset = 0;
    for (size_t i = begin; i < end; ++i) {
      unpack(items[i], wire, world, bucket + offset);
      offset += items[i].numel * elem;
    }
    GX_CHECK_EQ(offset, bytes);
    counters.cast_seconds += seconds_since(t2);
    begin = end;
  }
}

}  // namespace gradex::sync
