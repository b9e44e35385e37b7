#include "compress/dct/lane_dct.h"

#include <cmath>

#include "base/error.h"

namespace gradex::compress::dct {
namespace {

void copy_row(const float* __restrict in, float* __restrict out, size_t lanes) {
  for (size_t w = 0; w < lanes; ++w)
    out[w] = in[w];
}

void negate_row(const float* __restrict in, float* __restrict out, size_t lanes) {
  for (size_t w = 0; w < lanes; ++w)
    out[w] = -in[w];
}

}  // namespace

// The work area of a transform (work_floats): two complex planes of `plane` floats each, the
// FFT's input and output as split real and imaginary parts, then the FFT's scratch.
struct LaneDct::Planes {
  float *re0, *im0, *re1, *im1, *scratch;
};

LaneDct::LaneDct(uint32_t n)
    : n_(n), half_(n % 2 == 0 ? n / 2 : n), fft_(n == 0 ? 1 : (n % 2 == 0 ? n / 2 : n)) {
  if (n == 0) throw InvalidArgument("LaneDct: the length must be at least 1");
  perm_.resize(n);
  for (uint32_t q = 0; 2 * q < n; ++q)
    perm_[q] = 2 * q;
  for (uint32_t q = 0; 2 * q + 1 < n; ++q)
    perm_[n - 1 - q] = 2 * q + 1;
  const double pi = std::acos(-1.0), dn = n;
  const uint32_t last = n / 2;  // the largest k a post-twiddle serves (even n: h; odd n: (n-1)/2)
  for (uint32_t k = 0; k <= last; ++k) {
    const double sigma = k == 0 ? std::sqrt(1.0 / dn) : std::sqrt(2.0 / dn);
    const double rho = k == 0 ? 1.0 / std::sqrt(dn) : 1.0 / std::sqrt(2.0 * dn);
    const double w = -pi * k / (2.0 * dn);  // the angle of exp(-i pi k / (2n))
    if (n % 2 == 0) {
      // Y = w^k (s + t_k o) sigma / 2 with t_k = exp(-2 pi i k / n): s = Z_k + conj(Z_h-k) and
      // o = -i (Z_k - conj(Z_h-k)) are twice the DFTs of the even and the odd samples of v.
      alpha_re_.push_back(static_cast<float>(0.5 * sigma * std::cos(w)));
      alpha_im_.push_back(static_cast<float>(0.5 * sigma * std::sin(w)));
      const double wt = w - 2.0 * pi * k / dn;
      beta_re_.push_back(static_cast<float>(0.5 * sigma * std::cos(wt)));
      beta_im_.push_back(static_cast<float>(0.5 * sigma * std::sin(wt)));
      if (k < last) {
        t_re_.push_back(static_cast<float>(std::cos(2.0 * pi * k / dn)));
        t_im_.push_back(static_cast<float>(std::sin(2.0 * pi * k / dn)));
      }
    } else {
      alpha_re_.push_back(static_cast<float>(sigma * std::cos(w)));
      alpha_im_.push_back(static_cast<float>(sigma * std::sin(w)));
    }
    // The inverse: V_k / n = rho_k exp(i pi k / (2n)) (X_k - i X_n-k) for orthonormal X.
    g_re_.push_back(static_cast<float>(rho * std::cos(-w)));
    g_im_.push_back(static_cast<float>(rho * std::sin(-w)));
  }
}

size_t LaneDct::work_floats(size_t lanes) const {
  return 4 * (static_cast<size_t>(half_) + 1) * lanes + fft_.scratch_floats(lanes);
}

void LaneDct::forward(const float* in, size_t in_stride, float* out, size_t out_stride,
                      size_t lanes, float* work) const {
  run(&LaneDct::forward_planes, in, in_stride, out, out_stride, lanes, work);
}

void LaneDct::inverse(const float* in, size_t in_stride, float* out, size_t out_stride,
                      size_t lanes, float* work) const {
  run(&LaneDct::inverse_planes, in, in_stride, out, out_stride, lanes, work);
}

void LaneDct::run(Direction direction, const float* in, size_t in_stride, float* out,
                  size_t out_stride, size_t lanes, float* work) const {
  if (n_ == 1) {
    copy_row(in, out, lanes);
    return;
  }
  const size_t plane = (static_cast<size_t>(half_) + 1) * lanes;
  const Planes p{work, work + plane, work + 2 * plane, work + 3 * plane, work + 4 * plane};
  (this->*direction)(in, in_stride, out, out_stride, lanes, p);
}

void LaneDct::forward_planes(const float* in, size_t in_stride, float* out, size_t out_stride,
                             size_t lanes, const Planes& p) const {
  const size_t L = lanes;
  auto [re0, im0, re1, im1, scratch] = p;
  const uint32_t n = n_, h = half_;
  if (n % 2 == 0) {
    for (uint32_t m = 0; m < h; ++m) {
      copy_row(in + perm_[2 * m] * in_stride, re0 + m * L, L);
      copy_row(in + perm_[2 * m + 1] * in_stride, im0 + m * L, L);
    }
  } else {
    for (uint32_t q = 0; q < n; ++q) {
      copy_row(in + perm_[q] * in_stride, re0 + q * L, L);
      for (size_t w = 0; w < L; ++w)
        im0[q * L + w] = 0.0f;
    }
  }
  const bool second = fft_.forward(re0, im0, re1, im1, scratch, L);
  const float* zr = second ? re1 : re0;
  const float* zi = second ? im1 : im0;
  if (n % 2 != 0) {
    for (uint32_t k = 0; 2 * k < n; ++k) {
      const float ar = alpha_re_[k], ai = alpha_im_[k];
      const float* __restrict yr = zr + k * L;
      const float* __restrict yi = zi + k * L;
      float* __restrict xk = out + k * out_stride;
      for (size_t w = 0; w < L; ++w)
        xk[w] = ar * yr[w] - ai * yi[w];
      if (k == 0) continue;
      float* __restrict xnk = out + (n - k) * out_stride;
      for (size_t w = 0; w < L; ++w)
        xnk[w] = -(ar * yi[w] + ai * yr[w]);
    }
    return;
  }
  for (uint32_t k = 0; k <= h; ++k) {
    const float* __restrict pr = zr + (k % h) * L;  // Z_k (Z_h = Z_0)
    const float* __restrict pi = zi + (k % h) * L;
    const float* __restrict qr = zr + ((h - k) % h) * L;  // Z_h-k, used conjugated
    const float* __restrict qi = zi + ((h - k) % h) * L;
    const float ar = alpha_re_[k], ai = alpha_im_[k], br = beta_re_[k], bi = beta_im_[k];
    float* __restrict xk = out + k * out_stride;
    if (k == 0 || k == h) {
      for (size_t w = 0; w < L; ++w) {
        const float sr = pr[w] + qr[w], si = pi[w] - qi[w];
        const float dr = pr[w] - qr[w], di = pi[w] + qi[w];
        xk[w] = (ar * sr - ai * si) + (br * di + bi * dr);
      }
      continue;
    }
    float* __restrict xnk = out + (n - k) * out_stride;
    for (size_t w = 0; w < L; ++w) {
      const float sr = pr[w] + qr[w], si = pi[w] - qi[w];
      const float dr = pr[w] - qr[w], di = pi[w] + qi[w];
      xk[w] = (ar * sr - ai * si) + (br * di + bi * dr);
      xnk[w] = -((ar * si + ai * sr) + (bi * di - br * dr));
    }
  }
}

void LaneDct::inverse_planes(const float* in, size_t in_stride, float* out, size_t out_stride,
                             size_t lanes, const Planes& p) const {
  const size_t L = lanes;
  auto [re0, im0, re1, im1, scratch] = p;
  const uint32_t n = n_, h = half_;
  // V'_k = g_k (X_k - i X_n-k), k <= n/2, into (vr, vi): (re1, im1) for even n, straight into the
  // FFT's input, conjugated, for odd n.
  auto spectrum = [&](uint32_t k, float* __restrict vr, float* __restrict vi, bool conjugate) {
    const float gr = g_re_[k], gi = g_im_[k];
    const float* __restrict ck = in + k * in_stride;
    if (k == 0) {
      for (size_t w = 0; w < L; ++w) {
        vr[w] = gr * ck[w];
        vi[w] = conjugate ? -(gi * ck[w]) : gi * ck[w];
      }
      return;
    }
    const float* __restrict cn = in + (n - k) * in_stride;
    for (size_t w = 0; w < L; ++w) {
      vr[w] = gr * ck[w] + gi * cn[w];
      const float v = gi * ck[w] - gr * cn[w];
      vi[w] = conjugate ? -v : v;
    }
  };
  if (n % 2 != 0) {
    for (uint32_t k = 0; 2 * k < n; ++k) {
      spectrum(k, re0 + k * L, im0 + k * L, true);
      if (k == 0) continue;
      copy_row(re0 + k * L, re0 + (n - k) * L, L);  // V'_n-k = conj(V'_k), stored conjugated
      negate_row(im0 + k * L, im0 + (n - k) * L, L);
    }
    const bool second = fft_.forward(re0, im0, re1, im1, scratch, L);
    const float* zr = second ? re1 : re0;
    for (uint32_t q = 0; q < n; ++q)
      copy_row(zr + q * L, out + perm_[q] * out_stride, L);
    return;
  }
  for (uint32_t k = 0; k <= h; ++k)
    spectrum(k, re1 + k * L, im1 + k * L, false);
  // Z_k = E_k + i O_k with E_k = V'_k + conj(V'_h-k), O_k = exp(2 pi i k / n) (V'_k -
  // conj(V'_h-k)), stored conjugated: the inverse FFT is conj(FFT(conj(Z))).
  for (uint32_t k = 0; k < h; ++k) {
    const float* __restrict ar = re1 + k * L;
    const float* __restrict ai = im1 + k * L;
    const float* __restrict br = re1 + (h - k) * L;
    const float* __restrict bi = im1 + (h - k) * L;
    const float c = t_re_[k], s = t_im_[k];
    float* __restrict zr = re0 + k * L;
    float* __restrict zi = im0 + k * L;
    for (size_t w = 0; w < L; ++w) {
      const float sr = ar[w] + br[w], si = ai[w] - bi[w];
      const float dr = ar[w] - br[w], di = ai[w] + bi[w];
      zr[w] = sr - (c * di + s * dr);
      zi[w] = -(si + (c * dr - s * di));
    }
  }
  const bool second = fft_.forward(re0, im0, re1, im1, scratch, L);
  const float* zr = second ? re1 : re0;
  const float* zi = second ? im1 : im0;
  for (uint32_t m = 0; m < h; ++m) {
    copy_row(zr + m * L, out + perm_[2 * m] * out_stride, L);
    negate_row(zi + m * L, out + perm_[2 * m + 1] * out_stride, L);
  }
}

}  // namespace gradex::compress::dct
