// Finding NaN/Inf in a submitted gradient before anything else touches it: the engine scans each
// gradient once, just before announcing it, and carries one flag per tensor in the negotiation
// round, so every rank knows about a non-finite value on any rank before any state changes.
#pragma once

#include <cstdint>

#include "base/dtype.h"

namespace gradex::sync {

// Number of NaN/Inf values among the n elements of `data` (of type `dtype`). With `zero` set they
// are replaced by (positive) zero in place.
uint64_t scan_nonfinite(void* data, DType dtype, uint64_t n, bool zero);

}  // namespace gradex::sync
