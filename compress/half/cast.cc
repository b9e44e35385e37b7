#include "compress/half/cast.h"

#include <algorithm>
#include <string>
#include <vector>

#include "base/cpu_features.h"
#include "base/error.h"
#include "base/thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace gradex::compress::half {
namespace {

void require_half(DType type, const char* what) {
  if (type != DType::kFloat16 && type != DType::kBFloat16)
    throw InvalidArgument(std::string(what) + ": type must be fp16 or bf16, got " +
                          dtype_name(type));
}

// bf16, branch-free over blocks with 32-bit counters so that the compiler vectorizes it.
CastStats to_bf16_loop(const float* __restrict in, uint16_t* __restrict out, size_t n,
                       float scale) {
  CastStats s;
  for (size_t b = 0; b < n; b += 4096) {
    const size_t e = std::min(n, b + 4096);
    uint32_t sat = 0, nonfinite = 0;
    for (size_t i = b; i < e; ++i) {
      const uint32_t u = float_bits(in[i] * scale);
      const uint32_t abs = u & 0x7fffffffu;
      const uint32_t sign = (u >> 16) & 0x8000u;
      const uint32_t nan = abs > 0x7f800000u;
      const uint32_t fin_sat = (abs >= 0x7f7f8000u) & (abs < 0x7f800000u);
      const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
      uint32_t r = nan ? ((u >> 16) | 0x40u) : rounded;
      r = fin_sat ? (sign | 0x7f7fu) : r;
      out[i] = static_cast<uint16_t>(r);
      sat += fin_sat;
      nonfinite += abs >= 0x7f800000u;
    }
    s.saturated += sat;
    s.nonfinite += nonfinite;
  }
  return s;
}

CastStats to_fp16_scalar(const float* in, uint16_t* out, size_t n, float scale) {
  CastStats s;
  for (size_t i = 0; i < n; ++i) {
    const float x = in[i] * scale;
    bool saturated;
    out[i] = to_half_saturating(x, &saturated);
    s.saturated += saturated;
    s.nonfinite += (float_bits(x) & 0x7fffffffu) >= 0x7f800000u;
  }
  return s;
}

#if defined(__x86_64__)
// F16C: 8 values per iteration; saturation is applied before the hardware rounding (which is to
// nearest even, like float_to_half).
__attribute__((target("avx2,f16c"))) CastStats to_fp16_f16c(const float* in, uint16_t* out,
                                                            size_t n, float scale) {
  CastStats s;
  const __m256 vscale = _mm256_set1_ps(scale);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 limit = _mm256_castsi256_ps(_mm256_set1_epi32(0x477ff000));
  const __m256 fmax = _mm256_set1_ps(3.40282347e38f);
  const __m256 hmax = _mm256_set1_ps(kHalfMax);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_mul_ps(_mm256_loadu_ps(in + i), vscale);
    __m256 a = _mm256_and_ps(x, abs_mask);
    __m256 nonfinite = _mm256_cmp_ps(a, fmax, _CMP_NLE_UQ);  // > max or NaN
    __m256 big = _mm256_andnot_ps(nonfinite, _mm256_cmp_ps(a, limit, _CMP_GE_OQ));
    __m256 clamped = _mm256_or_ps(hmax, _mm256_andnot_ps(abs_mask, x));  // +-65504
    x = _mm256_blendv_ps(x, clamped, big);
    __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
    s.saturated += __builtin_popcount(_mm256_movemask_ps(big));
    s.nonfinite += __builtin_popcount(_mm256_movemask_ps(nonfinite));
  }
  CastStats tail = to_fp16_scalar(in + i, out + i, n - i, scale);
  s.saturated += tail.saturated;
  s.nonfinite += tail.nonfinite;
  return s;
}

__attribute__((target("avx2,f16c"))) void from_fp16_f16c(const uint16_t* in, float* out, size_t n,
                                                         float scale, bool add) {
  const __m256 vscale = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    x = _mm256_mul_ps(x, vscale);
    if (add) x = _mm256_add_ps(x, _mm256_loadu_ps(out + i));
    _mm256_storeu_ps(out + i, x);
  }
  for (; i < n; ++i)
    out[i] = add ? out[i] + half_to_float(in[i]) * scale : half_to_float(in[i]) * scale;
}

bool have_f16c() {
  return cpu_has_avx2_f16c();
}
#endif

void from_half_impl(const uint16_t* __restrict in, float* __restrict out, size_t n, DType type,
                    float scale, bool add) {
  if (type == DType::kBFloat16) {
    for (size_t i = 0; i < n; ++i) {
      const float x = bf16_to_float(in[i]) * scale;
      out[i] = add ? out[i] + x : x;
    }
    return;
  }
#if defined(__x86_64__)
  if (have_f16c()) return from_fp16_f16c(in, out, n, scale, add);
#endif
  for (size_t i = 0; i < n; ++i) {
    const float x = half_to_float(in[i]) * scale;
    out[i] = add ? out[i] + x : x;
  }
}

// Casts are element-wise, so splitting them over the shared pool changes no bit of the result;
// only large buffers are split (below kParallelMin the hand-off costs more than it saves).
constexpr size_t kParallelMin = size_t{1} << 20;
constexpr size_t kPerChunkMin = size_t{1} << 19;

int chunks_for(size_t n) {
  if (n < kParallelMin) return 1;
  return static_cast<int>(
      std::min<size_t>(static_cast<size_t>(shared_pool().threads()), n / kPerChunkMin));
}

// Runs fn(begin, end) over [0, n) in contiguous 64-aligned chunks on the shared pool.
template <typename Fn>
void for_chunks(size_t n, int chunks, Fn&& fn) {
  if (chunks <= 1) return fn(size_t{0}, n);
  const size_t per = ((n + chunks - 1) / chunks + 63) / 64 * 64;
  shared_pool().parallel_for(chunks, [&](int c) {
    const size_t b = std::min(n, per * static_cast<size_t>(c));
    const size_t e = std::min(n, b + per);
    if (b < e) fn(b, e);
  });
}

CastStats to_half_serial(const float* in, uint16_t* out, size_t n, DType type, float scale) {
  if (type == DType::kBFloat16) return to_bf16_loop(in, out, n, scale);
#if defined(__x86_64__)
  if (have_f16c()) return to_fp16_f16c(in, out, n, scale);
#endif
  return to_fp16_scalar(in, out, n, scale);
}

}  // namespace

CastStats to_half(const float* in, uint16_t* out, size_t n, DType type, float scale) {
  require_half(type, "half::to_half");
  const int chunks = chunks_for(n);
  if (chunks <= 1) return to_half_serial(in, out, n, type, scale);
  std::vector<CastStats> parts(static_cast<size_t>(chunks));
  const size_t per = ((n + chunks - 1) / chunks + 63) / 64 * 64;
  for_chunks(n, chunks, [&](size_t b, size_t e) {
    parts[b / per] = to_half_serial(in + b, out + b, e - b, type, scale);
  });
  CastStats s;
  for (const CastStats& p : parts) {
    s.saturated += p.saturated;
    s.nonfinite += p.nonfinite;
  }
  return s;
}

void from_half(const uint16_t* in, float* out, size_t n, DType type, float scale) {
  require_half(type, "half::from_half");
  for_chunks(n, chunks_for(n), [&](size_t b, size_t e) {
    from_half_impl(in + b, out + b, e - b, type, scale, false);
  });
}

void add_from_half(const uint16_t* in, float* out, size_t n, DType type, float scale) {
  require_half(type, "half::add_from_half");
  for_chunks(n, chunks_for(n), [&](size_t b, size_t e) {
    from_half_impl(in + b, out + b, e - b, type, scale, true);
  });
}

namespace {

// A value is non-finite when its exponent bits are all ones: testing bits keeps the loops
// branch-free and identical for the three types. `exponent` is the type's exponent mask.
template <typename Bits>
size_t count_bits(const Bits* v, size_t b, size_t e, Bits exponent) {
  // 32-bit block counters keep the loop vectorizable.
  size_t total = 0;
  for (size_t blk = b; blk < e; blk += 4096) {
    const size_t end = std::min(e, blk + 4096);
    uint32_t c = 0;
    for (size_t i = blk; i < end; ++i)
      c += (v[i] & exponent) == exponent;
    total += c;
  }
  return total;
}

template <typename Bits>
size_t zero_bits(Bits* v, size_t b, size_t e, Bits exponent) {
  size_t count = 0;
  for (size_t i = b; i < e; ++i) {
    const bool bad = (v[i] & exponent) == exponent;
    count += bad;
    if (bad) v[i] = 0;
  }
  return count;
}

// fn(b, e) -> size_t over the pool's chunks, summed.
template <typename Fn>
size_t sum_chunks(size_t n, Fn&& fn) {
  const int chunks = chunks_for(n);
  if (chunks <= 1) return fn(size_t{0}, n);
  std::vector<size_t> parts(static_cast<size_t>(chunks), 0);
  const size_t per = ((n + chunks - 1) / chunks + 63) / 64 * 64;
  for_chunks(n, chunks, [&](size_t b, size_t e) { parts[b / per] = fn(b, e); });
  size_t total = 0;
  for (size_t p : parts)
    total += p;
  return total;
}

uint16_t exponent16(DType type, const char* what) {
  require_half(type, what);
  return type == DType::kFloat16 ? uint16_t{0x7c00u} : uint16_t{0x7f80u};
}

const uint32_t* as_bits(const float* v) {
  return reinterpret_cast<const uint32_t*>(v);
}

}  // namespace

size_t count_nonfinite(const float* v, size_t n) {
  return sum_chunks(n,
                    [&](size_t b, size_t e) { return count_bits(as_bits(v), b, e, 0x7f800000u); });
}

size_t count_nonfinite(const uint16_t* v, size_t n, DType type) {
  const uint16_t exponent = exponent16(type, "half::count_nonfinite");
  return sum_chunks(n, [&](size_t b, size_t e) { return count_bits(v, b, e, exponent); });
}

size_t zero_nonfinite(float* v, size_t n) {
  auto* bits = reinterpret_cast<uint32_t*>(v);
  return sum_chunks(n, [&](size_t b, size_t e) { return zero_bits(bits, b, e, 0x7f800000u); });
}

size_t zero_nonfinite(uint16_t* v, size_t n, DType type) {
  const uint16_t exponent = exponent16(type, "half::zero_nonfinite");
  return sum_chunks(n, [&](size_t b, size_t e) { return zero_bits(v, b, e, exponent); });
}

}  // namespace gradex::compress::half
