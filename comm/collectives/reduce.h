// Element-wise sums used by the ring allreduce. fp16/bf16 are widened to fp32, added and rounded
// once (round to nearest even), so one ring hop costs one rounding.
#pragma once

#include <cstddef>

#include "base/dtype.h"

namespace gradex::comm {

// acc[i] = incoming[i] + acc[i] for i < count. The operand order is part of the documented
// summation order (docs/collectives.md); IEEE addition is commutative, so it only matters for
// NaN payloads.
void sum_into(void* acc, const void* incoming, size_t count, DType dtype);

}  // namespace gradex::comm
