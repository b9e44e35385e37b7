#include "compress/dct/lane_fft.h"

#include <cmath>
#include <string>

#include "base/error.h"

namespace gradex::compress::dct {
namespace {

// One radix-2 butterfly over the lanes: inputs rows a, b (b twiddled by (c, s) unless Twiddle is
// false, i.e. k == 0 where every twiddle is 1), outputs y0 = a + b', y1 = a - b'.
template <bool Twiddle>
void radix2(const float* __restrict ar, const float* __restrict ai, const float* __restrict br,
            const float* __restrict bi, float c, float s, float* __restrict y0r,
            float* __restrict y0i, float* __restrict y1r, float* __restrict y1i, size_t lanes) {
  for (size_t w = 0; w < lanes; ++w) {
    float tr = br[w], ti = bi[w];
    if (Twiddle) {
      const float xr = tr, xi = ti;
      tr = xr * c - xi * s;
      ti = xr * s + xi * c;
    }
    y0r[w] = ar[w] + tr;
    y0i[w] = ai[w] + ti;
    y1r[w] = ar[w] - tr;
    y1i[w] = ai[w] - ti;
  }
}

// One radix-4 butterfly: x1..x3 twiddled by tw[0..5] = (c1, s1, c2, s2, c3, s3), then the 4-point
// DFT with exp(-2 pi i / 4) = -i.
template <bool Twiddle>
void radix4(const float* const* xr, const float* const* xi, const float* tw, float* const* yr,
            float* const* yi, size_t lanes) {
  const float* __restrict x0r = xr[0];
  const float* __restrict x0i = xi[0];
  const float* __restrict x1r = xr[1];
  const float* __restrict x1i = xi[1];
  const float* __restrict x2r = xr[2];
  const float* __restrict x2i = xi[2];
  const float* __restrict x3r = xr[3];
  const float* __restrict x3i = xi[3];
  float* __restrict y0r = yr[0];
  float* __restrict y0i = yi[0];
  float* __restrict y1r = yr[1];
  float* __restrict y1i = yi[1];
  float* __restrict y2r = yr[2];
  float* __restrict y2i = yi[2];
  float* __restrict y3r = yr[3];
  float* __restrict y3i = yi[3];
  const float c1 = tw[0], s1 = tw[1], c2 = tw[2], s2 = tw[3], c3 = tw[4], s3 = tw[5];
  for (size_t w = 0; w < lanes; ++w) {
    const float ar = x0r[w], ai = x0i[w];
    float br = x1r[w], bi = x1i[w], cr = x2r[w], ci = x2i[w], dr = x3r[w], di = x3i[w];
    if (Twiddle) {
      const float b0 = br, c0 = cr, d0 = dr;
      br = b0 * c1 - bi * s1;
      bi = b0 * s1 + bi * c1;
      cr = c0 * c2 - ci * s2;
      ci = c0 * s2 + ci * c2;
      dr = d0 * c3 - di * s3;
      di = d0 * s3 + di * c3;
    }
    const float s02r = ar + cr, s02i = ai + ci, d02r = ar - cr, d02i = ai - ci;
    const float s13r = br + dr, s13i = bi + di, d13r = br - dr, d13i = bi - di;
    y0r[w] = s02r + s13r;
    y0i[w] = s02i + s13i;
    y2r[w] = s02r - s13r;
    y2i[w] = s02i - s13i;
    y1r[w] = d02r + d13i;  // d02 - i * d13
    y1i[w] = d02i - d13r;
    y3r[w] = d02r - d13i;  // d02 + i * d13
    y3i[w] = d02i + d13r;
  }
}

}  // namespace

LaneFft::LaneFft(uint32_t n) : n_(n) {
  if (n == 0) throw InvalidArgument("LaneFft: the length must be at least 1");
  std::vector<uint32_t> radices;
  uint32_t rest = n;
  while (rest % 4 == 0) {
    radices.push_back(4);
    rest /= 4;
  }
  if (rest % 2 == 0) {
    radices.push_back(2);
    rest /= 2;
  }
  for (uint32_t p = 3; rest > 1; p += 2) {
    if (static_cast<uint64_t>(p) * p > rest) p = rest;  // what is left is prime
    while (rest % p == 0) {
      radices.push_back(p);
      rest /= p;
    }
  }
  const double pi = std::acos(-1.0);
  uint32_t span = 1;
  for (uint32_t radix : radices) {
    Stage s;
    s.radix = radix;
    s.span = span;
    s.tw_re.resize(static_cast<size_t>(span) * (radix - 1));
    s.tw_im.resize(s.tw_re.size());
    for (uint32_t k = 0; k < span; ++k)
      for (uint32_t r = 1; r < radix; ++r) {
        const double angle =
            -2.0 * pi * static_cast<double>(k) * r / (static_cast<double>(span) * radix);
        s.tw_re[static_cast<size_t>(k) * (radix - 1) + r - 1] = static_cast<float>(std::cos(angle));
        s.tw_im[static_cast<size_t>(k) * (radix - 1) + r - 1] = static_cast<float>(std::sin(angle));
      }
    if (radix != 2 && radix != 4) {
      for (uint32_t q = 0; q < radix; ++q) {
        const double angle = -2.0 * pi * q / radix;
        s.root_re.push_back(static_cast<float>(std::cos(angle)));
        s.root_im.push_back(static_cast<float>(std::sin(angle)));
      }
      if (radix > max_generic_) max_generic_ = radix;
    }
    stages_.push_back(std::move(s));
    span *= radix;
  }
}

bool LaneFft::forward(float* re0, float* im0, float* re1, float* im1, float* scratch,
                      size_t lanes) const {
  bool in_second = false;
  for (const Stage& s : stages_) {
    if (in_second)
      run_stage(s, re1, im1, re0, im0, scratch, lanes);
    else
      run_stage(s, re0, im0, re1, im1, scratch, lanes);
    in_second = !in_second;
  }
  return in_second;
}

// Stockham, decimation in time: for j < n/R, with k = j mod span, the inputs are rows j + r*n/R
// (r < R), twiddled by exp(-2 pi i k r / (span R)), and the R-point DFT of them goes to rows
// (j / span) * span * R + k + s * span (s < R).
void LaneFft::run_stage(const Stage& st, const float* sre, const float* sim, float* dre, float* dim,
                        float* scratch, size_t lanes) const {
  const uint32_t radix = st.radix, span = st.span, m = n_ / radix;
  for (uint32_t j = 0; j < m; ++j) {
    const uint32_t k = j % span;
    const size_t out0 = static_cast<size_t>(j / span) * span * radix + k;
    const float* tw_re = st.tw_re.data() + static_cast<size_t>(k) * (radix - 1);
    const float* tw_im = st.tw_im.data() + static_cast<size_t>(k) * (radix - 1);
    auto in_re = [&](uint32_t r) { return sre + (j + static_cast<size_t>(r) * m) * lanes; };
    auto in_im = [&](uint32_t r) { return sim + (j + static_cast<size_t>(r) * m) * lanes; };
    auto out_re = [&](uint32_t s) { return dre + (out0 + static_cast<size_t>(s) * span) * lanes; };
    auto out_im = [&](uint32_t s) { return dim + (out0 + static_cast<size_t>(s) * span) * lanes; };
    if (radix == 2) {
      if (k == 0)
        radix2<false>(in_re(0), in_im(0), in_re(1), in_im(1), 1.0f, 0.0f, out_re(0), out_im(0),
                      out_re(1), out_im(1), lanes);
      else
        radix2<true>(in_re(0), in_im(0), in_re(1), in_im(1), tw_re[0], tw_im[0], out_re(0),
                     out_im(0), out_re(1), out_im(1), lanes);
      continue;
    }
    if (radix == 4) {
      const float* xr[4] = {in_re(0), in_re(1), in_re(2), in_re(3)};
      const float* xi[4] = {in_im(0), in_im(1), in_im(2), in_im(3)};
      float* yr[4] = {out_re(0), out_re(1), out_re(2), out_re(3)};
      float* yi[4] = {out_im(0), out_im(1), out_im(2), out_im(3)};
      const float tw[6] = {tw_re[0], tw_im[0], tw_re[1], tw_im[1], tw_re[2], tw_im[2]};
      if (k == 0)
        radix4<false>(xr, xi, tw, yr, yi, lanes);
      else
        radix4<true>(xr, xi, tw, yr, yi, lanes);
      continue;
    }
    // Generic odd radix: the twiddled inputs into scratch, then each output as the sum over r in
    // increasing order of input r times exp(-2 pi i r s / R).
    float* tre = scratch;
    float* tim = scratch + static_cast<size_t>(radix) * lanes;
    for (uint32_t r = 0; r < radix; ++r) {
      const float* __restrict xr = in_re(r);
      const float* __restrict xi = in_im(r);
      float* __restrict yr = tre + static_cast<size_t>(r) * lanes;
      float* __restrict yi = tim + static_cast<size_t>(r) * lanes;
      if (r == 0 || k == 0) {
        for (size_t w = 0; w < lanes; ++w) {
          yr[w] = xr[w];
          yi[w] = xi[w];
        }
      } else {
        const float c = tw_re[r - 1], s = tw_im[r - 1];
        for (size_t w = 0; w < lanes; ++w) {
          yr[w] = xr[w] * c - xi[w] * s;
          yi[w] = xr[w] * s + xi[w] * c;
        }
      }
    }
    for (uint32_t s = 0; s < radix; ++s) {
      float* __restrict yr = out_re(s);
      float* __restrict yi = out_im(s);
      for (size_t w = 0; w < lanes; ++w) {
        yr[w] = tre[w];
        yi[w] = tim[w];
      }
      for (uint32_t r = 1; r < radix; ++r) {
        const uint32_t q = static_cast<uint32_t>((static_cast<uint64_t>(r) * s) % radix);
        const float c = st.root_re[q], sn = st.root_im[q];
        const float* __restrict xr = tre + static_cast<size_t>(r) * lanes;
        const float* __restrict xi = tim + static_cast<size_t>(r) * lanes;
        for (size_t w = 0; w < lanes; ++w) {
          yr[w] = yr[w] + (xr[w] * c - xi[w] * sn);
          yi[w] = yi[w] + (xr[w] * sn + xi[w] * c);
        }
      }
    }
  }
}

}  // namespace gradex::compress::dct
