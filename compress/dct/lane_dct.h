// The orthonormal DCT-II of length n and its inverse, the DCT-III, over lanes (many vectors of the
// same length transformed together; the layout and the determinism of lane_fft.h):
//   forward  X_f = s_f * sum_j x_j cos(pi (2j + 1) f / (2n)),  s_0 = sqrt(1/n), s_f = sqrt(2/n)
//   inverse  x_j = sum_f s_f X_f cos(pi (2j + 1) f / (2n))
// in O(n log n) per vector (lane_fft.h's caveat for lengths with large prime factors).
//
// Algorithm (Makhoul, 1980): the reordering v = (x_0, x_2, x_4, ..., x_5, x_3, x_1) turns the
// DCT-II into X_f = s_f Re(exp(-i pi f / (2n)) V_f), V the DFT of v. For even n the real DFT of v
// is one complex FFT of length n/2 (z_m = v_2m + i v_2m+1) and a split of its output; odd n take a
// complex FFT of length n with a zero imaginary part. The inverse runs the same steps backwards
// (the inverse FFT as the conjugate of the forward one). Every scale factor is folded into
// twiddles computed in double and rounded once; the file is compiled without FMA contraction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "compress/dct/lane_fft.h"

namespace gradex::compress::dct {

class LaneDct {
 public:
  explicit LaneDct(uint32_t n);  // n >= 1

  uint32_t size() const { return n_; }
  // Floats of workspace forward() and inverse() need for `lanes` lanes.
  size_t work_floats(size_t lanes) const;

  // Row j of the input is in + j * in_stride (`lanes` floats, one per lane); row f of the output
  // goes to out + f * out_stride. `work` holds work_floats(lanes) floats. in, out and work must
  // not overlap. A lane's result is the same whatever `lanes` and the strides are.
  void forward(const float* in, size_t in_stride, float* out, size_t out_stride, size_t lanes,
               float* work) const;
  void inverse(const float* in, size_t in_stride, float* out, size_t out_stride, size_t lanes,
               float* work) const;

 private:
  struct Planes;  // the work area, split (lane_dct.cc)
  using Direction = void (LaneDct::*)(const float*, size_t, float*, size_t, size_t,
                                      const Planes&) const;
  // What forward() and inverse() share: n == 1 is the identity; otherwise the work area is split
  // and `direction` runs.
  void run(Direction direction, const float* in, size_t in_stride, float* out, size_t out_stride,
           size_t lanes, float* work) const;
  void forward_planes(const float* in, size_t in_stride, float* out, size_t out_stride,
                      size_t lanes, const Planes& p) const;
  void inverse_planes(const float* in, size_t in_stride, float* out, size_t out_stride,
                      size_t lanes, const Planes& p) const;

  uint32_t n_, half_;  // half_: n/2 for even n, n for odd n (the FFT's length)
  LaneFft fft_;
  std::vector<uint32_t> perm_;  // v_q = x_perm[q]
  // Forward post-twiddles, per k <= half (even n: Y = alpha * s + beta * o, odd n: Y = alpha * Z).
  std::vector<float> alpha_re_, alpha_im_, beta_re_, beta_im_;
  // Inverse: g_k = rho_k exp(i pi k / (2n)) (k <= n/2), and exp(2 pi i k / n) (k < n/2, even n).
  std::vector<float> g_re_, g_im_, t_re_, t_im_;
};

}  // namespace gradex::compress::dct
