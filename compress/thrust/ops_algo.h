// The device backend's element-wise operations written once with Thrust over raw pointers, next to
// the DGC step (dgc_algo.h): compiled by nvcc for the GPU (cuda/ops_cuda.cu) and by the host
// compiler on Thrust's OpenMP system (thrust/omp_backend.cc). Internal: include only from those.
// `B` supplies policy() as in dgc_algo.h. Each operation computes exactly the expression of its CPU
// counterpart (compress/half/cast.cc, wire::accumulate), so results are bit-identical as long as
// the compiler does not contract a*b+c into an FMA (the CUDA target builds with --fmad=false).
#pragma once

#include <thrust/count.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <cstdint>

#include "compress/thrust/dgc_algo.h"

namespace gradex::compress::thrust_dgc {

// fp16 / bf16 bits to fp32, exact (base/half.h's half_to_float and bf16_to_float).
GX_HD inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) return u2f(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return u2f(sign);
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return u2f(sign | ((exp + 112u) << 23) | (mant << 13));
}
GX_HD inline float bf16_to_float(uint16_t h) {
  return u2f(static_cast<uint32_t>(h) << 16);
}

struct FromHalf {
  const uint16_t* in;
  float* out;
  float scale;
  bool bf16, add;
  GX_HD void operator()(size_t i) const {
    const float x = (bf16 ? bf16_to_float(in[i]) : fp16_to_float(in[i])) * scale;
    out[i] = add ? out[i] + x : x;
  }
};

struct NonFinite {
  const float* x;
  GX_HD bool operator()(size_t i) const { return (f2u(x[i]) & 0x7fffffffu) >= 0x7f800000u; }
};

struct ZeroNonFinite {
  float* x;
  GX_HD void operator()(size_t i) const {
    if ((f2u(x[i]) & 0x7fffffffu) >= 0x7f800000u) x[i] = 0.0f;
  }
};

// sync/momentum.cc's expressions, in its operation order.
struct Momentum {
  float* g;
  float* u;
  float m, s;
  int mode;  // 0: scale only, 1: momentum, 2: nesterov
  GX_HD void operator()(size_t i) const {
    if (mode == 0) {
      g[i] = g[i] * s;
      return;
    }
    const float gi = g[i] * s;
    const float ui = m * u[i] + gi;
    u[i] = ui;
    g[i] = mode == 2 ? gi + m * ui : ui;
  }
};

// Indices are strictly increasing, so no two threads touch the same element.
struct ScatterAdd {
  const uint32_t* idx;
  const float* val;
  float* out;
  float scale;
  GX_HD void operator()(size_t j) const {
    const uint32_t i = idx[j];
    out[i] = out[i] + scale * val[j];
  }
};

template <class B>
void from_half(B& b, const uint16_t* in, float* out, size_t n, bool bf16, float scale, bool add) {
  if (n == 0) return;
  thrust::for_each_n(b.policy(), thrust::counting_iterator<size_t>(0), n,
                     FromHalf{in, out, scale, bf16, add});
}

template <class B>
size_t count_nonfinite(B& b, const float* x, size_t n) {
  if (n == 0) return 0;
  return thrust::count_if(b.policy(), thrust::counting_iterator<size_t>(0),
                          thrust::counting_iterator<size_t>(n), NonFinite{x});
}

template <class B>
double sum_squares(B& b, const float* x, size_t n) {
  if (n == 0) return 0.0;
  return thrust::transform_reduce(b.policy(), x, x + n, SquareD{}, 0.0, thrust::plus<double>());
}

template <class B>
void zero_nonfinite(B& b, float* x, size_t n) {
  if (n == 0) return;
  thrust::for_each_n(b.policy(), thrust::counting_iterator<size_t>(0), n, ZeroNonFinite{x});
}

template <class B>
void apply_momentum(B& b, float* g, float* u, size_t n, float m, bool nesterov, float s) {
  if (n == 0 || (m == 0.0f && s == 1.0f)) return;
  const int mode = m == 0.0f ? 0 : (nesterov ? 2 : 1);
  thrust::for_each_n(b.policy(), thrust::counting_iterator<size_t>(0), n,
                     Momentum{g, u, m, s, mode});
}

template <class B>
void scatter_add(B& b, const uint32_t* idx, const float* val, size_t count, float* out,
                 float scale) {
  if (count == 0) return;
  thrust::for_each_n(b.policy(), thrust::counting_iterator<size_t>(0), count,
                     ScatterAdd{idx, val, out, scale});
}

}  // namespace gradex::compress::thrust_dgc
