// CPU kernels of the DGC step. Each works on a range [begin, end) so that callers can split a
// tensor across threads; indices are global. Candidate collection counts every element that
// passes but stores only the first `cap` of them, so a caller learns the true count even when its
// buffer overflows.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gradex::compress::dgc {

struct UpdateParams {
  float momentum = 0;       // m; 0 means "no momentum buffer": u is not touched (may be null)
  bool nesterov = false;    // v += g + m*u instead of v += u
  float grad_scale = 1.0f;  // clipping factor applied to g first
  // Candidates are the elements with |v_new| >= hint (hint > 0; +inf collects nothing).
  float hint = __builtin_inff();
};

// One fused pass: g' = grad_scale*g; u = m*u + g'; v += u (or g' + m*u); collect candidates of the
// new v. Reads g, u, v and writes u, v once (20 bytes per element; 12 without momentum).
size_t update_and_collect(const float* g, float* u, float* v, size_t begin, size_t end,
                          const UpdateParams& p, uint32_t* cand, size_t cap);
// The same pass, which also sets g[i] to 0 once it has been read: a caller whose gradient buffer
// is about to receive a sparse sum (zero outside the selections) saves a separate zero-fill pass
// over it; g's cache lines are already loaded, so only their write-back is added.
size_t update_collect_and_clear(float* g, float* u, float* v, size_t begin, size_t end,
                                const UpdateParams& p, uint32_t* cand, size_t cap);

// Candidates of v: elements with |v| >= t (t > 0), as above.
size_t collect_at_least(const float* v, size_t begin, size_t end, float t, uint32_t* cand,
                        size_t cap);

// Sum of squares of g (double accumulation) for norm clipping; NaN if g holds a non-finite value.
double sum_squares(const float* g, size_t begin, size_t end);

// The streaming bound of update_and_collect: u += g; v += g over the same bytes, no selection.
void stream_reference(const float* g, float* u, float* v, size_t n);

}  // namespace gradex::compress::dgc
