// Conversions between any two of fp32, fp16 and bf16 (compress/half/cast.h: convert_saturating,
// convert_divided): the dense exchange packs tensors of any type into a bucket of any wire type
// and unpacks the sums. Element loops are compiled per (source, destination) type pair.
#include <cmath>
#include <string>

#include "base/error.h"
#include "compress/half/cast.h"

namespace gradex::compress::half {
namespace {

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

// Calls fn(Tag{}) with the type tag matching `t`.
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
  throw InvalidArgument("half::convert: unknown dtype " + std::to_string(static_cast<int>(t)));
}

template <typename Src, typename Dst>
CastStats saturating(const typename Src::T* in, typename Dst::T* out, size_t n, float scale,
                     float limit, bool zero_nonfinite) {
  CastStats s;
  for (size_t i = 0; i < n; ++i) {
    float v = Src::load(in[i]);
    if (!std::isfinite(v)) {
      ++s.nonfinite;
      if (zero_nonfinite) v = 0;
    } else {
      v *= scale;
      if (std::fabs(v) > limit) {
        ++s.saturated;
        v = std::copysign(limit, v);
      }
    }
    out[i] = Dst::store(v);
  }
  return s;
}

template <typename Src, typename Dst>
size_t divided(const typename Src::T* in, typename Dst::T* out, size_t n, float divisor) {
  size_t nonfinite = 0;
  for (size_t i = 0; i < n; ++i) {
    const float v = Src::load(in[i]) / divisor;
    nonfinite += !std::isfinite(v);
    out[i] = Dst::store(v);
  }
  return nonfinite;
}

}  // namespace

CastStats convert_saturating(const void* in, DType in_type, void* out, DType out_type, size_t n,
                             float scale, bool zero_nonfinite) {
  // fp32 cannot saturate: an infinite limit keeps one loop for every case.
  const float limit = out_type == DType::kFloat16    ? kHalfMax
                      : out_type == DType::kBFloat16 ? kBFloat16Max
                                                     : INFINITY;
  CastStats stats;
  with_type(in_type, [&](auto src) {
    with_type(out_type, [&](auto dst) {
      using S = decltype(src);
      using D = decltype(dst);
      stats = saturating<S, D>(static_cast<const typename S::T*>(in),
                               static_cast<typename D::T*>(out), n, scale, limit, zero_nonfinite);
    });
  });
  return stats;
}

size_t convert_divided(const void* in, DType in_type, void* out, DType out_type, size_t n,
                       float divisor) {
  size_t nonfinite = 0;
  with_type(in_type, [&](auto src) {
    with_type(out_type, [&](auto dst) {
      using S = decltype(src);
      using D = decltype(dst);
      nonfinite = divided<S, D>(static_cast<const typename S::T*>(in),
                                static_cast<typename D::T*>(out), n, divisor);
    });
  });
  return nonfinite;
}

}  // namespace gradex::compress::half
