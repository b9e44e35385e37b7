// The DGC step and the 16-bit casts written once with Thrust algorithms over raw pointers. It is
// compiled twice: by nvcc for the GPU (cuda/dgc_cuda.cu, policy thrust::cuda::par.on(stream)) and
// by the host compiler on Thrust's OpenMP backend (thrust/dgc_thrust_omp.cc), which is how CI tests
// it against the CPU kernels. Internal: include only from those two files.
//
// `B` (the backend) supplies policy() and load(const T*) (a device-to-host read of one value).
// Semantics match DgcCompressor exactly (reuse_threshold off): same sample, same acceptance rule
// and bracket adaptation, same exact top-k with ties broken by lower index.
#pragma once

#include <thrust/binary_search.h>
#include <thrust/copy.h>
#include <thrust/count.h>
#include <thrust/extrema.h>
#include <thrust/fill.h>
#include <thrust/for_each.h>
#include <thrust/functional.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/merge.h>
#include <thrust/sort.h>
#include <thrust/transform.h>
#include <thrust/transform_reduce.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "compress/thrust/dgc_params.h"

#if defined(__CUDACC__)
#define GX_HD __host__ __device__
#else
#define GX_HD
#endif

namespace gradex::compress::thrust_dgc {

GX_HD inline uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
GX_HD inline float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
// |x| with NaN mapped to 0, as the CPU selection does.
GX_HD inline float magnitude(float x) {
  float a = fabsf(x);
  return a == a ? a : 0.0f;
}

// x rounded to the nearest fp16 / bf16 value (ties to even), saturating finite values to the
// largest finite 16-bit value; as fp32. Equal to compress::half::round_to for every input.
GX_HD inline float round_fp16(float x, int* saturated) {
  uint32_t u = f2u(x), abs = u & 0x7fffffffu, sign = u & 0x80000000u;
  if (abs >= 0x7f800000u) return x;
  if (abs >= 0x477ff000u) {
    *saturated = 1;
    return u2f(sign | f2u(65504.0f));
  }
  if (abs < 0x38800000u) {  // fp16 subnormal range: a multiple of 2^-24
    float r = rintf(x * 16777216.0f) * 5.9604644775390625e-8f;
    return u2f(f2u(r) | sign);  // keep the sign of zero
  }
  uint32_t r = (abs + 0xfffu + ((abs >> 13) & 1u)) & ~0x1fffu;
  return u2f(sign | r);
}
GX_HD inline float round_bf16(float x, int* saturated) {
  uint32_t u = f2u(x), abs = u & 0x7fffffffu, sign = u & 0x80000000u;
  if (abs >= 0x7f800000u) return x;
  if (abs >= 0x7f7f8000u) {
    *saturated = 1;
    return u2f(sign | 0x7f7f0000u);
  }
  return u2f((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}

struct SquareD {
  GX_HD double operator()(float x) const { return double(x) * double(x); }
};

struct Update {
  const float* g;
  float* u;
  float* v;
  float m, s;
  int mode;  // 0 plain, 1 momentum, 2 nesterov
  GX_HD void operator()(size_t i) const {
    const float gi = g[i] * s;
    if (mode == 0) {
      v[i] = v[i] + gi;
      return;
    }
    const float ui = m * u[i] + gi;
    u[i] = ui;
    v[i] = mode == 2 ? v[i] + (gi + m * ui) : v[i] + ui;
  }
};

struct AtLeast {  // |v[i]| >= t
  const float* v;
  float t;
  GX_HD bool operator()(size_t i) const { return fabsf(v[i]) >= t; }
};
struct Above {  // magnitude(v[i]) > t
  const float* v;
  float t;
  GX_HD bool operator()(size_t i) const { return magnitude(v[i]) > t; }
};
struct Equal {  // magnitude(v[i]) == t (t > 0)
  const float* v;
  float t;
  GX_HD bool operator()(size_t i) const { return magnitude(v[i]) == t; }
};
struct BitsAtLeast {  // bits(magnitude(v[i])) >= b
  const float* v;
  uint32_t b;
  GX_HD bool operator()(size_t i) const { return f2u(magnitude(v[i])) >= b; }
};
struct SampleAt {
  const float* v;
  size_t offset, stride;
  GX_HD float operator()(size_t j) const { return magnitude(v[offset + j * stride]); }
};
struct MagnitudeOf {
  const float* v;
  GX_HD float operator()(uint32_t i) const { return fabsf(v[i]); }
};

// |sent + residual| of selected element j: its |v| before masking (exact, by the invariant). An
// infinite v is sent whole and leaves a NaN residual (inf - inf): its magnitude is |sent|.
struct RestoredMagnitude {
  const uint32_t* idx;
  const float* v;
  const float* sent;
  GX_HD float operator()(size_t j) const {
    const float s = sent[j];
    return (f2u(s) & 0x7fffffffu) == 0x7f800000u ? fabsf(s) : fabsf(s + v[idx[j]]);
  }
};

// Masking: values out, residual keeps the rounding error, momentum zeroed. Returns saturated count.
struct Finish {
  const uint32_t* idx;
  float* v;
  float* u;
  float* out;
  int dtype;
  GX_HD int operator()(size_t j) const {
    const uint32_t i = idx[j];
    const float x = v[i];
    int sat = 0;
    const float sent = dtype == 1 ? round_fp16(x, &sat) : dtype == 2 ? round_bf16(x, &sat) : x;
    out[j] = sent;
    v[i] = x - sent;
    if (u) u[i] = 0.0f;
    return sat;
  }
};

template <class B>
class StepAlgo {
 public:
  StepAlgo(B& b, const StepParams& p, float* u, float* v, float* sample, uint32_t* cand,
           float* cand_mag, uint32_t* out_idx)
      : b_(b), p_(p), u_(u), v_(v), sample_(sample), cand_(cand), mag_(cand_mag), out_(out_idx) {}

  StepResult run(const float* g, float* out_val) {
    StepResult r;
    if (p_.n == 0) return finish(r, out_val, 0);
    r.grad_scale = clip_scale(g) * p_.grad_scale;
    const int mode = p_.momentum == 0.0f ? 0 : (p_.nesterov ? 2 : 1);
    thrust::for_each_n(b_.policy(), it(0), p_.n,
                       Update{g, u_, v_, p_.momentum, r.grad_scale, mode});
    if (!p_.exact && p_.k >= p_.n) {  // dense target: every non-zero element, no rounds
      const float kMin = 1.401298464e-45f;
      return finish(r, out_val, take(kMin, count(kMin)));
    }
    if (!p_.exact) {
      size_t c = 0;
      if (select_adaptive(&r.rounds, &c)) return finish(r, out_val, c);
    }
    r.exact = true;
    return finish(r, out_val, exact_top_k());
  }

  // The dense step: the same update, then v is moved to dense_out (v zeroed, u kept).
  StepResult run_dense(const float* g, float* dense_out) {
    StepResult r;
    if (p_.n == 0) return r;
    r.grad_scale = clip_scale(g) * p_.grad_scale;
    const int mode = p_.momentum == 0.0f ? 0 : (p_.nesterov ? 2 : 1);
    thrust::for_each_n(b_.policy(), it(0), p_.n,
                       Update{g, u_, v_, p_.momentum, r.grad_scale, mode});
    thrust::copy(b_.policy(), v_, v_ + p_.n, dense_out);
    thrust::fill(b_.policy(), v_, v_ + p_.n, 0.0f);
    r.count = p_.n;
    return r;
  }

 private:
  static thrust::counting_iterator<size_t> it(size_t i) {
    return thrust::counting_iterator<size_t>(i);
  }

  float clip_scale(const float* g) {
    if (p_.clip_limit <= 0) return 1.0f;
    double ss =
        thrust::transform_reduce(b_.policy(), g, g + p_.n, SquareD{}, 0.0, thrust::plus<double>());
    double norm = std::sqrt(ss);
    return norm > p_.clip_limit ? static_cast<float>(p_.clip_limit / norm) : 1.0f;
  }

  size_t count(float t) { return thrust::count_if(b_.policy(), it(0), it(p_.n), AtLeast{v_, t}); }
  size_t count_bits(uint32_t b) {
    return thrust::count_if(b_.policy(), it(0), it(p_.n), BitsAtLeast{v_, b});
  }

  // Candidates |v| >= t, sorted, into out_ (trimmed to the exact top k when above `high`).
  size_t take(float t, size_t c) {
    thrust::copy_if(b_.policy(), it(0), it(p_.n), cand_, AtLeast{v_, t});
    if (c <= p_.high) {
      thrust::copy(b_.policy(), cand_, cand_ + c, out_);
      return c;
    }
    thrust::transform(b_.policy(), cand_, cand_ + c, mag_, MagnitudeOf{v_});
    // Stable: equal magnitudes keep ascending index order, so ties go to the lower index.
    thrust::stable_sort_by_key(b_.policy(), mag_, mag_ + c, cand_, thrust::greater<float>());
    thrust::copy(b_.policy(), cand_, cand_ + p_.k, out_);
    thrust::sort(b_.policy(), out_, out_ + p_.k);
    return p_.k;
  }

  bool select_adaptive(int* rounds, size_t* selected) {
    const float kMin = 1.401298464e-45f;
    thrust::transform(b_.policy(), it(0), it(p_.sample_m), sample_,
                      SampleAt{v_, p_.sample_offset, p_.sample_stride});
    thrust::sort(b_.policy(), sample_, sample_ + p_.sample_m, thrust::greater<float>());
    float t = b_.load(sample_ + (p_.sample_rank - 1));
    t = t > kMin ? t : kMin;
    float too_low = 0, too_high = INFINITY;
    for (int r = 0; r < p_.max_rounds; ++r) {
      ++*rounds;
      const size_t c = count(t);
      if ((c >= p_.low && c <= p_.cand_cap) || (c < p_.low && t == kMin)) {
        *selected = take(t, c);
        return true;
      }
      if (c > p_.cand_cap)
        too_low = t;
      else
        too_high = t;
      float next = std::isfinite(too_high) && too_low > 0
                       ? static_cast<float>(std::sqrt(double(too_low) * too_high))
                       : (c > p_.cand_cap ? t * 4.0f : t * 0.25f);
      next = next > kMin ? next : kMin;
      if (!std::isfinite(next) || next == t) break;
      t = next;
    }
    return false;
  }

  // The k largest non-zero magnitudes (ties: lower index), by bisection on the magnitude bits.
  size_t exact_top_k() {
    const size_t k = p_.k;
    uint32_t lo = 1, hi = 0x7f800000u;  // find the largest b with count(bits >= b) >= k
    if (count_bits(lo) < k) {
      lo = 0;  // fewer than k non-zeros: all of them
    } else {
      while (lo < hi) {
        uint32_t mid = lo + (hi - lo + 1) / 2;
        if (count_bits(mid) >= k)
          lo = mid;
        else
          hi = mid - 1;
      }
    }
    const float t = u2f(lo);
    uint32_t* end = thrust::copy_if(b_.policy(), it(0), it(p_.n), cand_, Above{v_, t});
    const size_t above = end - cand_;
    if (t == 0.0f) {
      thrust::copy(b_.policy(), cand_, end, out_);
      return above;
    }
    // Ties at t: the first (k - above) of them in index order. Find the index prefix holding
    // exactly that many by bisection, so that the compaction stays within the buffer.
    const size_t need = k - above;
    size_t lo_i = 0, hi_i = p_.n;
    while (lo_i < hi_i) {
      size_t mid = lo_i + (hi_i - lo_i) / 2;
      if (static_cast<size_t>(thrust::count_if(b_.policy(), it(0), it(mid), Equal{v_, t})) >= need)
        hi_i = mid;
      else
        lo_i = mid + 1;
    }
    uint32_t* ties = thrust::copy_if(b_.policy(), it(0), it(lo_i), end, Equal{v_, t});
    thrust::merge(b_.policy(), cand_, end, end, ties, out_);
    return above + (ties - end);
  }

  StepResult finish(StepResult r, float* out_val, size_t c) {
    r.count = c;
    r.saturated = c == 0 ? 0
                         : thrust::transform_reduce(
                               b_.policy(), it(0), it(c),
                               Finish{out_, v_, u_, out_val, static_cast<int>(p_.value_dtype)}, 0,
                               thrust::plus<int>());
    // The threshold: smallest |sent + residual| = smallest selected |v| before masking.
    r.threshold = INFINITY;
    if (c > 0) {
      thrust::transform(b_.policy(), it(0), it(c), mag_, RestoredMagnitude{out_, v_, out_val});
      r.threshold = b_.load(thrust::min_element(b_.policy(), mag_, mag_ + c));
    }
    return r;
  }

  B& b_;
  const StepParams& p_;
  float* u_;
  float* v_;
  float* sample_;
  uint32_t* cand_;
  float* mag_;
  uint32_t* out_;
};

// 16-bit casts with scaling: bits out, saturation and non-finite counts.
struct CastOne {
  const float* in;
  uint16_t* out;
  float scale;
  bool bf16;
  GX_HD uint64_t operator()(size_t i) const {  // low 32 bits: saturated, high: non-finite
    const float x = in[i] * scale;
    const uint32_t abs = f2u(x) & 0x7fffffffu;
    int sat = 0;
    uint16_t h;
    if (bf16) {
      const float r = round_bf16(x, &sat);
      h = static_cast<uint16_t>(abs > 0x7f800000u ? ((f2u(x) >> 16) | 0x40u) : (f2u(r) >> 16));
    } else {
      h = fp16_bits(round_fp16(x, &sat), abs > 0x7f800000u);
    }
    out[i] = h;
    return uint64_t(sat) | (uint64_t(abs >= 0x7f800000u) << 32);
  }
  // Bits of a value already representable in fp16.
  GX_HD static uint16_t fp16_bits(float r, bool nan) {
    const uint32_t u = f2u(r), sign = (u >> 16) & 0x8000u, abs = u & 0x7fffffffu;
    if (nan) return static_cast<uint16_t>(sign | 0x7e00u);
    if (abs >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
    if (abs < 0x38800000u)  // subnormal: a multiple of 2^-24
      return static_cast<uint16_t>(sign | static_cast<uint32_t>(u2f(abs) * 16777216.0f));
    return static_cast<uint16_t>(sign | ((abs - 0x38000000u) >> 13));
  }
};

template <class B>
CastCounts cast_to_half(B& b, const float* in, uint16_t* out, size_t n, float scale, bool bf16) {
  uint64_t packed = thrust::transform_reduce(
      b.policy(), thrust::counting_iterator<size_t>(0), thrust::counting_iterator<size_t>(n),
      CastOne{in, out, scale, bf16}, uint64_t{0}, thrust::plus<uint64_t>());
  return {static_cast<size_t>(packed & 0xffffffffu), static_cast<size_t>(packed >> 32)};
}

}  // namespace gradex::compress::thrust_dgc
