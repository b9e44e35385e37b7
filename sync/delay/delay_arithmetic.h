// The delayed exchange's element-wise arithmetic (sync/delay/delay_line.h): what a step exchanges
// (x_t, with gradex's momentum and a carried residual) and the correction of the gradient a step
// gets, update_t = x_t + (avg_{t-D} - x_{t-D}). Element by element in fp32, one rounding to a
// 16-bit type at the end; the fp32 cases are loops of their own, with the options decided outside
// them, so that they vectorize (they read the whole tensor every step: milliseconds of each step's
// CPU on the MLP race's 4.3M elements, which ranks sharing cores pay in steps).
#pragma once

#include <cstdint>

#include "base/dtype.h"

namespace gradex::sync::delay {

// out = g + (avg - g_old), in place (`out` holds g on entry). `stale`: out = avg
// (GRADEX_DELAY_RULE=stale).
void correct(uint8_t* out, const uint8_t* avg, const uint8_t* old, DType t, uint64_t n, bool stale);

// x = g, or with momentum m (u non-null): u = m u + g, x = u (Nesterov: g + m u); plus `carry` when
// non-null.
void make_x(const uint8_t* g, uint8_t* x, DType t, uint64_t n, float* u, float m, bool nesterov,
            const float* carry);

// make_x and correct in one pass for fp32, where the step to retire is already settled (the lanes'
// steady state: this lane's exchange of step t - D): x goes to `local` and `exchanged`, and `data`
// (g on entry) gets x + (avg - x_old). Bit for bit what make_x, two copies of x and correct give
// (the same operations in the same order), in one read of each input instead of four passes and
// two copies.
void make_x_and_correct(float* data, float* local, float* exchanged, uint64_t n, float* u, float m,
                        bool nesterov, const float* carry, const float* avg, const float* old);

}  // namespace gradex::sync::delay
