// A complex FFT of any length n >= 1 over "lanes": many independent transforms of the same length
// computed together. Element q of every lane is one row of `lanes` contiguous floats (re[q * lanes
// + w], im[q * lanes + w] for lane w), and every operation is the same elementwise operation on
// all lanes of a row, so the lane loops vectorise and a lane's result does not depend on how many
// lanes share the call, nor on which thread runs it.
//
// Algorithm: Stockham's self-sorting mixed-radix FFT (decimation in time, ping-pong between two
// buffers, no bit reversal). n is factored into radix-4 stages, then at most one radix-2 stage,
// then its odd prime factors in increasing order (a generic radix-p butterfly, O(p) per element
// and stage): O(n * sum of factors) in all, O(n log n) for the sizes the chunked DCT meets most
// (powers of two); a prime length costs O(n^2), as a direct evaluation. Twiddles are computed in
// double and rounded once, so every rank builds the same tables. The file is compiled without FMA
// contraction: every product is rounded before it is added, on every machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gradex::compress::dct {

class LaneFft {
 public:
  explicit LaneFft(uint32_t n);  // n >= 1

  uint32_t size() const { return n_; }
  // Floats of scratch forward() needs besides its two buffers, for `lanes` lanes.
  size_t scratch_floats(size_t lanes) const {
    return 2 * static_cast<size_t>(max_generic_) * lanes;
  }

  // The unnormalised forward DFT of every lane, X_k = sum_q x_q exp(-2 pi i q k / n). On entry
  // (re0, im0) holds x (n rows of `lanes` floats each); (re1, im1) is a second buffer of the same
  // size and `scratch` has scratch_floats(lanes) floats. Returns false when the result is in
  // (re0, im0), true when it is in (re1, im1). None of the arrays may overlap.
  bool forward(float* re0, float* im0, float* re1, float* im1, float* scratch, size_t lanes) const;

 private:
  struct Stage {
    uint32_t radix;
    uint32_t span;                    // the length of the sub-transforms this stage combines
    std::vector<float> tw_re, tw_im;  // twiddle of (k < span, 1 <= r < radix): [k*(radix-1)+r-1]
    std::vector<float> root_re, root_im;  // generic radix: exp(-2 pi i q / radix), q < radix
  };

  void run_stage(const Stage& s, const float* sre, const float* sim, float* dre, float* dim,
                 float* scratch, size_t lanes) const;

  uint32_t n_;
  uint32_t max_generic_ = 0;  // largest generic radix (0: none)
  std::vector<Stage> stages_;
};

}  // namespace gradex::compress::dct
