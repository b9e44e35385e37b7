#include "sync/dense_exchange.h"

#include <chrono>
#include <cmath>
#include <cstring>

#include "base/check.h"
#include "base/error.h"
#include "base/half.h"
#include "comm/collectives.h"
#include "compress/half/cast.h"

namespace gradex::sync {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct F32 {
  using T = float;
  static float load(T v) { return v; }
  static T store(float v) { return v; }
};
struct F16 {
  using T = uint16_t;
  static float load(T v) { return half_to_float(v); }
  static T store(float v) { return float_to_half(v); }
};
struct BF16 {
  using T = uint16_t;
  static float load(T v) { return bf16_to_float(v); }
  static T store(float v) { return float_to_bf16(v); }
};

// Calls fn(Tag{}) with the type tag matching `t`, so element loops are compiled per type pair.
template <typename Fn>
void with_type(DType t, Fn&& fn) {
  switch (t) {
    case DType::kFloat32:
      fn(F32{});
      return;
    case DType::kFloat16:
      fn(F16{});
      return;
    case DType::kBFloat16:
      fn(BF16{});
      return;
  }
}

float half_type_max(DType t) {
  return t == DType::kFloat16 ? 65504.0f : 3.38953139e38f;
}

template <typename Src, typename Wire>
void pack_typed(const typename Src::T* in, typename Wire::T* out, uint64_t n, float scale,
                float limit, bool zero_nonfinite, DenseCounters& counters) {
  uint64_t nonfinite = 0, saturated = 0;
  for (uint64_t i = 0; i < n; ++i) {
    float v = Src::load(in[i]);
    if (!std::isfinite(v)) {
      ++nonfinite;
      if (zero_nonfinite) v = 0;
    } else {
      v *= scale;
      if (std::fabs(v) > limit) {
        ++saturated;
        v = std::copysign(limit, v);
      }
    }
    out[i] = Wire::store(v);
  }
  counters.nonfinite += nonfinite;
  counters.saturated += saturated;
}

template <typename Wire, typename Dst>
bool unpack_typed(const typename Wire::T* in, typename Dst::T* out, uint64_t n, float divisor) {
  bool nonfinite = false;
  for (uint64_t i = 0; i < n; ++i) {
    float v = Wire::load(in[i]) / divisor;
    nonfinite |= !std::isfinite(v);
    out[i] = Dst::store(v);
  }
  return nonfinite;
}

void pack(const DenseItem& item, DType wire, float scale, const DenseExchangeOptions& options,
          uint8_t* out, DenseCounters& counters) {
  if (item.dtype == DType::kFloat32 && wire != DType::kFloat32) {
    // The common case (fp32 gradients, 16-bit wire): compress/'s vectorized saturating cast.
    const auto* in = static_cast<const float*>(item.data);
    auto* half_out = reinterpret_cast<uint16_t*>(out);
    compress::half::CastStats stats =
        compress::half::to_half(in, half_out, item.numel, wire, scale);
    counters.saturated += stats.saturated;
    counters.nonfinite += stats.nonfinite;
    if (stats.nonfinite > 0 && options.nonfinite == NonFinitePolicy::kZero)
      for (uint64_t i = 0; i < item.numel; ++i)
        if (!std::isfinite(in[i])) half_out[i] = 0;
    return;
  }
  // fp32 on the wire cannot saturate: an infinite limit keeps one loop for every case.
  const float limit = wire == DType::kFloat32 ? INFINITY : half_type_max(wire);
  const bool zero = options.nonfinite == NonFinitePolicy::kZero;
  with_type(item.dtype, [&](auto src) {
    with_type(wire, [&](auto w) {
      using S = decltype(src);
      using W = decltype(w);
      pack_typed<S, W>(static_cast<const typename S::T*>(item.data),
                       reinterpret_cast<typename W::T*>(out), item.numel, scale, limit, zero,
                       counters);
    });
  });
}

void unpack(DenseItem& item, DType wire, int world, const uint8_t* in) {
  if (item.dtype == DType::kFloat32 && wire != DType::kFloat32) {
    auto* out = static_cast<float*>(item.data);
    compress::half::from_half(reinterpret_cast<const uint16_t*>(in), out, item.numel, wire, 1.0f);
    bool nonfinite = false;
    for (uint64_t i = 0; i < item.numel; ++i)
      nonfinite |= !std::isfinite(out[i]);
    item.nonfinite_result = nonfinite;
    return;
  }
  // fp32 sums are divided here; 16-bit values were divided before the cast.
  const float divisor = wire == DType::kFloat32 ? static_cast<float>(world) : 1.0f;
  with_type(wire, [&](auto w) {
    with_type(item.dtype, [&](auto dst) {
      using W = decltype(w);
      using D = decltype(dst);
      item.nonfinite_result =
          unpack_typed<W, D>(reinterpret_cast<const typename W::T*>(in),
                             static_cast<typename D::T*>(item.data), item.numel, divisor);
    });
  });
}

}  // namespace

void dense_average(comm::Communicator& comm, std::vector<DenseItem>& items,
                   const DenseExchangeOptions& options, DenseCounters& counters) {
  const int world = comm.size();
  const DType wire = options.half_on_wire ? options.half_type : DType::kFloat32;
  const size_t elem = dtype_size(wire);
  // 16-bit: divide before the cast so the ring's partial sums stay in range.
  const float scale = wire == DType::kFloat32 ? 1.0f : 1.0f / static_cast<float>(world);
  const size_t bucket_limit = std::max<size_t>(options.fusion_bytes, elem);

  std::vector<uint8_t> bucket;
  size_t begin = 0;
  while (begin < items.size()) {
    // Greedy packing in submission order; an item larger than a bucket travels alone.
    size_t end = begin, bytes = 0;
    while (end < items.size() &&
           (end == begin || bytes + items[end].numel * elem <= bucket_limit)) {
      bytes += items[end].numel * elem;
      ++end;
    }
    bucket.resize(bytes);
    auto t0 = Clock::now();
    size_t offset = 0;
    for (size_t i = begin; i < end; ++i) {
      pack(items[i], wire, scale, options, bucket.data() + offset, counters);
      offset += items[i].numel * elem;
    }
    counters.cast_seconds += seconds_since(t0);

    auto t1 = Clock::now();
    uint64_t sent_before = comm.bytes_sent();
    try {
      comm::allreduce_sum(comm, bucket.data(), bytes / elem, wire);
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
      unpack(items[i], wire, world, bucket.data() + offset);
      offset += items[i].numel * elem;
    }
    GX_CHECK_EQ(offset, bytes);
    counters.cast_seconds += seconds_since(t2);
    begin = end;
  }
}

}  // namespace gradex::sync
